//go:build linux || darwin

package pipeline

import "syscall"

// freeSpace returns the bytes that an unprivileged user may still write in
// the file system of dir.
func freeSpace(dir string) (uint64, bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true, nil
}
