//go:build !unix

package blob

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// openNoFollow checks before it opens: weaker than O_NOFOLLOW, which this
// platform lacks.
func openNoFollow(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("open %s: %w", path, syscall.ELOOP)
	}
	return os.Open(path)
}

// hardLinks is unknown on this platform: every file counts as having one.
func hardLinks(os.FileInfo) uint64 { return 1 }
