//go:build linux

package blob_test

import "syscall"

// peakRSS is the most memory this process has held in RAM, in MiB.
func peakRSS() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return float64(ru.Maxrss) / 1024 // KiB on Linux
}
