// Package miniotest runs a real MinIO server for tests: on 127.0.0.1, on a
// free port, with a throwaway data directory and generated credentials. A
// test package shares one server and gives each test its own bucket:
//
//	func TestMain(m *testing.M) { os.Exit(miniotest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		srv := miniotest.Shared(t)
//		bucket := srv.Bucket(t)
//		// connect to srv.Endpoint with srv.AccessKey and srv.SecretKey
//	}
//
// Fault tests take a server of their own (New) and Stop, Kill, Pause,
// Resume, Start or Restart it. The MinIO binary is $PGWORKER_TEST_MINIO, else bin/minio at
// the module root, which `make tools` builds.
package miniotest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// Config configures Start. The zero value works.
type Config struct {
	// Binary is the MinIO server binary. Defaults to $PGWORKER_TEST_MINIO,
	// else bin/minio at the module root.
	Binary string
	// MemLimit caps MinIO's memory (MINIO_MEMLIMIT). Defaults to "1GiB".
	MemLimit string
	// StartTimeout bounds the wait for the server to answer. Defaults to 60s.
	StartTimeout time.Duration
}

// Server is a running (or stopped) MinIO server.
type Server struct {
	// Endpoint is "http://127.0.0.1:PORT"; Host is "127.0.0.1:PORT". Both
	// stay the same across Stop and Start.
	Endpoint string
	Host     string
	// AccessKey and SecretKey are the root credentials.
	AccessKey string
	SecretKey string

	cfg     Config
	dir     string // holds data/ and minio.log
	client  *minio.Client
	tr      *http.Transport
	console string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Binary returns the path of the MinIO binary, or an error saying how to get it.
func Binary() (string, error) {
	if p := os.Getenv("PGWORKER_TEST_MINIO"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("PGWORKER_TEST_MINIO=%s: %w", p, err)
		}
		return p, nil
	}
	root, err := testhelp.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("%w: set PGWORKER_TEST_MINIO to the MinIO binary", err)
	}
	p := filepath.Join(root, "bin", "minio")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("MinIO server binary %s is missing: run `make tools` (or set PGWORKER_TEST_MINIO)", p)
	}
	return p, nil
}

// Start starts a server and waits until it answers. Close it when done.
func Start(cfg *Config) (*Server, error) {
	s := &Server{}
	if cfg != nil {
		s.cfg = *cfg
	}
	if s.cfg.Binary == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		s.cfg.Binary = bin
	}
	if s.cfg.MemLimit == "" {
		s.cfg.MemLimit = "1GiB"
	}
	if s.cfg.StartTimeout <= 0 {
		s.cfg.StartTimeout = 60 * time.Second
	}
	port, err := testhelp.FreePort()
	if err != nil {
		return nil, err
	}
	cport, err := testhelp.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "miniotest-")
	if err != nil {
		return nil, err
	}
	s.dir = dir
	s.Host = fmt.Sprintf("127.0.0.1:%d", port)
	s.console = fmt.Sprintf("127.0.0.1:%d", cport)
	s.Endpoint = "http://" + s.Host
	s.AccessKey = "test-" + testhelp.RandomHex(6)
	s.SecretKey = testhelp.RandomHex(20)
	s.tr = &http.Transport{DisableKeepAlives: true}
	s.client, err = minio.New(s.Host, &minio.Options{
		Creds:     credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Transport: s.tr,
		Region:    "us-east-1",
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// New starts a server of the test's own, closed when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start(nil)
	if err != nil {
		t.Fatalf("start MinIO: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close MinIO: %v", err)
		}
	})
	return s
}

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns the server that the tests of this process share, starting
// it on first use. Main closes it; without Main, it dies with the process.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() { shared.srv, shared.err = Start(nil) })
	if shared.err != nil {
		t.Fatalf("start MinIO: %v", shared.err)
	}
	return shared.srv
}

// Main runs the tests and then closes the shared server, if one started.
// It returns the exit code for os.Exit.
func Main(m *testing.M) int {
	code := m.Run()
	if err := CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, "miniotest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// CloseShared closes the shared server, if one started.
func CloseShared() error {
	if shared.srv == nil {
		return nil
	}
	return shared.srv.Close()
}

// Start starts the stopped server again, with the same port, credentials
// and data, and waits until it answers.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("MinIO is already running")
	}
	logf, err := os.OpenFile(s.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.cfg.Binary, "server", "--quiet",
		"--address", s.Host, "--console-address", s.console, filepath.Join(s.dir, "data"))
	cmd.Env = append(environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=on",
		"MINIO_MEMLIMIT="+s.cfg.MemLimit,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.cfg.Binary, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	if err := s.waitReady(done); err != nil {
		_ = cmd.Process.Kill()
		<-done
		s.cmd, s.done = nil, nil
		return fmt.Errorf("%w\n%s", err, s.LogTail())
	}
	return nil
}

// environ is the test's environment without MinIO's and AWS's variables,
// which would reconfigure the server.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MINIO_") && !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return env
}

func (s *Server) waitReady(done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StartTimeout)
	defer cancel()
	client := &http.Client{Transport: s.tr, Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/minio/health/ready", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return errors.New("MinIO exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("MinIO did not answer within %s", s.cfg.StartTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops the server gracefully (SIGTERM), killing it after 10s.
func (s *Server) Stop() error { return s.halt(sigTerm, 10*time.Second) }

// Kill kills the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() error { return s.halt(os.Kill, 0) }

func (s *Server) halt(sig os.Signal, grace time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if sigCont != nil {
		_ = s.cmd.Process.Signal(sigCont) // a paused server handles SIGTERM only once resumed
	}
	select {
	case <-s.done:
	case <-time.After(grace):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd, s.done = nil, nil
	return nil
}

// Pause freezes the server (SIGSTOP): connections stay open and new ones
// are accepted by the kernel, but nothing answers, as with a hung server.
func (s *Server) Pause() error { return s.signal(sigStop) }

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume() error { return s.signal(sigCont) }

func (s *Server) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sig == nil {
		return errors.New("not supported on this platform")
	}
	if s.cmd == nil {
		return errors.New("MinIO is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Restart kills the server and starts it again on the same port and data.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.Start()
}

// Close stops the server and removes its data.
func (s *Server) Close() error {
	err := s.Kill()
	s.tr.CloseIdleConnections()
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// LogFile is the file that receives the server's output.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "minio.log") }

// LogTail returns the last lines of the server's output, for error messages.
func (s *Server) LogTail() string {
	b, err := os.ReadFile(s.LogFile())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err.Error()
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "MinIO log:\n" + string(b)
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(ctx context.Context, name string) error {
	return s.client.MakeBucket(ctx, name, minio.MakeBucketOptions{})
}

// Bucket creates a bucket for the test, named after it.
func (s *Server) Bucket(t testing.TB) string {
	t.Helper()
	name := bucketName(t.Name())
	if err := s.MakeBucket(context.Background(), name); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
	return name
}

// bucketName turns a test name into a unique valid bucket name.
func bucketName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 40 {
		name = strings.Trim(name[:40], "-")
	}
	return "t-" + name + "-" + testhelp.RandomHex(4)
}
