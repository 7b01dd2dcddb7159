package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/miniotest"
)

// rawClient talks to srv without the blob package, to plant what pgworker
// would never write.
func rawClient(t *testing.T, srv *miniotest.Server) *minio.Client {
	t.Helper()
	tr, err := minio.DefaultTransport(false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := minio.New(srv.Host, &minio.Options{
		Creds:     credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""),
		Region:    "us-east-1",
		Transport: tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

func TestS3BadCredentials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := miniotest.Shared(t)
	bucket := srv.Bucket(t)
	good := openStore(t, "s3://"+bucket, s3Options(srv, blob.Options{}))
	if _, err := good.Put(ctx, "k", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	const secret = "definitely-not-the-secret-9f8e7d"
	for name, opts := range map[string]blob.Options{
		"wrong secret": {AccessKeyID: srv.AccessKey, SecretAccessKey: secret},
		"unknown key":  {AccessKeyID: "nobody", SecretAccessKey: secret},
	} {
		t.Run(name, func(t *testing.T) {
			rec := &recorder{}
			o := s3Options(srv, blob.Options{Logger: slog.New(rec)})
			o.AccessKeyID, o.SecretAccessKey = opts.AccessKeyID, opts.SecretAccessKey
			s := openStore(t, "s3://"+bucket, o)
			errs := map[string]error{}
			_, errs["get"] = s.Get(ctx, "k", io.Discard)
			_, errs["stat"] = s.Stat(ctx, "k")
			_, errs["put"] = s.Put(ctx, "k2", strings.NewReader("x"), 1)
			_, errs["put multipart"] = s.Put(ctx, "k3", pattern(1, 11<<20), -1)
			errs["delete"] = s.Delete(ctx, "k")
			for _, err := range s.List(ctx, "") {
				errs["list"] = err
			}
			for op, err := range errs {
				if !errors.Is(err, blob.ErrPermission) || !blob.IsPermanent(err) {
					t.Errorf("%s: err = %v, want permanent ErrPermission", op, err)
					continue
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("%s: the error shows the secret: %v", op, err)
				}
				if !strings.Contains(err.Error(), "s3://"+bucket) {
					t.Errorf("%s: %q does not name the store", op, err)
				}
			}
			if n := rec.count("retrying"); n != 0 {
				t.Errorf("refused credentials were retried %d times", n)
			}
		})
	}
}

func TestS3MissingBucket(t *testing.T) {
	t.Parallel()
	srv := miniotest.Shared(t)
	s := openStore(t, "s3://no-such-bucket-here/x", s3Options(srv, blob.Options{}))
	_, err := s.Get(context.Background(), "k", io.Discard)
	if !errors.Is(err, blob.ErrNotFound) || !blob.IsPermanent(err) {
		t.Errorf("get from a missing bucket: err = %v, want ErrNotFound", err)
	}
	_, err = s.Put(context.Background(), "k", strings.NewReader("x"), 1)
	if !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("put to a missing bucket: err = %v, want ErrNotFound", err)
	}
}

func TestS3Unreachable(t *testing.T) {
	t.Parallel()
	// A port that was free a moment ago: nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	rec := &recorder{}
	s := openStore(t, "s3://bucket", blob.Options{
		Endpoint: "http://" + addr, AccessKeyID: "k", SecretAccessKey: "secret-secret", Region: "us-east-1",
		Retry:  blob.Retry{Attempts: 3, Backoff: 10 * time.Millisecond},
		Logger: slog.New(rec),
	})
	ctx := context.Background()
	_, err = s.Get(ctx, "k", io.Discard)
	if err == nil || blob.IsPermanent(err) {
		t.Errorf("get: err = %v, want a transient error", err)
	}
	_, err = s.Put(ctx, "k", strings.NewReader("x"), 1)
	if err == nil || blob.IsPermanent(err) {
		t.Errorf("put: err = %v, want a transient error", err)
	}
	if n := rec.count("retrying"); n != 4 {
		t.Errorf("%d retries logged, want 2 per call:\n%s", n, rec)
	}
}

func TestS3IntegrityMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := miniotest.Shared(t)
	bucket := srv.Bucket(t)
	raw := rawClient(t, srv)
	body := "what was stored"
	_, err := raw.PutObject(ctx, bucket, "p/bad", strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{
		UserMetadata: map[string]string{"Sha256": strings.Repeat("ab", 32)},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = raw.PutObject(ctx, bucket, "p/foreign", strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, "s3://"+bucket+"/p", s3Options(srv, blob.Options{}))

	_, err = s.Get(ctx, "bad", io.Discard)
	if !errors.Is(err, blob.ErrIntegrity) || !blob.IsPermanent(err) {
		t.Errorf("get: err = %v, want ErrIntegrity", err)
	}
	dir := t.TempDir()
	if _, err := s.GetFile(ctx, "bad", filepath.Join(dir, "bad")); !errors.Is(err, blob.ErrIntegrity) {
		t.Errorf("get file: err = %v, want ErrIntegrity", err)
	}
	assertOnlyFiles(t, dir)

	// An object written by someone else, without the metadata, is checked by size only.
	info, err := s.Get(ctx, "foreign", io.Discard)
	if err != nil || info.Size != int64(len(body)) || info.SHA256 == "" {
		t.Errorf("get foreign = %+v, %v", info, err)
	}
}

// TestS3HostileListedNames plants objects whose names are not valid keys and
// checks that listing skips them, so that no caller is handed one.
func TestS3HostileListedNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := miniotest.Shared(t)
	bucket := srv.Bucket(t)
	raw := rawClient(t, srv)
	planted := 0
	for _, name := range []string{
		"in/ok", "in/a\\..\\..\\x", "in/back\\slash", "in/.pgworker-tmp-1", "in/new\nline", "in/a//b", "in/../up", "in/a/../b",
	} {
		if _, err := raw.PutObject(ctx, bucket, name, strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
			t.Logf("MinIO refuses %q itself: %v", name, err)
			continue
		}
		planted++
	}
	if planted < 3 {
		t.Fatalf("only %d names planted", planted)
	}
	rec := &recorder{}
	s := openStore(t, "s3://"+bucket+"/in", s3Options(srv, blob.Options{Logger: slog.New(rec)}))
	var listed []string
	for info, err := range s.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, info.Key)
	}
	if len(listed) != 1 || listed[0] != "ok" {
		t.Errorf("list = %q, want [ok]", listed)
	}
	if rec.count("skipping") != planted-1 {
		t.Errorf("want %d warnings:\n%s", planted-1, rec)
	}
}

// gate blocks a reader or writer once n bytes have passed, until opened.
type gate struct {
	n       int64
	reached chan struct{} // closed when n bytes have passed
	open    chan struct{} // closed to let the rest pass
	once    sync.Once
}

func newGate(n int64) *gate {
	return &gate{n: n, reached: make(chan struct{}), open: make(chan struct{})}
}

func (g *gate) pass(m int) {
	if g.n -= int64(m); g.n <= 0 {
		g.once.Do(func() { close(g.reached) })
		<-g.open
	}
}

type gatedReader struct {
	r io.Reader
	g *gate
}

func (r gatedReader) Read(p []byte) (int, error) {
	r.g.pass(0)
	n, err := r.r.Read(p[:min(len(p), 64<<10)])
	r.g.pass(n)
	return n, err
}

type gatedWriter struct {
	w io.Writer
	g *gate
}

func (w gatedWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.g.pass(n)
	return n, err
}

// faultOptions retry long enough to outlast a restart of MinIO.
func faultOptions(srv *miniotest.Server, rec *recorder) blob.Options {
	return s3Options(srv, blob.Options{
		Retry:       blob.Retry{Attempts: 30, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second},
		IdleTimeout: time.Second,
		Logger:      slog.New(rec),
	})
}

// fault runs the interruption while g holds a transfer, lets the transfer
// go on, and recovers once the store has logged a retry: the fault hit it.
func fault(t *testing.T, g *gate, rec *recorder, interrupt, recover func() error) {
	t.Helper()
	go func() {
		<-g.reached
		if err := interrupt(); err != nil {
			t.Errorf("interrupt: %v", err)
		}
		close(g.open)
		for deadline := time.Now().Add(2 * time.Minute); rec.count("retrying") == 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if err := recover(); err != nil {
			t.Errorf("recover: %v", err)
		}
	}()
}

// TestS3Faults interrupts transfers in the middle, by killing MinIO and by
// freezing it, and checks that they are retried and then succeed.
func TestS3Faults(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts MinIO")
	}
	t.Parallel()
	srv := miniotest.New(t)
	bucket := srv.Bucket(t)
	const size = 40 << 20
	want := patternSum(7, size)
	ctx := context.Background()

	faults := []struct {
		name               string
		interrupt, recover func() error
	}{
		{"restart", srv.Kill, srv.Start},
		{"hang", srv.Pause, srv.Resume},
	}
	for _, f := range faults {
		t.Run(f.name+"/download", func(t *testing.T) {
			rec := &recorder{}
			s := openStore(t, "s3://"+bucket, faultOptions(srv, rec))
			if _, err := s.Put(ctx, "big", pattern(7, size), size); err != nil {
				t.Fatal(err)
			}
			g := newGate(8 << 20)
			fault(t, g, rec, f.interrupt, f.recover)
			w := newHashWriter()
			info, err := s.Get(ctx, "big", gatedWriter{w, g})
			if err != nil || info.SHA256 != want || w.sum() != want {
				t.Fatalf("get = %+v, %v; wrote sha256 %s, want %s\n%s", info, err, w.sum(), want, rec)
			}
			if rec.count("retrying") == 0 {
				t.Errorf("no retry logged: the fault did not hit the transfer")
			}
		})
		t.Run(f.name+"/upload", func(t *testing.T) {
			rec := &recorder{}
			s := openStore(t, "s3://"+bucket, faultOptions(srv, rec))
			g := newGate(12 << 20) // inside the third part
			fault(t, g, rec, f.interrupt, f.recover)
			info, err := s.Put(ctx, "up-"+f.name, gatedReader{pattern(7, size), g}, -1)
			if err != nil || info.SHA256 != want || info.Size != size {
				t.Fatalf("put = %+v, %v\n%s", info, err, rec)
			}
			if rec.count("retrying") == 0 {
				t.Errorf("no retry logged: the fault did not hit the transfer")
			}
			w := newHashWriter()
			if _, err := s.Get(ctx, "up-"+f.name, w); err != nil || w.sum() != want {
				t.Fatalf("get after put: %v, sha256 %s", err, w.sum())
			}
		})
	}
}

func TestS3StampsStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openS3(t, blob.Options{})
	info, err := s.Put(ctx, "stream", pattern(3, 11<<20), -1)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat(ctx, "stream")
	if err != nil || st.SHA256 != info.SHA256 || st.ETag != info.ETag {
		t.Errorf("stat = %+v, %v; put said %+v", st, err, info)
	}
	var buf bytes.Buffer
	if _, err := s.Get(ctx, "stream", &buf); err != nil || buf.Len() != 11<<20 {
		t.Errorf("get: %v, %d bytes", err, buf.Len())
	}
}

func TestS3CAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, opts := range map[string]blob.Options{
		"missing": {Endpoint: "https://127.0.0.1:1", CAFile: filepath.Join(dir, "absent.pem")},
		"not PEM": {Endpoint: "https://127.0.0.1:1", CAFile: bad},
	} {
		if s, err := blob.Open(ctx, "s3://bucket", &opts); err == nil {
			s.Close()
			t.Errorf("%s CA file: Open succeeded", name)
		}
	}
}
