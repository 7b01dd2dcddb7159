package riverbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// CPUResult is what CPU measured, between the start of the inserts (or of
// the burn-down) and the last completion; the fields are those of pgworker
// bench cpu.
type CPUResult struct {
	Setup
	Rate              float64         `json:"rate"` // 0: peak
	ElapsedMS         float64         `json:"elapsed_ms"`
	RowsPerSec        float64         `json:"rows_per_sec"`
	ServerCPUMSPerRow float64         `json:"server_cpu_ms_per_row"`
	WorkerCPUMSPerRow float64         `json:"worker_cpu_ms_per_row"`
	WALBytesPerRow    float64         `json:"wal_bytes_per_row"`
	XactsPerRow       float64         `json:"xacts_per_row"`
	Statements        []StatementCost `json:"statements,omitempty"`
}

// StatementCost is one statement's share of a CPU run.
type StatementCost struct {
	Query        string  `json:"query"`
	CallsPerRow  float64 `json:"calls_per_row"`
	ExecMSPerRow float64 `json:"exec_ms_per_row"`
	PlanMSPerRow float64 `json:"plan_ms_per_row"`
}

// CPU measures what a job costs the database server and River's process:
// with rate > 0 it inserts jobs one per transaction (Client.Insert) at rate
// per second for duration while a client with cfg.Slots workers runs them;
// with rate 0 it burns cfg.Rows jobs inserted beforehand (not measured) down
// at peak. The server's CPU time comes from /proc: it must run on this
// machine.
func CPU(ctx context.Context, pool *pgxpool.Pool, cfg *Config, rate float64, duration time.Duration) (*CPUResult, error) {
	c := cfg.withDefaults(DefaultThroughputRows)
	if rate > 0 {
		c.Rows = max(int(rate*duration.Seconds()), 1)
	}
	server, err := findServer(ctx, pool)
	if err != nil {
		return nil, err
	}
	client, err := newClient(pool, &c, &noopWorker{})
	if err != nil {
		return nil, err
	}
	if rate == 0 {
		params := make([]river.InsertManyParams, 0, min(c.Rows, insertBatch))
		for i := range c.Rows {
			params = append(params, river.InsertManyParams{Args: noopArgs{Seq: i}})
			if len(params) == cap(params) || i == c.Rows-1 {
				if _, err := client.InsertManyFast(ctx, params); err != nil {
					return nil, fmt.Errorf("insert jobs: %w", err)
				}
				params = params[:0]
			}
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
			return nil, fmt.Errorf("vacuum river_job: %w", err)
		}
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: c.Rows + 1,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled, river.EventKindJobSnoozed},
	})
	defer cancel()
	if rate > 0 {
		// Idle before measuring, as pgworker's worker is.
		if err := client.Start(ctx); err != nil {
			return nil, fmt.Errorf("start River client: %w", err)
		}
		defer stop(client)
		if err := sleep(ctx, time.Second); err != nil {
			return nil, err
		}
	}
	before, err := readCosts(ctx, pool, server)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	produced := make(chan error, 4)
	if rate == 0 {
		if err := client.Start(ctx); err != nil {
			return nil, fmt.Errorf("start River client: %w", err)
		}
		defer stop(client)
		produced <- nil
	} else {
		// Four producers, as pgworker bench cpu has, so that a commit's
		// flush does not hold back the next job.
		const producers = 4
		start := time.Now()
		for p := range producers {
			go func() {
				for i := p; i < c.Rows; i += producers {
					if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
						if err := sleep(ctx, d); err != nil {
							produced <- err
							return
						}
					}
					if _, err := client.Insert(ctx, noopArgs{Seq: i}, nil); err != nil {
						produced <- fmt.Errorf("insert job %d: %w", i, err)
						return
					}
				}
				produced <- nil
			}()
		}
	}
	for done := 0; done < c.Rows; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return nil, fmt.Errorf("job %d: %s, want completed", ev.Job.ID, ev.Kind)
			}
			done++
		case err := <-produced:
			if err != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("cpu: %d of %d jobs completed: %w", done, c.Rows, ctx.Err())
		}
	}
	elapsed := time.Since(t0)
	after, err := readCosts(ctx, pool, server)
	if err != nil {
		return nil, err
	}
	n := float64(c.Rows)
	res := &CPUResult{
		Setup: setup("cpu", pool, &c), Rate: rate, ElapsedMS: ms(elapsed), RowsPerSec: n / elapsed.Seconds(),
		ServerCPUMSPerRow: ms(after.server-before.server) / n, WorkerCPUMSPerRow: ms(after.self-before.self) / n,
		XactsPerRow: float64(after.xacts-before.xacts) / n,
	}
	var wal float64
	if err := pool.QueryRow(ctx, `/* riverbench */ SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8`, after.lsn, before.lsn).Scan(&wal); err != nil {
		return nil, err
	}
	res.WALBytesPerRow = wal / n
	for id, s := range after.statements {
		p := before.statements[id]
		if s.calls == p.calls || strings.HasPrefix(s.query, "/* riverbench */") {
			continue // unchanged, or the benchmark's own readings
		}
		res.Statements = append(res.Statements, StatementCost{Query: s.query, CallsPerRow: float64(s.calls-p.calls) / n,
			ExecMSPerRow: (s.execMS - p.execMS) / n, PlanMSPerRow: (s.planMS - p.planMS) / n})
	}
	slices.SortFunc(res.Statements, func(a, b StatementCost) int {
		return cmp.Compare(b.ExecMSPerRow+b.PlanMSPerRow, a.ExecMSPerRow+a.PlanMSPerRow)
	})
	res.Statements = res.Statements[:min(len(res.Statements), 10)]
	return res, nil
}

type costs struct {
	server, self time.Duration
	lsn          string
	xacts        int64
	statements   map[string]stmtStats
}

type stmtStats struct {
	query          string
	calls          int64
	execMS, planMS float64
}

func readCosts(ctx context.Context, pool *pgxpool.Pool, server int) (costs, error) {
	var c costs
	// The pool's idle sessions report their transactions now.
	for _, conn := range pool.AcquireAllIdle(ctx) {
		_, _ = conn.Exec(ctx, `/* riverbench */ SELECT pg_stat_force_next_flush()`)
		conn.Release()
	}
	if err := pool.QueryRow(ctx, `/* riverbench */ SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.xacts); err != nil {
		return c, err
	}
	if err := pool.QueryRow(ctx, `/* riverbench */ SELECT pg_current_wal_lsn()::text`).Scan(&c.lsn); err != nil {
		return c, err
	}
	var have bool
	if err := pool.QueryRow(ctx, `/* riverbench */ SELECT to_regclass('pg_stat_statements') IS NOT NULL`).Scan(&have); err != nil {
		return c, err
	}
	if have {
		rows, err := pool.Query(ctx, `/* riverbench */ SELECT queryid::text, left(regexp_replace(query, '\s+', ' ', 'g'), 120), calls, total_exec_time, total_plan_time
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`)
		if err == nil {
			c.statements = map[string]stmtStats{}
			for rows.Next() {
				var id string
				var s stmtStats
				if err := rows.Scan(&id, &s.query, &s.calls, &s.execMS, &s.planMS); err != nil {
					rows.Close()
					return c, err
				}
				c.statements[id] = s
			}
			rows.Close()
		}
	}
	var err error
	if c.server, err = serverTotal(server); err != nil {
		return c, err
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return c, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every architecture Linux supports.
const clockTicks = 100

// findServer returns the PID of the server's postmaster: the parent of a
// backend, checked to be the parent of the server's checkpointer and writers
// too (as pgworker's bench cpu does: start times cannot tell, since the wall
// clock and /proc's boot time drift apart on a virtual machine).
func findServer(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var backend int
	var aux []int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid(),
       coalesce(array_agg(a.pid) FILTER (WHERE a.backend_type IN ('checkpointer', 'background writer', 'walwriter')), '{}')
FROM pg_stat_activity a`).Scan(&backend, &aux); err != nil {
		return 0, err
	}
	st, err := readStat(backend)
	if err != nil {
		return 0, fmt.Errorf("the server's CPU is read from /proc, and its backend %d is not a process here: %w", backend, err)
	}
	if len(aux) == 0 {
		return 0, errors.New("pg_stat_activity shows none of the server's checkpointer and writers")
	}
	for _, pid := range aux {
		if a, err := readStat(pid); err != nil || a.ppid != st.ppid {
			return 0, fmt.Errorf("process %d, the parent of backend %d, is not the parent of the server's process %d: it is not the server's postmaster", st.ppid, backend, pid)
		}
	}
	return st.ppid, nil
}

// serverTotal is the CPU time of the postmaster, of the children it waited
// for and of those alive. A child waited for during the walk through /proc
// could be counted in neither or in both, so the walk is taken again until
// the postmaster's count of its ended children is the same on both sides.
func serverTotal(postmaster int) (time.Duration, error) {
	for range 1000 {
		pm, err := readStat(postmaster)
		if err != nil {
			return 0, err
		}
		dirs, err := os.ReadDir("/proc")
		if err != nil {
			return 0, err
		}
		var live int64
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil {
				continue
			}
			if st, err := readStat(pid); err == nil && st.ppid == postmaster {
				live += st.utime + st.stime
			}
		}
		pm2, err := readStat(postmaster)
		if err != nil {
			return 0, err
		}
		if pm2.cutime == pm.cutime && pm2.cstime == pm.cstime {
			ticks := pm.utime + pm.stime + pm.cutime + pm.cstime + live
			return time.Duration(ticks) * time.Second / clockTicks, nil
		}
	}
	return 0, errors.New("the server's backends end faster than its processes can be read")
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return procStat{}, errors.New("short /proc stat")
	}
	num := func(n int) int64 { v, _ := strconv.ParseInt(f[n-3], 10, 64); return v }
	return procStat{ppid: int(num(4)), utime: num(14), stime: num(15), cutime: num(16), cstime: num(17)}, nil
}
