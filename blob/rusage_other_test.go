//go:build !linux

package blob_test

// peakRSS is unknown here (VmHWM is read from Linux's /proc).
func peakRSS() float64 { return -1 }
