package backend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the backend program: with BACKEND_TEST_HELPER
// set it runs helper(os.Args[1:]) instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("BACKEND_TEST_HELPER") != "" {
		os.Exit(helper(os.Args[1:]))
	}
	if os.Getenv("BACKEND_TEST_WORKER") != "" {
		os.Exit(probeWorker(os.Args[1:]))
	}
	// As in pgworker: what programs leave behind comes back to this process.
	if err := BecomeSubreaper(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

func helper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no mode")
		return 100
	}
	writeJSON := func(name string, v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(name, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(101)
		}
	}
	switch args[0] {
	case "exit": // exit CODE [STDERR-MESSAGE]
		if len(args) > 2 {
			fmt.Fprintln(os.Stderr, args[2])
		}
		code, _ := strconv.Atoi(args[1])
		return code
	case "args": // writes its arguments to args.json in the working directory
		writeJSON("args.json", args[1:])
		return 0
	case "env": // writes its environment to env.json
		writeJSON("env.json", os.Environ())
		return 0
	case "pwd":
		wd, _ := os.Getwd()
		writeJSON("pwd.json", wd)
		return 0
	case "stderr": // stderr N: writes N numbered lines to stderr
		n, _ := strconv.Atoi(args[1])
		w := bufio.NewWriter(os.Stderr)
		for i := range n {
			fmt.Fprintf(w, "line %07d\n", i)
		}
		w.Flush()
		return 0
	case "print": // print LINES... to stdout, the last one without a newline
		for i, l := range args[1:] {
			if i == len(args)-2 {
				fmt.Print(l)
			} else {
				fmt.Println(l)
			}
		}
		return 0
	case "kill": // kill SIGNUM: killed by a signal
		n, _ := strconv.Atoi(args[1])
		syscall.Kill(os.Getpid(), syscall.Signal(n))
		time.Sleep(time.Hour)
		return 0
	case "hang": // hang [ignore-term]
		if len(args) > 1 && args[1] == "ignore-term" {
			signal.Ignore(syscall.SIGTERM)
		}
		fmt.Println("ready")
		time.Sleep(time.Hour)
		return 0
	case "orphan": // runs "spawn escape" to its end, leaving an orphan in a session of its own, then hangs
		self, _ := os.Executable()
		c := exec.Command(self, "spawn", "escape")
		c.Stdout, c.Stderr = os.Stderr, os.Stderr // files: Run does not wait for the orphan to close them
		if err := c.Run(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 104
		}
		fmt.Println("spawned")
		time.Sleep(time.Hour)
		return 0
	case "spawn": // spawn MODE [ignore-term]: starts "hang" as a child, writes its pid to child.pid, then MODE
		if len(args) > 2 && args[2] == "ignore-term" {
			signal.Ignore(syscall.SIGTERM)
		}
		self, _ := os.Executable()
		child := exec.Command(self, "hang")
		if len(args) > 2 {
			child.Args = append(child.Args, args[2])
		}
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		switch args[1] {
		case "escape", "escape-hang":
			child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		case "escape-noenv": // a new session and no trace of the run
			child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			child.Env = []string{"BACKEND_TEST_HELPER=1", "GORACE=atexit_sleep_ms=0"}
		}
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 102
		}
		writeJSON("child.pid", child.Process.Pid)
		if args[1] == "hang" || args[1] == "escape-hang" {
			fmt.Println("spawned")
			time.Sleep(time.Hour)
		}
		return 0
	case "payload": // writes what it got of the payload to payload.json
		b, err := os.ReadFile(os.Getenv("PGWORKER_PAYLOAD_FILE"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 103
		}
		fi, _ := os.Stat(os.Getenv("PGWORKER_PAYLOAD_FILE"))
		env, inEnv := os.LookupEnv("PGWORKER_PAYLOAD")
		writeJSON("payload-seen.json", map[string]any{
			"file": string(b), "mode": fi.Mode().Perm().String(), "env": env, "in_env": inEnv,
			"path": os.Getenv("PGWORKER_PAYLOAD_FILE"), "args": args[1:],
		})
		return 0
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", args[0])
	return 100
}

// helperCommand is a command line that runs the test binary as helper.
func helperCommand(t *testing.T, args ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Join([]string{self}) + " " + strings.Join(args, " ")
}

func helperEnv(extra ...string) []string {
	// A -race binary sleeps a second at exit unless told not to.
	return append([]string{"PATH=" + os.Getenv("PATH"), "BACKEND_TEST_HELPER=1", "GORACE=atexit_sleep_ms=0"}, extra...)
}

// lines is a slog handler that keeps the backend's output lines and signals
// each one on a channel.
type lines struct {
	mu      sync.Mutex
	records []map[string]any
	seen    chan string
}

func newLines() *lines { return &lines{seen: make(chan string, 1000)} }

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &withAttrs{l: l, attrs: attrs}
}
func (l *lines) WithGroup(string) slog.Handler                 { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error { return l.handle(r, nil) }
func (l *lines) handle(r slog.Record, attrs []slog.Attr) error {
	m := map[string]any{"msg": r.Message, "level": r.Level.String()}
	for _, a := range attrs {
		m[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
	l.mu.Lock()
	l.records = append(l.records, m)
	l.mu.Unlock()
	if line, ok := m["line"].(string); ok {
		select {
		case l.seen <- line:
		default:
		}
	}
	return nil
}

func (l *lines) output(stream string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, r := range l.records {
		if r["msg"] == "backend "+stream {
			out = append(out, r)
		}
	}
	return out
}

// waitLine waits until the program has written line, and reports whether
// it did.
func (l *lines) waitLine(line string) bool {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case got := <-l.seen:
			if got == line {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

type withAttrs struct {
	l     *lines
	attrs []slog.Attr
}

func (w *withAttrs) Enabled(context.Context, slog.Level) bool { return true }
func (w *withAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &withAttrs{l: w.l, attrs: append(slices.Clone(w.attrs), attrs...)}
}
func (w *withAttrs) WithGroup(string) slog.Handler                 { return w }
func (w *withAttrs) Handle(_ context.Context, r slog.Record) error { return w.l.handle(r, w.attrs) }

func newRunner(t *testing.T, cfg Config) *Runner {
	t.Helper()
	if cfg.Env == nil {
		cfg.Env = helperEnv()
	}
	r, err := New(&cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", cfg.Command, err)
	}
	return r
}

func newJob(t *testing.T) *Job {
	t.Helper()
	dir := t.TempDir()
	return &Job{ID: 7, Queue: "q", Source: "src", Attempt: 1, WorkDir: dir, OutputDir: filepath.Join(dir, "out"), Input: filepath.Join(dir, "in")}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// waitGone fails the test unless process pid exits within a generous bound.
// It waits on a pidfd, which becomes readable when the process exits.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 30_000)
	if err != nil {
		t.Fatalf("poll pidfd: %v", err)
	}
	if n == 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("process %d is still running", pid)
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, 1, 3, 127, 255} {
		r := newRunner(t, Config{Command: helperCommand(t, "exit", strconv.Itoa(code), "'it went wrong: code "+strconv.Itoa(code)+"'")})
		res, err := r.Run(context.Background(), newJob(t))
		if res.ExitCode != code || res.Signal != 0 || res.TimedOut || res.Cancelled || res.Pid == 0 {
			t.Errorf("exit %d: result %+v", code, res)
		}
		if code == 0 {
			if err != nil {
				t.Errorf("exit 0: error %v", err)
			}
			continue
		}
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != code || Permanent(err) {
			t.Errorf("exit %d: error %#v", code, err)
		}
		if want := fmt.Sprintf("exit status %d: it went wrong: code %d", code, code); err.Error() != want {
			t.Errorf("exit %d: error %q, want %q", code, err, want)
		}
	}
}

func TestRunSignals(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGUSR1, syscall.SIGTERM} {
		// A shell kills itself: the signal arrives from outside, as in real crashes.
		r := newRunner(t, Config{Command: fmt.Sprintf(`/bin/sh -c 'kill -%d $$'`, sig)})
		res, err := r.Run(context.Background(), newJob(t))
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Signal != sig || res.Signal != sig || res.ExitCode != -1 {
			t.Errorf("signal %v: result %+v, error %v", sig, res, err)
			continue
		}
		if !strings.Contains(err.Error(), "killed by signal "+unix.SignalName(sig)) {
			t.Errorf("signal %v: error %q", sig, err)
		}
	}
}

func TestRunTimeoutKillsProcessGroup(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"term", "ignore-term"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			args := []string{"spawn", "hang"}
			if mode == "ignore-term" {
				args = append(args, "ignore-term")
			}
			r := newRunner(t, Config{Command: helperCommand(t, args...), Timeout: 2 * time.Second, KillGrace: 500 * time.Millisecond})
			job := newJob(t)
			res, err := r.Run(context.Background(), job)
			if !errors.Is(err, ErrTimeout) || !res.TimedOut || res.Cancelled {
				t.Fatalf("error %v, result %+v; want a timeout", err, res)
			}
			want := syscall.SIGTERM
			if mode == "ignore-term" {
				want = syscall.SIGKILL
			}
			if res.Signal != want {
				t.Errorf("killed by %v, want %v", res.Signal, want)
			}
			var child int
			readJSON(t, filepath.Join(job.WorkDir, "child.pid"), &child)
			waitGone(t, child)
		})
	}
}

func TestRunCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	out := newLines()
	r := newRunner(t, Config{Command: helperCommand(t, "spawn", "hang", "ignore-term"), KillGrace: 200 * time.Millisecond, Logger: slog.New(out)})
	job := newJob(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	errLeaseLost := errors.New("lease lost")
	go func() {
		if !out.waitLine("spawned") {
			t.Error("the program never wrote spawned")
		}
		cancel(errLeaseLost)
	}()
	res, err := r.Run(ctx, job)
	if !errors.Is(err, errLeaseLost) || !res.Cancelled || res.Signal != syscall.SIGKILL {
		t.Fatalf("error %v, result %+v; want a cancelled run killed by SIGKILL", err, res)
	}
	var child int
	readJSON(t, filepath.Join(job.WorkDir, "child.pid"), &child)
	waitGone(t, child)

	// Cancelled before it starts: nothing runs.
	res, err = r.Run(ctx, newJob(t))
	if !errors.Is(err, errLeaseLost) || res.Pid != 0 {
		t.Errorf("run on a cancelled context: pid %d, error %v", res.Pid, err)
	}
}

func TestRunKillsLeftoverChildren(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{Command: helperCommand(t, "spawn", "exit")})
	job := newJob(t)
	if _, err := r.Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	var child int
	readJSON(t, filepath.Join(job.WorkDir, "child.pid"), &child)
	waitGone(t, child)
}

// TestRunProcessOutsideGroupDoesNotBlock: a process that left the group
// and cleared its environment cannot be told apart from the run; it keeps
// the output pipes open, and Run still ends.
func TestRunProcessOutsideGroupDoesNotBlock(t *testing.T) {
	t.Parallel()
	out := newLines()
	r := newRunner(t, Config{Command: helperCommand(t, "spawn", "escape-noenv"), Logger: slog.New(out)})
	job := newJob(t)
	_, err := r.Run(context.Background(), job)
	var child int
	readJSON(t, filepath.Join(job.WorkDir, "child.pid"), &child)
	syscall.Kill(child, syscall.SIGKILL) // it left the group: the test cleans up
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, child)
}

func TestRunStderrTail(t *testing.T) {
	t.Parallel()
	var want bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&want, "line %07d\n", i)
	}
	tests := []struct {
		lines, tailBytes int
		truncated        bool
	}{
		{20000, 64 << 10, true}, // 260,000 bytes: the last 64 KiB
		{100, 64 << 10, false},
		{20000, 1000, true},
	}
	for _, tt := range tests {
		r := newRunner(t, Config{Command: helperCommand(t, "stderr", strconv.Itoa(tt.lines)), StderrTailBytes: tt.tailBytes})
		res, err := r.Run(context.Background(), newJob(t))
		if err != nil {
			t.Fatal(err)
		}
		all := want.Bytes()[:tt.lines*13]
		expect := all
		if len(all) > tt.tailBytes {
			expect = all[len(all)-tt.tailBytes:]
		}
		if res.StderrTail != string(expect) || res.StderrTruncated != tt.truncated {
			t.Errorf("%d lines, tail %d: got %d bytes (truncated %v) ending %q; want %d bytes (truncated %v)",
				tt.lines, tt.tailBytes, len(res.StderrTail), res.StderrTruncated, res.StderrTail[max(0, len(res.StderrTail)-20):], len(expect), tt.truncated)
		}
	}
}

func TestTailBufferText(t *testing.T) {
	t.Parallel()
	tb := newTailBuffer(4)
	for _, p := range []string{"xx", "ab\x00", "é\xff", "cd"} {
		tb.Write([]byte(p))
	}
	// The last 4 bytes start in the middle of é (2 bytes).
	got, truncated := tb.String()
	if want := "\uFFFDcd"; got != want || !truncated {
		t.Errorf("tail = %q (truncated %v), want %q", got, truncated, want)
	}
	tb = newTailBuffer(6)
	for _, p := range []string{"xx", "ab\x00", "é\xff", "cd"} {
		tb.Write([]byte(p))
	}
	if got, _ := tb.String(); got != "\uFFFDé\uFFFDcd" {
		t.Errorf("tail = %q", got)
	}
	tb = newTailBuffer(8)
	tb.Write([]byte("a\x00b"))
	if got, truncated := tb.String(); got != "a\uFFFDb" || truncated {
		t.Errorf("tail = %q (truncated %v)", got, truncated)
	}
}

func TestRunLogsOutputLines(t *testing.T) {
	t.Parallel()
	out := newLines()
	long := strings.Repeat("x", 5000)
	r := newRunner(t, Config{
		Command:      helperCommand(t, "print", "hello", "'two words'", "''", long, "'no newline'"),
		Logger:       slog.New(out),
		MaxLineBytes: 1024,
	})
	if _, err := r.Run(context.Background(), newJob(t)); err != nil {
		t.Fatal(err)
	}
	got := out.output("stdout")
	var text []string
	for _, rec := range got {
		text = append(text, rec["line"].(string))
		if rec["id"] != int64(7) || rec["attempt"] != int64(1) {
			t.Errorf("record %v lacks id=7 attempt=1", rec)
		}
	}
	want := []string{"hello", "two words", long[:1024], "no newline"}
	if !reflect.DeepEqual(text, want) {
		t.Errorf("stdout lines = %.60q, want %.60q", text, want)
	}
	if len(got) == 4 && got[2]["cut_bytes"] != int64(5000-1024) {
		t.Errorf("long line: cut_bytes = %v, want %d", got[2]["cut_bytes"], 5000-1024)
	}
}

func TestRunEnvironment(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{
		Command: helperCommand(t, "env"),
		Env: helperEnv(
			"HOME=/home/worker", "FOO=bar", "LANG=C.UTF-8",
			"DATABASE_URL=postgres://app:secret@db/q", "PGWORKER_DATABASE_URL=postgres://app:secret@db/q",
			"PGPASSWORD=secret", "AWS_SECRET_ACCESS_KEY=secret", "AWS_ACCESS_KEY_ID=AKIA", "AWS_SESSION_TOKEN=secret",
			"MINIO_ROOT_PASSWORD=secret", "PGWORKER_SLOTS=4", "PGWORKER_ID=999", "MY_TOKEN=passed",
		),
		PassEnv: []string{"AWS_ACCESS_KEY_ID"},
	})
	job := newJob(t)
	job.ID, job.Source, job.Attempt, job.Queue, job.WorkerID = 12, "a b;$(x)", 2, "images", "node:1:0"
	job.Payload = json.RawMessage(`{"size":3}`)
	if _, err := r.Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	var envList []string
	readJSON(t, filepath.Join(job.WorkDir, "env.json"), &envList)
	env := map[string]string{}
	for _, kv := range envList {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := env[k]; dup {
			t.Errorf("%s is set twice", k)
		}
		env[k] = v
	}
	want := map[string]string{
		"PGWORKER_ID": "12", "PGWORKER_SOURCE": "a b;$(x)", "PGWORKER_ATTEMPT": "2", "PGWORKER_QUEUE": "images",
		"PGWORKER_PAYLOAD": `{"size":3}`, "PGWORKER_INPUT": job.Input, "PGWORKER_OUTPUT_DIR": job.OutputDir,
		"PGWORKER_WORK_DIR": job.WorkDir, "PGWORKER_WORKER_ID": "node:1:0",
		"HOME": "/home/worker", "FOO": "bar", "LANG": "C.UTF-8", "MY_TOKEN": "passed", "AWS_ACCESS_KEY_ID": "AKIA",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for _, k := range []string{"DATABASE_URL", "PGWORKER_DATABASE_URL", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "MINIO_ROOT_PASSWORD", "PGWORKER_SLOTS"} {
		if v, ok := env[k]; ok {
			t.Errorf("%s leaked to the program: %q", k, v)
		}
	}
	for _, kv := range envList {
		if strings.Contains(kv, "secret") {
			t.Errorf("a secret leaked: %s", kv)
		}
	}
}

func TestRunHostileSources(t *testing.T) {
	t.Parallel()
	sources := []string{
		"; rm -rf /",
		"$(touch pwned)",
		"`touch pwned`",
		"a b  c",
		`'"\`,
		"x\ny",
		"-rf",
		"--exec=touch pwned",
		"{input}",
		"*",
		"$HOME",
		"&& touch pwned &",
		"| touch pwned",
		"> pwned",
	}
	r := newRunner(t, Config{Command: helperCommand(t, "args", "{source}", "'pre {source} post'", "{input}")})
	for _, src := range sources {
		job := newJob(t)
		job.Source = src
		if _, err := r.Run(context.Background(), job); err != nil {
			t.Fatalf("source %q: %v", src, err)
		}
		var args []string
		readJSON(t, filepath.Join(job.WorkDir, "args.json"), &args)
		if want := []string{src, "pre " + src + " post", job.Input}; !reflect.DeepEqual(args, want) {
			t.Errorf("source %q: argv %q, want %q", src, args, want)
		}
		if _, err := os.Stat(filepath.Join(job.WorkDir, "pwned")); err == nil {
			t.Errorf("source %q ran a command", src)
		}
	}
}

func TestRunWorkDir(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{Command: helperCommand(t, "pwd")})
	job := newJob(t)
	if _, err := r.Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	var wd string
	readJSON(t, filepath.Join(job.WorkDir, "pwd.json"), &wd)
	if wd != job.WorkDir {
		t.Errorf("working directory %q, want %q", wd, job.WorkDir)
	}
	job.WorkDir = filepath.Join(job.WorkDir, "missing")
	if _, err := r.Run(context.Background(), job); err == nil || Permanent(err) {
		t.Errorf("missing work directory: error %v", err)
	}
}

func TestProgramNotRunnable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noExec := write("no-exec", "#!/bin/sh\n", 0o644)
	noShebang := write("no-shebang", "echo hi\n", 0o755)
	badInterp := write("bad-interp", "#!/nonexistent/interpreter\n", 0o755)
	env := []string{"PATH=/usr/bin:/bin:" + dir}

	// Found at startup by New.
	for _, tt := range []struct {
		cmd  string
		want error
	}{
		{"/nonexistent/prog {input}", ErrNotFound},
		{"no-such-program-anywhere", ErrNotFound},
		{Join([]string{noExec}), ErrNotExecutable},
		{"no-exec", ErrNotExecutable}, // found through PATH, not executable
		{Join([]string{dir}), ErrNotExecutable},
	} {
		_, err := New(&Config{Command: tt.cmd, Env: env})
		if !errors.Is(err, tt.want) || !Permanent(err) {
			t.Errorf("New(%q) error = %v, want %v", tt.cmd, err, tt.want)
		}
	}

	// Found when the program starts.
	for _, tt := range []struct {
		source string
		want   error
	}{
		{"/nonexistent/prog", ErrNotFound},
		{noExec, ErrNotExecutable},
		{noShebang, ErrNotExecutable},
		{badInterp, ErrNotFound},
	} {
		r := newRunner(t, Config{Command: "{source}", Env: env})
		job := newJob(t)
		job.Source = tt.source
		res, err := r.Run(context.Background(), job)
		if !errors.Is(err, tt.want) || !Permanent(err) || res.Pid != 0 {
			t.Errorf("program %s: error %v (pid %d), want %v", tt.source, err, res.Pid, tt.want)
		}
	}

	if _, err := New(&Config{Command: "prog 'unterminated"}); err == nil || Permanent(err) {
		t.Errorf("syntax error: %v", err)
	}
}

func TestRunRelativeProgram(t *testing.T) {
	// A relative program path is taken from the worker's directory, not the
	// work directory.
	r := newRunner(t, Config{Command: "./testdata/args.sh {source}"})
	job := newJob(t)
	job.Source = "one arg"
	if _, err := r.Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(job.WorkDir, "args.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "[one arg]\n" {
		t.Errorf("args.txt = %q", b)
	}
}
