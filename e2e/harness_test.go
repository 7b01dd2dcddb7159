package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

// poll is how often waitFor looks again.
const poll = 50 * time.Millisecond

// stack is what one test runs pgworker against: its own database, its own
// buckets or directories, its own scripts and work directories.
type stack struct {
	t     *testing.T
	dir   string
	dbURL string
	db    *pgxpool.Pool
	env   []string

	s3  *miniotest.Server // nil until the test asks for a bucket
	s3c *minio.Client

	procs []*proc // started, in order

	// procAttr is how pgworker processes start (for example as another
	// user); nil: like the test.
	procAttr *syscall.SysProcAttr
}

func newStack(t *testing.T) *stack {
	t.Helper()
	dbURL := pgtest.URL(t)
	s := &stack{
		t:     t,
		dir:   t.TempDir(),
		dbURL: dbURL,
		db:    pgtest.PoolFor(t, dbURL),
	}
	var base []string
	for _, kv := range pgworkerbin.Env() {
		// Nothing of the machine's S3 or MinIO settings may reach pgworker.
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "MINIO_") {
			base = append(base, kv)
		}
	}
	s.env = append(base, "PGWORKER_DATABASE_URL="+dbURL, "PGWORKER_LOG_FORMAT=json")
	return s
}

// bucket creates a bucket on the shared MinIO server and returns its store
// URL, s3://bucket. The first call points pgworker's environment at MinIO.
func (s *stack) bucket() string {
	s.t.Helper()
	if s.s3 == nil {
		s.s3 = miniotest.Shared(s.t)
		tr, err := minio.DefaultTransport(false)
		if err != nil {
			s.t.Fatal(err)
		}
		s.t.Cleanup(tr.CloseIdleConnections)
		c, err := minio.New(s.s3.Host, &minio.Options{
			Creds:     credentials.NewStaticV4(s.s3.AccessKey, s.s3.SecretKey, ""),
			Transport: tr,
		})
		if err != nil {
			s.t.Fatal(err)
		}
		s.s3c = c
		s.env = append(s.env,
			"PGWORKER_S3_ENDPOINT="+s.s3.Endpoint,
			"AWS_ACCESS_KEY_ID="+s.s3.AccessKey,
			"AWS_SECRET_ACCESS_KEY="+s.s3.SecretKey)
	}
	return "s3://" + s.s3.Bucket(s.t)
}

// fileStore creates a directory for a file:// store and returns its URL.
func (s *stack) fileStore(name string) string {
	s.t.Helper()
	dir := filepath.Join(s.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Fatal(err)
	}
	return "file://" + dir
}

// put stores data under key in the store at storeURL (s3:// or file://),
// as a user loading the inputs would, without pgworker.
func (s *stack) put(storeURL, key string, data []byte) {
	s.t.Helper()
	if err := s.tryPut(storeURL, key, data); err != nil {
		s.t.Fatal(err)
	}
}

// tryPut is put for other goroutines than the test's.
func (s *stack) tryPut(storeURL, key string, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch {
	case strings.HasPrefix(storeURL, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(storeURL, "s3://"), "/")
		name := key
		if prefix != "" {
			name = strings.TrimSuffix(prefix, "/") + "/" + key
		}
		if _, err := s.s3c.PutObject(ctx, bucket, name, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			return fmt.Errorf("upload %s to %s: %w", key, storeURL, err)
		}
	case strings.HasPrefix(storeURL, "file://"):
		p := filepath.Join(strings.TrimPrefix(storeURL, "file://"), filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, data, 0o644)
	default:
		return fmt.Errorf("put: unknown store %s", storeURL)
	}
	return nil
}

// get reads the object at a full object URL (s3://bucket/key or
// file:///path) as a user checking the outputs would, without pgworker.
func (s *stack) get(objURL string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch {
	case strings.HasPrefix(objURL, "s3://"):
		bucket, name, _ := strings.Cut(strings.TrimPrefix(objURL, "s3://"), "/")
		obj, err := s.s3c.GetObject(ctx, bucket, name, minio.GetObjectOptions{})
		if err != nil {
			return nil, err
		}
		defer obj.Close()
		return io.ReadAll(obj)
	case strings.HasPrefix(objURL, "file://"):
		u, err := url.Parse(objURL)
		if err != nil {
			return nil, err
		}
		return os.ReadFile(u.Path)
	}
	return nil, fmt.Errorf("unknown object URL %s", objURL)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// script writes an executable shell script and returns its path.
func (s *stack) script(name, body string) string {
	s.t.Helper()
	dir := filepath.Join(s.dir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\nset -u\n"+body), 0o755); err != nil {
		s.t.Fatal(err)
	}
	return p
}

// shq quotes s for a shell script.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// gatedBackend returns a backend that records its pid in pids-ID, then
// blocks until the test opens its gate (openGate), then writes out.txt. It
// forks nothing: echo and read are shell builtins.
func (s *stack) gatedBackend() string {
	s.t.Helper()
	d := shq(s.dir)
	return s.script("gated", `echo $$ >> `+d+`/pids-"$PGWORKER_ID"
read line < `+d+`/gate-"$PGWORKER_ID" || exit 3
echo "$line" > "$PGWORKER_OUTPUT_DIR/out.txt"
`)
}

// makeGates creates the FIFOs that gated backends of rows ids wait on.
func (s *stack) makeGates(ids ...int64) {
	s.t.Helper()
	for _, id := range ids {
		if err := syscall.Mkfifo(s.gatePath(id), 0o600); err != nil {
			s.t.Fatal(err)
		}
	}
}

func (s *stack) gatePath(id int64) string {
	return filepath.Join(s.dir, "gate-"+strconv.FormatInt(id, 10))
}

// openGate lets the gated backend of row id finish, once it is waiting.
func (s *stack) openGate(id int64) {
	s.t.Helper()
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
	b, err := os.ReadFile(filepath.Join(s.dir, "pids-"+strconv.FormatInt(id, 10)))
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

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(poll)
	}
}

// waitFor is waitFor that also gives up as soon as a pgworker process
// that the test did not stop has exited.
func (s *stack) waitFor(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	waitFor(s.t, timeout, what, func() bool {
		for _, p := range s.procs {
			if !p.signaled && p.exited() {
				s.t.Fatalf("waiting for %s: %s exited %d:\n%s", what, p.name, p.code, p.logTail(4000))
			}
		}
		return cond()
	})
}

// --- the binary ---

// pgworker runs a pgworker command to its end.
func (s *stack) pgworker(stdin io.Reader, args ...string) pgworkerbin.Result {
	s.t.Helper()
	return pgworkerbin.Run(s.t, pgworkerBin, stdin, s.env, args...)
}

// enqueue runs pgworker enqueue, which must succeed, with sources as
// arguments after --.
func (s *stack) enqueue(flags []string, sources ...string) {
	s.t.Helper()
	args := append([]string{"enqueue"}, flags...)
	args = append(append(args, "--"), sources...)
	if res := s.pgworker(nil, args...); res.Code != 0 {
		s.t.Fatalf("pgworker %s: exit %d\nstderr: %s", strings.Join(args, " "), res.Code, res.Stderr)
	}
}

// proc is a pgworker process running in the background.
type proc struct {
	t        *testing.T
	name     string
	cmd      *exec.Cmd
	log      string // its stdout and stderr
	done     chan struct{}
	code     int
	signaled bool // by the test: its exit is expected
}

// start starts `pgworker run` with args plus a work directory of its own and
// test-friendly heartbeat settings (which args may override). It is killed
// at the end of the test, and its log printed if the test failed.
func (s *stack) start(args ...string) *proc {
	s.t.Helper()
	name := fmt.Sprintf("run-%d", len(s.procs)+1)
	full := []string{"run",
		"--work-dir", filepath.Join(s.dir, "work-"+name),
		"--heartbeat", "250ms", "--lease-timeout", "5s", "--kill-grace", "2s"}
	return s.startCmd(name, append(full, args...)...)
}

func (s *stack) startCmd(name string, args ...string) *proc {
	s.t.Helper()
	logPath := filepath.Join(s.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(pgworkerBin, args...)
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = s.procAttr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start pgworker %s: %v", strings.Join(args, " "), err)
	}
	p := &proc{t: s.t, name: name, cmd: cmd, log: logPath, done: make(chan struct{}), code: -1}
	s.procs = append(s.procs, p)
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
			p.code = 0
		case errors.As(err, &ee):
			p.code = ee.ExitCode() // -1 when killed by a signal
		}
		close(p.done)
	}()
	s.t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Kill()
			<-p.done
		}
		// The binary is built with the race detector when the tests are.
		if _, race, found := strings.Cut(p.logText(), "WARNING: DATA RACE"); found {
			s.t.Errorf("%s: the race detector found a data race:\n%.32000s", p.name, race)
		}
		if s.t.Failed() {
			s.t.Logf("log of %s (pid %d):\n%s", p.name, p.pid(), p.logTail(16<<10))
		}
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	p.signaled = true
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// wait waits for the process to exit and returns its exit code, failing the
// test after timeout.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func (p *proc) logTail(n int) string {
	s := p.logText()
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// --- the database ---

func (s *stack) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// query runs a query and collects its rows with scan.
func query[T any](s *stack, scan pgx.RowToFunc[T], sql string, args ...any) []T {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	rs, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rs, scan)
	if err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// count runs a query that returns one number.
func (s *stack) count(query string, args ...any) int {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	var n int
	if err := s.db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		s.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (s *stack) exec(query string, args ...any) {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	if _, err := s.db.Exec(ctx, query, args...); err != nil {
		s.t.Fatalf("%s: %v", query, err)
	}
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
	s.t.Helper()
	return query(s, scanRow, `SELECT `+rowColumns+` FROM files.files ORDER BY id`)
}

func (s *stack) row(id int64) row {
	s.t.Helper()
	rs := query(s, scanRow, `SELECT `+rowColumns+` FROM files.files WHERE id = $1`, id)
	if len(rs) != 1 {
		s.t.Fatalf("row %d does not exist", id)
	}
	return rs[0]
}

// state returns the state of row id.
func (s *stack) state(id int64) string {
	s.t.Helper()
	return s.row(id).State
}

// waitState waits until row id is in state.
func (s *stack) waitState(timeout time.Duration, id int64, state string) {
	s.t.Helper()
	s.waitFor(timeout, fmt.Sprintf("row %d to be %s", id, state), func() bool { return s.state(id) == state })
}

// waitSettled waits until no row is pending or running.
func (s *stack) waitSettled(timeout time.Duration) {
	s.t.Helper()
	s.waitFor(timeout, "every row to reach a terminal state", func() bool {
		return s.count(`SELECT count(*) FROM files.files WHERE state IN ('pending', 'running')`) == 0
	})
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
	s.t.Helper()
	return query(s, func(rs pgx.CollectableRow) (attempt, error) {
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
	s.t.Helper()
	return query(s, pgx.RowTo[string], `SELECT state FROM files.workers WHERE pid = $1 ORDER BY slot`, pid)
}

// waitSlots waits until process pid has n slots, all in state.
func (s *stack) waitSlots(timeout time.Duration, pid, n int, state string) {
	s.t.Helper()
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
	s.t.Helper()
	return query(s, pgx.RowTo[int64], `SELECT f.id FROM files.files f JOIN files.workers w USING (worker_id)
		WHERE f.state = 'running' AND w.pid = $1 ORDER BY f.id`, pid)
}

// workerPID returns the pid recorded for a worker id.
func (s *stack) workerPID(workerID string) int {
	s.t.Helper()
	return s.count(`SELECT pid FROM files.workers WHERE worker_id = $1`, workerID)
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
		if sum := sha256Hex(b); sum != o.SHA256 || int64(len(b)) != o.Size {
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
