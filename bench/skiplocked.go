package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
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

// The statements of SkipLocked with the rows that pgworker's guarantees
// write, and nothing else: the same table with an index of the running rows
// by slot (as files_running_idx, which the heartbeat and the reaper read), a
// token's hash written at the claim and checked at the completion (the
// fence: one token per claim, as pgworker's), a history row per outcome in
// a table of files.attempts' shape with its indexes, and one line of counts
// per completion in a table of files.queue_counts' shape. The claim commits
// asynchronously, as pgworker's do. No functions, no slots' table, no checks
// beyond the tables' own.
const (
	sqlKeepRunningIndex = `CREATE INDEX ON ` + skipSchema + `.files (worker_id) WHERE state = 'running'`
	sqlKeepAttempts     = `CREATE TABLE ` + skipSchema + `.attempts (LIKE files.attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING INDEXES)`
	sqlKeepCounts       = `CREATE TABLE ` + skipSchema + `.queue_counts (LIKE files.queue_counts INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)`
	sqlKeepClaim        = `UPDATE ` + skipSchema + `.files f SET state = 'running', worker_id = $2, attempt = f.attempt + 1,
    claimed_at = now(), lease_expires_at = now() + interval '15 seconds',
    claim_token_hash = (SELECT sha256(convert_to($4, 'UTF8')))
WHERE f.id IN (SELECT id FROM ` + skipSchema + `.files WHERE state = 'pending' AND queue = $1
    ORDER BY priority DESC, id LIMIT $3 FOR UPDATE SKIP LOCKED)
    AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING f.id`
	sqlKeepComplete = `WITH done AS (
    UPDATE ` + skipSchema + `.files f SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(),
        claim_token_hash = NULL
    WHERE f.id = ANY ($1) AND f.state = 'running' AND f.worker_id = $2
      AND f.claim_token_hash = sha256(convert_to($3, 'UTF8'))
    RETURNING f.id, f.queue, f.attempt, f.claimed_at
), logged AS (
    INSERT INTO ` + skipSchema + `.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, duration)
    SELECT d.id, d.queue, d.attempt, $2, d.claimed_at, now(), 'done', now() - d.claimed_at FROM done d
), counted AS (
    INSERT INTO ` + skipSchema + `.queue_counts (queue, at, done, ended_done)
    SELECT d.queue, date_trunc('minute', now()), count(*), count(*) FROM done d GROUP BY d.queue
)
SELECT count(*) FROM done`
)

// The same loop through the SQL API on files.files, as a worker in any
// language would drive it (docs/protocol.md): files.claim_batch for a batch
// of slots, committed asynchronously as pgworker run's claims are, and
// files.complete_many for the rows it took.
const (
	sqlAPIClaim = `SELECT id, worker_id, attempt, claim_token FROM files.claim_batch($1::text[], ARRAY[$2::text], $3)
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL`
	sqlAPIComplete = `SELECT count(*) FROM files.complete_many($1::bigint[], $2::text[], $3::integer[], $4::text[],
    NULL::jsonb[], NULL::jsonb[], NULL)`
	sqlAPIDeregister = `SELECT count(files.deregister_worker(w, $2)) FROM unnest($1::text[]) w`
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
	// API claims and completes the rows of files.files through the SQL API
	// (files.claim_batch and files.complete_many) instead of bare statements
	// on a table of its shape: the bookkeeping of exactly-once outcomes, with
	// no worker runtime around it. Defaults to false.
	API bool
	// Bookkeeping runs the bare loop with the rows pgworker's guarantees
	// write (an index of the running rows, a token's hash, a history row
	// per outcome, a line of counts per completion) and nothing else: what
	// the database can do for a queue that keeps them. Not with API.
	Bookkeeping bool
}

// SkipLockedResult is what SkipLocked measured.
type SkipLockedResult struct {
	Setup
	Rows    int `json:"rows"`
	Clients int `json:"clients"`
	Batch   int `json:"batch"`
	// API is true for the loop through the SQL API, Bookkeeping for the
	// bare loop with the guarantees' writes.
	API         bool `json:"api,omitempty"`
	Bookkeeping bool `json:"bookkeeping,omitempty"`
	// ElapsedMS runs from the clients' first claim to the last completion.
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// ServerCPUMSPerRow is the CPU time of the server's processes during the
	// burn-down per row, as bench cpu measures it; ClientCPUMSPerRow the
	// benchmark's own (its clients). Left out when the server is not on this
	// machine.
	ServerCPUMSPerRow float64 `json:"server_cpu_ms_per_row,omitempty"`
	ClientCPUMSPerRow float64 `json:"client_cpu_ms_per_row,omitempty"`
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
	if c.API && c.Bookkeeping {
		return nil, errors.New("bench: skiplocked runs through the SQL API or with the bare bookkeeping, not both")
	}
	res := &SkipLockedResult{Rows: c.Rows, Clients: c.Clients, Batch: c.Batch, API: c.API, Bookkeeping: c.Bookkeeping}
	err := b.run(ctx, "skiplocked", func(ctx context.Context) (err error) {
		res.Setup = b.setup("skiplocked")
		if c.API {
			return b.apiLoops(ctx, &c, res)
		}
		drop, err := b.bareTable(ctx, c.Bookkeeping)
		defer func() { err = errors.Join(err, drop()) }()
		if err != nil {
			return err
		}
		if _, err := b.pool.Exec(ctx, sqlSkipLoad, Queue, c.Rows); err != nil {
			return fmt.Errorf("bench: load the rows: %w", err)
		}
		if _, err := b.pool.Exec(ctx, sqlSkipVacuum); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		conns, err := b.clients(ctx, c.Clients)
		defer closeAll(ctx, conns)
		if err != nil {
			return err
		}
		b.logger.Info("bench: burning down with bare SKIP LOCKED", "rows", c.Rows, "clients", c.Clients, "batch", c.Batch,
			"bookkeeping", c.Bookkeeping)
		cpu := b.startCPU(ctx)
		elapsed, err := burnDown(conns, func(i int, conn *pgx.Conn) error {
			return skipLockedLoop(ctx, conn, "client:"+strconv.Itoa(i), c.Batch, c.Bookkeeping)
		})
		if err != nil {
			return err
		}
		res.ServerCPUMSPerRow, res.ClientCPUMSPerRow = cpu.perRow(c.Rows)
		if err := b.bareDone(ctx); err != nil {
			return err
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

// bareTable creates the table of SkipLocked in a schema of its own (a
// leftover of an earlier run is dropped first), with the index and tables
// of the guarantees' writes when bookkeeping; drop drops it, also when the
// creation failed or ctx was cancelled.
func (b *Bench) bareTable(ctx context.Context, bookkeeping bool) (drop func() error, err error) {
	drop = func() error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := b.pool.Exec(cctx, sqlSkipDrop); err != nil {
			return fmt.Errorf("bench: drop schema %s: %w", skipSchema, err)
		}
		return nil
	}
	stmts := []string{sqlSkipDrop, sqlSkipSchema, sqlSkipTable, sqlSkipIndex}
	if bookkeeping {
		stmts = append(stmts, sqlKeepRunningIndex, sqlKeepAttempts, sqlKeepCounts)
	}
	for _, stmt := range stmts {
		if _, err := b.pool.Exec(ctx, stmt); err != nil {
			return drop, fmt.Errorf("bench: %s: %w", stmt, explain(err))
		}
	}
	return drop, nil
}

// bareDone returns an error unless every row of the bare table is done.
func (b *Bench) bareDone(ctx context.Context) error {
	var left int64
	if err := b.pool.QueryRow(ctx, sqlSkipPending).Scan(&left); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if left != 0 {
		return fmt.Errorf("bench: %d rows were not done", left)
	}
	return nil
}

// apiLoops is SkipLocked through the SQL API: cfg.Rows rows of Queue in
// files.files, cfg.Clients connections each claiming for cfg.Batch slots of
// its own and completing what it took, until a claim finds nothing.
func (b *Bench) apiLoops(ctx context.Context, c *SkipLockedConfig, res *SkipLockedResult) error {
	if err := b.copyRows(ctx, func(i int) string { return "skiplocked/" + strconv.Itoa(i) }, c.Rows); err != nil {
		return err
	}
	b.vacuum(ctx)
	conns, err := b.clients(ctx, c.Clients)
	defer closeAll(ctx, conns)
	if err != nil {
		return err
	}
	key := "pgworker-bench-key-" + strconv.Itoa(os.Getpid())
	slots := make([][]string, len(conns))
	for i := range slots {
		slots[i] = make([]string, c.Batch)
		for j := range slots[i] {
			slots[i][j] = workerPrefix + strconv.Itoa(os.Getpid()) + ":skiplocked:" + strconv.Itoa(i) + ":" + strconv.Itoa(j)
		}
	}
	b.logger.Info("bench: burning down through the SQL API", "rows", c.Rows, "clients", c.Clients, "batch", c.Batch)
	cpu := b.startCPU(ctx)
	elapsed, err := burnDown(conns, func(i int, conn *pgx.Conn) error { return apiLoop(ctx, conn, slots[i], key) })
	res.ServerCPUMSPerRow, res.ClientCPUMSPerRow = cpu.perRow(c.Rows)
	for _, s := range slots {
		// Stopped, so that the cleanup deletes them.
		if _, derr := b.pool.Exec(ctx, sqlAPIDeregister, s, key); derr != nil {
			err = errors.Join(err, fmt.Errorf("bench: deregister the slots: %w", derr))
		}
	}
	if err != nil {
		return err
	}
	res.ElapsedMS = ms(elapsed)
	res.RowsPerSec = round(float64(c.Rows)/elapsed.Seconds(), 1)
	return b.outcomes(ctx, c.Rows)
}

// apiLoop claims for slots and completes what it took until a claim finds
// nothing.
func apiLoop(ctx context.Context, conn *pgx.Conn, slots []string, key string) error {
	n := len(slots)
	ids, wids, attempts, tokens := make([]int64, 0, n), make([]string, 0, n), make([]int32, 0, n), make([]string, 0, n)
	for {
		ids, wids, attempts, tokens = ids[:0], wids[:0], attempts[:0], tokens[:0]
		rows, err := conn.Query(ctx, sqlAPIClaim, slots, Queue, key)
		if err != nil {
			return fmt.Errorf("bench: claim: %w", err)
		}
		for rows.Next() {
			var (
				id         int64
				wid, token string
				attempt    int32
			)
			if err := rows.Scan(&id, &wid, &attempt, &token); err != nil {
				rows.Close()
				return fmt.Errorf("bench: claim: %w", err)
			}
			ids, wids, attempts, tokens = append(ids, id), append(wids, wid), append(attempts, attempt), append(tokens, token)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("bench: claim: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		var took int
		if err := conn.QueryRow(ctx, sqlAPIComplete, ids, wids, attempts, tokens).Scan(&took); err != nil {
			return fmt.Errorf("bench: complete: %w", err)
		}
		if took != len(ids) {
			return fmt.Errorf("bench: complete recorded %d of %d outcomes", took, len(ids))
		}
	}
}

// clients opens n connections of their own, as separate workers would have.
func (b *Bench) clients(ctx context.Context, n int) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, n)
	for i := range n {
		conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
		if err != nil {
			return conns, fmt.Errorf("bench: connect client %d: %w", i, err)
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

func closeAll(ctx context.Context, conns []*pgx.Conn) {
	for _, conn := range conns {
		conn.Close(context.WithoutCancel(ctx))
	}
}

// burnDown runs loop on each connection at once and returns how long they
// took together.
func burnDown(conns []*pgx.Conn, loop func(i int, conn *pgx.Conn) error) (time.Duration, error) {
	t0 := time.Now()
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() { errs[i] = loop(i, conn) })
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// skipLockedLoop claims and completes batches until a claim finds nothing;
// with bookkeeping, with the statements that write what the guarantees keep,
// each claim with a token of its own.
func skipLockedLoop(ctx context.Context, conn *pgx.Conn, id string, batch int, bookkeeping bool) error {
	claim := func() (pgx.Rows, error) { return conn.Query(ctx, sqlSkipClaim, Queue, id, batch) }
	complete := func(ids []int64) error {
		_, err := conn.Exec(ctx, sqlSkipComplete, ids)
		return err
	}
	if bookkeeping {
		var token string
		claim = func() (pgx.Rows, error) {
			token = rand.Text()
			return conn.Query(ctx, sqlKeepClaim, Queue, id, batch, token)
		}
		complete = func(ids []int64) error {
			var took int
			if err := conn.QueryRow(ctx, sqlKeepComplete, ids, id, token).Scan(&took); err != nil {
				return err
			}
			if took != len(ids) {
				return fmt.Errorf("recorded %d of %d outcomes", took, len(ids))
			}
			return nil
		}
	}
	ids := make([]int64, 0, batch)
	for {
		ids = ids[:0]
		rows, err := claim()
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
		if err := complete(ids); err != nil {
			return fmt.Errorf("bench: complete: %w", err)
		}
	}
}
