package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBackendFailureRetries: a backend that exits 1 on some inputs makes
// those rows retry with a growing delay and end failed with the end of its
// stderr in last_error; the other rows are done at the first attempt.
func TestBackendFailureRetries(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	for _, k := range []string{"good-1.txt", "bad-1.txt", "good-2.txt", "bad-2.txt", "good-3.txt"} {
		s.Put(in, k, []byte("content of "+k+"\n"))
	}
	backend := s.script("picky", `case "$PGWORKER_SOURCE" in
bad-*)
	echo "picky: reading $PGWORKER_SOURCE" >&2
	echo "picky: cannot digest $PGWORKER_SOURCE (attempt $PGWORKER_ATTEMPT)" >&2
	exit 1
	;;
esac
cp -- "$1" "$2/copy"
`)
	s.Enqueue([]string{"--max-attempts", "3"}, "good-1.txt", "bad-1.txt", "good-2.txt", "bad-2.txt", "good-3.txt")
	// The queue row appeared with the rows: make its backoff short, so that
	// the delays are 150-300ms after the first failure, 300-600ms after the
	// second.
	const base = 300 * time.Millisecond
	s.Exec(`UPDATE files.queues SET backoff_base = $1 WHERE queue = 'default'`, base)
	s.start("--exec", backend+" {input} {output_dir}", "--slots", "2", "--input-store", in, "--output-store", out)
	s.WaitSettled(2 * time.Minute)

	for _, r := range s.rows() {
		as := s.attempts(r.ID)
		if strings.HasPrefix(r.Source, "good-") {
			if r.State != "done" || r.Attempt != 1 || len(as) != 1 || as[0].Outcome != "done" {
				t.Errorf("row %d (%s): state %s, attempt %d, attempts %v; want done at the first attempt",
					r.ID, r.Source, r.State, r.Attempt, outcomes(as))
			}
			continue
		}
		if r.State != "failed" || r.Attempt != 3 {
			t.Errorf("row %d (%s): state %s after %d attempts, want failed after 3", r.ID, r.Source, r.State, r.Attempt)
		}
		wantErr := fmt.Sprintf("picky: cannot digest %s (attempt 3)", r.Source)
		if !strings.Contains(r.lastError(), wantErr) || !strings.Contains(r.lastError(), "exit status 1") {
			t.Errorf("row %d: last_error %q, want the exit status and the stderr tail %q", r.ID, r.lastError(), wantErr)
		}
		if strings.Join(outcomes(as), ",") != "failed,failed,failed" {
			t.Fatalf("row %d: attempts %v, want three failed", r.ID, outcomes(as))
		}
		for i, a := range as {
			if a.Attempt != i+1 || a.ExitCode == nil || *a.ExitCode != 1 ||
				!strings.Contains(a.StderrTail, "picky: reading "+r.Source) ||
				!strings.Contains(a.StderrTail, fmt.Sprintf("(attempt %d)", i+1)) {
				t.Errorf("row %d, attempt %d: number %d, exit code %v, stderr tail %q", r.ID, i+1, a.Attempt, a.ExitCode, a.StderrTail)
			}
		}
		// The next attempt starts no sooner than the backoff allows, which
		// doubles with each failure (jitter takes up to half of it off).
		for i := 1; i < len(as); i++ {
			gap := as[i].StartedAt.Sub(*as[i-1].FinishedAt)
			least := base << (i - 1) / 2
			t.Logf("row %d: attempt %d started %s after attempt %d failed (backoff at least %s)", r.ID, i+1, gap, i, least)
			if gap < least {
				t.Errorf("row %d: attempt %d started %s after attempt %d failed, before the backoff of at least %s",
					r.ID, i+1, gap, i, least)
			}
		}
	}
}

// TestBackendTimeout: a backend that hangs (a shell waiting for a child
// `sleep 1000`) is killed at --timeout together with its child, even when
// it ignores SIGTERM, and the row is retried, then fails, saying it timed
// out.
func TestBackendTimeout(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "polite", []byte("x"))
	s.Put(in, "stubborn", []byte("x"))
	children := filepath.Join(s.Dir, "children")
	backend := s.script("hang", `[ "$PGWORKER_SOURCE" = stubborn ] && trap '' TERM
sleep 1000 &
echo "$PGWORKER_SOURCE $!" >> `+shq(children)+`
wait
`)
	s.Enqueue([]string{"--max-attempts", "2"}, "polite", "stubborn")
	s.Exec(`UPDATE files.queues SET backoff_base = '100 ms'`)
	start := time.Now()
	s.start("--exec", backend, "--slots", "2", "--timeout", "1s", "--kill-grace", "1s",
		"--input-store", in, "--output-store", out)
	s.WaitSettled(time.Minute)
	t.Logf("both rows failed after %s", time.Since(start).Round(time.Millisecond))

	for _, r := range s.rows() {
		as := s.attempts(r.ID)
		if r.State != "failed" || r.Attempt != 2 || strings.Join(outcomes(as), ",") != "failed,failed" {
			t.Errorf("row %d (%s): state %s, attempt %d, attempts %v; want failed after two failed attempts",
				r.ID, r.Source, r.State, r.Attempt, outcomes(as))
		}
		if !strings.Contains(r.lastError(), "timed out after 1s") {
			t.Errorf("row %d (%s): last_error %q, want it to say the backend timed out after 1s", r.ID, r.Source, r.lastError())
		}
		t.Logf("row %d (%s): last_error %q", r.ID, r.Source, r.lastError())
		for _, a := range as {
			if d := a.FinishedAt.Sub(a.StartedAt); d > 30*time.Second {
				t.Errorf("row %d (%s): an attempt took %s with a 1s timeout", r.ID, r.Source, d)
			}
		}
	}

	b, err := os.ReadFile(children)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 {
		t.Fatalf("the backends started %d children, want 4 (two rows, two attempts):\n%s", len(lines), b)
	}
	for _, l := range lines {
		// The process group is killed once the backend is gone: its
		// children are gone by the time the attempt is recorded.
		for _, pid := range pids(l) {
			if alive(pid) {
				t.Errorf("the backend's child %s outlived the timeout", l)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// TestKillDashNine: of two `pgworker run` processes, one is killed with
// SIGKILL while it holds rows. Its rows come back after the lease timeout
// and the other process finishes them; each row has exactly one done
// attempt, the killed ones are recorded as lost, and the killed slots dead.
func TestKillDashNine(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	for i := 1; i <= 4; i++ {
		s.Put(in, fmt.Sprintf("in-%d", i), []byte("x"))
	}
	s.makeGates(1, 2, 3, 4)
	backend := s.gatedBackend()
	args := []string{"--exec", backend, "--slots", "2", "--input-store", in, "--output-store", out, "--heartbeat", "200ms"}

	// The victim's slots register its 1s lease, which the reaper applies.
	// The survivor reaps every lease timeout: 2s keeps the test short
	// without risking its own lease on a loaded machine.
	victim := s.start(slices.Concat(args, []string{"--lease-timeout", "1s"})...)
	s.waitSlots(time.Minute, victim.Pid(), 2, "active")
	s.Enqueue(nil, "in-1", "in-2", "in-3", "in-4")
	s.waitFor(time.Minute, "the victim's backends of rows 1 and 2 to start", func() bool {
		return len(s.backendPIDs(1)) == 1 && len(s.backendPIDs(2)) == 1
	})
	if held := s.heldBy(victim.Pid()); fmt.Sprint(held) != "[1 2]" {
		t.Fatalf("the victim holds rows %v, want [1 2]", held)
	}

	survivor := s.start(slices.Concat(args, []string{"--lease-timeout", "2s"})...)
	s.waitFor(time.Minute, "the survivor to take rows 3 and 4", func() bool {
		return fmt.Sprint(s.heldBy(survivor.Pid())) == "[3 4]"
	})

	victim.Signal(syscall.SIGKILL)
	if code := victim.Wait(30 * time.Second); code != -1 {
		t.Fatalf("the victim exited %d, want death by SIGKILL", code)
	}
	// The victim's programs outlive it (they run in their own process
	// groups); under systemd, KillMode=mixed kills what is left of the unit.
	// Do the same here: a leftover still waiting at a gate would take the
	// survivor's turn through the FIFO.
	for _, id := range []int64{1, 2} {
		for _, pid := range s.backendPIDs(id) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	s.waitFor(time.Minute, "the victim's programs to end", func() bool {
		for _, id := range []int64{1, 2} {
			for _, pid := range s.backendPIDs(id) {
				if alive(pid) {
					return false
				}
			}
		}
		return true
	})
	// The survivor's slots are busy until rows 3 and 4 finish; rows 1 and 2
	// come back when the victim's lease runs out, and the survivor takes them.
	for _, id := range []int64{3, 4, 1, 2} {
		s.openGate(id)
	}
	s.WaitSettled(time.Minute)

	for _, r := range s.rows() {
		as := s.attempts(r.ID)
		var done []attempt
		for _, a := range as {
			if a.Outcome == "done" {
				done = append(done, a)
			}
		}
		if r.State != "done" || len(done) != 1 {
			t.Errorf("row %d: state %s, attempts %v; want done once", r.ID, r.State, outcomes(as))
			continue
		}
		if pid := s.workerPID(done[0].WorkerID); pid != survivor.Pid() {
			t.Errorf("row %d was done by pid %d, want the survivor %d", r.ID, pid, survivor.Pid())
		}
		m, err := r.manifest()
		if err != nil {
			t.Fatal(err)
		}
		if m.WorkerID != done[0].WorkerID || m.Attempt != done[0].Attempt {
			t.Errorf("row %d: result of %s attempt %d, but the done attempt is %s attempt %d",
				r.ID, m.WorkerID, m.Attempt, done[0].WorkerID, done[0].Attempt)
		}
		got, err := s.checkOutputs(r.ID, m)
		if err != nil {
			t.Error(err)
		} else if string(got["out.txt"]) != "go\n" {
			t.Errorf("row %d: outputs %q", r.ID, got)
		}
		if r.ID > 2 {
			if len(as) != 1 {
				t.Errorf("row %d: attempts %v, want one", r.ID, outcomes(as))
			}
			continue
		}
		// Rows 1 and 2: the victim's attempt was lost, then the survivor's
		// attempt (number 2) took over once the lease had run out.
		if strings.Join(outcomes(as), ",") != "lost,done" {
			t.Errorf("row %d: attempts %v, want lost then done", r.ID, outcomes(as))
			continue
		}
		lost := as[0]
		if s.workerPID(lost.WorkerID) != victim.Pid() || !strings.Contains(lost.Error, lost.WorkerID) {
			t.Errorf("row %d: lost attempt by %s with error %q, want the victim's", r.ID, lost.WorkerID, lost.Error)
		}
		if !as[1].StartedAt.After(*lost.FinishedAt) || as[1].Attempt != 2 {
			t.Errorf("row %d: attempt %d started at %s, before the lost one was reaped at %s",
				r.ID, as[1].Attempt, as[1].StartedAt, lost.FinishedAt)
		}
		silence := s.MustCount(`SELECT (extract(epoch FROM $1::timestamptz - w.last_heartbeat_at) * 1000)::int
			FROM files.workers w WHERE w.worker_id = $2`, *lost.FinishedAt, lost.WorkerID)
		if silence < 1000 {
			t.Errorf("row %d was reaped %dms after its worker's last heartbeat, within the 1s lease", r.ID, silence)
		}
	}
	if st := s.slotStates(victim.Pid()); strings.Join(st, ",") != "dead,dead" {
		t.Errorf("the victim's slots are %v, want dead", st)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'lost'`); n != 2 {
		t.Errorf("%d lost attempts, want 2", n)
	}
	// The victim's backends died with it (they are blocked at their gates otherwise).
	for _, id := range []int64{1, 2} {
		if p := s.backendPIDs(id); len(p) > 0 && alive(p[0]) {
			t.Errorf("the victim's backend of row %d (pid %d) outlived it", id, p[0])
		}
	}
}
