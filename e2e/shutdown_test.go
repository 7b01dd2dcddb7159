package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDrain: SIGTERM while backends run stops the claiming and marks the
// slots draining; the running rows finish (within --drain-timeout), the
// process exits 0, and what was pending stays pending, untouched.
func TestDrain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	for _, k := range []string{"a", "b", "c", "d"} {
		s.Put(in, k, []byte(k))
	}
	s.makeGates(1, 2, 3, 4)
	p := s.start("--exec", s.gatedBackend(), "--slots", "2", "--drain-timeout", "2m",
		"--input-store", in, "--output-store", out)
	s.Enqueue(nil, "a", "b", "c")
	s.waitFor(time.Minute, "the backends of rows 1 and 2 to start", func() bool {
		return len(s.backendPIDs(1)) == 1 && len(s.backendPIDs(2)) == 1
	})

	p.Signal(syscall.SIGTERM)
	s.waitSlots(30*time.Second, p.Pid(), 2, "draining")
	// Work that arrives while draining is not taken either.
	s.Enqueue(nil, "d")
	s.openGate(1)
	s.openGate(2)
	if code := p.Wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after a drain, want 0", code)
	}

	for _, r := range s.rows() {
		as := s.attempts(r.ID)
		switch {
		case r.ID <= 2 && (r.State != "done" || strings.Join(outcomes(as), ",") != "done"):
			t.Errorf("row %d: state %s, attempts %v; want it finished during the drain", r.ID, r.State, outcomes(as))
		case r.ID > 2 && (r.State != "pending" || r.Attempt != 0 || len(as) != 0):
			t.Errorf("row %d: state %s, attempt %d, attempts %v; want it left pending, untouched", r.ID, r.State, r.Attempt, outcomes(as))
		}
	}
	if st := s.slotStates(p.Pid()); strings.Join(st, ",") != "stopped,stopped" {
		t.Errorf("slots %v after the drain, want stopped", st)
	}
	if !strings.Contains(p.LogText(), "draining") {
		t.Errorf("the log does not mention the drain:\n%s", p.LogTail(4000))
	}
}

// TestDrainTimeout: when the running rows outlast --drain-timeout, or when a
// second SIGTERM comes, their backends are terminated and the rows released:
// pending again, the attempt given back (outcome released), exit status 0.
func TestDrainTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		drain   string
		signals int
		within  time.Duration // how soon the process must exit after the last signal
	}{
		{"drain timeout", "500ms", 1, 30 * time.Second},
		// The drain would last two minutes: the second signal cuts it short.
		{"second signal", "2m", 2, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t)
			in, out := s.FileStore("in"), s.FileStore("out")
			s.Put(in, "a", []byte("a"))
			s.Put(in, "b", []byte("b"))
			s.makeGates(1, 2) // never opened: the backends run until stopped
			p := s.start("--exec", s.gatedBackend(), "--slots", "2", "--drain-timeout", tc.drain,
				"--kill-grace", "1s", "--input-store", in, "--output-store", out)
			s.Enqueue(nil, "a", "b")
			s.waitFor(time.Minute, "the backends of rows 1 and 2 to start", func() bool {
				return len(s.backendPIDs(1)) == 1 && len(s.backendPIDs(2)) == 1
			})

			p.Signal(syscall.SIGTERM)
			if tc.signals == 2 {
				s.waitSlots(30*time.Second, p.Pid(), 2, "draining")
				p.Signal(syscall.SIGTERM)
			}
			last := time.Now()
			if code := p.Wait(tc.within); code != 0 {
				t.Fatalf("exit %d, want 0", code)
			}
			t.Logf("exited %s after the last signal", time.Since(last).Round(time.Millisecond))

			for _, id := range []int64{1, 2} {
				r := s.row(id)
				as := s.attempts(id)
				if r.State != "pending" || r.Attempt != 0 || r.WorkerID != nil {
					t.Errorf("row %d: state %s, attempt %d, worker %v; want pending with its attempt given back",
						id, r.State, r.Attempt, r.WorkerID)
				}
				if len(as) != 1 || as[0].Outcome != "released" || as[0].Attempt != 1 {
					t.Errorf("row %d: attempts %+v, want one released", id, as)
				}
				for _, pid := range s.backendPIDs(id) {
					if alive(pid) {
						t.Errorf("row %d: backend pid %d outlived its worker", id, pid)
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			if st := s.slotStates(p.Pid()); strings.Join(st, ",") != "stopped,stopped" {
				t.Errorf("slots %v after the stop, want stopped", st)
			}
		})
	}
}
