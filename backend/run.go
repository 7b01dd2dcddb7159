package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var (
	// ErrNotFound means the program does not exist (or, for a script, its #!
	// interpreter does not). Retrying will not help: see Permanent.
	ErrNotFound = errors.New("program not found")
	// ErrNotExecutable means the program exists but cannot be executed: no
	// execute permission, a directory, a noexec mount, or a file that is
	// neither a binary for this machine nor a script with a #! line.
	ErrNotExecutable = errors.New("program not executable")
	// ErrTimeout means the program ran past Config.Timeout and its process
	// group was killed.
	ErrTimeout = errors.New("backend timed out")
)

// Permanent reports whether err means that running the same command again
// cannot succeed (ErrNotFound, ErrNotExecutable), so the row should fail
// without retries.
func Permanent(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotExecutable)
}

// ExitError reports a program that exited with a non-zero status or was
// killed by a signal.
type ExitError struct {
	// Code is the exit status, or -1 when the program was killed by a signal.
	Code int
	// Signal is the signal that killed the program, 0 if none did.
	Signal syscall.Signal
	// LastLine is the last non-blank line the program wrote to stderr
	// (shortened), which often says what went wrong.
	LastLine string
}

func (e *ExitError) Error() string {
	var msg string
	if e.Signal != 0 {
		msg = "killed by signal " + signalName(e.Signal)
	} else {
		msg = fmt.Sprintf("exit status %d", e.Code)
	}
	if e.LastLine != "" {
		msg += ": " + e.LastLine
	}
	return msg
}

func signalName(s syscall.Signal) string {
	if name := unix.SignalName(s); name != "" {
		return name
	}
	return s.String()
}

// Job is one attempt at a row, as the program sees it: through the
// placeholders of the command (see Placeholders) and the PGWORKER_*
// environment variables (see JobEnv).
type Job struct {
	ID       int64
	Queue    string
	Source   string
	Attempt  int
	Payload  json.RawMessage // the row's payload; "{}" when empty
	WorkerID string

	// Input is the path of the downloaded input file.
	Input string
	// OutputDir is the directory the program writes its outputs to.
	OutputDir string
	// WorkDir becomes the program's working directory. Empty: the worker
	// process's own working directory.
	WorkDir string
}

// Result describes how a run ended.
type Result struct {
	// Argv is the expanded command.
	Argv []string
	// Pid is the program's process id (and process group id); 0 when it did
	// not start.
	Pid int
	// ExitCode is the exit status; -1 when the program was killed by a
	// signal or did not start.
	ExitCode int
	// Signal is the signal that killed the program, 0 if none did.
	Signal syscall.Signal
	// Duration runs from the start of the program to its exit.
	Duration time.Duration
	// TimedOut is true when the program ran past Config.Timeout.
	TimedOut bool
	// Cancelled is true when the context ended the run.
	Cancelled bool
	// StderrTail holds the last Config.StderrTailBytes bytes of standard
	// error, made valid UTF-8 without NUL bytes so that it can be stored in a
	// text column.
	StderrTail string
	// StderrTruncated is true when StderrTail lacks the beginning of stderr.
	StderrTruncated bool
}

// Config configures a Runner. Only Command is required.
type Config struct {
	// Command is the command line, with placeholders (see Parse).
	Command string
	// Timeout bounds each run; past it the process group is killed and Run
	// returns ErrTimeout. Zero means no limit. Defaults to 0.
	Timeout time.Duration
	// KillGrace is how long the process group has to exit between SIGTERM
	// and SIGKILL, on timeout or cancellation. Defaults to 10s.
	KillGrace time.Duration
	// Logger receives the program's output, one record per line, with the
	// row id. Defaults to discarding it.
	Logger *slog.Logger
	// Env is the environment to start from, as NAME=value strings; the
	// variables named at SecretEnv are removed from it. Defaults to
	// os.Environ() at the time of New.
	Env []string
	// PassEnv names variables to hand to the program even though the policy
	// at SecretEnv would remove them. Defaults to none.
	PassEnv []string
	// MaxLineBytes bounds a logged line; the rest of a longer line is left
	// out of the log (it stays in StderrTail). Defaults to 8 KiB.
	MaxLineBytes int
	// StderrTailBytes is how much of the end of stderr Result.StderrTail
	// keeps. Defaults to 64 KiB.
	StderrTailBytes int
}

// Runner runs the program for jobs. It is safe for concurrent use: slots
// share one Runner.
type Runner struct {
	cfg     Config
	tmpl    *Template
	program string // resolved path of the program word, "" when it has placeholders
	path    string // PATH of cfg.Env
}

// pipeGrace bounds the wait for the program's output pipes after its
// process group is gone: only processes that left the group (setsid) can
// still hold them open.
const pipeGrace = 2 * time.Second

// New parses the command and, unless the program word holds a placeholder,
// finds the program (in PATH when it has no slash; a relative path is taken
// from the current directory), so that a missing or non-executable program
// is reported at startup.
func New(cfg *Config) (*Runner, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.KillGrace <= 0 {
		c.KillGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.MaxLineBytes <= 0 {
		c.MaxLineBytes = 8 << 10
	}
	if c.StderrTailBytes <= 0 {
		c.StderrTailBytes = 64 << 10
	}
	tmpl, err := Parse(c.Command)
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, tmpl: tmpl, path: lookupEnv(c.Env, "PATH")}
	if p := tmpl.Program(); p != "" {
		if r.program, err = resolve(p, r.path); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Template returns the parsed command.
func (r *Runner) Template() *Template { return r.tmpl }

// Program returns the resolved path of the program, or "" when the program
// word holds a placeholder.
func (r *Runner) Program() string { return r.program }

func lookupEnv(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v
		}
	}
	return ""
}

// resolve finds the program the way execvp does, minus the relative PATH
// entries (".", ""), which would make the program depend on the work
// directory.
func resolve(prog, pathEnv string) (string, error) {
	if prog == "" {
		return "", fmt.Errorf("%w: the program name is empty", ErrNotFound)
	}
	if strings.Contains(prog, "/") {
		abs, err := filepath.Abs(prog)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrNotFound, prog, err)
		}
		return abs, checkExecutable(abs)
	}
	var firstErr error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, prog)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if firstErr == nil && !errors.Is(err, ErrNotFound) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("%w: %q is not in PATH (give its full path, or fix PATH)", ErrNotFound, prog)
}

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist", ErrNotFound, path)
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrNotExecutable, path, err)
	case fi.IsDir():
		return fmt.Errorf("%w: %s is a directory", ErrNotExecutable, path)
	}
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("%w: %s has no execute permission (chmod +x it, or check the mount's noexec option)", ErrNotExecutable, path)
	}
	return nil
}

// startError turns an exec failure into ErrNotFound or ErrNotExecutable
// where the errno says so.
func startError(path string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("start %s: %w", path, err)
	}
	switch errno {
	case syscall.ENOENT:
		return fmt.Errorf("%w: %s (or the interpreter on its #! line) does not exist", ErrNotFound, path)
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%w: %s: permission denied", ErrNotExecutable, path)
	case syscall.ENOEXEC:
		return fmt.Errorf("%w: %s: exec format error (not a binary for this machine, or a script without a #! line)", ErrNotExecutable, path)
	case syscall.EISDIR:
		return fmt.Errorf("%w: %s is a directory", ErrNotExecutable, path)
	}
	return fmt.Errorf("start %s: %w", path, err)
}

// Run runs the program for job and waits for it to end. It returns a nil
// error only when the program exited with status 0. Otherwise the error is
// a *ExitError, wraps ErrTimeout or the context's cause, or wraps
// ErrNotFound or ErrNotExecutable (then Result.Pid is 0).
//
// The program runs without a shell, in its own process group, with stdin
// from /dev/null, in job.WorkDir. Its stdout and stderr go to the logger
// line by line. When ctx ends or the timeout passes, the whole group gets
// SIGTERM, then SIGKILL after Config.KillGrace; when the program exits,
// whatever it left running in its group is killed. Processes that leave the
// group (setsid, double fork into a new session) escape this.
func (r *Runner) Run(ctx context.Context, job *Job) (*Result, error) {
	argv := r.tmpl.Expand(job)
	res := &Result{Argv: argv, ExitCode: -1}
	path := r.program
	if path == "" {
		var err error
		if path, err = resolve(argv[0], r.path); err != nil {
			return res, err
		}
	}
	if job.WorkDir != "" {
		if fi, err := os.Stat(job.WorkDir); err != nil || !fi.IsDir() {
			return res, fmt.Errorf("work directory %s is not a directory: %v", job.WorkDir, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("backend not started: %w", context.Cause(ctx))
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return res, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return res, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   argv,
		Env:    environ(r.cfg.Env, r.cfg.PassEnv, job),
		Dir:    job.WorkDir,
		Stdout: outW,
		Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid: true,
			// If the worker dies (kill -9), the program goes too. Its own
			// children are orphaned then; the lease makes the row run again.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	log := r.cfg.Logger.With(slog.Int64("id", job.ID), slog.Int("attempt", job.Attempt))
	start := time.Now()
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return res, startError(path, err)
	}
	res.Pid = cmd.Process.Pid
	log.Debug("backend started", "pid", res.Pid, "argv", Join(argv))

	tail := newTailBuffer(r.cfg.StderrTailBytes)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.stream(outR, "backend stdout", log, nil) }()
	go func() { defer wg.Done(); r.stream(errR, "backend stderr", log, tail) }()

	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()

	var timeout <-chan time.Time
	if r.cfg.Timeout > 0 {
		t := time.NewTimer(r.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-exited:
	case <-timeout:
		res.TimedOut = true
		log.Warn("backend timed out: stopping its process group", "pid", res.Pid, "timeout", r.cfg.Timeout)
		r.terminate(cmd.Process, exited)
	case <-ctx.Done():
		res.Cancelled = true
		log.Info("backend stopped: stopping its process group", "pid", res.Pid, "cause", context.Cause(ctx))
		r.terminate(cmd.Process, exited)
	}
	res.Duration = time.Since(start)
	// The program is gone; what it left running in its group goes too.
	_ = syscall.Kill(-res.Pid, syscall.SIGKILL)

	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(pipeGrace):
		log.Warn("backend left processes outside its process group that keep its output open; no longer reading it", "pid", res.Pid)
		outR.Close()
		errR.Close()
		<-drained
	}
	outR.Close()
	errR.Close()

	res.StderrTail, res.StderrTruncated = tail.String()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = ws.Signal()
	} else {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	log.Debug("backend exited", "pid", res.Pid, "exit_code", res.ExitCode, "signal", res.Signal, "duration", res.Duration)

	exitErr := &ExitError{Code: res.ExitCode, Signal: res.Signal, LastLine: lastLine(res.StderrTail)}
	switch {
	case res.TimedOut:
		return res, fmt.Errorf("%w after %s (%v)", ErrTimeout, r.cfg.Timeout, exitErr)
	case res.Cancelled:
		return res, fmt.Errorf("backend stopped (%v): %w", exitErr, context.Cause(ctx))
	case res.Signal != 0 || res.ExitCode != 0:
		return res, exitErr
	case waitErr != nil:
		return res, fmt.Errorf("wait for backend: %w", waitErr)
	}
	return res, nil
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

// stream logs rd line by line; a line longer than MaxLineBytes is logged
// cut, with the number of bytes left out.
func (r *Runner) stream(rd io.Reader, msg string, log *slog.Logger, tail *tailBuffer) {
	if tail != nil {
		rd = io.TeeReader(rd, tail)
	}
	br := newLineReader(rd, r.cfg.MaxLineBytes)
	ctx := context.Background()
	for {
		line, cut, err := br.next()
		if len(line) > 0 || cut > 0 {
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

func lastLine(s string) string {
	s = strings.TrimRight(s, " \t\r\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSpace(s)
	const max = 200
	if len(s) > max {
		cut := max
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
