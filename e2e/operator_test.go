package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCancelRunning: `pgworker cancel ID` while the row's backend runs kills
// the backend within about a second; the row ends cancelled, its attempt
// too, and the slot goes on with other work.
func TestCancelRunning(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	s.Put(in, "a", []byte("a"))
	s.Put(in, "b", []byte("b"))
	s.makeGates(1, 2)
	s.start("--exec", s.gatedBackend(), "--slots", "1", "--input-store", in, "--output-store", out)
	s.Enqueue(nil, "a")
	s.waitFor(time.Minute, "the backend of row 1 to start", func() bool { return len(s.backendPIDs(1)) == 1 })
	pid := s.backendPIDs(1)[0]

	res := s.Pgworker(nil, "cancel", "1")
	if res.Code != 0 || !strings.Contains(res.Stdout, "cancelled 1 row") {
		t.Fatalf("cancel: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	cancelled := time.Now()
	s.waitFor(30*time.Second, "the backend to be killed", func() bool { return !alive(pid) })
	took := time.Since(cancelled)
	t.Logf("the backend was killed %s after the cancel was committed", took.Round(time.Millisecond))
	// About a second: the notification, then SIGTERM to the process group
	// (the backend does not need the 2s kill grace). A loaded machine gets
	// some slack.
	if took > 5*time.Second {
		t.Errorf("the backend was killed %s after the cancel, want about a second", took)
	}

	// The slot is free again: the next row runs through.
	s.Enqueue(nil, "b")
	s.openGate(2)
	s.waitState(time.Minute, 2, "done")

	r := s.row(1)
	as := s.attempts(1)
	if r.State != "cancelled" || r.Result != nil || len(as) != 1 || as[0].Outcome != "cancelled" {
		t.Errorf("row 1: state %s, result %s, attempts %v; want cancelled", r.State, r.Result, outcomes(as))
	}
}

// TestPauseResume: rows of a paused queue stay pending while a worker idles;
// resume hands them out.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	for _, k := range []string{"p1", "p2", "p3", "other"} {
		s.Put(in, k, []byte(k))
	}
	if res := s.Pgworker(nil, "pause", "thumbs"); res.Code != 0 || !strings.Contains(res.Stdout, `paused queue "thumbs"`) {
		t.Fatalf("pause: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	s.Enqueue([]string{"--queue", "thumbs"}, "p1", "p2", "p3")
	p := s.start("--exec", "cp -- {input} {output_dir}/copy", "--slots", "2", "--input-store", in, "--output-store", out)
	s.waitSlots(time.Minute, p.Pid(), 2, "active")

	// A row of another queue, enqueued after them, is done: the worker was
	// awake and claiming, and passed over the paused rows.
	s.Enqueue(nil, "other")
	s.waitState(time.Minute, 4, "done")
	for id := int64(1); id <= 3; id++ {
		if r, as := s.row(id), s.attempts(id); r.State != "pending" || r.Attempt != 0 || len(as) != 0 {
			t.Fatalf("row %d of the paused queue: state %s, attempts %v; want pending, untouched", id, r.State, outcomes(as))
		}
	}
	if n := s.MustCount(`SELECT count(*) FROM files.active_workers WHERE pid = $1 AND file_id IS NULL`, p.Pid()); n != 2 {
		t.Errorf("%d idle slots, want 2", n)
	}

	if res := s.Pgworker(nil, "resume", "thumbs"); res.Code != 0 {
		t.Fatalf("resume: exit %d, stderr %q", res.Code, res.Stderr)
	}
	s.WaitSettled(time.Minute)
	for _, r := range s.rows() {
		if r.State != "done" {
			t.Errorf("row %d: %s after resume, want done", r.ID, r.State)
		}
	}
}

// TestRetryFailed: `pgworker retry --failed` puts failed rows back with a
// fresh attempt budget, and they run again.
func TestRetryFailed(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	for _, k := range []string{"a", "b", "c"} {
		s.Put(in, k, []byte(k))
	}
	fixed := filepath.Join(s.Dir, "fixed")
	backend := s.script("flaky", `if [ ! -e `+shq(fixed)+` ] && [ "$PGWORKER_SOURCE" != c ]; then
	echo "flaky: not fixed yet" >&2
	exit 1
fi
cp -- "$1" "$2/copy"
`)
	s.start("--exec", backend+" {input} {output_dir}", "--slots", "2", "--input-store", in, "--output-store", out)
	s.Enqueue([]string{"--max-attempts", "1"}, "a", "b", "c")
	s.WaitSettled(time.Minute)
	if got := s.MustCount(`SELECT count(*) FROM files.files WHERE state = 'failed'`); got != 2 {
		t.Fatalf("%d failed rows, want 2 (a and b)", got)
	}

	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := s.Pgworker(nil, "retry", "--failed")
	if res.Code != 0 || !strings.Contains(res.Stdout, "requeued 2 rows") {
		t.Fatalf("retry --failed: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	s.WaitSettled(time.Minute)
	for _, r := range s.rows() {
		as := s.attempts(r.ID)
		want := "failed,done"
		if r.Source == "c" {
			want = "done"
		}
		if r.State != "done" || strings.Join(outcomes(as), ",") != want {
			t.Errorf("row %d (%s): state %s, attempts %v; want done, attempts %s", r.ID, r.Source, r.State, outcomes(as), want)
		}
		if r.Attempt != 1 {
			t.Errorf("row %d (%s): attempt %d, want 1 (a fresh budget)", r.ID, r.Source, r.Attempt)
		}
	}
}
