package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/worker"
)

// Each worker prunes on its own schedule, in calls of PruneRows rows, until
// what the retention lets go is gone; the rows it must keep stay.
func TestWorkerPrunesFinishedRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	exec(t, pool, `INSERT INTO files.files (source, state, finished_at)
		SELECT 'old-' || i, 'done', now() - interval '8 days' FROM generate_series(1, 25) i`)
	exec(t, pool, `INSERT INTO files.files (source, state, finished_at) VALUES ('recent', 'done', now())`)
	exec(t, pool, `INSERT INTO files.files (source, created_at, run_after) VALUES ('waiting', now() - interval '1 year', now() + interval '1 day')`)

	w := start(t, pool, &worker.Config{
		Handler: worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) { return nil, nil }), Slots: 1,
		PruneInterval: 20 * time.Millisecond, PruneRows: 10,
	})
	waitCount(t, pool, 2, "SELECT count(*) FROM files.files")
	waitFor(t, "the pruned counter", func() bool { return w.Stats().Pruned == 25 })
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE source IN ('recent')")
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE source IN ('waiting') AND state = 'pending'")
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
