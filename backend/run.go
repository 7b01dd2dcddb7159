package backend

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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
	// ErrArgTooLong means the kernel refused to start the program because
	// an argument, or the arguments and environment together, exceed its
	// limits (E2BIG). The same row would fail the same way: see Permanent.
	ErrArgTooLong = errors.New("argument list too long")
)

// Permanent reports whether err means that running the same command again
// cannot succeed (ErrNotFound, ErrNotExecutable, ErrArgTooLong), so the row
// should fail without retries.
func Permanent(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotExecutable) || errors.Is(err, ErrArgTooLong)
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
	// PayloadFile is the file that holds Payload. Run sets it in its own
	// copy of the job: it writes PayloadFileName in WorkDir (a temporary
	// file when WorkDir is empty), mode 0600.
	PayloadFile string
}

// PayloadFileName is the name of the file in the work directory that holds
// the row's payload ({payload_file}, PGWORKER_PAYLOAD_FILE).
const PayloadFileName = "payload.json"

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
	// LogLines and LogBytes are the log budget of one run: how many lines
	// of output (stdout and stderr together), and how many bytes of them,
	// are logged; past either bound one line says how many more were not.
	// A negative value logs none. Default to 1000 lines and 1 MiB.
	LogLines, LogBytes int
	// RunAs is the user the program runs as: a user name or uid, optionally
	// followed by :GROUP (a group name or gid; needed for a uid without a
	// passwd entry). The worker must then run as root; Run hands the job's
	// work directory tree to that user before starting the program. Empty:
	// the worker's own user. Defaults to "".
	RunAs string
}

// Runner runs the program for jobs. It is safe for concurrent use: slots
// share one Runner.
type Runner struct {
	cfg     Config
	tmpl    *Template
	program string              // resolved path of the program word, "" when it has placeholders
	path    string              // PATH of cfg.Env
	cred    *syscall.Credential // RunAs; nil for the worker's own user
}

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
	if c.LogLines == 0 {
		c.LogLines = 1000
	}
	if c.LogBytes == 0 {
		c.LogBytes = 1 << 20
	}
	tmpl, err := Parse(c.Command)
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, tmpl: tmpl, path: lookupEnv(c.Env, "PATH")}
	if c.RunAs != "" {
		if r.cred, err = lookupUser(c.RunAs); err != nil {
			return nil, err
		}
	}
	if p := tmpl.Program(); p != "" {
		if r.program, err = resolve(p, r.path); err != nil {
			return nil, err
		}
		if r.cred != nil {
			if err := checkAccess(r.program, 0o1, r.cred); err != nil {
				return nil, fmt.Errorf("%w: %s cannot be run by user %s: %v", ErrNotExecutable, r.program, c.RunAs, err)
			}
		}
	}
	return r, nil
}

// CheckWorkDir reports whether the program's user (Config.RunAs) can reach
// dir, the directory under which the jobs' work directories are made: it
// must be able to search dir and every directory above it. It returns nil
// without RunAs.
func (r *Runner) CheckWorkDir(dir string) error {
	if r.cred == nil {
		return nil
	}
	if err := checkAccess(dir, 0o1, r.cred); err != nil {
		return fmt.Errorf("user %s cannot reach the work directory %s: %w (let other users search it, chmod o+x, or choose another one)", r.cfg.RunAs, dir, err)
	}
	return nil
}

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
	case syscall.E2BIG:
		return fmt.Errorf("%w: start %s: an argument or the environment exceeds the kernel's limit (128 KiB per string): "+
			"pass large values in files, for example the payload through {payload_file}", ErrArgTooLong, path)
	}
	return fmt.Errorf("start %s: %w", path, err)
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
