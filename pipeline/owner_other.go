//go:build !unix

package pipeline

import "io/fs"

// owner is unknown on this platform.
func owner(fs.FileInfo) (uint32, bool) { return 0, false }

// links is unknown on this platform: every file counts as having one.
func links(fs.FileInfo) uint64 { return 1 }
