package blob_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/miniotest"
)

func TestMain(m *testing.M) {
	code := miniotest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// backend opens an empty store of one kind for a test, closed at its end.
type backend struct {
	name string
	open func(t testing.TB, opts blob.Options) blob.Store
}

var backends = []backend{
	{"file", openFile},
	{"s3", openS3},
}

func openFile(t testing.TB, opts blob.Options) blob.Store {
	t.Helper()
	return openStore(t, fileURL(t.TempDir()), opts)
}

// openS3 opens a store under a prefix in a fresh bucket of the shared MinIO.
func openS3(t testing.TB, opts blob.Options) blob.Store {
	t.Helper()
	srv := miniotest.Shared(t)
	return openStore(t, "s3://"+srv.Bucket(t)+"/some/prefix", s3Options(srv, opts))
}

// s3Options fills in where srv is, and test-sized parts and retries.
func s3Options(srv *miniotest.Server, opts blob.Options) blob.Options {
	opts.Endpoint = srv.Endpoint
	opts.AccessKeyID = srv.AccessKey
	opts.SecretAccessKey = srv.SecretKey
	opts.Region = "us-east-1"
	if opts.PartSize == 0 {
		opts.PartSize = 5 << 20
	}
	if opts.Retry.Attempts == 0 {
		opts.Retry = blob.Retry{Attempts: 3, Backoff: 20 * time.Millisecond}
	}
	return opts
}

func openStore(t testing.TB, rawURL string, opts blob.Options) blob.Store {
	t.Helper()
	s, err := blob.Open(context.Background(), rawURL, &opts)
	if err != nil {
		t.Fatalf("open %s: %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func fileURL(dir string) string { return (&url.URL{Scheme: "file", Path: dir}).String() }

// pattern returns n deterministic pseudo-random bytes as a stream.
func pattern(seed byte, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{seed}), n)
}

func patternSum(seed byte, n int64) string {
	h := sha256.New()
	if _, err := io.Copy(h, pattern(seed, n)); err != nil {
		panic(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writePattern writes pattern(seed, n) to a new file in dir.
func writePattern(t testing.TB, dir string, seed byte, n int64) string {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("pattern-%d-%d", seed, n))
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, pattern(seed, n)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func fileSum(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// hashWriter hashes what it is given.
type hashWriter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func newHashWriter() *hashWriter { return &hashWriter{h: sha256.New()} }

func (w *hashWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return w.h.Write(p)
}

func (w *hashWriter) sum() string { return hex.EncodeToString(w.h.Sum(nil)) }

// recorder is a slog.Handler that keeps the messages logged, for tests that
// check that a retry happened.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}

func (r *recorder) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}
