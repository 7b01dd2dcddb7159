package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of SkipLocked: a table of files.files' shape (its columns,
// defaults and checks, with a partial index on the pending rows as
// files_claim_idx is) in a schema of its own, and the plainest queue on it:
// claim the first pending rows with FOR UPDATE SKIP LOCKED and mark them
// running, then mark them done; one statement and transaction each.
const (
	skipSchema     = "pgworker_bench_skiplocked"
	sqlSkipDrop    = `DROP SCHEMA IF EXISTS ` + skipSchema + ` CASCADE`
	sqlSkipSchema  = `CREATE SCHEMA ` + skipSchema
	sqlSkipTable   = `CREATE TABLE ` + skipSchema + `.files (LIKE files.files INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY, PRIMARY KEY (id))`
	sqlSkipIndex   = `CREATE INDEX ON ` + skipSchema + `.files (queue, priority DESC, id) WHERE state = 'pending'`
	sqlSkipLoad    = `INSERT INTO ` + skipSchema + `.files (queue, source) SELECT $1, 'skiplocked/' || i FROM generate_series(1, $2) i`
	sqlSkipVacuum  = `VACUUM ANALYZE ` + skipSchema + `.files`
	sqlSkipPending = `SELECT count(*) FROM ` + skipSchema + `.files WHERE state <> 'done'`
	sqlSkipClaim   = `UPDATE ` + skipSchema + `.files f SET state = 'running', worker_id = $2, attempt = f.attempt + 1,
    claimed_at = now(), lease_expires_at = now() + interval '15 seconds'
WHERE f.id IN (SELECT id FROM ` + skipSchema + `.files WHERE state = 'pending' AND queue = $1
    ORDER BY priority DESC, id LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING f.id`
	sqlSkipComplete = `UPDATE ` + skipSchema + `.files SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now()
WHERE id = ANY ($1) AND state = 'running'`
)

// SkipLockedConfig sizes a SkipLocked run. A nil or zero config works.
type SkipLockedConfig struct {
	// Rows to burn down. Defaults to 50,000.
	Rows int
	// Clients claiming and completing at once, one connection each.
	// Defaults to 8.
	Clients int
	// Batch is the rows per claim and per completion. Defaults to 100.
	Batch int
}

// SkipLockedResult is what SkipLocked measured.
type SkipLockedResult struct {
	Setup
	Rows    int `json:"rows"`
	Clients int `json:"clients"`
	Batch   int `json:"batch"`
	// ElapsedMS runs from the clients' first claim to the last completion.
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// SkipLocked measures what the database can do for a queue with no queue
// software at all: cfg.Clients connections, each claiming cfg.Batch rows of
// a table shaped like files.files with FOR UPDATE SKIP LOCKED and then
// completing them, until cfg.Rows rows are done. The table lives in a
// schema of its own, dropped at the end.
func (b *Bench) SkipLocked(ctx context.Context, cfg *SkipLockedConfig) (*SkipLockedResult, error) {
	c := SkipLockedConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 50000)
	c.Clients = orDefault(c.Clients, 8)
	c.Batch = orDefault(c.Batch, 100)
	res := &SkipLockedResult{Rows: c.Rows, Clients: c.Clients, Batch: c.Batch}
	err := b.run(ctx, "skiplocked", func(ctx context.Context) (err error) {
		res.Setup = b.setup("skiplocked")
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if _, derr := b.pool.Exec(cctx, sqlSkipDrop); derr != nil {
				err = errors.Join(err, fmt.Errorf("bench: drop schema %s: %w", skipSchema, derr))
			}
		}()
		for _, stmt := range []string{sqlSkipDrop, sqlSkipSchema, sqlSkipTable, sqlSkipIndex} {
			if _, err := b.pool.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("bench: %s: %w", stmt, explain(err))
			}
		}
		if _, err := b.pool.Exec(ctx, sqlSkipLoad, Queue, c.Rows); err != nil {
			return fmt.Errorf("bench: load the rows: %w", err)
		}
		if _, err := b.pool.Exec(ctx, sqlSkipVacuum); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		conns := make([]*pgx.Conn, c.Clients)
		for i := range conns {
			conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
			if err != nil {
				return fmt.Errorf("bench: connect client %d: %w", i, err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			conns[i] = conn
		}
		b.logger.Info("bench: burning down with bare SKIP LOCKED", "rows", c.Rows, "clients", c.Clients, "batch", c.Batch)
		t0 := time.Now()
		errs := make([]error, len(conns))
		var wg sync.WaitGroup
		for i, conn := range conns {
			wg.Go(func() { errs[i] = skipLockedLoop(ctx, conn, "client:"+strconv.Itoa(i), c.Batch) })
		}
		wg.Wait()
		elapsed := time.Since(t0)
		if err := errors.Join(errs...); err != nil {
			return err
		}
		var left int64
		if err := b.pool.QueryRow(ctx, sqlSkipPending).Scan(&left); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if left != 0 {
			return fmt.Errorf("bench: %d rows were not done", left)
		}
		res.ElapsedMS = ms(elapsed)
		res.RowsPerSec = round(float64(c.Rows)/elapsed.Seconds(), 1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// skipLockedLoop claims and completes batches until a claim finds nothing.
func skipLockedLoop(ctx context.Context, conn *pgx.Conn, id string, batch int) error {
	ids := make([]int64, 0, batch)
	for {
		ids = ids[:0]
		rows, err := conn.Query(ctx, sqlSkipClaim, Queue, id, batch)
		if err != nil {
			return fmt.Errorf("bench: claim: %w", err)
		}
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return fmt.Errorf("bench: claim: %w", err)
			}
			ids = append(ids, v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("bench: claim: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := conn.Exec(ctx, sqlSkipComplete, ids); err != nil {
			return fmt.Errorf("bench: complete: %w", err)
		}
	}
}
