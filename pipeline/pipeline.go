// Package pipeline is the worker.Handler that pgworker run uses: for each
// claimed row it downloads the input object into a fresh work directory, runs
// the backend program on it, uploads every file the program left in its
// output directory under a prefix of its own attempt, and returns the
// manifest that becomes the row's result when the attempt completes.
//
//	h, err := pipeline.New(&pipeline.Config{
//		Resolver: blob.NewResolver(inputStore),
//		Output:   outputStore,
//		Runner:   runner, // backend.New(&backend.Config{Command: "convert {input} {output_dir}/page.png"})
//	})
//	w, err := worker.New(pool, &worker.Config{Handler: h, Slots: 8})
//
// Output keys are <id>/<attempt>-<token>/<path in output_dir>: an attempt that
// lost its row (its lease expired, the row went elsewhere) can still finish
// uploading, but never into the place whose manifest was recorded.
package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/worker"
)

// Config configures a Handler. Resolver, Output and Runner are required.
type Config struct {
	// Resolver maps a row's source to a store and key (a plain key in the
	// input store, or a full URL inside a configured store).
	Resolver *blob.Resolver
	// Output receives the files the backend writes.
	Output blob.Store
	// Runner runs the backend program.
	Runner *backend.Runner
	// WorkDir is where each attempt gets its own directory, removed when the
	// attempt ends. Defaults to a "pgworker" directory in os.TempDir().
	WorkDir string
	// KeepWorkDirs leaves the attempts' directories in place, for
	// debugging a backend. Defaults to false.
	KeepWorkDirs bool
	// WorkDirWait is how long an attempt waits for the work directory to
	// become usable (a full or read-only disk, a directory moved away)
	// before it hands its row back. Waiting in place keeps a node whose disk
	// is broken from taking row after row only to hand each back at once,
	// spending their attempts. Defaults to 30s.
	WorkDirWait time.Duration
	// Logger receives the handler's warnings and debug lines (the lines of
	// each row's start and end come from the runtime's observer, see
	// worker.Observer). Defaults to discarding.
	Logger *slog.Logger
}

// Handler runs the download, backend, upload pipeline for one row at a time
// per slot. It is safe for concurrent use by all slots.
type Handler struct {
	cfg Config
}

// Manifest is the result recorded for a completed row.
type Manifest struct {
	Input      Object   `json:"input"`
	OutputRoot string   `json:"output_root"` // URL of the attempt's output prefix
	Outputs    []Object `json:"outputs"`
	ExitCode   int      `json:"exit_code"`
	DurationMS int64    `json:"duration_ms"`
	Worker     string   `json:"worker_id"`
	Attempt    int      `json:"attempt"`
}

// Object is one object moved by an attempt.
type Object struct {
	URL    string `json:"url"`
	Key    string `json:"key"` // in its store
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// New checks cfg and returns a Handler.
func New(cfg *Config) (*Handler, error) {
	if cfg == nil || cfg.Resolver == nil || cfg.Output == nil || cfg.Runner == nil {
		return nil, errors.New("pipeline: Resolver, Output and Runner are required")
	}
	c := *cfg
	if c.WorkDir == "" {
		c.WorkDir = filepath.Join(os.TempDir(), "pgworker")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.WorkDirWait <= 0 {
		c.WorkDirWait = 30 * time.Second
	}
	if err := os.MkdirAll(c.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	return &Handler{cfg: c}, nil
}

// Handle processes one row. Errors are classified for the runtime: bad input
// (an unsafe or missing object, a refused credential, a program that cannot
// run) is permanent; trouble that is not the row's (the work directory stays
// unusable through WorkDirWait, the object store does not answer through
// the store's retries) releases the row without spending an attempt; the
// rest is retried.
func (h *Handler) Handle(ctx context.Context, job *worker.Job) (*worker.Result, error) {
	log := h.cfg.Logger.With("id", job.ID, "queue", job.Queue, "attempt", job.Attempt)
	token := randomToken()
	dir := filepath.Join(h.cfg.WorkDir, fmt.Sprintf("%d-%d-%s", job.ID, job.Attempt, token))
	inDir, outDir := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if !h.cfg.KeepWorkDirs {
		defer func() {
			if err := os.RemoveAll(dir); err != nil {
				log.Warn("remove work directory", "dir", dir, "err", err)
			}
		}()
	}
	if err := h.mkdirs(ctx, log, inDir, outDir); err != nil {
		return nil, localTrouble(fmt.Errorf("create work directory: %w", err))
	}

	// 1. Download the input.
	store, key, err := h.cfg.Resolver.Resolve(job.Source)
	if err != nil {
		return nil, worker.Permanent(err)
	}
	input, err := blob.LocalPath(inDir, path.Base(key))
	if err != nil {
		return nil, worker.Permanent(err)
	}
	in, err := store.GetFile(ctx, key, input)
	if err != nil {
		switch {
		case isLocalTrouble(err):
			return nil, localTrouble(fmt.Errorf("download %s: %w", key, err))
		case blob.IsPermanent(err):
			return nil, worker.Permanent(fmt.Errorf("download: %w", err))
		}
		return nil, storeTrouble(ctx, fmt.Errorf("download: %w", err))
	}

	// 2. Run the backend.
	run, err := h.cfg.Runner.Run(ctx, &backend.Job{
		ID:        job.ID,
		Queue:     job.Queue,
		Source:    job.Source,
		Attempt:   job.Attempt,
		Payload:   job.Payload,
		WorkerID:  job.WorkerID,
		Input:     input,
		OutputDir: outDir,
		WorkDir:   dir,
	})
	result := &worker.Result{}
	if run != nil {
		code := run.ExitCode
		result.ExitCode = &code
		result.Duration = run.Duration
		result.StderrTail = run.StderrTail
	}
	if err != nil {
		switch {
		case errors.Is(err, backend.ErrArgTooLong):
			// The row's own values make the command too long for the
			// kernel: every attempt would fail the same way.
			return result, worker.Permanent(err)
		case backend.Permanent(err) && h.cfg.Runner.Program() != "":
			// The program was found at startup and is gone now (an NFS
			// mount dropped, a deploy in progress): the node's trouble, not
			// the row's. Hand the row to another node.
			return result, localTrouble(err)
		case backend.Permanent(err):
			// The program word comes from the row ({source}...).
			return result, worker.Permanent(err)
		case ctx.Err() == nil && !exists(outDir):
			// The directory went away under the program (moved, deleted by
			// a cleaner): the node's trouble, not the row's.
			return result, localTrouble(fmt.Errorf("work directory lost while the program ran: %s is gone (program: %w)", outDir, err))
		}
		return result, err
	}

	// 3. Upload what it wrote, under this attempt's own prefix.
	prefix := fmt.Sprintf("%d/%d-%s", job.ID, job.Attempt, token)
	manifest := &Manifest{
		Input:      object(store, key, in),
		OutputRoot: joinURL(h.cfg.Output.Location().String(), prefix),
		Outputs:    []Object{},
		ExitCode:   run.ExitCode,
		DurationMS: run.Duration.Milliseconds(),
		Worker:     job.WorkerID,
		Attempt:    job.Attempt,
	}
	err = filepath.WalkDir(outDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return worker.Permanent(fmt.Errorf("output %s is not a regular file (links and devices are not uploaded)", strings.TrimPrefix(p, outDir+"/")))
		}
		rel, err := blob.LocalKey(outDir, p)
		if err != nil {
			return worker.Permanent(fmt.Errorf("output: %w", err))
		}
		info, err := h.cfg.Output.PutFile(ctx, prefix+"/"+rel, p)
		if err != nil {
			if blob.IsPermanent(err) {
				return fmt.Errorf("upload %s: %w", rel, err)
			}
			return storeTrouble(ctx, fmt.Errorf("upload %s: %w", rel, err))
		}
		manifest.Outputs = append(manifest.Outputs, object(h.cfg.Output, info.Key, info))
		return nil
	})
	if err != nil {
		return result, err
	}
	result.Output = manifest
	log.Debug("outputs uploaded", "outputs", len(manifest.Outputs), "root", manifest.OutputRoot)
	return result, nil
}

func object(s blob.Store, key string, info blob.Info) Object {
	return Object{URL: joinURL(s.Location().String(), key), Key: key, Size: info.Size, SHA256: info.SHA256}
}

func joinURL(base, key string) string {
	return strings.TrimSuffix(base, "/") + "/" + key
}

// mkdirs creates the attempt's directories, waiting up to WorkDirWait for
// the work directory to become usable.
func (h *Handler) mkdirs(ctx context.Context, log *slog.Logger, dirs ...string) error {
	err := mkdirs(dirs...)
	if err == nil {
		return nil
	}
	log.Warn("work directory unusable; waiting for it before handing the row back",
		"work_dir", h.cfg.WorkDir, "wait", h.cfg.WorkDirWait, "err", err)
	deadline := time.Now().Add(h.cfg.WorkDirWait)
	for wait := 100 * time.Millisecond; time.Now().Add(wait).Before(deadline); wait = min(2*wait, 2*time.Second) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if err = mkdirs(dirs...); err == nil {
			log.Info("work directory usable again", "work_dir", h.cfg.WorkDir)
			return nil
		}
	}
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func mkdirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// localTrouble hands the row back without spending an attempt: the fault is
// this node's (its disk is full or read-only), and another node may succeed.
func localTrouble(err error) error {
	return worker.Release(err)
}

// storeTrouble hands the row back without spending an attempt when the
// object store did not answer through all of the store's retries (it is
// restarting, failing over, or out of this node's reach): the row is not at
// fault. An error of a cancelled attempt (timeout, lost lease, stop) is
// left as it is, for the runtime to judge by the cause.
func storeTrouble(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return worker.Release(err)
}

func isLocalTrouble(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) ||
		errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EACCES) && !blob.IsPermanent(err)
}

func randomToken() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var _ worker.Handler = (*Handler)(nil)
