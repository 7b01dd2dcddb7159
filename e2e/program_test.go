package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// logRecords returns the JSON records of a pgworker log.
func logRecords(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

// TestProgramLogBudget: a program that writes many lines puts at most the
// row's budget in the worker's log, then one line saying how many more were
// not logged; the end of its stderr is still kept with the attempt.
func TestProgramLogBudget(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "a.txt", []byte("a"))
	const written, budget = 20000, 50
	chatty := s.script("chatty", `i=0
while [ $i -lt `+strconv.Itoa(written)+` ]; do echo "chatty line $i" >&2; i=$((i+1)); done
`)
	s.Enqueue(nil, "a.txt")
	p := s.start("--exec", chatty, "--row-log-lines", strconv.Itoa(budget), "--input-store", in, "--output-store", out)
	s.waitState(2*time.Minute, 1, "done")
	p.Signal(syscall.SIGTERM)
	p.Wait(time.Minute)

	logged, summaries := 0, []string{}
	for _, rec := range logRecords(t, p.LogText()) {
		switch msg, _ := rec["msg"].(string); {
		case msg == "backend stderr":
			logged++
		case strings.Contains(msg, "not logged"):
			summaries = append(summaries, msg)
		}
	}
	want := []string{fmt.Sprintf("backend output: %d more lines not logged", written-budget)}
	if logged != budget || !reflect.DeepEqual(summaries, want) {
		t.Errorf("%d stderr lines logged and summaries %q; want %d lines and %q", logged, summaries, budget, want)
	}
	if as := s.attempts(1); len(as) != 1 || !strings.Contains(as[0].StderrTail, fmt.Sprintf("chatty line %d", written-1)) {
		t.Errorf("the attempt's stderr tail lacks the last line")
	}
}

// TestLargePayloadReachesProgram: a payload far over what the kernel allows
// in one environment variable reaches the program whole, through
// {payload_file} and PGWORKER_PAYLOAD_FILE, and the row completes at the
// first attempt; PGWORKER_PAYLOAD is left out.
func TestLargePayloadReachesProgram(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "a.txt", []byte("a"))
	copier := s.script("payload", `test "$1" = "$PGWORKER_PAYLOAD_FILE" || { echo "{payload_file} $1 is not PGWORKER_PAYLOAD_FILE" >&2; exit 1; }
test -z "${PGWORKER_PAYLOAD+set}" || { echo "PGWORKER_PAYLOAD is set" >&2; exit 1; }
cp -- "$1" "$PGWORKER_OUTPUT_DIR/payload.json"
`)
	s.Enqueue([]string{"--max-attempts", "3"}, "a.txt")
	big := map[string]string{"text": strings.Repeat("0123456789abcdef", 200<<10/16)}
	b, err := json.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(`UPDATE files.files SET payload = $1 WHERE id = 1`, string(b))
	s.start("--exec", copier+" {payload_file}", "--input-store", in, "--output-store", out)
	s.WaitSettled(2 * time.Minute)

	r := s.row(1)
	if r.State != "done" || r.Attempt != 1 {
		t.Fatalf("row 1: %s after %d attempts (%s), want done at the first", r.State, r.Attempt, r.lastError())
	}
	m, err := r.manifest()
	if err != nil {
		t.Fatal(err)
	}
	outs, err := s.checkOutputs(1, m)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(outs["payload.json"], &got); err != nil || !reflect.DeepEqual(got, big) {
		t.Errorf("the program got a payload of %d bytes (%v), want the %d bytes enqueued", len(outs["payload.json"]), err, len(b))
	}
}

// TestArgTooLongFailsAtOnce: a command whose expansion exceeds the kernel's
// limit on an argument cannot start (E2BIG); the row fails at its first
// attempt, with an error that says so, instead of spending its attempts.
func TestArgTooLongFailsAtOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "a.txt", []byte("a"))
	s.Enqueue([]string{"--max-attempts", "5"}, "a.txt")
	// One word of 2,000 input paths: some 200 KB.
	word := strings.Repeat("{input}", 2000)
	s.start("--exec", "/bin/echo "+word, "--input-store", in, "--output-store", out)
	s.waitFor(2*time.Minute, "row 1 to fail or to wait for a retry", func() bool {
		r := s.row(1)
		return r.State == "failed" || r.State == "pending" && r.lastError() != ""
	})
	r := s.row(1)
	if r.State != "failed" || r.Attempt != 1 || !strings.Contains(r.lastError(), "argument list too long") {
		t.Errorf("row 1: %s after %d attempts, last_error %q; want failed at the first, argument list too long", r.State, r.Attempt, r.lastError())
	}
}

// daemonBackend returns a program that starts a daemon in a session of its
// own (setsid), which records its pid in daemon-ID, and then, when hang is
// true, waits forever.
func (s *stack) daemonBackend(hang bool) string {
	s.T.Helper()
	d := shq(s.Dir)
	tail := "exit 0\n"
	if hang {
		tail = "exec sleep 1000\n"
	}
	return s.script("daemonize", `fifo="$PGWORKER_WORK_DIR/daemon.fifo"
mkfifo "$fifo" || exit 3
setsid sh -c 'echo $$ > "$0"; exec sleep 1000' "$fifo" &
read pid < "$fifo"
echo "$pid" > `+d+`/daemon-"$PGWORKER_ID".tmp
mv `+d+`/daemon-"$PGWORKER_ID".tmp `+d+`/daemon-"$PGWORKER_ID"
`+tail)
}

// daemonPID waits until the daemon of row id has recorded its pid.
func (s *stack) daemonPID(id int64) int {
	s.T.Helper()
	path := filepath.Join(s.Dir, "daemon-"+strconv.FormatInt(id, 10))
	var pid int
	s.waitFor(time.Minute, "the daemon of row "+strconv.FormatInt(id, 10)+" to start", func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	s.T.Cleanup(func() {
		if alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pid
}

// TestProgramDaemonEndsWithItsRow: a daemon that the program starts in a
// session of its own (setsid) is killed when the row ends, when the
// program times out, and when the worker stops with the row running.
func TestProgramDaemonEndsWithItsRow(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"exit", "timeout", "stop"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t)
			in, out := s.FileStore("in"), s.FileStore("out")
			s.Put(in, "a.txt", []byte("a"))
			s.Enqueue([]string{"--max-attempts", "1"}, "a.txt")
			args := []string{"--exec", s.daemonBackend(mode != "exit"), "--input-store", in, "--output-store", out}
			if mode == "timeout" {
				args = append(args, "--timeout", "3s")
			}
			p := s.start(args...)
			pid := s.daemonPID(1)
			switch mode {
			case "exit":
				s.waitState(time.Minute, 1, "done")
			case "timeout":
				s.waitState(time.Minute, 1, "failed")
			case "stop":
				// Drain, then stop at once: the running program is killed.
				p.Signal(syscall.SIGTERM)
				p.Signal(syscall.SIGTERM)
				p.Wait(time.Minute)
			}
			// The row's end is recorded after its program's leftovers are killed.
			if alive(pid) {
				t.Errorf("the daemon (pid %d) outlived the row (%s)", pid, mode)
			}
		})
	}
}

// TestRunAsProgramCannotReadWorker: a worker started as root with --run-as
// runs the program as that user; the program reads its input and payload,
// writes its outputs, and cannot read the worker's environment (which holds
// the database URL) or memory through /proc.
func TestRunAsProgramCannotReadWorker(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	s := newStack(t)
	// The unprivileged user must reach the scripts and the work directory.
	if err := os.Chmod(filepath.Dir(s.Dir), 0o711); err != nil {
		t.Fatal(err)
	}
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "a.txt", []byte("input a"))
	probe := s.script("probe", `o="$PGWORKER_OUTPUT_DIR"
for f in environ cmdline; do cat /proc/$PPID/$f > "$o/$f" 2>/dev/null || echo denied > "$o/$f"; done
if (exec 3</proc/$PPID/mem) 2>/dev/null; then echo opened > "$o/mem"; else echo denied > "$o/mem"; fi
id -u > "$o/uid"
cat "$PGWORKER_INPUT" "$PGWORKER_PAYLOAD_FILE" > "$o/copy"
`)
	s.Enqueue([]string{"--payload", `{"p": 1}`}, "a.txt")
	s.start("--exec", probe, "--run-as", "nobody", "--input-store", in, "--output-store", out)
	s.WaitSettled(2 * time.Minute)
	r := s.row(1)
	if r.State != "done" {
		t.Fatalf("row 1: %s (%s)", r.State, r.lastError())
	}
	m, err := r.manifest()
	if err != nil {
		t.Fatal(err)
	}
	outs, err := s.checkOutputs(1, m)
	if err != nil {
		t.Fatal(err)
	}
	text := func(k string) string { return strings.TrimSpace(string(outs[k])) }
	if text("uid") != "65534" || text("environ") != "denied" || text("mem") != "denied" {
		t.Errorf("program as uid %s: environ %.80q, mem %q; want uid 65534 and both denied", text("uid"), text("environ"), text("mem"))
	}
	if text("copy") != `input a{"p": 1}` {
		t.Errorf("the program read %q, want its input and payload", text("copy"))
	}
	for _, k := range []string{"environ", "cmdline", "mem"} {
		if strings.Contains(string(outs[k]), s.DatabaseURL) {
			t.Errorf("the program read the database URL from /proc/PPID/%s", k)
		}
	}
}

// TestProgramCannotReadWorker: the program runs as the worker's own user
// (here an unprivileged one) and still cannot read the worker's environment,
// which holds its credentials, or its memory through /proc; the worker's
// command line, which every user can read, holds no secret.
func TestProgramCannotReadWorker(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to start the worker as an unprivileged user")
	}
	const uid = 65534
	s := newStack(t)
	// The unprivileged worker must reach its binary, the scripts and the
	// stores, and own its work directory and output store.
	for _, d := range []string{filepath.Dir(pgworkerBin), filepath.Dir(s.Dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	in, out := s.FileStore("in"), s.FileStore("out")
	work := filepath.Join(s.Dir, "work-run-1")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{work, strings.TrimPrefix(out, "file://")} {
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	s.Put(in, "a.txt", []byte("a"))
	probe := s.script("probe", `o="$PGWORKER_OUTPUT_DIR"
for f in environ cmdline; do cat /proc/$PPID/$f > "$o/$f" 2>/dev/null || echo denied > "$o/$f"; done
if (exec 3</proc/$PPID/mem) 2>/dev/null; then echo opened > "$o/mem"; else echo denied > "$o/mem"; fi
id -u > "$o/uid"
`)
	const secret = "canary-secret-key-0123456789"
	s.Env = append(s.Env, "AWS_SECRET_ACCESS_KEY="+secret)
	s.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	s.Enqueue(nil, "a.txt")
	s.start("--exec", probe, "--input-store", in, "--output-store", out)
	s.WaitSettled(2 * time.Minute)
	r := s.row(1)
	if r.State != "done" {
		t.Fatalf("row 1: %s (%s)", r.State, r.lastError())
	}
	m, err := r.manifest()
	if err != nil {
		t.Fatal(err)
	}
	outs, err := s.checkOutputs(1, m)
	if err != nil {
		t.Fatal(err)
	}
	text := func(k string) string { return strings.TrimSpace(string(outs[k])) }
	if text("uid") != strconv.Itoa(uid) {
		t.Fatalf("the program ran as uid %s, want %d", text("uid"), uid)
	}
	if text("environ") != "denied" || text("mem") != "denied" {
		t.Errorf("the program read the worker's environ (%.80q) or opened its mem (%s); want both denied", text("environ"), text("mem"))
	}
	for _, k := range []string{"environ", "cmdline"} {
		if strings.Contains(string(outs[k]), secret) {
			t.Errorf("the program read the worker's secret from /proc/PPID/%s", k)
		}
	}
}
