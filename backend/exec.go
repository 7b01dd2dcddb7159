package backend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// run is one run of the program, from prepare to classify.
type run struct {
	job   Job // the caller's job, with PayloadFile set
	token string
	path  string
	res   *Result
	log   *slog.Logger

	cmd        *exec.Cmd
	outR, errR *os.File
	start      time.Time
	streams    sync.WaitGroup
	tail       *tailBuffer
	budget     *logBudget
	exited     chan struct{}
	waitErr    error
	removeFile string // a temporary payload file to remove at the end
}

// Run runs the program for job and waits for it to end. It returns a nil
// error only when the program exited with status 0. Otherwise the error is
// a *ExitError, wraps ErrTimeout or the context's cause, or wraps
// ErrNotFound, ErrNotExecutable or ErrArgTooLong (then Result.Pid is 0).
//
// The program runs without a shell, in its own process group, with stdin
// from /dev/null, in job.WorkDir, as Config.RunAs when set. Its stdout and
// stderr go to the logger line by line, within the row's log budget. When
// ctx ends or the timeout passes, the whole group gets SIGTERM, then
// SIGKILL after Config.KillGrace; when the program exits, whatever it left
// running in its group is killed, and so is what it left in other sessions
// once the process is a subreaper (see BecomeSubreaper).
func (r *Runner) Run(ctx context.Context, job *Job) (*Result, error) {
	ru, err := r.prepare(ctx, job)
	if ru.removeFile != "" {
		defer os.Remove(ru.removeFile)
	}
	if err != nil {
		return ru.res, err
	}
	if err := r.start(ru); err != nil {
		return ru.res, err
	}
	r.wait(ctx, ru)
	r.killLeftovers(ru)
	r.drain(ru)
	return ru.res, r.classify(ctx, ru)
}

// prepare expands the command, finds the program, writes the payload file
// and hands the work directory to Config.RunAs.
func (r *Runner) prepare(ctx context.Context, job *Job) (*run, error) {
	ru := &run{job: *job, token: randomToken(), res: &Result{ExitCode: -1}}
	ru.log = r.cfg.Logger.With(slog.Int64("id", job.ID), slog.Int("attempt", job.Attempt))
	if job.WorkDir != "" {
		if fi, err := os.Stat(job.WorkDir); err != nil || !fi.IsDir() {
			return ru, fmt.Errorf("work directory %s is not a directory: %v", job.WorkDir, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return ru, fmt.Errorf("backend not started: %w", context.Cause(ctx))
	}
	if err := r.writePayload(ru); err != nil {
		return ru, err
	}
	ru.res.Argv = r.tmpl.Expand(&ru.job)
	ru.path = r.program
	if ru.path == "" {
		var err error
		if ru.path, err = resolve(ru.res.Argv[0], r.path); err != nil {
			return ru, err
		}
	}
	if r.cred != nil && job.WorkDir != "" {
		if err := chownTree(job.WorkDir, r.cred); err != nil {
			return ru, fmt.Errorf("hand the work directory to the program's user: %w", err)
		}
	}
	return ru, nil
}

// writePayload writes the job's payload to payload.json in the work
// directory (a temporary file when there is none), readable by the program
// alone.
func (r *Runner) writePayload(ru *run) error {
	payload := ru.job.Payload
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if ru.job.WorkDir == "" {
		f, err := os.CreateTemp("", "pgworker-payload-*.json")
		if err != nil {
			return fmt.Errorf("payload file: %w", err)
		}
		ru.removeFile = f.Name()
		ru.job.PayloadFile = f.Name()
		_, err = f.Write(payload)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && r.cred != nil {
			err = os.Chown(f.Name(), int(r.cred.Uid), int(r.cred.Gid))
		}
		if err != nil {
			return fmt.Errorf("payload file: %w", err)
		}
		return nil
	}
	ru.job.PayloadFile = filepath.Join(ru.job.WorkDir, PayloadFileName)
	// A fresh file: never through a link that an earlier run left there.
	if err := os.Remove(ru.job.PayloadFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("payload file: %w", err)
	}
	f, err := os.OpenFile(ru.job.PayloadFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("payload file: %w", err)
	}
	_, err = f.Write(payload)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("payload file: %w", err)
	}
	return nil
}

// start starts the program with its output on two pipes, and starts
// reading them.
func (r *Runner) start(ru *run) error {
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("stderr pipe: %w", err)
	}
	ru.cmd = &exec.Cmd{
		Path:   ru.path,
		Args:   ru.res.Argv,
		Env:    environ(r.cfg.Env, r.cfg.PassEnv, &ru.job, ru.token),
		Dir:    ru.job.WorkDir,
		Stdout: outW,
		Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid: true,
			// If the worker dies (kill -9), the program goes too. Its own
			// children are orphaned then; the lease makes the row run again.
			Pdeathsig:  syscall.SIGKILL,
			Credential: r.cred,
		},
	}
	ru.start = time.Now()
	err = startProgram(ru.cmd)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return startError(ru.path, err)
	}
	ru.res.Pid = ru.cmd.Process.Pid
	ru.log.Debug("backend started", "pid", ru.res.Pid, "argv", Join(ru.res.Argv))

	ru.outR, ru.errR = outR, errR
	ru.tail = newTailBuffer(r.cfg.StderrTailBytes)
	ru.budget = &logBudget{lines: r.cfg.LogLines, bytes: r.cfg.LogBytes}
	ru.streams.Add(2)
	go func() { defer ru.streams.Done(); r.stream(outR, "backend stdout", ru.log, ru.budget, nil) }()
	go func() { defer ru.streams.Done(); r.stream(errR, "backend stderr", ru.log, ru.budget, ru.tail) }()

	ru.exited = make(chan struct{})
	go func() {
		ru.waitErr = ru.cmd.Wait()
		programEnded(ru.res.Pid)
		close(ru.exited)
	}()
	return nil
}

// wait waits for the program to exit, or stops it when the timeout passes
// or ctx ends.
func (r *Runner) wait(ctx context.Context, ru *run) {
	var timeout <-chan time.Time
	if r.cfg.Timeout > 0 {
		t := time.NewTimer(r.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ru.exited:
	case <-timeout:
		ru.res.TimedOut = true
		ru.log.Warn("backend timed out: stopping its process group", "pid", ru.res.Pid, "timeout", r.cfg.Timeout)
		r.terminate(ru.cmd.Process, ru.exited)
	case <-ctx.Done():
		ru.res.Cancelled = true
		ru.log.Info("backend stopped: stopping its process group", "pid", ru.res.Pid, "cause", context.Cause(ctx))
		r.terminate(ru.cmd.Process, ru.exited)
	}
	ru.res.Duration = time.Since(ru.start)
}

// terminate sends SIGTERM to the process group, and SIGKILL when the
// program has not exited after the grace period. The program itself is
// signalled directly too, in case it moved to another process group.
func (r *Runner) terminate(p *os.Process, exited <-chan struct{}) {
	signal := func(sig syscall.Signal) {
		_ = syscall.Kill(-p.Pid, sig)
		_ = p.Signal(sig)
	}
	signal(syscall.SIGTERM)
	t := time.NewTimer(r.cfg.KillGrace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		signal(syscall.SIGKILL)
		<-exited
	}
}

// killLeftovers kills what the program left running: its process group,
// and, in a subreaper, whatever it left in other sessions.
func (r *Runner) killLeftovers(ru *run) {
	_ = syscall.Kill(-ru.res.Pid, syscall.SIGKILL)
	if subreaper.Load() {
		if n := sweepRun(ru.log, ru.res.Pid, ru.token); n > 0 {
			ru.log.Info("killed processes the backend left behind", "pid", ru.res.Pid, "processes", n)
		}
	}
}

// pipeGrace bounds the wait for the program's output pipes after its
// process group is gone: only processes that left the group (setsid) can
// still hold them open.
const pipeGrace = 2 * time.Second

// drain waits for the output to be read to its end, for at most pipeGrace,
// and logs what the log budget left out.
func (r *Runner) drain(ru *run) {
	drained := make(chan struct{})
	go func() { ru.streams.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(pipeGrace):
		ru.log.Warn("backend left processes outside its process group that keep its output open; no longer reading it", "pid", ru.res.Pid)
		ru.outR.Close()
		ru.errR.Close()
		<-drained
	}
	ru.outR.Close()
	ru.errR.Close()
	ru.budget.report(ru.log)
}

// classify fills in how the program ended and returns the error Run
// reports.
func (r *Runner) classify(ctx context.Context, ru *run) error {
	res := ru.res
	res.StderrTail, res.StderrTruncated = ru.tail.String()
	if ws, ok := ru.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = ws.Signal()
	} else {
		res.ExitCode = ru.cmd.ProcessState.ExitCode()
	}
	ru.log.Debug("backend exited", "pid", res.Pid, "exit_code", res.ExitCode, "signal", res.Signal, "duration", res.Duration)

	exitErr := &ExitError{Code: res.ExitCode, Signal: res.Signal, LastLine: lastLine(res.StderrTail)}
	switch {
	case res.TimedOut:
		return fmt.Errorf("%w after %s (%v)", ErrTimeout, r.cfg.Timeout, exitErr)
	case res.Cancelled:
		return fmt.Errorf("backend stopped (%v): %w", exitErr, context.Cause(ctx))
	case res.Signal != 0 || res.ExitCode != 0:
		return exitErr
	case ru.waitErr != nil:
		return fmt.Errorf("wait for backend: %w", ru.waitErr)
	}
	return nil
}

// stream logs rd line by line within budget; a line longer than
// MaxLineBytes is logged cut, with the number of bytes left out.
func (r *Runner) stream(rd io.Reader, msg string, log *slog.Logger, budget *logBudget, tail *tailBuffer) {
	if tail != nil {
		rd = io.TeeReader(rd, tail)
	}
	br := newLineReader(rd, r.cfg.MaxLineBytes)
	ctx := context.Background()
	for {
		line, cut, err := br.next()
		if (len(line) > 0 || cut > 0) && budget.take(len(line)) {
			if cut > 0 {
				log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("line", string(line)), slog.Int("cut_bytes", cut))
			} else {
				log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("line", string(line)))
			}
		}
		if err != nil {
			return
		}
	}
}

// logBudget bounds what one run may put in the log: lines and bytes of
// output, stdout and stderr together.
type logBudget struct {
	mu           sync.Mutex
	lines, bytes int // left; negative: none at all
	skipped      int
	skippedBytes int64
}

// take reports whether a line of n bytes may be logged, and counts it.
func (b *logBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.skipped == 0 && b.lines > 0 && n <= b.bytes {
		b.lines--
		b.bytes -= n
		return true
	}
	b.skipped++
	b.skippedBytes += int64(n)
	return false
}

// report logs one line saying how much output was left out, if any.
func (b *logBudget) report(log *slog.Logger) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.skipped > 0 {
		log.Warn(fmt.Sprintf("backend output: %d more lines not logged", b.skipped),
			"lines_not_logged", b.skipped, "bytes_not_logged", b.skippedBytes,
			"hint", "the row's log budget is spent (--row-log-lines, --row-log-bytes); the stderr tail is kept with the attempt")
	}
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
