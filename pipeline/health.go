package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// health tracks whether the work directory can take rows. While it cannot
// (it is full, read-only, not writable or gone), the worker's slots wait at
// its gate instead of claiming rows only to hand them back, and /readyz
// says why. It finds out by itself when the directory is usable again.
type health struct {
	dir     string
	minFree uint64
	log     *slog.Logger

	mu      sync.Mutex
	problem error // nil while usable
}

// Open reports whether the work directory is usable, as far as the last
// attempt or probe knows.
func (h *health) Open() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.problem == nil
}

// Wait returns once the work directory is usable, probing it while it is
// not, or with ctx's error.
func (h *health) Wait(ctx context.Context) error {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		if h.Open() {
			return nil
		}
		if err := h.check(); err == nil {
			h.recovered()
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Ready returns nil while the work directory is usable, else a short reason
// fit for /readyz; the details are in the log.
func (h *health) Ready(context.Context) error {
	h.mu.Lock()
	err := h.problem
	h.mu.Unlock()
	if err == nil {
		return nil
	}
	return fmt.Errorf("work directory %s", reason(err))
}

// fail records that the work directory is unusable; the first failure of an
// outage is logged, with its cause.
func (h *health) fail(err error) {
	h.mu.Lock()
	first := h.problem == nil
	h.problem = err
	h.mu.Unlock()
	if first {
		h.log.Warn("work directory unusable; rows that meet it wait for it, then go back to the queue, and no row is claimed until it is usable again",
			"work_dir", h.dir, "err", err)
	}
}

// recovered records that the work directory is usable again.
func (h *health) recovered() {
	h.mu.Lock()
	was := h.problem
	h.problem = nil
	h.mu.Unlock()
	if was != nil {
		h.log.Info("work directory usable again; claiming rows again", "work_dir", h.dir)
	}
}

// check probes the work directory: enough free space, and a directory can
// be created in it and removed.
func (h *health) check() error {
	if err := h.checkSpace(); err != nil {
		return err
	}
	d, err := os.MkdirTemp(h.dir, ".probe-")
	if err != nil {
		return err
	}
	return os.Remove(d)
}

// checkSpace returns an error wrapping ENOSPC when less than minFree bytes
// are free in the work directory's file system.
func (h *health) checkSpace() error {
	free, known, err := freeSpace(h.dir)
	if err != nil {
		return fmt.Errorf("work directory %s: %w", h.dir, err)
	}
	if known && free < h.minFree {
		return fmt.Errorf("work directory %s: %w (%d bytes free, below the %d bytes kept free)", h.dir, syscall.ENOSPC, free, h.minFree)
	}
	return nil
}

// reason says in a few words what is wrong with a directory.
func reason(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "out of space"
	case errors.Is(err, syscall.EROFS):
		return "read-only"
	case errors.Is(err, fs.ErrPermission):
		return "not writable"
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return "missing"
	}
	return "unusable"
}
