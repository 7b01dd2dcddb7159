//go:build linux

package blob_test

import (
	"bytes"
	"os"
	"strconv"
)

// peakRSS is the most memory this process has held in RAM, in MiB: VmHWM,
// the high-water mark of its own address space. getrusage's ru_maxrss would
// not do: a child started by vfork, as os/exec starts one, takes the parent's
// high-water mark over at exec.
func peakRSS() float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kib, err := strconv.ParseFloat(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 64)
			if err != nil {
				return -1
			}
			return kib / 1024
		}
	}
	return -1
}
