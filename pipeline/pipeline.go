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
//	w, err := worker.New(pool, &worker.Config{Handler: h, Gate: h.Gate(), Slots: 8})
//
// The work directory belongs to the worker's user and nobody else can write
// to it (MakeWorkDir). While it is unusable (full, read-only, gone), rows
// go back to the queue without spending an attempt, the Gate holds the
// worker's slots back and Ready says why, until it is usable again. What a
// program leaves in its output directory is checked before anything is
// uploaded: only regular files with a single link, within the bounds on
// files and bytes.
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
	// attempt ends. It is created with mode 0700 if missing, and refused
	// when another user could change what is in it (see MakeWorkDir).
	// Defaults to DefaultWorkDir().
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
	// WorkDirMinFree is the free space, in bytes, below which the work
	// directory counts as full: rows wait for space before they start, and
	// a program that fails while the space is below it has its row handed
	// back rather than failed. Defaults to 1 MiB.
	WorkDirMinFree int64
	// MaxOutputFiles bounds the number of files one attempt uploads; past
	// it the row fails, with nothing uploaded. Negative means no bound.
	// Defaults to 10,000.
	MaxOutputFiles int
	// MaxOutputBytes bounds the bytes one attempt uploads, counting each
	// file at its length (a sparse file is uploaded whole); past it the row
	// fails, with nothing uploaded. Negative means no bound. Defaults to
	// 10 GiB.
	MaxOutputBytes int64
	// Logger receives the handler's warnings and debug lines (the lines of
	// each row's start and end come from the runtime's observer, see
	// worker.Observer). Defaults to discarding.
	Logger *slog.Logger
}

// Defaults of the output bounds.
const (
	DefaultMaxOutputFiles = 10_000
	DefaultMaxOutputBytes = 10 << 30
)

// Handler runs the download, backend, upload pipeline for one row at a time
// per slot. It is safe for concurrent use by all slots.
type Handler struct {
	cfg    Config
	health *health
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

// New checks cfg, creates or checks the work directory, and returns a
// Handler.
func New(cfg *Config) (*Handler, error) {
	if cfg == nil || cfg.Resolver == nil || cfg.Output == nil || cfg.Runner == nil {
		return nil, errors.New("pipeline: Resolver, Output and Runner are required")
	}
	c := *cfg
	if c.WorkDir == "" {
		dir, err := DefaultWorkDir()
		if err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
		c.WorkDir = dir
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.WorkDirWait <= 0 {
		c.WorkDirWait = 30 * time.Second
	}
	if c.WorkDirMinFree <= 0 {
		c.WorkDirMinFree = 1 << 20
	}
	if c.MaxOutputFiles == 0 {
		c.MaxOutputFiles = DefaultMaxOutputFiles
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	dir, err := MakeWorkDir(c.WorkDir)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	c.WorkDir = dir
	return &Handler{cfg: c, health: &health{dir: dir, minFree: uint64(c.WorkDirMinFree), log: c.Logger}}, nil
}

// Gate holds the worker's slots back from claiming while the work
// directory is unusable (see worker.Config.Gate).
func (h *Handler) Gate() worker.Gate { return h.health }

// Ready returns nil while the work directory is usable, else a short reason
// ("work directory out of space") for a readiness check; the details are in
// the log.
func (h *Handler) Ready(ctx context.Context) error { return h.health.Ready(ctx) }

// attempt is one row's pass through the pipeline.
type attempt struct {
	job                *worker.Job
	log                *slog.Logger
	token              string
	dir, inDir, outDir string

	// The input, once downloaded.
	store blob.Store
	key   string
	input string
	in    blob.Info
}

// Handle processes one row: prepare its directory, download the input, run
// the program, upload what it wrote, clean up. Errors are classified for the
// runtime: bad input (an unsafe or missing object, a refused credential, a
// program that cannot run, an output that breaks a bound) is permanent;
// trouble that is not the row's (the work directory is unusable through
// WorkDirWait or full when the program fails, the object store does not
// answer through the store's retries) releases the row without spending
// an attempt; the rest is retried.
func (h *Handler) Handle(ctx context.Context, job *worker.Job) (*worker.Result, error) {
	a, err := h.prepare(ctx, job)
	if err != nil {
		return nil, err
	}
	defer h.cleanUp(a)
	if err := h.download(ctx, a); err != nil {
		return nil, err
	}
	result, run, err := h.run(ctx, a)
	if err != nil {
		return result, err
	}
	manifest, err := h.upload(ctx, a, run)
	if err != nil {
		return result, err
	}
	result.Output = manifest
	return result, nil
}

// prepare creates the attempt's directories, waiting up to WorkDirWait for
// the work directory to become usable.
func (h *Handler) prepare(ctx context.Context, job *worker.Job) (*attempt, error) {
	a := &attempt{
		job:   job,
		log:   h.cfg.Logger.With("id", job.ID, "queue", job.Queue, "attempt", job.Attempt),
		token: randomToken(),
	}
	a.dir = filepath.Join(h.cfg.WorkDir, fmt.Sprintf("%d-%d-%s", job.ID, job.Attempt, a.token))
	a.inDir, a.outDir = filepath.Join(a.dir, "in"), filepath.Join(a.dir, "out")
	if err := h.mkdirs(ctx, a); err != nil {
		h.cleanUp(a)
		return nil, localTrouble(fmt.Errorf("create work directory: %w", err))
	}
	return a, nil
}

// cleanUp removes the attempt's directory, whatever its program did to it.
func (h *Handler) cleanUp(a *attempt) {
	if h.cfg.KeepWorkDirs {
		return
	}
	if err := removeAll(h.cfg.WorkDir, a.dir); err != nil {
		a.log.Warn("remove work directory", "dir", a.dir, "err", err)
	}
}

// download fetches the row's input into the attempt's directory.
func (h *Handler) download(ctx context.Context, a *attempt) error {
	store, key, err := h.cfg.Resolver.Resolve(a.job.Source)
	if err != nil {
		return worker.Permanent(err)
	}
	input, err := blob.LocalPath(a.inDir, path.Base(key))
	if err != nil {
		return worker.Permanent(err)
	}
	in, err := store.GetFile(ctx, key, input)
	if err != nil {
		switch {
		case isLocalTrouble(err):
			h.health.fail(err)
			return localTrouble(fmt.Errorf("download %s: %w", key, err))
		case blob.IsPermanent(err):
			return worker.Permanent(fmt.Errorf("download: %w", err))
		}
		return storeTrouble(ctx, fmt.Errorf("download: %w", err))
	}
	a.store, a.key, a.input, a.in = store, key, input, in
	return nil
}

// run runs the program on the input. The result it returns carries the
// program's report even when the program failed.
func (h *Handler) run(ctx context.Context, a *attempt) (*worker.Result, *backend.Result, error) {
	job := a.job
	run, err := h.cfg.Runner.Run(ctx, &backend.Job{
		ID:        job.ID,
		Queue:     job.Queue,
		Source:    job.Source,
		Attempt:   job.Attempt,
		Payload:   job.Payload,
		WorkerID:  job.WorkerID,
		Input:     a.input,
		OutputDir: a.outDir,
		WorkDir:   a.dir,
	})
	result := &worker.Result{}
	if run != nil {
		code := run.ExitCode
		result.ExitCode = &code
		result.Duration = run.Duration
		result.StderrTail = run.StderrTail
	}
	if err != nil {
		return result, run, h.runError(ctx, a, err)
	}
	return result, run, nil
}

// runError classifies the failure of a program.
func (h *Handler) runError(ctx context.Context, a *attempt, err error) error {
	switch {
	case errors.Is(err, backend.ErrArgTooLong):
		// The row's own values make the command too long for the
		// kernel: every attempt would fail the same way.
		return worker.Permanent(err)
	case backend.Permanent(err) && h.cfg.Runner.Program() != "":
		// The program was found at startup and is gone now (an NFS
		// mount dropped, a deploy in progress): the node's trouble, not
		// the row's. Hand the row to another node.
		return localTrouble(err)
	case backend.Permanent(err):
		// The program word comes from the row ({source}...).
		return worker.Permanent(err)
	case ctx.Err() != nil:
		return err
	case !exists(a.outDir):
		// The directory went away under the program (moved, deleted by
		// a cleaner): the node's trouble, not the row's.
		return localTrouble(fmt.Errorf("work directory lost while the program ran: %s is gone (program: %w)", a.outDir, err))
	}
	if full := h.health.checkSpace(); errors.Is(full, syscall.ENOSPC) {
		// The program most likely failed for want of space: the node's
		// trouble, not the row's.
		h.health.fail(full)
		return localTrouble(fmt.Errorf("work directory full when the program failed: %v (program: %w)", full, err))
	}
	return err
}

func object(s blob.Store, key string, info blob.Info) Object {
	return Object{URL: joinURL(s.Location().String(), key), Key: key, Size: info.Size, SHA256: info.SHA256}
}

func joinURL(base, key string) string {
	return strings.TrimSuffix(base, "/") + "/" + key
}

// mkdirs creates the attempt's directories once the work directory has
// room, waiting up to WorkDirWait for it to become usable.
func (h *Handler) mkdirs(ctx context.Context, a *attempt) error {
	try := func() error {
		if err := h.health.checkSpace(); err != nil {
			return err
		}
		return mkdirs(a.inDir, a.outDir)
	}
	err := try()
	if err == nil {
		return nil
	}
	h.health.fail(err)
	a.log.Debug("work directory unusable; waiting for it before handing the row back",
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
		if err = try(); err == nil {
			h.health.recovered()
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
