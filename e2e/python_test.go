package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/harness"
)

// pythonWorker is examples/python/worker.py, from the e2e folder.
const pythonWorker = "../examples/python/worker.py"

// TestPythonWorkers runs two `pgworker run` processes and two Python workers
// (examples/python/worker.py) on one queue of 300 rows. One Python worker is
// killed with SIGKILL while it runs a row: that row comes back through
// files.reap as a lost attempt and is done again by another worker, every row
// ends done with exactly one done attempt, and the other Python worker
// deregisters cleanly on SIGTERM.
func TestPythonWorkers(t *testing.T) {
	t.Parallel()
	python := findPython(t)
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	const n = 300
	sources := make([]string, n)
	for i := range sources {
		sources[i] = fmt.Sprintf("in-%03d", i)
		s.Put(in, sources[i], []byte("x"))
	}

	// Every handler takes a little time, so that rows are running when the
	// victim is killed.
	slow := s.script("slow", "sleep 0.05\n")
	var runs []*proc
	for range 2 {
		runs = append(runs, s.start("--exec", slow, "--slots", "2", "--input-store", in, "--output-store", out))
	}
	d := shq(s.Dir)
	survivorCmd := s.script("py-row", `sleep 0.02
echo "{\"row\": $1}"
`)
	// The victim does two rows, then blocks in its third, where it is killed.
	victimCmd := s.script("py-victim", `echo "$1" >> `+d+`/victim-rows
if [ $(wc -l < `+d+`/victim-rows) -ge 3 ]; then
	echo "$1 $$" > `+d+`/victim-held.tmp && mv `+d+`/victim-held.tmp `+d+`/victim-held
	exec sleep 600
fi
sleep 0.02
echo "{\"row\": $1}"
`)
	// Short heartbeats and leases keep the test quick; both Python workers
	// reap every lease timeout or so, as pgworker run does every 5s.
	pyArgs := []string{"--heartbeat", "200ms", "--lease-timeout", "3s", "--safety-net", "5s", "--"}
	survivor := startPython(s, python, "py-survivor", append(pyArgs, survivorCmd, "{id}")...)
	victim := startPython(s, python, "py-victim", append(pyArgs, victimCmd, "{id}")...)
	pys := []*pyProc{survivor, victim}

	for _, p := range runs {
		s.waitSlots(time.Minute, p.Pid(), 2, "active")
	}
	for _, p := range pys {
		waitPython(s, pys, time.Minute, p.name+"'s slot to be registered", func() bool {
			return fmt.Sprint(s.slotStates(p.Pid())) == "[active]"
		})
	}
	victimID := s.slotID(victim.Pid())
	survivorID := s.slotID(survivor.Pid())

	s.Enqueue(nil, sources...)

	// The event: the victim's program of its third row is running, and the
	// database shows the row running on the victim's slot.
	var held int64
	var heldPID int
	waitPython(s, pys, 2*time.Minute, "the victim to hold a row", func() bool {
		b, err := os.ReadFile(filepath.Join(s.Dir, "victim-held"))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			t.Fatalf("victim-held: %q", b)
		}
		held, _ = strconv.ParseInt(f[0], 10, 64)
		heldPID, _ = strconv.Atoi(f[1])
		r := s.row(held)
		return r.State == "running" && r.WorkerID != nil && *r.WorkerID == victimID
	})
	victim.kill(t)
	// A worker killed with SIGKILL leaves its program behind (it runs in a
	// session of its own); end it, as a service manager would.
	_ = syscall.Kill(heldPID, syscall.SIGKILL)
	s.waitFor(time.Minute, "the victim's program to end", func() bool { return !alive(heldPID) })

	waitPython(s, pys, 3*time.Minute, "every row to reach a terminal state", func() bool {
		ok, err := s.Settled(context.Background())
		return err == nil && ok
	})

	if c := s.MustCount(`SELECT count(*) FROM files.files WHERE state <> 'done'`); c != 0 {
		t.Errorf("%d rows are not done", c)
	}
	if c := s.MustCount(`SELECT count(*) FROM files.files f WHERE (SELECT count(*) FROM files.attempts a
		WHERE a.file_id = f.id AND a.outcome = 'done') <> 1`); c != 0 {
		t.Errorf("%d rows do not have exactly one done attempt", c)
	}
	if c := s.MustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'failed'`); c != 0 {
		t.Errorf("%d attempts failed", c)
	}
	// What the Python workers completed is what their program printed.
	if c := s.MustCount(`SELECT count(*) FROM files.files f JOIN files.attempts a ON a.file_id = f.id AND a.outcome = 'done'
		WHERE a.worker_id = ANY ($1) AND f.result->>'row' IS DISTINCT FROM f.id::text`, []string{survivorID, victimID}); c != 0 {
		t.Errorf("%d rows done by a Python worker have a result that is not their program's", c)
	}
	if c := s.MustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'done' AND worker_id = $1`, victimID); c != 2 {
		t.Errorf("the victim completed %d rows, want 2 before it was killed", c)
	}

	// The held row went back as a lost attempt and was redone elsewhere.
	as := s.attempts(held)
	var lost, done []attempt
	for _, a := range as {
		switch a.Outcome {
		case "lost":
			lost = append(lost, a)
		case "done":
			done = append(done, a)
		}
	}
	if len(lost) != 1 || lost[0].WorkerID != victimID {
		t.Errorf("row %d: attempts %v; want one lost attempt of the victim %s", held, outcomes(as), victimID)
	}
	if len(done) != 1 || done[0].WorkerID == victimID {
		t.Errorf("row %d: attempts %v; want it done once by another worker than the victim", held, outcomes(as))
	}
	if st := s.slotStates(victim.Pid()); fmt.Sprint(st) != "[dead]" {
		t.Errorf("the victim's slot is %v, want dead", st)
	}
	for _, p := range runs {
		t.Logf("%s: %d rows done", p.Name, s.doneBy(p.Pid()))
	}
	t.Logf("%s: %d rows done", survivor.name, s.doneBy(survivor.Pid()))

	survivor.signal(t, syscall.SIGTERM)
	for _, p := range runs {
		p.Signal(syscall.SIGTERM)
	}
	if code := survivor.wait(t, time.Minute); code != 0 {
		t.Errorf("the Python worker exited %d after SIGTERM, want 0", code)
	}
	if st := s.slotStates(survivor.Pid()); fmt.Sprint(st) != "[stopped]" {
		t.Errorf("the Python worker's slot is %v after SIGTERM, want stopped", st)
	}
	for _, p := range runs {
		if code := p.Wait(time.Minute); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", p.Name, code)
		}
	}
}

// slotID returns the worker id of the one slot of process pid.
func (s *stack) slotID(pid int) string {
	s.T.Helper()
	ids := harness.Query(s.Harness, pgx.RowTo[string], `SELECT worker_id FROM files.workers WHERE pid = $1`, pid)
	if len(ids) != 1 {
		s.T.Fatalf("pid %d has slots %v, want one", pid, ids)
	}
	return ids[0]
}

// doneBy returns how many done attempts the slots of process pid have.
func (s *stack) doneBy(pid int) int {
	s.T.Helper()
	return s.MustCount(`SELECT count(*) FROM files.attempts a JOIN files.workers w USING (worker_id)
		WHERE a.outcome = 'done' AND w.pid = $1`, pid)
}

// findPython returns $PYTHON, or else the first python3 on PATH, that can
// import psycopg2, and skips the test when there is none.
func findPython(t *testing.T) string {
	t.Helper()
	var candidates []string
	if p := os.Getenv("PYTHON"); p != "" {
		candidates = append(candidates, p)
	} else {
		for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
			if dir != "" {
				candidates = append(candidates, filepath.Join(dir, "python3"))
			}
		}
	}
	for _, p := range candidates {
		if err := exec.Command(p, "-c", "import psycopg2").Run(); err == nil {
			return p
		}
	}
	t.Skip("no python3 that can import psycopg2 (install python3-psycopg2, or set PYTHON): the Python worker is not tested")
	return ""
}

// pyProc is a Python worker running in the background.
type pyProc struct {
	name     string
	cmd      *exec.Cmd
	log      string
	done     chan struct{}
	code     int
	signaled bool
}

// startPython starts examples/python/worker.py with args and the harness's
// environment (PGWORKER_DATABASE_URL), its output going to a log of its own.
// It is killed at the end of the test, and its log printed if the test failed.
func startPython(s *stack, python, name string, args ...string) *pyProc {
	s.T.Helper()
	script, err := filepath.Abs(pythonWorker)
	if err != nil {
		s.T.Fatal(err)
	}
	p := &pyProc{name: name, log: filepath.Join(s.Dir, name+".log"), done: make(chan struct{}), code: -1}
	logf, err := os.Create(p.log)
	if err != nil {
		s.T.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(python, append([]string{script}, args...)...)
	p.cmd.Env = s.Env
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		s.T.Fatalf("start %s: %v", name, err)
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
			p.code = 0
		case errors.As(err, &ee):
			p.code = ee.ExitCode() // -1 when killed by a signal
		}
		close(p.done)
	}()
	s.T.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if s.T.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 16<<10 {
				b = b[len(b)-16<<10:]
			}
			s.T.Logf("log of %s (pid %d):\n%s", p.name, p.Pid(), b)
		}
	})
	return p
}

func (p *pyProc) Pid() int { return p.cmd.Process.Pid }

func (p *pyProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitPython is the stack's waitFor that also fails as soon as one of the
// Python workers pys has exited without being told to.
func waitPython(s *stack, pys []*pyProc, timeout time.Duration, what string, cond func() bool) {
	s.T.Helper()
	s.waitFor(timeout, what, func() bool {
		for _, p := range pys {
			if !p.signaled && !p.running() {
				b, _ := os.ReadFile(p.log)
				s.T.Fatalf("waiting for %s: %s exited %d:\n%s", what, p.name, p.code, b)
			}
		}
		return cond()
	})
}

func (p *pyProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	p.signaled = true
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// kill kills the worker with SIGKILL and waits for it to die.
func (p *pyProc) kill(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	<-p.done
}

// wait waits for the worker to exit and returns its exit code (-1 when a
// signal killed it), failing the test after timeout.
func (p *pyProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}
