package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of ClaimDepth. sqlFillDepth adds the rows $2 to $3 of
// Queue: every $4-th one pending, the others done as if long processed.
const (
	sqlFillDepth = `
INSERT INTO files.files (queue, source, state, attempt, claimed_at, finished_at)
SELECT $1, 'depth/' || g,
       CASE WHEN g % $4 = 0 THEN 'pending' ELSE 'done' END,
       CASE WHEN g % $4 = 0 THEN 0 ELSE 1 END,
       CASE WHEN g % $4 = 0 THEN NULL ELSE now() END,
       CASE WHEN g % $4 = 0 THEN NULL ELSE now() END
FROM generate_series($2::bigint, $3::bigint) AS g`
	sqlClaimBatchOne = `SELECT id, attempt, claim_token FROM files.claim_batch($1::text[], $2::text[], $3)`
	sqlClaimOne      = `SELECT id, attempt, claim_token FROM files.claim($1, $2::text[], 1, $3)`
	sqlRelease       = `SELECT files.release($1::bigint, $2, $3::integer, $4, $5)`
	sqlDeregister    = `SELECT files.deregister_worker($1, $2)`
)

// slotKey is the key of the bench's slot: its first claim registers it with it.
var slotKey = rand.Text()

// fillChunk is how many rows one INSERT ... SELECT adds.
const fillChunk = 1_000_000

// ClaimDepthConfig sizes a ClaimDepth run. A nil or zero config works.
type ClaimDepthConfig struct {
	// Depths are the table sizes to measure at, in rows. Defaults to
	// 10,000, 1,000,000 and 10,000,000.
	Depths []int
	// Claims is how many claims of each function are timed at each depth,
	// after a few that are not. Defaults to 200.
	Claims int
	// PendingPercent of the rows are pending, the rest done. Defaults to 1.
	PendingPercent float64
}

// ClaimDepthResult is what ClaimDepth measured.
type ClaimDepthResult struct {
	Setup
	Claims         int          `json:"claims"`
	PendingPercent float64      `json:"pending_percent"`
	Depths         []DepthClaim `json:"depths"`
	// RatioClaimBatch is the median claim_batch time at the largest depth
	// over the one at the smallest; RatioClaim the same for files.claim.
	RatioClaimBatch float64 `json:"ratio_claim_batch"`
	RatioClaim      float64 `json:"ratio_claim"`
	RatioDepths     [2]int  `json:"ratio_depths"`
}

// DepthClaim is the time of one claim at one table size: the client's round
// trip of a committed statement, and the server's own mean when
// track_functions counts it.
type DepthClaim struct {
	Rows    int     `json:"rows"`
	Pending int     `json:"pending"`
	BuildMS float64 `json:"build_ms"` // adding the rows since the previous depth, and VACUUM ANALYZE
	// ClaimBatch times files.claim_batch for one slot, the query the worker
	// runtime sends; Claim times files.claim(worker_id, queues, 1).
	ClaimBatch Percentiles `json:"claim_batch"`
	Claim      Percentiles `json:"claim"`
	// Server-side mean time per call from pg_stat_user_functions; null
	// when the server does not track functions.
	ClaimBatchServerMS *float64 `json:"claim_batch_server_ms"`
	ClaimServerMS      *float64 `json:"claim_server_ms"`
}

// ClaimDepth grows the table through cfg.Depths with INSERT ... SELECT
// generate_series (mostly done rows, cfg.PendingPercent pending) and times,
// at each depth, cfg.Claims committed claims of one row for one slot with
// files.claim_batch and with files.claim, alternately. Each claimed row is
// released at once, untimed, so the depth and the backlog stay as they were.
func (b *Bench) ClaimDepth(ctx context.Context, cfg *ClaimDepthConfig) (*ClaimDepthResult, error) {
	c, err := claimDepthDefaults(cfg)
	if err != nil {
		return nil, err
	}
	every := max(int64(100/c.PendingPercent+0.5), 1)
	res := &ClaimDepthResult{Claims: c.Claims, PendingPercent: c.PendingPercent}
	err = b.run(ctx, "claim-depth", func(ctx context.Context) error {
		res.Setup = b.setup("claim-depth")
		var track string
		if err := b.pool.QueryRow(ctx, sqlTrackFunctions).Scan(&track); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer conn.Release()
		slot := workerPrefix + strconv.Itoa(os.Getpid()) + ":depth:0"
		defer func() {
			// The first claim registered the slot; stopped, the cleanup removes it.
			_, _ = conn.Exec(context.WithoutCancel(ctx), sqlDeregister, slot, slotKey)
		}()
		have := 0
		for _, depth := range c.Depths {
			t := time.Now()
			if err := b.grow(ctx, have, depth, every); err != nil {
				return err
			}
			have = depth
			d := DepthClaim{Rows: depth, Pending: depth / int(every), BuildMS: ms(time.Since(t))}
			if d.Pending == 0 {
				return fmt.Errorf("bench: claim-depth %d rows with %g%% pending leaves none to claim", depth, c.PendingPercent)
			}
			if err := b.timeDepth(ctx, conn.Conn(), slot, c.Claims, track != "none", &d); err != nil {
				return err
			}
			b.logger.Info("bench: claim time", "rows", depth, "claim_batch_p50_ms", d.ClaimBatch.P50MS, "claim_p50_ms", d.Claim.P50MS)
			res.Depths = append(res.Depths, d)
		}
		res.ratios()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func claimDepthDefaults(cfg *ClaimDepthConfig) (ClaimDepthConfig, error) {
	c := ClaimDepthConfig{}
	if cfg != nil {
		c = *cfg
	}
	if len(c.Depths) == 0 {
		c.Depths = []int{10_000, 1_000_000, 10_000_000}
	}
	c.Depths = slices.Clone(c.Depths)
	slices.Sort(c.Depths)
	c.Depths = slices.Compact(c.Depths)
	if c.Depths[0] < 1 {
		return c, errors.New("bench: claim-depth depths must be positive")
	}
	c.Claims = orDefault(c.Claims, 200)
	c.PendingPercent = orDefault(c.PendingPercent, 1)
	if c.PendingPercent > 100 {
		return c, errors.New("bench: claim-depth pending percent must be at most 100")
	}
	return c, nil
}

// grow adds the rows have+1 to depth to Queue, fillChunk at a time, every
// every-th one pending, and gives the planner fresh statistics.
func (b *Bench) grow(ctx context.Context, have, depth int, every int64) error {
	b.logger.Info("bench: building the table", "rows", depth)
	for have < depth {
		to := min(have+fillChunk, depth)
		if _, err := b.pool.Exec(ctx, sqlFillDepth, Queue, have+1, to, every); err != nil {
			return fmt.Errorf("bench: add rows %d to %d: %w", have+1, to, explain(err))
		}
		have = to
	}
	b.vacuum(ctx)
	return nil
}

// timeDepth times claims claims with each function on conn, after a few
// that are not timed, into d; with track, it reads the server's own mean
// time per call too.
func (b *Bench) timeDepth(ctx context.Context, conn *pgx.Conn, slot string, claims int, track bool, d *DepthClaim) error {
	// Warm up: the slot's registration, the plans, the cache.
	if _, _, err := claimTimes(ctx, conn, slot, 5); err != nil {
		return err
	}
	var before map[string]funcStats
	if track {
		var err error
		if before, err = b.flushedFunctionStats(ctx, conn); err != nil {
			return err
		}
	}
	batch, single, err := claimTimes(ctx, conn, slot, claims)
	if err != nil {
		return err
	}
	d.ClaimBatch, d.Claim = percentiles(batch), percentiles(single)
	if track {
		after, err := b.flushedFunctionStats(ctx, conn)
		if err != nil {
			return err
		}
		d.ClaimBatchServerMS = meanCall(before["claim_batch"], after["claim_batch"])
		d.ClaimServerMS = meanCall(before["claim"], after["claim"])
	}
	return nil
}

// ratios compares the median claim times at the largest depth with those
// at the smallest.
func (res *ClaimDepthResult) ratios() {
	first, last := res.Depths[0], res.Depths[len(res.Depths)-1]
	res.RatioDepths = [2]int{last.Rows, first.Rows}
	if first.ClaimBatch.P50MS > 0 && first.Claim.P50MS > 0 {
		res.RatioClaimBatch = round(last.ClaimBatch.P50MS/first.ClaimBatch.P50MS, 2)
		res.RatioClaim = round(last.Claim.P50MS/first.Claim.P50MS, 2)
	}
}

// claimTimes times n claims with each function, alternately; each claimed
// row is released at once.
func claimTimes(ctx context.Context, conn *pgx.Conn, slot string, n int) (batch, single []time.Duration, err error) {
	queues := []string{Queue}
	claim := func(sql string, args ...any) (time.Duration, error) {
		var id int64
		var attempt int32
		var token string
		t := time.Now()
		err := conn.QueryRow(ctx, sql, args...).Scan(&id, &attempt, &token)
		d := time.Since(t)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, errors.New("bench: a claim found no pending row")
		}
		if err != nil {
			return 0, fmt.Errorf("bench: claim: %w", err)
		}
		if _, err := conn.Exec(ctx, sqlRelease, id, slot, attempt, token, "pgworker bench"); err != nil {
			return 0, fmt.Errorf("bench: release: %w", err)
		}
		return d, nil
	}
	for range n {
		db, err := claim(sqlClaimBatchOne, []string{slot}, queues, slotKey)
		if err != nil {
			return nil, nil, err
		}
		ds, err := claim(sqlClaimOne, slot, queues, slotKey)
		if err != nil {
			return nil, nil, err
		}
		batch, single = append(batch, db), append(single, ds)
	}
	return batch, single, nil
}

// funcStats is a line of pg_stat_user_functions.
type funcStats struct {
	calls   int64
	totalMS float64
}

func (b *Bench) functionStats(ctx context.Context) (map[string]funcStats, error) {
	rows, err := b.pool.Query(ctx, sqlFunctionStats)
	if err != nil {
		return nil, fmt.Errorf("bench: read pg_stat_user_functions: %w", err)
	}
	out := map[string]funcStats{}
	var name string
	var s funcStats
	_, err = pgx.ForEachRow(rows, []any{&name, &s.calls, &s.totalMS}, func() error {
		out[name] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bench: read pg_stat_user_functions: %w", err)
	}
	return out, nil
}

// flushedFunctionStats makes conn, the only session that claims, report its
// statistics now, and reads them.
func (b *Bench) flushedFunctionStats(ctx context.Context, conn *pgx.Conn) (map[string]funcStats, error) {
	forceFlush(ctx, conn)
	return b.settledFunctionStats(ctx, func(map[string]funcStats) bool { return true })
}

// forceFlush asks the session of conn to report its statistics at the end of
// this statement instead of up to 10s later (PostgreSQL 15 and later; older
// servers report within half a second anyway).
func forceFlush(ctx context.Context, conn *pgx.Conn) {
	_, _ = conn.Exec(ctx, sqlForceFlush)
}

// settledFunctionStats reads the function statistics once done accepts them
// and they have stopped changing. A backend reports its counts when it goes
// idle, at most once a second; one that ran again within that second holds
// them back for up to 10s, unless told to report them (forceFlush).
func (b *Bench) settledFunctionStats(ctx context.Context, done func(map[string]funcStats) bool) (map[string]funcStats, error) {
	const (
		every  = 250 * time.Millisecond
		stable = 1500 * time.Millisecond
		limit  = 30 * time.Second
	)
	deadline := time.Now().Add(limit)
	last, err := b.functionStats(ctx)
	if err != nil {
		return nil, err
	}
	since := time.Now()
	for time.Since(since) < stable || !done(last) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench: the function statistics did not settle within %s (are other sessions claiming?)", limit)
		}
		if err := sleep(ctx, every); err != nil {
			return nil, err
		}
		cur, err := b.functionStats(ctx)
		if err != nil {
			return nil, err
		}
		if !equalStats(cur, last) {
			last, since = cur, time.Now()
		}
	}
	return last, nil
}

func equalStats(a, b map[string]funcStats) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k].calls != v.calls {
			return false
		}
	}
	return true
}

func meanCall(before, after funcStats) *float64 {
	calls := after.calls - before.calls
	if calls <= 0 {
		return nil
	}
	m := round((after.totalMS-before.totalMS)/float64(calls), 3)
	return &m
}
