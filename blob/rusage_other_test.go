//go:build !linux

package blob_test

// peakRSS is unknown here (Maxrss is in KiB only on Linux).
func peakRSS() float64 { return -1 }
