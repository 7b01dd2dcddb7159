package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/worker"
)

// The statements of CPU: the WAL position, the database's transactions, and
// pg_stat_statements when the server has it loaded and the database has the
// extension (CPU reads it, never creates it).
// The bench's own readings start with benchMark, so that the breakdown
// leaves them out.
const (
	benchMark         = "/* pgworker bench */ "
	sqlWALLSN         = benchMark + `SELECT pg_current_wal_lsn()::text`
	sqlWALBytes       = benchMark + `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8`
	sqlXactCommits    = benchMark + `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`
	sqlHaveStatements = benchMark + `SELECT to_regclass('pg_stat_statements') IS NOT NULL`
	sqlStatements     = benchMark + `SELECT queryid::text, left(regexp_replace(query, '\s+', ' ', 'g'), 120), calls, total_exec_time, total_plan_time
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`
)

// CPUConfig sizes a CPU run. A nil or zero config works.
type CPUConfig struct {
	// Rate of inserts per second, one row per transaction, while the
	// worker keeps up. Zero measures at peak instead: Rows rows inserted
	// beforehand (not measured) and burnt down. Defaults to zero.
	Rate float64
	// Duration of the inserts at Rate. Defaults to 10s.
	Duration time.Duration
	// Rows burnt down at peak. Defaults to 20,000.
	Rows int
	// Slots of the worker. Defaults to 100.
	Slots int
	// MaxConns of the worker's pool. Defaults to 8.
	MaxConns int
	// ClaimCooldown of the worker (worker.Config.ClaimCooldown). Defaults
	// to 0: each notification is answered at once.
	ClaimCooldown time.Duration
}

// CPUResult is what CPU measured, between the start of the inserts (or of
// the burn-down) and the last outcome.
type CPUResult struct {
	Setup
	Rate  float64 `json:"rate"` // 0: peak
	Rows  int     `json:"rows"`
	Slots int     `json:"slots"`
	// CooldownMS is the worker's claim cooldown; 0 (left out) for none.
	CooldownMS float64 `json:"claim_cooldown_ms,omitempty"`
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// ServerCPUMSPerRow is the CPU time of every process of the server
	// (from /proc) over the rows; WorkerCPUMSPerRow that of this process,
	// which runs the worker runtime and, at a fixed rate, the inserts.
	ServerCPUMSPerRow float64 `json:"server_cpu_ms_per_row"`
	WorkerCPUMSPerRow float64 `json:"worker_cpu_ms_per_row"`
	// WALBytesPerRow is the server's WAL written over the rows.
	WALBytesPerRow float64 `json:"wal_bytes_per_row"`
	// XactsPerRow is the database's committed transactions over the rows.
	XactsPerRow float64 `json:"xacts_per_row"`
	// Claims is the number of claim queries the worker sent.
	Claims uint64 `json:"claims"`
	// Statements is the database's statements by execution time, when
	// pg_stat_statements is there: calls and milliseconds per row.
	Statements []StatementCost `json:"statements,omitempty"`
}

// StatementCost is one statement's share of a CPU run.
type StatementCost struct {
	Query        string  `json:"query"`
	CallsPerRow  float64 `json:"calls_per_row"`
	ExecMSPerRow float64 `json:"exec_ms_per_row"`
	PlanMSPerRow float64 `json:"plan_ms_per_row"`
}

// CPU measures what a row costs the database server and the worker: it
// runs the worker on rows inserted one per transaction at cfg.Rate (or
// burns cfg.Rows down at peak) and divides the server's CPU time (read from
// /proc: the server must run on this machine), WAL and transactions by the
// rows.
func (b *Bench) CPU(ctx context.Context, cfg *CPUConfig) (*CPUResult, error) {
	c := CPUConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Duration = orDefault(c.Duration, 10*time.Second)
	c.Rows = orDefault(c.Rows, 20000)
	c.Slots = orDefault(c.Slots, 100)
	c.MaxConns = orDefault(c.MaxConns, 8)
	if c.Rate > 0 {
		c.Rows = max(int(c.Rate*c.Duration.Seconds()), 1)
	}
	res := &CPUResult{Rate: c.Rate, Rows: c.Rows, Slots: c.Slots, CooldownMS: ms(c.ClaimCooldown)}
	err := b.run(ctx, "cpu", func(ctx context.Context) error {
		res.Setup = b.setup("cpu")
		server, err := b.findServerCPU(ctx)
		if err != nil {
			return err
		}
		if c.Rate == 0 {
			if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
				return fmt.Errorf("bench: pause queue %s: %w", Queue, explain(err))
			}
			if err := b.copyRows(ctx, func(i int) string { return "cpu/" + strconv.Itoa(i) }, c.Rows); err != nil {
				return err
			}
			b.vacuum(ctx)
		}
		pool, err := b.workerPool(ctx, c.MaxConns, nil)
		if err != nil {
			return err
		}
		defer pool.Close()
		noop := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) { return nil, nil })
		outcomes := &outcomeCount{}
		w, err := b.startWorker(ctx, pool, "cpu", worker.Config{
			Handler: noop, Slots: c.Slots, Observer: outcomes, ClaimCooldown: c.ClaimCooldown,
		})
		if err != nil {
			return err
		}
		defer stopWorker(w)
		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer conn.Release()
		inserters, err := b.workerPool(ctx, producers, nil)
		if err != nil {
			return err
		}
		defer inserters.Close()

		before, err := b.costs(ctx, conn, pool, server)
		if err != nil {
			return err
		}
		claims := w.Stats().Claims
		b.logger.Info("bench: measuring", "rows", c.Rows, "rate", c.Rate, "slots", c.Slots)
		t0 := time.Now()
		if c.Rate == 0 {
			if _, err := conn.Exec(ctx, sqlResume, Queue); err != nil {
				return fmt.Errorf("bench: resume queue %s: %w", Queue, err)
			}
		} else if err := insertAtRate(ctx, inserters, c.Rows, c.Rate, sqlInsertOne,
			func(i int) string { return "cpu/" + strconv.Itoa(i) }, nil); err != nil {
			return err
		}
		if err := outcomes.wait(ctx, uint64(c.Rows)); err != nil {
			return err
		}
		elapsed := time.Since(t0)
		res.Claims = w.Stats().Claims - claims
		after, err := b.costs(ctx, conn, pool, server)
		if err != nil {
			return err
		}
		res.ElapsedMS = ms(elapsed)
		res.RowsPerSec = round(float64(c.Rows)/elapsed.Seconds(), 1)
		if err := b.perRow(ctx, conn, before, after, c.Rows, res); err != nil {
			return err
		}
		return b.outcomes(ctx, c.Rows)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// producers insert CPU's rows at a fixed rate, each on a connection of its
// own, so that a commit's flush does not hold back the next row.
const producers = 4

// insertAtRate inserts n rows with stmt (its arguments Queue and the row's
// source), one per transaction, the i-th at i/rate seconds from now (or at
// once when late: the schedule does not drift), on producers connections of
// pool; committed, when not nil, is told of each commit.
func insertAtRate(ctx context.Context, pool *pgxpool.Pool, n int, rate float64, stmt string,
	source func(i int) string, committed func(i int)) error {
	start := time.Now()
	errs := make([]error, producers)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			var id int64
			for i := p; i < n; i += producers {
				if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
					if err := sleep(ctx, d); err != nil {
						errs[p] = err
						return
					}
				}
				if err := pool.QueryRow(ctx, stmt, Queue, source(i)).Scan(&id); err != nil {
					errs[p] = fmt.Errorf("bench: insert: %w", explain(err))
					return
				}
				if committed != nil {
					committed(i)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// costs is a reading of the counters that CPU divides by the rows.
type costs struct {
	server, self time.Duration
	lsn          string
	xacts        int64
	statements   map[string]statementStats // nil without pg_stat_statements
}

type statementStats struct {
	query          string
	calls          int64
	execMS, planMS float64
}

func (b *Bench) costs(ctx context.Context, conn *pgxpool.Conn, workers *pgxpool.Pool, server *serverCPU) (costs, error) {
	var c costs
	var err error
	// The sessions report their transactions now rather than within a second.
	flushAll(ctx, []*pgxpool.Pool{workers})
	forceFlush(ctx, conn.Conn())
	if err := conn.QueryRow(ctx, sqlXactCommits).Scan(&c.xacts); err != nil {
		return c, fmt.Errorf("bench: %w", err)
	}
	if err := conn.QueryRow(ctx, sqlWALLSN).Scan(&c.lsn); err != nil {
		return c, fmt.Errorf("bench: %w", err)
	}
	if c.statements, err = readStatements(ctx, conn); err != nil {
		return c, err
	}
	if c.server, err = server.total(); err != nil {
		return c, err
	}
	c.self = selfCPU()
	return c, nil
}

func readStatements(ctx context.Context, conn *pgxpool.Conn) (map[string]statementStats, error) {
	var have bool
	if err := conn.QueryRow(ctx, sqlHaveStatements).Scan(&have); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if !have {
		return nil, nil
	}
	rows, err := conn.Query(ctx, sqlStatements)
	if err != nil {
		// The extension is there but the library is not loaded: no breakdown.
		return nil, nil //nolint:nilerr // a missing breakdown is not a failed run
	}
	defer rows.Close()
	m := map[string]statementStats{}
	for rows.Next() {
		var id string
		var s statementStats
		if err := rows.Scan(&id, &s.query, &s.calls, &s.execMS, &s.planMS); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		m[id] = s
	}
	return m, rows.Err()
}

// benchOwn reports whether query is one of the bench's readings. The mark
// alone is not enough: pg_stat_statements keeps the text it saw first, which
// an older bench may have sent without it.
func benchOwn(query string) bool {
	if strings.HasPrefix(query, benchMark) {
		return true
	}
	for _, s := range []string{"pg_stat_statements", "queryid::text", "pg_stat_database", "to_regclass", "pg_current_wal_lsn", "pg_stat_force_next_flush"} {
		if strings.Contains(query, s) {
			return true
		}
	}
	return false
}

// maxStatements is how many statements a CPU result lists.
const maxStatements = 10

func (b *Bench) perRow(ctx context.Context, conn *pgxpool.Conn, before, after costs, rows int, res *CPUResult) error {
	n := float64(rows)
	res.ServerCPUMSPerRow = round(ms(after.server-before.server)/n, 4)
	res.WorkerCPUMSPerRow = round(ms(after.self-before.self)/n, 4)
	res.XactsPerRow = round(float64(after.xacts-before.xacts)/n, 3)
	var wal float64
	if err := conn.QueryRow(ctx, sqlWALBytes, after.lsn, before.lsn).Scan(&wal); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	res.WALBytesPerRow = round(wal/n, 1)
	if after.statements == nil {
		return nil
	}
	var list []StatementCost
	for id, s := range after.statements {
		p := before.statements[id]
		if s.calls == p.calls || benchOwn(s.query) {
			continue
		}
		list = append(list, StatementCost{
			Query: strings.TrimSpace(s.query), CallsPerRow: round(float64(s.calls-p.calls)/n, 3),
			ExecMSPerRow: round((s.execMS-p.execMS)/n, 4), PlanMSPerRow: round((s.planMS-p.planMS)/n, 4),
		})
	}
	slices.SortFunc(list, func(a, b StatementCost) int {
		return cmp.Compare(b.ExecMSPerRow+b.PlanMSPerRow, a.ExecMSPerRow+a.PlanMSPerRow)
	})
	res.Statements = list[:min(len(list), maxStatements)]
	return nil
}
