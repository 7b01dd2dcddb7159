// Command slowcopy is the backend of the fault suite: it sleeps a random
// time, so that faults land while rows are being worked on, then copies its
// input into the output directory under the input's base name.
//
//	slowcopy [-min 20ms] [-max 500ms] INPUT OUTPUT_DIR
package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

func main() {
	minSleep := flag.Duration("min", 20*time.Millisecond, "shortest sleep")
	maxSleep := flag.Duration("max", 500*time.Millisecond, "longest sleep")
	flag.Parse()
	if flag.NArg() != 2 || *maxSleep < *minSleep {
		fmt.Fprintln(os.Stderr, "usage: slowcopy [-min D] [-max D] INPUT OUTPUT_DIR")
		os.Exit(2)
	}
	time.Sleep(*minSleep + rand.N(*maxSleep-*minSleep+1))
	if err := copyFile(flag.Arg(0), filepath.Join(flag.Arg(1), filepath.Base(flag.Arg(0)))); err != nil {
		fmt.Fprintln(os.Stderr, "slowcopy:", err)
		os.Exit(1)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
