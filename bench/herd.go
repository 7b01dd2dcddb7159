package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/worker"
)

// herdConns is the pool size of each of Herd's worker runtimes, besides its
// LISTEN connection.
const herdConns = 3

// HerdConfig sizes a Herd run. A nil or zero config works.
type HerdConfig struct {
	// Processes is how many worker runtimes run, each with its own pool and
	// LISTEN connection, as separate processes would. Defaults to 20.
	Processes int
	// Slots of each runtime, all idle. Defaults to 50.
	Slots int
	// Rows inserted one at a time. Defaults to 100.
	Rows int
	// Interval between a row's pickup and the next insert, so that each row
	// is a wake-up of its own. Defaults to 50ms.
	Interval time.Duration
}

// HerdResult is what Herd measured. A wake-up is one notification reaching
// one process; every row wakes every process once.
type HerdResult struct {
	Setup
	Processes  int     `json:"processes"`
	Slots      int     `json:"slots"`
	Rows       int     `json:"rows"`
	IntervalMS float64 `json:"interval_ms"`
	// Server side: calls of files.claim_batch and files.claim counted by
	// pg_stat_user_functions while the rows were inserted and taken.
	ClaimBatchCalls int64 `json:"claim_batch_calls"`
	ClaimCalls      int64 `json:"claim_calls"`
	// ClaimQueriesPerRow is (claim_batch_calls + claim_calls) / rows;
	// ClaimQueriesPerProcessPerWakeup divides that by the processes too.
	ClaimQueriesPerRow              float64 `json:"claim_queries_per_row"`
	ClaimQueriesPerProcessPerWakeup float64 `json:"claim_queries_per_process_per_wakeup"`
	// Client side, from the runtimes' own counters: claim queries sent,
	// those that got no row, and the most any one process sent per row.
	ClientClaims           uint64  `json:"client_claims"`
	ClientRacesLost        uint64  `json:"client_races_lost"`
	MaxProcessClaimsPerRow float64 `json:"max_process_claims_per_row"`
}

// Herd starts cfg.Processes worker runtimes of cfg.Slots idle slots each,
// inserts cfg.Rows rows one at a time, each after the previous one was
// picked up and cfg.Interval passed, and counts the claim queries the server
// ran (pg_stat_user_functions, read once the statistics have settled).
func (b *Bench) Herd(ctx context.Context, cfg *HerdConfig) (*HerdResult, error) {
	c := HerdConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Processes = orDefault(c.Processes, 20)
	c.Slots = orDefault(c.Slots, 50)
	c.Rows = orDefault(c.Rows, 100)
	c.Interval = orDefault(c.Interval, 50*time.Millisecond)
	res := &HerdResult{Processes: c.Processes, Slots: c.Slots, Rows: c.Rows, IntervalMS: ms(c.Interval)}
	err := b.run(ctx, "herd", func(ctx context.Context) error {
		res.Setup = b.setup("herd")
		var free int
		if err := b.pool.QueryRow(ctx, sqlFreeConns).Scan(&free); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if need := c.Processes * (herdConns + 1); need > free {
			return fmt.Errorf("bench: herd with %d processes needs up to %d connections, and the server has %d free "+
				"(lower the processes or raise max_connections)", c.Processes, need, free)
		}
		// The server counts calls only with track_functions; a superuser may
		// turn it on for the runtimes' sessions alone.
		var track string
		if err := b.pool.QueryRow(ctx, sqlTrackFunctions).Scan(&track); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		var params map[string]string
		if track == "none" {
			params = map[string]string{"track_functions": "pl"}
		}

		var picked atomic.Int64
		h := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
			picked.Add(1)
			return nil, nil
		})
		workers := make([]*worker.Worker, 0, c.Processes)
		pools := make([]*pgxpool.Pool, 0, c.Processes)
		defer func() {
			for _, w := range workers {
				stopWorker(w)
			}
			for _, p := range pools {
				p.Close()
			}
		}()
		b.logger.Info("bench: starting the runtimes", "processes", c.Processes, "slots", c.Slots)
		for i := range c.Processes {
			pool, err := b.workerPool(ctx, herdConns, params)
			if err != nil {
				return err
			}
			pools = append(pools, pool)
			w, err := b.startWorker(ctx, pool, "herd"+strconv.Itoa(i), worker.Config{Handler: h, Slots: c.Slots})
			if err != nil {
				if params != nil && isPrivilege(err) {
					return errors.New("bench: herd counts claims with pg_stat_user_functions, and track_functions is none " +
						"(set track_functions = 'pl' in postgresql.conf, or run the benchmark as a superuser)")
				}
				return err
			}
			workers = append(workers, w)
		}
		// Every runtime has settled; let the server's counters catch up.
		flushAll(ctx, pools)
		before, err := b.settledFunctionStats(ctx, func(map[string]funcStats) bool { return true })
		if err != nil {
			return err
		}
		clientBefore := make([]uint64, len(workers))
		var racesBefore uint64
		for i, w := range workers {
			s := w.Stats()
			clientBefore[i] = s.Claims
			racesBefore += s.RacesLost
		}
		clientClaims := func() uint64 {
			var n uint64
			for _, w := range workers {
				n += w.Stats().Claims
			}
			return n
		}

		b.logger.Info("bench: inserting", "rows", c.Rows, "interval", c.Interval)
		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer conn.Release()
		for i := range c.Rows {
			var id int64
			if err := conn.QueryRow(ctx, sqlInsertOne, Queue, "herd/"+strconv.Itoa(i)).Scan(&id); err != nil {
				return fmt.Errorf("bench: insert: %w", explain(err))
			}
			want := int64(i + 1)
			if err := waitFor(ctx, 30*time.Second, 200*time.Microsecond, "the row to be picked up", func() bool {
				return picked.Load() >= want
			}); err != nil {
				return err
			}
			if err := sleep(ctx, c.Interval); err != nil {
				return err
			}
		}
		// The losers' claims may still be on their way.
		last, since := clientClaims(), time.Now()
		if err := waitFor(ctx, 30*time.Second, 5*time.Millisecond, "the runtimes to stop claiming", func() bool {
			if n := clientClaims(); n != last {
				last, since = n, time.Now()
			}
			return time.Since(since) > 300*time.Millisecond
		}); err != nil {
			return err
		}
		// The server has counted every claim once it counts at least as
		// many as the runtimes sent.
		var sent uint64
		for i, w := range workers {
			sent += w.Stats().Claims - clientBefore[i]
		}
		flushAll(ctx, pools)
		after, err := b.settledFunctionStats(ctx, func(m map[string]funcStats) bool {
			calls := m["claim_batch"].calls - before["claim_batch"].calls + m["claim"].calls - before["claim"].calls
			return calls >= int64(sent)
		})
		if err != nil {
			return err
		}
		res.ClaimBatchCalls = after["claim_batch"].calls - before["claim_batch"].calls
		res.ClaimCalls = after["claim"].calls - before["claim"].calls
		if res.ClaimBatchCalls+res.ClaimCalls == 0 {
			return errors.New("bench: pg_stat_user_functions counted no claim (is track_functions on?)")
		}
		total := float64(res.ClaimBatchCalls + res.ClaimCalls)
		res.ClaimQueriesPerRow = round(total/float64(c.Rows), 3)
		res.ClaimQueriesPerProcessPerWakeup = round(total/float64(c.Rows*c.Processes), 3)
		var most uint64
		var races uint64
		for i, w := range workers {
			s := w.Stats()
			n := s.Claims - clientBefore[i]
			res.ClientClaims += n
			most = max(most, n)
			races += s.RacesLost
		}
		res.ClientRacesLost = races - racesBefore
		res.MaxProcessClaimsPerRow = round(float64(most)/float64(c.Rows), 3)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// flushAll makes the idle sessions of the pools report their statistics.
func flushAll(ctx context.Context, pools []*pgxpool.Pool) {
	for _, p := range pools {
		for _, c := range p.AcquireAllIdle(ctx) {
			forceFlush(ctx, c.Conn())
			c.Release()
		}
	}
}
