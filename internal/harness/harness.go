// Package harness runs pgworker the way an operator does, for the end-to-end
// tests (e2e) and the fault suite (faults): real `pgworker` processes against
// a database and stores of the test's own, with the helpers both need to
// enqueue, count rows, wait for them to settle and read the outputs back.
//
//	h := harness.New(t, bin, &harness.Config{Strict: true})
//	in := h.Bucket()
//	h.Put(in, "a.txt", []byte("hello"))
//	h.Enqueue(nil, "a.txt")
//	h.Start("run-1", nil, "run", "--exec", "cp {input} {output_dir}", "--input-store", in)
//	h.WaitSettled(time.Minute)
//
// Every process is killed at the end of its test; its log is printed when the
// test failed, and a data race it reports (the binary has the race detector
// when the tests do) fails the test.
package harness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// Poll is how often waits look again.
const Poll = 100 * time.Millisecond

// Config chooses what a Harness runs against. A nil Config: a fresh database
// on the shared test server, the shared MinIO server once a bucket is asked for.
type Config struct {
	// DatabaseURL is a migrated database (a private cluster's, for example).
	// Defaults to a fresh database on the shared test server (pgtest.URL).
	DatabaseURL string
	// MinIO is the server Bucket creates buckets on. Defaults to the shared
	// server (miniotest.Shared).
	MinIO *miniotest.Server
	// Strict makes every wait fail as soon as a query fails or a process
	// that the test did not signal has exited. Defaults to false, for
	// scenarios that take the database away: errors count as "not yet".
	Strict bool
}

// Harness is one test's world: its database, its stores, its directory and
// the pgworker processes it runs.
type Harness struct {
	T           *testing.T
	Bin         string // the pgworker binary
	Dir         string // the test's temporary directory
	DatabaseURL string // superuser URL of the test's database
	DB          *pgxpool.Pool
	// Env is the environment of every pgworker process: the test's, without
	// the machine's pgworker, libpq, S3 and MinIO settings, plus
	// PGWORKER_DATABASE_URL, JSON logs and, once Bucket was called, MinIO's
	// endpoint and credentials.
	Env []string
	// SysProcAttr is how processes start (for example as another user) when
	// Start is given none; nil: like the test.
	SysProcAttr *syscall.SysProcAttr

	S3       *miniotest.Server // nil until Bucket
	S3Client *minio.Client

	host   string // os.Hostname, the node part of worker ids
	minio  *miniotest.Server
	strict bool

	mu    sync.Mutex
	procs []*Proc
}

// New returns the harness of test t, running the pgworker binary bin.
func New(t *testing.T, bin string, cfg *Config) *Harness {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	h := &Harness{T: t, Bin: bin, Dir: t.TempDir(), DatabaseURL: cfg.DatabaseURL, minio: cfg.MinIO, strict: cfg.Strict}
	if h.DatabaseURL == "" {
		h.DatabaseURL = pgtest.URL(t)
	}
	h.DB = pgtest.PoolFor(t, h.DatabaseURL)
	var err error
	if h.host, err = os.Hostname(); err != nil || h.host == "" {
		h.host = "localhost"
	}
	for _, kv := range pgworkerbin.Env() {
		// Nothing of the machine's S3 or MinIO settings may reach pgworker.
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "MINIO_") {
			h.Env = append(h.Env, kv)
		}
	}
	h.Env = append(h.Env, "PGWORKER_DATABASE_URL="+h.DatabaseURL, "PGWORKER_LOG_FORMAT=json")
	return h
}

// --- stores ---

// Bucket creates a bucket and returns its store URL, s3://bucket. The first
// call points the processes' environment at MinIO.
func (h *Harness) Bucket() string {
	h.T.Helper()
	if h.S3 == nil {
		s3 := h.minio
		if s3 == nil {
			s3 = miniotest.Shared(h.T)
		}
		tr, err := minio.DefaultTransport(false)
		if err != nil {
			h.T.Fatal(err)
		}
		h.T.Cleanup(tr.CloseIdleConnections)
		c, err := minio.New(s3.Host, &minio.Options{
			Creds:     credentials.NewStaticV4(s3.AccessKey, s3.SecretKey, ""),
			Transport: tr,
		})
		if err != nil {
			h.T.Fatal(err)
		}
		h.S3, h.S3Client = s3, c
		h.Env = append(h.Env,
			"PGWORKER_S3_ENDPOINT="+s3.Endpoint,
			"AWS_ACCESS_KEY_ID="+s3.AccessKey,
			"AWS_SECRET_ACCESS_KEY="+s3.SecretKey)
	}
	return "s3://" + h.S3.Bucket(h.T)
}

// FileStore creates a directory for a file:// store and returns its URL.
func (h *Harness) FileStore(name string) string {
	h.T.Helper()
	dir := filepath.Join(h.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.T.Fatal(err)
	}
	return "file://" + dir
}

// Put stores data under key in the store at storeURL (s3:// or file://),
// as a user loading the inputs would, without pgworker.
func (h *Harness) Put(storeURL, key string, data []byte) {
	h.T.Helper()
	if err := h.TryPut(storeURL, key, data); err != nil {
		h.T.Fatal(err)
	}
}

// TryPut is Put for other goroutines than the test's.
func (h *Harness) TryPut(storeURL, key string, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch {
	case strings.HasPrefix(storeURL, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(storeURL, "s3://"), "/")
		name := key
		if prefix != "" {
			name = strings.TrimSuffix(prefix, "/") + "/" + key
		}
		if _, err := h.S3Client.PutObject(ctx, bucket, name, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
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

// Get reads the object at a full object URL (s3://bucket/key or
// file:///path) as a user checking the outputs would, without pgworker.
func (h *Harness) Get(ctx context.Context, objURL string) ([]byte, error) {
	switch {
	case strings.HasPrefix(objURL, "s3://"):
		bucket, name, _ := strings.Cut(strings.TrimPrefix(objURL, "s3://"), "/")
		obj, err := h.S3Client.GetObject(ctx, bucket, name, minio.GetObjectOptions{})
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

// SHA256Hex returns the SHA-256 of b in hex, as manifests record it.
func SHA256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// --- the binary ---

// Pgworker runs a pgworker command to its end.
func (h *Harness) Pgworker(stdin io.Reader, args ...string) pgworkerbin.Result {
	h.T.Helper()
	return pgworkerbin.Run(h.T, h.Bin, stdin, h.Env, args...)
}

// Enqueue runs pgworker enqueue, which must succeed, with sources as
// arguments after --.
func (h *Harness) Enqueue(flags []string, sources ...string) {
	h.T.Helper()
	args := append([]string{"enqueue"}, flags...)
	args = append(append(args, "--"), sources...)
	if res := h.Pgworker(nil, args...); res.Code != 0 {
		h.T.Fatalf("pgworker %s: exit %d\nstderr: %s", strings.Join(args, " "), res.Code, res.Stderr)
	}
}

// ProcConfig is how Start runs one process. A nil ProcConfig: the harness's
// environment and SysProcAttr.
type ProcConfig struct {
	// Env is added to the harness's Env (a later value of a name wins).
	Env []string
	// SysProcAttr defaults to the harness's.
	SysProcAttr *syscall.SysProcAttr
}

// Start starts pgworker with args in the background, its standard output
// and error going to a log file of its own.
func (h *Harness) Start(name string, cfg *ProcConfig, args ...string) *Proc {
	h.T.Helper()
	if cfg == nil {
		cfg = &ProcConfig{}
	}
	attr := cfg.SysProcAttr
	if attr == nil {
		attr = h.SysProcAttr
	}
	p := &Proc{t: h.T, Name: name, Log: filepath.Join(h.Dir, name+".log"), done: make(chan struct{}), code: -1}
	logf, err := os.Create(p.Log)
	if err != nil {
		h.T.Fatal(err)
	}
	defer logf.Close()
	p.Cmd = exec.Command(h.Bin, args...)
	p.Cmd.Env = append(slices.Clone(h.Env), cfg.Env...)
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	p.Cmd.SysProcAttr = attr
	if err := p.Cmd.Start(); err != nil {
		h.T.Fatalf("start pgworker %s: %v", strings.Join(args, " "), err)
	}
	p.Prefix = h.host + ":" + strconv.Itoa(p.Cmd.Process.Pid) + ":"
	go func() {
		p.err = p.Cmd.Wait()
		var ee *exec.ExitError
		switch {
		case p.err == nil:
			p.code = 0
		case errors.As(p.err, &ee):
			p.code = ee.ExitCode() // -1 when killed by a signal
		}
		close(p.done)
	}()
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	h.T.Cleanup(func() {
		if p.Running() {
			_ = p.Cmd.Process.Kill()
			<-p.done
		}
		if n := strings.Count(p.LogText(), "WARNING: DATA RACE"); n > 0 {
			_, race, _ := strings.Cut(p.LogText(), "WARNING: DATA RACE")
			h.T.Errorf("%s: the race detector reported %d data races:\n%.32000s", p.Name, n, race)
		}
		if h.T.Failed() {
			h.T.Logf("log of %s (pid %d):\n%s", p.Name, p.Pid(), p.LogTail(16<<10))
		}
	})
	return p
}

// Procs returns every process started, in order.
func (h *Harness) Procs() []*Proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.procs)
}

// Live returns the processes still running.
func (h *Harness) Live() []*Proc {
	var out []*Proc
	for _, p := range h.Procs() {
		if p.Running() {
			out = append(out, p)
		}
	}
	return out
}

// Proc is a pgworker process running in the background.
type Proc struct {
	t      *testing.T
	Name   string
	Cmd    *exec.Cmd
	Log    string // path of its standard output and error
	Prefix string // worker id prefix of its slots: node:pid:

	done     chan struct{}
	err      error // of Wait, once done
	code     int   // exit code once done; -1 when killed by a signal
	signaled atomic.Bool
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Err is how the process ended (nil: exit 0), once Done.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Code is the exit code, once Done (-1 when killed by a signal).
func (p *Proc) Code() int {
	<-p.done
	return p.code
}

// Signal sends sig: the process's exit is then expected.
func (p *Proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	p.signaled.Store(true)
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Fatalf("signal %s to %s: %v", sig, p.Name, err)
	}
}

// Kill kills the process with SIGKILL and waits for it to die.
func (p *Proc) Kill() {
	p.t.Helper()
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits for the process to exit and returns its exit code, failing the
// test after timeout.
func (p *Proc) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.Name, timeout)
		return -1
	}
}

// LogText is the process's log so far.
func (p *Proc) LogText() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// LogTail is the last n bytes of the process's log.
func (p *Proc) LogTail(n int) string {
	s := p.LogText()
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// --- waiting ---

// WaitFor polls cond until it holds and returns how long that took, failing
// the test after timeout. Errors (the database may be away) count as "not
// yet"; the last one is reported if the deadline passes. With Config.Strict,
// it fails at the first error, or as soon as a process that the test did not
// signal has exited.
func (h *Harness) WaitFor(timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) time.Duration {
	h.T.Helper()
	start := time.Now()
	ok, err := h.Poll(start.Add(timeout), func(ctx context.Context) (bool, error) {
		if h.strict {
			for _, p := range h.Procs() {
				if !p.signaled.Load() && !p.Running() {
					h.T.Fatalf("waiting for %s: %s exited %d:\n%s", what, p.Name, p.code, p.LogTail(4000))
				}
			}
		}
		ok, err := cond(ctx)
		if err != nil && h.strict {
			h.T.Fatalf("waiting for %s: %v", what, err)
		}
		return ok, err
	})
	if !ok {
		h.T.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, err)
	}
	return time.Since(start)
}

// Poll polls cond until it holds or deadline passes, and returns whether it
// held and the last error it returned.
func (h *Harness) Poll(deadline time.Time, cond func(ctx context.Context) (bool, error)) (bool, error) {
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := cond(ctx)
		cancel()
		if err == nil && ok {
			return true, nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return false, last
		}
		time.Sleep(Poll)
	}
}

// --- the database ---

// Count runs a query that returns one integer.
func (h *Harness) Count(ctx context.Context, sql string, args ...any) (int, error) {
	var n int64
	err := h.DB.QueryRow(ctx, sql, args...).Scan(&n)
	return int(n), err
}

// MustCount is Count that fails the test on an error.
func (h *Harness) MustCount(sql string, args ...any) int {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := h.Count(ctx, sql, args...)
	if err != nil {
		h.T.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Exec runs a statement, failing the test on an error.
func (h *Harness) Exec(sql string, args ...any) {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.DB.Exec(ctx, sql, args...); err != nil {
		h.T.Fatalf("%s: %v", sql, err)
	}
}

// Query runs a query and collects its rows with scan, failing the test on
// an error.
func Query[T any](h *Harness, scan pgx.RowToFunc[T], sql string, args ...any) []T {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := h.DB.Query(ctx, sql, args...)
	if err != nil {
		h.T.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rs, scan)
	if err != nil {
		h.T.Fatalf("%s: %v", sql, err)
	}
	return out
}

// Settled reports whether no row is pending or running.
func (h *Harness) Settled(ctx context.Context) (bool, error) {
	n, err := h.Count(ctx, `SELECT count(*) FROM files.files WHERE state IN ('pending', 'running')`)
	return n == 0, err
}

// WaitSettled waits until no row is pending or running.
func (h *Harness) WaitSettled(timeout time.Duration) {
	h.T.Helper()
	h.WaitFor(timeout, "every row to reach a terminal state", h.Settled)
}
