package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunLogBudget(t *testing.T) {
	t.Parallel()
	// Each line of "stderr N" is "line 0000000": 12 bytes.
	tests := []struct {
		name              string
		lines, bytes      int
		written, wantLogs int
	}{
		{"lines", 100, 1 << 20, 5000, 100},
		{"bytes", 1000, 12 * 10, 5000, 10},
		{"none", -1, -1, 50, 0},
		{"within", 100, 1 << 20, 30, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := newLines()
			r := newRunner(t, Config{Command: helperCommand(t, "stderr", strconv.Itoa(tt.written)), Logger: slog.New(out),
				LogLines: tt.lines, LogBytes: tt.bytes})
			res, err := r.Run(context.Background(), newJob(t))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(out.output("stderr")); got != tt.wantLogs {
				t.Errorf("%d stderr lines logged, want %d", got, tt.wantLogs)
			}
			var summaries []string
			out.mu.Lock()
			for _, rec := range out.records {
				if msg := rec["msg"].(string); strings.Contains(msg, "not logged") {
					summaries = append(summaries, msg)
				}
			}
			out.mu.Unlock()
			want := []string(nil)
			if n := tt.written - tt.wantLogs; n > 0 {
				want = []string{fmt.Sprintf("backend output: %d more lines not logged", n)}
			}
			if fmt.Sprint(summaries) != fmt.Sprint(want) {
				t.Errorf("summary lines %q, want %q", summaries, want)
			}
			if !strings.HasSuffix(res.StderrTail, fmt.Sprintf("line %07d\n", tt.written-1)) {
				t.Errorf("the stderr tail lacks the last line: %q", lastLine(res.StderrTail))
			}
		})
	}
}

func TestRunPayloadFile(t *testing.T) {
	t.Parallel()
	for _, size := range []int{10, PayloadEnvMax - 20, PayloadEnvMax + 1, 300 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			t.Parallel()
			payload := `{"k":"` + strings.Repeat("x", size-8) + `"}`
			r := newRunner(t, Config{Command: helperCommand(t, "payload", "{payload_file}")})
			job := newJob(t)
			job.Payload = json.RawMessage(payload)
			if _, err := r.Run(context.Background(), job); err != nil {
				t.Fatal(err)
			}
			var seen struct {
				File, Mode, Env, Path string
				InEnv                 bool `json:"in_env"`
				Args                  []string
			}
			readJSON(t, filepath.Join(job.WorkDir, "payload-seen.json"), &seen)
			wantPath := filepath.Join(job.WorkDir, PayloadFileName)
			if seen.File != payload || seen.Mode != "-rw-------" || seen.Path != wantPath || fmt.Sprint(seen.Args) != "["+wantPath+"]" {
				t.Errorf("payload file %s (%s, args %q): %.40q..., want %s (-rw-------) holding the payload", seen.Path, seen.Mode, seen.Args, seen.File, wantPath)
			}
			if small := len(payload) <= PayloadEnvMax; seen.InEnv != small || small && seen.Env != payload {
				t.Errorf("%d bytes: PGWORKER_PAYLOAD set %v (%d bytes), want set only up to %d bytes", len(payload), seen.InEnv, len(seen.Env), PayloadEnvMax)
			}
		})
	}
}

func TestRunArgTooLongIsPermanent(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{Command: helperCommand(t, "args", "{source}")})
	job := newJob(t)
	job.Source = strings.Repeat("s", 200<<10) // over the kernel's 128 KiB per argument
	res, err := r.Run(context.Background(), job)
	if !errors.Is(err, ErrArgTooLong) || !Permanent(err) || res.Pid != 0 {
		t.Fatalf("error %v (pid %d), want a permanent ErrArgTooLong", err, res.Pid)
	}
	if !strings.Contains(err.Error(), "{payload_file}") {
		t.Errorf("error %q does not say how to pass large values", err)
	}
}

// TestRunKillsWhatItLeftInOtherSessions: a program starts a process in a
// session of its own (setsid): once the run ends, however it ends, that
// process is gone.
func TestRunKillsWhatItLeftInOtherSessions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		mode string
		cfg  Config
		stop bool // cancel the run once the program says spawned
	}{
		{"exit", "escape", Config{}, false},
		{"timeout", "escape-hang", Config{Timeout: 2 * time.Second, KillGrace: 200 * time.Millisecond}, false},
		{"stop", "escape-hang", Config{KillGrace: 200 * time.Millisecond}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := newLines()
			cfg := tt.cfg
			cfg.Command, cfg.Logger = helperCommand(t, "spawn", tt.mode), slog.New(out)
			r := newRunner(t, cfg)
			job := newJob(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.stop {
				go func() {
					if !out.waitLine("spawned") {
						t.Error("the program never wrote spawned")
					}
					cancel()
				}()
			}
			res, err := r.Run(ctx, job)
			if tt.name == "exit" && err != nil || tt.name != "exit" && err == nil {
				t.Fatalf("run: %v (%+v)", err, res)
			}
			var child int
			readJSON(t, filepath.Join(job.WorkDir, "child.pid"), &child)
			// Run has returned: the process must already be gone, not dying.
			if err := syscall.Kill(child, 0); err == nil {
				if st, ok := readStat(child); ok && !st.zombie {
					syscall.Kill(child, syscall.SIGKILL)
					t.Fatalf("process %d, which the program left in a session of its own, outlived the run", child)
				}
			}
		})
	}
}

// probeScript tries to read the worker's secrets through /proc and writes
// what it got to files in its working directory.
const probeScript = `for f in environ cmdline; do cat /proc/$PPID/$f > $f.out 2>/dev/null || echo denied > $f.out; done
if (exec 3</proc/$PPID/mem) 2>/dev/null; then echo opened > mem.out; else echo denied > mem.out; fi
id -u > uid.out`

const probeSecret = "postgres://app:s3cret-in-environ@db/q"

type probeResult struct {
	Environ, Cmdline, Mem, UID string
}

func readProbe(t *testing.T, dir string) probeResult {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("the probe did not run: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	return probeResult{Environ: read("environ.out"), Cmdline: read("cmdline.out"), Mem: read("mem.out"), UID: read("uid.out")}
}

// probeWorker is the test binary as a worker (BACKEND_TEST_WORKER set): it
// runs as an unprivileged user, holds a secret in its environment, calls
// HideProcess unless told "visible", runs probeScript in the directory
// args[0], and exits 0 when the probe ran.
func probeWorker(args []string) int {
	if len(args) < 2 || args[1] != "visible" {
		if err := HideProcess(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	r, err := New(&Config{Command: "/bin/sh -c " + Join([]string{probeScript}), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := r.Run(context.Background(), &Job{ID: 1, Attempt: 1, WorkDir: args[0]}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestHiddenWorker: a program running as the worker's own user cannot read
// the worker's environment or memory through /proc once the worker called
// HideProcess; the same worker without the call leaks them (which shows the
// probe works). The worker runs as an unprivileged uid, since root reads
// every process's files.
func TestHiddenWorker(t *testing.T) {
	// Not parallel: the worker is a child of this process that Runner did not
	// start (see BecomeSubreaper).
	if os.Geteuid() != 0 {
		t.Skip("needs root, to start the worker as an unprivileged user")
	}
	const uid = 65534
	dir, err := os.MkdirTemp("", "pgworker-backend-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The worker binary: this test binary, where the unprivileged user can run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "worker")
	copyFile(t, self, bin)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"hidden", "visible"} {
		work := filepath.Join(dir, mode)
		if err := os.Mkdir(work, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(work, uid, uid); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, work, mode)
		cmd.Env = []string{"BACKEND_TEST_WORKER=1", "GORACE=atexit_sleep_ms=0", "PGWORKER_DATABASE_URL=" + probeSecret}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		if out, err := commandOutput(cmd, true); err != nil {
			t.Fatalf("%s worker: %v\n%s", mode, err, out)
		}
		got := readProbe(t, work)
		if got.UID != strconv.Itoa(uid) {
			t.Fatalf("%s: the program ran as uid %s, want %d", mode, got.UID, uid)
		}
		leaked := strings.Contains(got.Environ, probeSecret) || got.Mem == "opened"
		switch {
		case mode == "hidden" && (leaked || got.Environ != "denied" || got.Mem != "denied"):
			t.Errorf("hidden worker: the program read environ %.60q, mem %s; want both denied", got.Environ, got.Mem)
		case mode == "visible" && !leaked:
			t.Errorf("visible worker: the probe read nothing (environ %.60q, mem %s): it proves nothing", got.Environ, got.Mem)
		}
		// cmdline is readable by every user whatever the worker does; it
		// holds no secret as long as secrets come through the environment.
		if strings.Contains(got.Cmdline, probeSecret) {
			t.Errorf("%s: cmdline holds the secret: %q", mode, got.Cmdline)
		}
	}
}

// TestRunAs: started as root with RunAs, the program runs as that user,
// reads its input and payload and writes its outputs in the work directory
// that Run handed over, and cannot read the worker's /proc files.
func TestRunAs(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base, err := os.MkdirTemp("", "pgworker-backend-runas-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil { // others may search it, not list it
		t.Fatal(err)
	}
	dir := filepath.Join(base, "row") // the job's own, as the worker makes it
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	job := &Job{ID: 3, Attempt: 1, WorkDir: dir, Input: filepath.Join(dir, "in", "data"), OutputDir: filepath.Join(dir, "out"),
		Payload: json.RawMessage(`{"p":1}`)}
	for _, d := range []string{filepath.Dir(job.Input), job.OutputDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(job.Input, []byte("input"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := probeScript + `
cat "$PGWORKER_INPUT" "$PGWORKER_PAYLOAD_FILE" > "$PGWORKER_OUTPUT_DIR/copy"`
	r := newRunner(t, Config{Command: "/bin/sh -c " + Join([]string{script}), RunAs: "nobody",
		Env: []string{"PATH=/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY=" + probeSecret}})
	if err := r.CheckWorkDir(base); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	got := readProbe(t, dir)
	if got.UID != "65534" || got.Environ != "denied" || got.Mem != "denied" {
		t.Errorf("program as %s read environ %.60q, mem %s; want uid 65534 and both denied", got.UID, got.Environ, got.Mem)
	}
	if b, err := os.ReadFile(filepath.Join(job.OutputDir, "copy")); err != nil || string(b) != `input{"p":1}` {
		t.Errorf("output: %q, %v", b, err)
	}

	// A work directory the user cannot reach is refused up front.
	closed := t.TempDir() // 0700, and so is its parent
	if err := r.CheckWorkDir(closed); !errors.Is(err, errNoAccess) {
		t.Errorf("CheckWorkDir(%s) = %v, want it refused", closed, err)
	}
}

func TestRunAsRefused(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"root", "0", "no-such-user-here", "nobody:no-such-group", ":1", "123456"} {
		if _, err := New(&Config{Command: "/bin/true", RunAs: spec}); !errors.Is(err, ErrRunAs) {
			t.Errorf("RunAs %q: error %v, want ErrRunAs", spec, err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRunKillsOnlyItsOwnLeftovers: with several runs at once, the end of
// one kills what it left in other sessions, and nothing that another run,
// still going, left there.
func TestRunKillsOnlyItsOwnLeftovers(t *testing.T) {
	t.Parallel()
	out := newLines()
	// The long run's leftover is an orphan, a child of this process, while
	// the long run goes on.
	long := newRunner(t, Config{Command: helperCommand(t, "orphan"), Logger: slog.New(out), KillGrace: 200 * time.Millisecond})
	short := newRunner(t, Config{Command: helperCommand(t, "spawn", "escape")})
	longJob, shortJob := newJob(t), newJob(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := long.Run(ctx, longJob); done <- err }()
	if !out.waitLine("spawned") {
		cancel()
		<-done
		t.Fatal("the long run never wrote spawned")
	}
	var longChild, shortChild int
	readJSON(t, filepath.Join(longJob.WorkDir, "child.pid"), &longChild)
	defer syscall.Kill(longChild, syscall.SIGKILL)

	if _, err := short.Run(context.Background(), shortJob); err != nil {
		t.Fatal(err)
	}
	readJSON(t, filepath.Join(shortJob.WorkDir, "child.pid"), &shortChild)
	if st, ok := readStat(shortChild); ok && !st.zombie {
		t.Errorf("the short run's leftover %d outlived it", shortChild)
	}
	if st, ok := readStat(longChild); !ok || st.zombie {
		t.Errorf("the short run killed the long run's process %d", longChild)
	}

	cancel()
	if err := <-done; err == nil {
		t.Error("the long run was cancelled but reports success")
	}
	if st, ok := readStat(longChild); ok && !st.zombie {
		t.Errorf("the long run's leftover %d outlived it", longChild)
	}
}
