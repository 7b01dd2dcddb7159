package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/harness"
)

// stack is what one test runs pgworker against: its own database, its own
// buckets or directories, its own scripts and work directories.
type stack struct {
	*harness.Harness
}

// proc is a pgworker process running in the background.
type proc = harness.Proc

// newStack returns the test's stack. Its waits fail as soon as a query
// fails or a pgworker process that the test did not stop has exited.
func newStack(t *testing.T) *stack {
	t.Helper()
	return &stack{harness.New(t, pgworkerBin, &harness.Config{Strict: true})}
}

// get reads the object at a full object URL (s3://bucket/key or
// file:///path).
func (s *stack) get(objURL string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return s.Get(ctx, objURL)
}

// script writes an executable shell script and returns its path.
func (s *stack) script(name, body string) string {
	s.T.Helper()
	dir := filepath.Join(s.Dir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.T.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\nset -u\n"+body), 0o755); err != nil {
		s.T.Fatal(err)
	}
	return p
}

// shq quotes s for a shell script.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// gatedBackend returns a backend that records its pid in pids-ID, then
// blocks until the test opens its gate (openGate), then writes out.txt. It
// forks nothing: echo and read are shell builtins.
func (s *stack) gatedBackend() string {
	s.T.Helper()
	d := shq(s.Dir)
	return s.script("gated", `echo $$ >> `+d+`/pids-"$PGWORKER_ID"
read line < `+d+`/gate-"$PGWORKER_ID" || exit 3
echo "$line" > "$PGWORKER_OUTPUT_DIR/out.txt"
`)
}

// makeGates creates the FIFOs that gated backends of rows ids wait on.
func (s *stack) makeGates(ids ...int64) {
	s.T.Helper()
	for _, id := range ids {
		if err := syscall.Mkfifo(s.gatePath(id), 0o600); err != nil {
			s.T.Fatal(err)
		}
	}
}

func (s *stack) gatePath(id int64) string {
	return filepath.Join(s.Dir, "gate-"+strconv.FormatInt(id, 10))
}

// openGate lets the gated backend of row id finish, once it is waiting.
func (s *stack) openGate(id int64) {
	s.T.Helper()
	s.waitFor(time.Minute, fmt.Sprintf("the backend of row %d to wait at its gate", id), func() bool {
		// Without a reader, a non-blocking open for writing fails (ENXIO).
		f, err := os.OpenFile(s.gatePath(id), os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return false
		}
		defer f.Close()
		_, err = f.WriteString("go\n")
		return err == nil
	})
}

// backendPIDs returns the pids that gated backends of row id recorded.
func (s *stack) backendPIDs(id int64) []int {
	b, err := os.ReadFile(filepath.Join(s.Dir, "pids-"+strconv.FormatInt(id, 10)))
	if err != nil {
		return nil
	}
	return pids(string(b))
}

func pids(s string) []int {
	var out []int
	for _, f := range strings.Fields(s) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// alive reports whether process pid exists and is not a zombie (an
// orphaned child may wait a while to be reaped by init).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state != 'Z' && state != 'X'
}

// waitFor polls cond until it holds, failing the test after timeout, or as
// soon as a pgworker process that the test did not stop has exited.
func (s *stack) waitFor(timeout time.Duration, what string, cond func() bool) {
	s.T.Helper()
	s.WaitFor(timeout, what, func(context.Context) (bool, error) { return cond(), nil })
}

// --- pgworker run ---

// start starts `pgworker run` with args plus a work directory of its own and
// test-friendly heartbeat settings (which args may override). It is killed
// at the end of the test, and its log printed if the test failed.
func (s *stack) start(args ...string) *proc {
	s.T.Helper()
	name := fmt.Sprintf("run-%d", len(s.Procs())+1)
	full := []string{"run",
		"--work-dir", filepath.Join(s.Dir, "work-"+name),
		"--heartbeat", "250ms", "--lease-timeout", "5s", "--kill-grace", "2s"}
	return s.Start(name, nil, append(full, args...)...)
}

// --- the database ---

func (s *stack) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// row is a files.files row.
type row struct {
	ID        int64
	Queue     string
	Source    string
	State     string
	WorkerID  *string
	Attempt   int
	LastError *string
	Result    json.RawMessage
}

func (r row) lastError() string {
	if r.LastError == nil {
		return ""
	}
	return *r.LastError
}

const rowColumns = `id, queue, source, state, worker_id, attempt, last_error, result`

func scanRow(rs pgx.CollectableRow) (row, error) {
	var r row
	err := rs.Scan(&r.ID, &r.Queue, &r.Source, &r.State, &r.WorkerID, &r.Attempt, &r.LastError, &r.Result)
	return r, err
}

// rows returns every row of files.files in id order.
func (s *stack) rows() []row {
	s.T.Helper()
	return harness.Query(s.Harness, scanRow, `SELECT `+rowColumns+` FROM files.files ORDER BY id`)
}

func (s *stack) row(id int64) row {
	s.T.Helper()
	rs := harness.Query(s.Harness, scanRow, `SELECT `+rowColumns+` FROM files.files WHERE id = $1`, id)
	if len(rs) != 1 {
		s.T.Fatalf("row %d does not exist", id)
	}
	return rs[0]
}

// state returns the state of row id.
func (s *stack) state(id int64) string {
	s.T.Helper()
	return s.row(id).State
}

// waitState waits until row id is in state.
func (s *stack) waitState(timeout time.Duration, id int64, state string) {
	s.T.Helper()
	s.waitFor(timeout, fmt.Sprintf("row %d to be %s", id, state), func() bool { return s.state(id) == state })
}

// attempt is a files.attempts row.
type attempt struct {
	FileID     int64
	Attempt    int
	WorkerID   string
	Outcome    string // "" while running
	Error      string
	ExitCode   *int
	StderrTail string
	StartedAt  time.Time
	FinishedAt *time.Time
	Output     json.RawMessage
}

// attempts returns the attempts at row id, oldest first.
func (s *stack) attempts(id int64) []attempt {
	s.T.Helper()
	return harness.Query(s.Harness, func(rs pgx.CollectableRow) (attempt, error) {
		var a attempt
		err := rs.Scan(&a.FileID, &a.Attempt, &a.WorkerID, &a.Outcome, &a.Error, &a.ExitCode,
			&a.StderrTail, &a.StartedAt, &a.FinishedAt, &a.Output)
		return a, err
	}, `SELECT file_id, attempt, worker_id, coalesce(outcome, ''), coalesce(error, ''), exit_code,
		coalesce(stderr_tail, ''), started_at, finished_at, output
		FROM files.attempts WHERE file_id = $1 ORDER BY id`, id)
}

func outcomes(as []attempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Outcome
	}
	return out
}

// slotStates returns the states of the slots of process pid.
func (s *stack) slotStates(pid int) []string {
	s.T.Helper()
	return harness.Query(s.Harness, pgx.RowTo[string], `SELECT state FROM files.workers WHERE pid = $1 ORDER BY slot`, pid)
}

// waitSlots waits until process pid has n slots, all in state.
func (s *stack) waitSlots(timeout time.Duration, pid, n int, state string) {
	s.T.Helper()
	s.waitFor(timeout, fmt.Sprintf("%d slots of pid %d to be %s", n, pid, state), func() bool {
		st := s.slotStates(pid)
		if len(st) != n {
			return false
		}
		for _, x := range st {
			if x != state {
				return false
			}
		}
		return true
	})
}

// heldBy returns the ids of the rows that process pid holds.
func (s *stack) heldBy(pid int) []int64 {
	s.T.Helper()
	return harness.Query(s.Harness, pgx.RowTo[int64], `SELECT f.id FROM files.files f JOIN files.workers w USING (worker_id)
		WHERE f.state = 'running' AND w.pid = $1 ORDER BY f.id`, pid)
}

// workerPID returns the pid recorded for a worker id.
func (s *stack) workerPID(workerID string) int {
	s.T.Helper()
	return s.MustCount(`SELECT pid FROM files.workers WHERE worker_id = $1`, workerID)
}

// --- results ---

// manifest is the result pgworker run records for a completed row.
type manifest struct {
	Input      object   `json:"input"`
	OutputRoot string   `json:"output_root"`
	Outputs    []object `json:"outputs"`
	ExitCode   int      `json:"exit_code"`
	WorkerID   string   `json:"worker_id"`
	Attempt    int      `json:"attempt"`
}

type object struct {
	URL    string `json:"url"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

func (r row) manifest() (manifest, error) {
	var m manifest
	if err := json.Unmarshal(r.Result, &m); err != nil {
		return m, fmt.Errorf("row %d: result %s is not a manifest: %w", r.ID, r.Result, err)
	}
	return m, nil
}

// checkOutputs downloads every output of m and compares it with the
// recorded size and SHA-256. It returns the outputs' contents by key
// relative to the output root.
func (s *stack) checkOutputs(id int64, m manifest) (map[string][]byte, error) {
	got := map[string][]byte{}
	if m.OutputRoot == "" {
		return nil, fmt.Errorf("row %d: manifest without output_root", id)
	}
	for _, o := range m.Outputs {
		if !strings.HasPrefix(o.URL, m.OutputRoot+"/") {
			return nil, fmt.Errorf("row %d: output %s is outside the attempt's root %s", id, o.URL, m.OutputRoot)
		}
		b, err := s.get(o.URL)
		if err != nil {
			return nil, fmt.Errorf("row %d: output %s: %w", id, o.URL, err)
		}
		if sum := harness.SHA256Hex(b); sum != o.SHA256 || int64(len(b)) != o.Size {
			return nil, fmt.Errorf("row %d: output %s has %d bytes, sha256 %s; the manifest says %d bytes, %s",
				id, o.URL, len(b), sum, o.Size, o.SHA256)
		}
		got[strings.TrimPrefix(o.URL, m.OutputRoot+"/")] = b
	}
	return got, nil
}

// parallel runs fn for each i in [0, n) on a few goroutines and returns the
// errors.
func parallel(n, workers int, fn func(i int) error) []error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}
