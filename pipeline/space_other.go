//go:build !(linux || darwin)

package pipeline

// freeSpace is unknown on this platform.
func freeSpace(string) (uint64, bool, error) { return 0, false, nil }
