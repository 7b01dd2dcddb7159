package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/testutil"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// fixture is a handler on file:// stores whose backend copies its input.
type fixture struct {
	workDir string
	handler *pipeline.Handler
}

func newFixture(t *testing.T, input blob.Store, wait time.Duration) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if input == nil {
		in := filepath.Join(dir, "in")
		if err := os.MkdirAll(in, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in, "a.txt"), []byte("hello\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		if input, err = blob.Open(ctx, "file://"+in, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := blob.Open(ctx, "file://"+filepath.Join(dir, "out"), nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := backend.New(&backend.Config{Command: "cp {input} {output_dir}"})
	if err != nil {
		t.Skip(err)
	}
	f := &fixture{workDir: filepath.Join(dir, "work")}
	f.handler, err = pipeline.New(&pipeline.Config{
		Resolver: blob.NewResolver(input), Output: out, Runner: runner, WorkDir: f.workDir, WorkDirWait: wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func job() *worker.Job {
	return &worker.Job{ID: 7, Queue: "default", Source: "a.txt", Payload: json.RawMessage("{}"), Attempt: 1, MaxAttempts: 5, WorkerID: "w:1:0"}
}

// breakWorkDir replaces the work directory with a regular file (which stops
// root too) and returns the function that puts it back.
func (f *fixture) breakWorkDir(t *testing.T) (repair func()) {
	t.Helper()
	if err := os.Rename(f.workDir, f.workDir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.workDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(f.workDir); err != nil {
			t.Error(err)
		}
		if err := os.Rename(f.workDir+".away", f.workDir); err != nil {
			t.Error(err)
		}
	}
}

func TestHandleCopies(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 0)
	res, err := f.handler.Handle(context.Background(), job())
	if err != nil {
		t.Fatal(err)
	}
	m := res.Output.(*pipeline.Manifest)
	if len(m.Outputs) != 1 || m.Outputs[0].Size != 6 || !strings.HasPrefix(m.Outputs[0].Key, "7/1-") {
		t.Fatalf("manifest: %+v", m)
	}
}

// A work directory that comes back within WorkDirWait costs the row nothing.
func TestHandleWaitsForWorkDir(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, time.Minute)
	repair := f.breakWorkDir(t)
	done := make(chan error, 1)
	go func() {
		_, err := f.handler.Handle(context.Background(), job())
		done <- err
	}()
	// The gate closes when the attempt meets the broken directory; the
	// attempt then waits for it.
	testutil.WaitFor(t, time.Minute, "the attempt to meet the broken work directory", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Handle returned %v while the work directory was unusable", err)
		default:
		}
		return !f.handler.Gate().Open()
	})
	if err := f.handler.Ready(context.Background()); err == nil {
		t.Error("Ready: nil while the work directory is unusable")
	}
	repair()
	if err := <-done; err != nil {
		t.Fatalf("Handle after the repair: %v", err)
	}
	if !f.handler.Gate().Open() {
		t.Error("the gate is still closed after the attempt used the repaired work directory")
	}
}

// A work directory that stays unusable hands the row back with a clear error.
func TestHandleReleasesOnBrokenWorkDir(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 200*time.Millisecond)
	defer f.breakWorkDir(t)()
	_, err := f.handler.Handle(context.Background(), job())
	if !worker.IsRelease(err) || !strings.Contains(err.Error(), "create work directory") {
		t.Fatalf("got %v, want a release that names the work directory", err)
	}
}

// An object store that does not answer through its retries hands the row
// back without spending an attempt, unless the attempt itself was cancelled.
func TestHandleReleasesOnStoreOutage(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	input, err := blob.Open(context.Background(), "s3://bucket", &blob.Options{
		Endpoint: "http://" + addr, AccessKeyID: "k", SecretAccessKey: "s", Region: "us-east-1",
		Retry: blob.Retry{Attempts: 2, Backoff: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, input, 0)
	_, err = f.handler.Handle(context.Background(), job())
	if !worker.IsRelease(err) || worker.IsPermanent(err) {
		t.Fatalf("got %v, want a release", err)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(worker.ErrLeaseLost)
	_, err = f.handler.Handle(ctx, job())
	if err == nil || worker.IsRelease(err) || !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "lease lost") {
		t.Fatalf("cancelled attempt: got %v, want its plain error", err)
	}
}

// A program that fails because its directory went away hands the row back.
func TestHandleReleasesWhenWorkDirVanishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{"in", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "in", "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := blob.Open(ctx, "file://"+filepath.Join(dir, "in"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := blob.Open(ctx, "file://"+filepath.Join(dir, "out"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The program removes its own directory, as a cleaner might, and fails.
	runner, err := backend.New(&backend.Config{Command: "sh -c 'rm -rf \"$0\"; exit 1' {work_dir}"})
	if err != nil {
		t.Skip(err)
	}
	h, err := pipeline.New(&pipeline.Config{Resolver: blob.NewResolver(in), Output: out, Runner: runner, WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Handle(ctx, job())
	if !worker.IsRelease(err) || !strings.Contains(err.Error(), "work directory lost") {
		t.Fatalf("got %v, want a release that says the work directory was lost", err)
	}
}
