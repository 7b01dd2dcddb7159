package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start starts w and stops it (StopAndCancel) at the end of the test.
func start(t testing.TB, pool *pgxpool.Pool, cfg *worker.Config) *worker.Worker {
	t.Helper()
	w, err := worker.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		if err := w.StopAndCancel(ctx); err != nil {
			t.Errorf("StopAndCancel: %v", err)
		}
	})
	return w
}

// settled waits until w listens and has looked for work after connecting, so
// that from then on only doorbells and the safety net make it claim.
func settled(t testing.TB, w *worker.Worker) {
	t.Helper()
	waitFor(t, "the worker to listen and look once", func() bool {
		s := w.Stats()
		return s.Listening && s.Claims >= 2
	})
}

// patience bounds every wait for something that must happen: long enough
// for a machine loaded by other suites, so that only a defect times out.
const patience = 2 * time.Minute

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testhelp.WaitFor(t, patience, what, cond)
}

func insert(t testing.TB, pool *pgxpool.Pool, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"INSERT INTO files.files (source) SELECT 'src-' || g FROM generate_series(1, $1::int) g RETURNING id", n)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func waitCount(t testing.TB, pool *pgxpool.Pool, want int, sql string, args ...any) {
	t.Helper()
	waitFor(t, sql, func() bool { return count(t, pool, sql, args...) == want })
}

// logCapture collects a worker's log lines.
type logCapture struct{ testhelp.SyncBuffer }

func (l *logCapture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// problems returns the WARN and ERROR lines.
func (l *logCapture) problems() []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return out
}

// gate is a handler that blocks until opened or its context ends.
type gate struct {
	started chan *worker.Job
	open    chan struct{}
	causes  chan error
}

func newGate() *gate {
	return &gate{started: make(chan *worker.Job, 100), open: make(chan struct{}), causes: make(chan error, 100)}
}

func (g *gate) Handle(ctx context.Context, job *worker.Job) (*worker.Result, error) {
	g.started <- job
	select {
	case <-g.open:
		return &worker.Result{Output: map[string]any{"id": job.ID}}, nil
	case <-ctx.Done():
		g.causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}
}

func (g *gate) next(t testing.TB, what string) *worker.Job {
	t.Helper()
	return receive(t, g.started, "no handler started: "+what)
}

func (g *gate) cause(t testing.TB) error {
	t.Helper()
	return receive(t, g.causes, "handler context not cancelled")
}

// receive waits for the next value of ch; after patience it fails the test
// with failure.
func receive[T any](t testing.TB, ch <-chan T, failure string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatal(failure)
		var zero T
		return zero
	}
}

// noop completes every job.
var noop = worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) { return nil, nil })
