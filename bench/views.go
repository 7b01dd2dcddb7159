package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pgworker/pgworker/queue"
)

// The statements of the views mode: a table with a long history (most rows
// ended, a backlog, a row held by every live slot), the attempts of that
// history, and the fleet's slots, live and stopped, all inserted by the
// server; then the operator queries, each timed on its own.
const (
	// Rows $1..$2 of Queue: 85% done, 5% failed, 10% pending, ended over
	// the last two hours; one in a hundred in a batch.
	sqlInsertViewRows = `
INSERT INTO files.files (queue, source, state, attempt, batch, created_at, claimed_at, finished_at, last_error)
SELECT $3, 'bench/views/' || i,
       CASE WHEN i % 100 < 85 THEN 'done' WHEN i % 100 < 90 THEN 'failed' ELSE 'pending' END,
       CASE WHEN i % 100 < 90 THEN 1 ELSE 0 END,
       CASE WHEN i % 100 = 0 THEN 'pgworker-bench-views-' || (i / 1000000) END,
       now() - interval '3 hours', now() - interval '2 hours',
       CASE WHEN i % 100 < 90 THEN now() - interval '2 hours' + (i::double precision / $2) * interval '2 hours' END,
       CASE WHEN i % 100 >= 85 AND i % 100 < 90 THEN 'exit status 3' END
FROM generate_series($1::bigint, $2::bigint) i`
	// $1 live slots on $1/16 nodes, and as many stopped ones.
	sqlInsertViewWorkers = `
INSERT INTO files.workers (worker_id, node, pid, slot, state, version, last_heartbeat_at, stopped_at)
SELECT '` + viewsSlots + `bench-node-' || (g / 16) || ':' || (1000 + g / 16) || ':' || (g % 16) || CASE WHEN g >= $1 THEN ':old' ELSE '' END,
       'bench-node-' || (g / 16), 1000 + g / 16, g % 16,
       CASE WHEN g < $1 THEN 'active' ELSE 'stopped' END, 'bench', now(),
       CASE WHEN g >= $1 THEN now() - interval '1 day' END
FROM generate_series(0, 2 * $1::int - 1) g`
	// Every live slot holds one of the pending rows, as a claim leaves it.
	sqlHoldViewRows = `
WITH w AS (SELECT worker_id, row_number() OVER (ORDER BY worker_id) AS n FROM files.workers WHERE state = 'active'),
     f AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM (SELECT id FROM files.files WHERE state = 'pending' ORDER BY id LIMIT $1) x)
UPDATE files.files x SET state = 'running', worker_id = w.worker_id, attempt = 1, claimed_at = now(),
       lease_expires_at = now() + interval '15 seconds'
FROM w JOIN f USING (n) WHERE x.id = f.id`
	// Attempts $1..$2 of the $3 rows, in the order they ended (as the SQL
	// API writes them), by the live and the stopped slots.
	sqlInsertViewAttempts = `
INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, error, exit_code, duration)
SELECT 1 + (i * 7919) % $3, $6::text, 1,
       '` + viewsSlots + `bench-node-' || ((i % (2 * $4)) / 16) || ':' || (1000 + (i % (2 * $4)) / 16) || ':' || (i % 16)
           || CASE WHEN i % (2 * $4) >= $4 THEN ':old' ELSE '' END,
       now() - interval '2 hours' + (i::double precision / $5) * interval '2 hours' - interval '20 seconds',
       now() - interval '2 hours' + (i::double precision / $5) * interval '2 hours',
       CASE WHEN i % 20 = 0 THEN 'failed' ELSE 'done' END, CASE WHEN i % 20 = 0 THEN 'exit status 3' END,
       CASE WHEN i % 20 = 0 THEN 3 ELSE 0 END, (15 + i % 10) * interval '1 second'
FROM generate_series($1::bigint, $2::bigint) i`
	sqlAnalyzeViews       = `ANALYZE files.files; ANALYZE files.attempts; ANALYZE files.workers; ANALYZE files.queue_counts`
	sqlDeleteViewsBatches = `DELETE FROM files.batches WHERE batch LIKE 'pgworker-bench-views-%'`
	// The slots go with the run, live ones too: the modes after it would
	// find them and refuse to run beside them.
	sqlDeleteViewsSlots = `DELETE FROM files.workers WHERE worker_id LIKE '` + viewsSlots + `%'`
)

// viewsSlots starts the ids of the slots Views makes up.
const viewsSlots = workerPrefix + "views:"

// ViewsConfig sizes a Views run.
type ViewsConfig struct {
	// Rows in files.files. Defaults to 10,000,000.
	Rows int
	// Attempts in files.attempts. Defaults to 10,000,000.
	Attempts int
	// Slots alive (each holding a row), and as many stopped. Defaults to 2,000.
	Slots int
	// Queries is how many times each read is timed. Defaults to 20.
	Queries int
}

// ViewQuery is one operator query and its timings.
type ViewQuery struct {
	Name string `json:"name"`
	SQL  string `json:"sql"`
	Percentiles
}

// ViewsResult is what Views measured.
type ViewsResult struct {
	Setup
	Rows     int         `json:"rows"`
	Attempts int         `json:"attempts"`
	Slots    int         `json:"slots"`
	Reads    int         `json:"reads"` // timed reads of each query
	SeedS    float64     `json:"seed_s"`
	Queries  []ViewQuery `json:"queries"`
}

// viewQueries are what operators, pgworker status, scale-hint, the metrics
// endpoint and the dashboard read; each reads every column of every line
// (a count alone would let the planner leave joins out) and returns one
// number to scan.
var viewQueries = []struct{ name, sql string }{
	{"files.queue_summary", `SELECT sum(length(v::text)) FROM files.queue_summary v`},
	{"files.queue_stats", `SELECT sum(length(v::text)) FROM files.queue_stats v`},
	{"files.active_workers", `SELECT sum(length(v::text)) FROM files.active_workers v`},
	{"files.worker_metrics", `SELECT sum(length(v::text)) FROM files.worker_metrics v`},
	{"files.batch_progress", `SELECT sum(length(v::text)) FROM files.batch_progress v`},
	{"files.scaling_hint()", `SELECT sum(length(v::text)) FROM files.scaling_hint() v`},
}

// Views builds a table with a long history and times every operator query
// on it, and pgworker status's read of them (queue.Client.Status).
func (b *Bench) Views(ctx context.Context, cfg *ViewsConfig) (*ViewsResult, error) {
	c := ViewsConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 10_000_000)
	c.Attempts = orDefault(c.Attempts, 10_000_000)
	c.Slots = orDefault(c.Slots, 2000)
	c.Queries = orDefault(c.Queries, 20)
	res := &ViewsResult{Rows: c.Rows, Attempts: c.Attempts, Slots: c.Slots, Reads: c.Queries}
	err := b.run(ctx, "views", func(ctx context.Context) error {
		defer b.pool.Exec(context.WithoutCancel(ctx), sqlDeleteViewsBatches) //nolint:errcheck // scratch batches, best effort
		defer func() {
			if _, err := b.pool.Exec(context.WithoutCancel(ctx), sqlDeleteViewsSlots); err != nil {
				b.logger.Warn("bench: delete the slots of views", "error", err)
			}
		}()
		res.Setup = b.setup("views")
		start := time.Now()
		if err := b.fillViews(ctx, &c); err != nil {
			return err
		}
		res.SeedS = round(time.Since(start).Seconds(), 1)
		for _, q := range viewQueries {
			p, err := b.timeQuery(ctx, c.Queries, q.sql)
			if err != nil {
				return err
			}
			res.Queries = append(res.Queries, ViewQuery{Name: q.name, SQL: q.sql, Percentiles: p})
		}
		client := queue.New(b.pool, nil)
		ds := make([]time.Duration, 0, c.Queries)
		for range c.Queries {
			t := time.Now()
			if _, err := client.Status(ctx, nil); err != nil {
				return fmt.Errorf("bench: status: %w", err)
			}
			ds = append(ds, time.Since(t))
		}
		res.Queries = append(res.Queries, ViewQuery{Name: "pgworker status", SQL: "queue.Client.Status", Percentiles: percentiles(ds)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (b *Bench) fillViews(ctx context.Context, c *ViewsConfig) error {
	b.logger.Info("bench: filling files.files", "rows", c.Rows)
	for next := int64(1); next <= int64(c.Rows); next += 1_000_000 {
		last := min(next+999_999, int64(c.Rows))
		if _, err := b.pool.Exec(ctx, sqlInsertViewRows, next, last, Queue); err != nil {
			return fmt.Errorf("bench: fill rows: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, sqlInsertViewWorkers, c.Slots); err != nil {
		return fmt.Errorf("bench: fill slots: %w", err)
	}
	if _, err := b.pool.Exec(ctx, sqlHoldViewRows, c.Slots); err != nil {
		return fmt.Errorf("bench: hold rows: %w", err)
	}
	b.logger.Info("bench: filling files.attempts", "attempts", c.Attempts)
	for next := int64(1); next <= int64(c.Attempts); next += 1_000_000 {
		last := min(next+999_999, int64(c.Attempts))
		if _, err := b.pool.Exec(ctx, sqlInsertViewAttempts, next, last, c.Rows, c.Slots, c.Attempts, Queue); err != nil {
			return fmt.Errorf("bench: fill attempts: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, sqlVacuum); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if _, err := b.pool.Exec(ctx, sqlAnalyzeViews); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}
