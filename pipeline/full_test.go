//go:build linux

package pipeline_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// mountSmall mounts a file system of size bytes (a tmpfs, mode 0700) on a
// new directory and returns the directory.
func mountSmall(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file that leaves about free bytes free in dir's file system.
func fill(t *testing.T, dir string, total, free int64) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	if err := os.WriteFile(p, make([]byte, total-free), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeMiB is a program that writes 1 MiB to its output directory.
const writeMiB = `sh -c 'head -c 1048576 /dev/zero > "$0/big"' {output_dir}`

// A program that fails for want of space in the work directory has its row
// handed back, not failed: the node's trouble, not the row's. The work
// directory then counts as unusable (the gate is closed, the readiness check
// says why) until it has room again, which it finds out by itself.
func TestHandleReleasesWhenWorkDirFull(t *testing.T) {
	t.Parallel()
	small := mountSmall(t, "2m")
	h, _, err := newWith(t, writeMiB, pipeline.Config{WorkDir: filepath.Join(small, "work"), WorkDirMinFree: 4096})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, small, 2<<20, 256<<10)
	ctx := context.Background()
	_, err = h.Handle(ctx, job())
	if !worker.IsRelease(err) || !strings.Contains(err.Error(), "work directory full when the program failed") {
		t.Fatalf("got %v, want a release that says the work directory was full", err)
	}
	if err := h.Ready(ctx); err == nil || err.Error() != "work directory out of space" {
		t.Errorf("Ready: %v, want \"work directory out of space\"", err)
	}
	if h.Gate().Open() {
		t.Error("the gate is open after the work directory was found full")
	}
	// The attempt's directory is gone with its megabyte: the directory has
	// room again, and the gate finds it out.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := h.Gate().Wait(wctx); err != nil {
		t.Fatalf("the gate did not open once the space was back: %v", err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Errorf("Ready once the space was back: %v", err)
	}
}

// A work directory with less than WorkDirMinFree free takes no row: the row
// waits for WorkDirWait, then goes back to the queue without spending an
// attempt; once space is freed, rows run again.
func TestHandleWaitsForSpace(t *testing.T) {
	t.Parallel()
	small := mountSmall(t, "2m")
	h, _, err := newWith(t, writeMiB, pipeline.Config{WorkDir: filepath.Join(small, "work"), WorkDirWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	filler := fill(t, small, 2<<20, 256<<10)
	ctx := context.Background()
	_, err = h.Handle(ctx, job())
	if !worker.IsRelease(err) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("got %v, want a release that says the work directory has no space", err)
	}
	if err := h.Ready(ctx); err == nil || err.Error() != "work directory out of space" {
		t.Errorf("Ready: %v, want \"work directory out of space\"", err)
	}
	waited := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		waited <- h.Gate().Wait(wctx)
	}()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the gate did not open once the space was freed: %v", err)
	}
	if _, err := h.Handle(ctx, job()); err != nil {
		t.Fatalf("Handle once the space was freed: %v", err)
	}
}
