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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/listener"
	"github.com/pgworker/pgworker/worker"
)

// The statements of the steady modes (LongTx, Soak): the producer's insert,
// the snapshot holder's, the table statistics and the optional prune.
const (
	sqlInsertMany = `INSERT INTO files.files (queue, source, max_attempts)
SELECT $1, $2 || g, 1 FROM generate_series($3::bigint, $4::bigint) AS g`
	sqlHoldSnapshot = `SELECT pg_backend_pid()`
	sqlHolderXmin   = `SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $1`
	sqlTableStats   = `SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count + s.vacuum_count,
       pg_relation_size('files.files'), pg_indexes_size('files.files'),
       pg_relation_size('files.files_claim_idx'), pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
FROM pg_stat_user_tables s WHERE s.relid = 'files.files'::regclass`
	sqlPruneExists = `SELECT to_regproc('files.prune') IS NOT NULL AND to_regprocedure('files.keep_queue(text, interval, interval)') IS NOT NULL`
	sqlNotDone     = `SELECT count(*) FROM files.files WHERE queue = $1 AND state <> 'done'`
	sqlKeepQueue   = `SELECT files.keep_queue($1, $2::interval, $2::interval)`
	sqlPrune       = `SELECT coalesce(sum(p.rows), 0)::bigint FROM files.prune(max_rows => $1) AS p`
)

// pruneBatch is the rows one call of files.prune deletes at most; the
// pruner calls it again while it deletes that many.
const pruneBatch = 10_000

// steadySource is the prefix of the producer's rows' sources, before the
// row's number in the run.
const steadySource = "steady/"

// steadyTick is how often the producer looks at the clock or the depth.
const steadyTick = 10 * time.Millisecond

// maxInsert bounds the rows of one insert statement.
const maxInsert = 10_000

// Sample is the state of a steady run over one sampling interval: rates and
// pickup times of the interval, and the depth and the table's statistics at
// its end.
type Sample struct {
	// AtSec is the end of the interval, in seconds since the first phase
	// began.
	AtSec float64 `json:"at_sec"`
	Phase string  `json:"phase"`
	// RowsPerSec is the rows done in the interval per second;
	// InsertedPerSec the rows the producer inserted.
	RowsPerSec     float64 `json:"rows_per_sec"`
	InsertedPerSec float64 `json:"inserted_per_sec"`
	// Pickup is from the row's insert (its created_at) to its handler's
	// start, for the rows started in the interval; PickupFromReturn from
	// the moment the insert's answer came back to the producer, its commit
	// done (0 for a row started before that). The difference is the
	// insert's own time: Insert is the round trips of the producer's
	// inserts answered in the interval (sent → answered, commit included).
	PickupP50MS           float64 `json:"pickup_p50_ms"`
	PickupP99MS           float64 `json:"pickup_p99_ms"`
	PickupFromReturnP50MS float64 `json:"pickup_from_return_p50_ms"`
	PickupFromReturnP99MS float64 `json:"pickup_from_return_p99_ms"`
	InsertP99MS           float64 `json:"insert_p99_ms"`
	InsertMaxMS           float64 `json:"insert_max_ms"`
	// Claims is the claim queries the workers' pools had answered in the
	// interval, EmptyClaims those that returned no row, and Claim their
	// round trips (sent → answered); ClaimIdleMaxMS is the longest time in
	// it during which no claim query was under way, fleet-wide. From the
	// benchmark's trace of the pools.
	Claims         int     `json:"claims"`
	EmptyClaims    int     `json:"empty_claims"`
	ClaimP50MS     float64 `json:"claim_p50_ms"`
	ClaimP99MS     float64 `json:"claim_p99_ms"`
	ClaimMaxMS     float64 `json:"claim_max_ms"`
	ClaimIdleMaxMS float64 `json:"claim_idle_max_ms"`
	// Outcome is the round trips of the workers' outcome calls answered in
	// the interval (files.complete and complete_many, each commit flushed):
	// a process's slots wait for them once its worker.Config.MaxUnrecorded
	// outcomes wait.
	OutcomeP99MS float64 `json:"outcome_p99_ms"`
	OutcomeMaxMS float64 `json:"outcome_max_ms"`
	// OutcomeWaits is how many times in the interval a slot waited for its
	// own outcome because its process's MaxUnrecorded outcomes waited
	// already (worker.Stats.OutcomeWaits): the commits held the slots back.
	OutcomeWaits uint64 `json:"outcome_waits"`
	// NotifyIdleMaxMS is the longest time in the interval without a
	// notification reaching the first worker runtime's listener: beside
	// ClaimIdleMaxMS, it tells a pause in what the claimers were told from
	// a pause of the claimers.
	NotifyIdleMaxMS float64 `json:"notify_idle_max_ms"`
	// Depth is the rows inserted (or in an insert under way) and not yet
	// started.
	Depth int64 `json:"depth"`
	// WALBytesPerRow is the WAL the server wrote in the interval (the
	// whole cluster's) per row done in it; 0 when none was done.
	WALBytesPerRow float64 `json:"wal_bytes_per_row"`
	TableStats
}

// TableStats are files.files' statistics: tuples as the statistics
// collector counts them, and sizes in bytes.
type TableStats struct {
	LiveTuples int64 `json:"live_tuples"`
	DeadTuples int64 `json:"dead_tuples"`
	// Vacuums counts the vacuums of the table so far (autovacuum and
	// manual).
	Vacuums         int64 `json:"vacuums"`
	TableBytes      int64 `json:"table_bytes"`
	IndexBytes      int64 `json:"index_bytes"`
	ClaimIndexBytes int64 `json:"claim_index_bytes"`
	// wal is the server's WAL position in bytes: the WAL written between
	// two readings, the whole cluster's.
	wal int64
}

// PhaseResult sums up one phase of a steady run.
type PhaseResult struct {
	Name         string  `json:"name"`
	Seconds      float64 `json:"seconds"`
	HeldSnapshot bool    `json:"held_snapshot"`
	// RowsPerSec is the rows done in the phase per second; InsertedPerSec
	// the producer's rate.
	RowsPerSec     float64 `json:"rows_per_sec"`
	InsertedPerSec float64 `json:"inserted_per_sec"`
	// Pickup is from insert (created_at) to handler start of the rows
	// started in the phase; PickupFromReturn from the insert's answer, and
	// Insert the inserts' round trips, as in Sample.
	Pickup           Percentiles `json:"pickup"`
	PickupFromReturn Percentiles `json:"pickup_from_return"`
	Insert           Percentiles `json:"insert"`
	// DepthEnd is the rows inserted (or in an insert under way) and not
	// started at the end of the phase;
	// DepthMax the largest depth sampled in it.
	DepthEnd int64 `json:"depth_end"`
	DepthMax int64 `json:"depth_max"`
	// Claims is the claim queries the worker sent in the phase; ClaimMS
	// their mean time in the server (from pg_stat_user_functions; 0 when
	// track_functions is off and cannot be turned on).
	Claims  uint64  `json:"claims"`
	ClaimMS float64 `json:"claim_ms"`
	// OutcomeWaits is as in Sample, for the phase.
	OutcomeWaits uint64 `json:"outcome_waits"`
	// WALBytesPerRow is the WAL the server wrote in the phase per row done
	// in it, as in Sample.
	WALBytesPerRow float64 `json:"wal_bytes_per_row"`
	// End is the table's statistics at the end of the phase.
	End TableStats `json:"end"`
	// Vacuums is the vacuums of files.files during the phase.
	Vacuums int64 `json:"vacuums"`
}

// steadyPhase is one phase to run: its name, its length, and whether a
// snapshot is held open through it.
type steadyPhase struct {
	name     string
	duration time.Duration
	hold     bool
}

// steadyConfig is what LongTx and Soak share.
type steadyConfig struct {
	mode        string
	slots       int
	maxConns    int
	processes   int     // worker runtimes, each of slots slots; 0 is 1
	rate        float64 // rows per second; 0 with depth: peak mode
	depth       int     // peak mode: the backlog the producer keeps
	sampleEvery time.Duration
	pruneEvery  time.Duration // 0: no prune
	keep        time.Duration // with pruneEvery: how long done rows are kept
	drain       time.Duration
	phases      []steadyPhase
}

// steadyResult is what a steady run measured.
type steadyResult struct {
	phases  []PhaseResult
	samples []Sample
	rows    int64
	pruned  int64 // prune calls
	deleted int64 // rows they deleted
	// undrained is the rows not done when the drain gave up.
	undrained int64
}

// steadyHandler is the steady modes' no-op handler: it counts the rows it
// starts and keeps, for the sample and the phase, when each started.
type steadyHandler struct {
	started atomic.Int64
	mu      sync.Mutex
	sample  []rowStart
	phase   []rowStart
}

// rowStart is when the handler started the producer's row seq (its source
// is "steady/seq"), and how long after its insert's created_at.
type rowStart struct {
	seq     int64
	at      time.Time
	created time.Duration
}

func (h *steadyHandler) Handle(_ context.Context, job *worker.Job) (*worker.Result, error) {
	now := time.Now()
	seq, err := strconv.ParseInt(strings.TrimPrefix(job.Source, steadySource), 10, 64)
	if err != nil {
		seq = -1 // not the producer's: counted from created_at alone
	}
	r := rowStart{seq: seq, at: now, created: now.Sub(job.CreatedAt)}
	h.mu.Lock()
	h.sample = append(h.sample, r)
	h.phase = append(h.phase, r)
	h.mu.Unlock()
	h.started.Add(1)
	return nil, nil
}

// takeSample returns the rows started since the last call.
func (h *steadyHandler) takeSample() []rowStart { return take(&h.mu, &h.sample) }

// takePhase returns the rows started since the last call.
func (h *steadyHandler) takePhase() []rowStart { return take(&h.mu, &h.phase) }

// take empties *s under mu and returns what it held.
func take[T any](mu *sync.Mutex, s *[]T) []T {
	mu.Lock()
	defer mu.Unlock()
	t := *s
	*s = nil
	return t
}

// pickups returns the rows' pickup times from their created_at, and from
// the moment their insert's answer came back to the producer (0 for a row
// started before that: its commit was visible before the answer arrived).
func (p *producer) pickups(starts []rowStart) (fromCreated, fromReturn []time.Duration) {
	fromCreated = make([]time.Duration, len(starts))
	fromReturn = make([]time.Duration, 0, len(starts))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range starts {
		fromCreated[i] = r.created
		if r.seq < 0 {
			continue
		}
		// The first insert whose rows reach seq.
		j, _ := slices.BinarySearchFunc(p.returned, r.seq, func(m insertReturn, seq int64) int { return cmp.Compare(m.last, seq) })
		if j == len(p.returned) || p.returned[j].first > r.seq {
			fromReturn = append(fromReturn, 0) // its insert has not answered yet
			continue
		}
		fromReturn = append(fromReturn, max(r.at.Sub(p.returned[j].at), 0))
	}
	return fromCreated, fromReturn
}

// producer inserts rows of Queue at a fixed rate, or keeping a depth.
type producer struct {
	pool     *pgxpool.Pool
	rate     float64
	depth    int64
	started  *atomic.Int64 // rows the handler started, for the depth
	inserted atomic.Int64

	mu sync.Mutex
	// returned is when each insert's answer came back, in order; trips
	// and phaseTrips the round trips (sent → answered, its commit
	// included) of those answered since the sample's and the phase's start.
	returned   []insertReturn
	trips      []time.Duration
	phaseTrips []time.Duration
}

// insertReturn is when the answer to the insert of rows first to last came
// back to the producer.
type insertReturn struct {
	first, last int64
	at          time.Time
}

// takeTrips returns the inserts' round trips since the last call.
func (p *producer) takeTrips() []time.Duration { return take(&p.mu, &p.trips) }

// takePhaseTrips returns the inserts' round trips since the last call.
func (p *producer) takePhaseTrips() []time.Duration { return take(&p.mu, &p.phaseTrips) }

// run inserts until stop is closed (an insert that ctx cut short could
// have committed, and the count would be wrong). At a fixed rate it
// inserts, each tick, the rows due since it began (catching up when an
// insert was slow); in peak mode what brings the depth back to its target.
func (p *producer) run(ctx context.Context, stop <-chan struct{}) error {
	t0 := time.Now()
	tick := time.NewTicker(steadyTick)
	defer tick.Stop()
	for {
		var n int64
		have := p.inserted.Load()
		if p.rate > 0 {
			n = int64(p.rate*time.Since(t0).Seconds()) - have
		} else {
			n = p.depth - (have - p.started.Load())
		}
		if n > 0 {
			n = min(n, maxInsert)
			// Counted before the insert: its rows can be started before
			// its answer comes back, and a depth read meanwhile would be
			// below zero. A failed insert ends the run.
			p.inserted.Add(n)
			sent := time.Now()
			if _, err := p.pool.Exec(ctx, sqlInsertMany, Queue, steadySource, have, have+n-1); err != nil {
				return fmt.Errorf("bench: insert: %w", explain(err))
			}
			back := time.Now()
			p.mu.Lock()
			p.returned = append(p.returned, insertReturn{first: have, last: have + n - 1, at: back})
			p.trips = append(p.trips, back.Sub(sent))
			p.phaseTrips = append(p.phaseTrips, back.Sub(sent))
			p.mu.Unlock()
		}
		select {
		case <-tick.C:
		case <-stop:
			return nil
		}
	}
}

// steady runs cfg's phases with a producer and a worker of cfg.slots
// slots, samples every cfg.sampleEvery, and at the end waits for the
// backlog to drain and checks that every row ended done.
func (b *Bench) steady(ctx context.Context, c steadyConfig) (*steadyResult, error) {
	res := &steadyResult{}
	err := b.run(ctx, c.mode, func(ctx context.Context) error {
		if c.pruneEvery > 0 {
			var ok bool
			if err := b.pool.QueryRow(ctx, sqlPruneExists).Scan(&ok); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if !ok {
				return errors.New("bench: pruning asked for, and the database has no files.prune() and files.keep_queue (migrate to a version with retention)")
			}
			if _, err := b.pool.Exec(ctx, sqlKeepQueue, Queue, c.keep); err != nil {
				return fmt.Errorf("bench: files.keep_queue: %w", err)
			}
		}
		var track string
		if err := b.pool.QueryRow(ctx, sqlTrackFunctions).Scan(&track); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		var params map[string]string
		if track == "none" {
			params = map[string]string{"track_functions": "pl"}
		}
		h := &steadyHandler{}
		outcomes := &outcomeCount{}
		trace := &claimTrace{}
		// The first runtime's listener is the benchmark's, with a
		// subscriber that records each notification, subscribed before the
		// runtime: rung first on each. It stops after the runtimes.
		notes := &notifyTrace{}
		l, stopListen, err := listen(ctx, &b.workerPoolConfig(1).ConnConfig.Config, notes)
		if err != nil {
			return err
		}
		defer stopListen()

		// Each process a worker runtime with a pool and a LISTEN connection
		// of its own, as separate processes would have.
		var ws []*worker.Worker
		var pools []*pgxpool.Pool
		defer func() {
			for _, w := range ws {
				stopWorker(w)
			}
			for _, p := range pools {
				p.Close()
			}
		}()
		for i := range max(c.processes, 1) {
			name := c.mode
			if c.processes > 1 {
				name += "-" + strconv.Itoa(i+1)
			}
			var own *listener.Listener
			if i == 0 {
				own = l
			}
			w, wpool, err := b.steadyWorker(ctx, name, c.slots, c.maxConns, &params, h, outcomes, trace, own)
			if err != nil {
				return err
			}
			ws, pools = append(ws, w), append(pools, wpool)
		}

		// The producer, the snapshot holder and the pruner have a pool of
		// their own.
		side, err := b.workerPool(ctx, 3, nil)
		if err != nil {
			return err
		}
		defer side.Close()
		prod := &producer{pool: side, rate: c.rate, depth: int64(c.depth), started: &h.started}
		pctx, stopProducer := context.WithCancel(ctx)
		defer stopProducer()
		perr := make(chan error, 1)
		go func() { perr <- prod.run(ctx, pctx.Done()) }()
		pr := &pruner{b: b, pool: side}
		var pruning sync.WaitGroup
		if c.pruneEvery > 0 {
			pruning.Go(func() { pr.every(pctx, c.pruneEvery) })
		}

		s := &sampler{b: b, h: h, ws: ws, outcomes: outcomes, prod: prod, trace: trace, notes: notes, t0: time.Now()}
		if err := s.begin(ctx); err != nil {
			return err
		}
		for _, ph := range c.phases {
			pr, err := b.steadyPhase(ctx, s, side, ph, c.sampleEvery, perr)
			if err != nil {
				return err
			}
			res.phases = append(res.phases, *pr)
		}
		stopProducer()
		pruning.Wait()
		if err := <-perr; err != nil {
			return err
		}
		if c.pruneEvery > 0 {
			// A last call, so that every run with pruning has pruned.
			if err := pr.prune(ctx); err != nil {
				return err
			}
		}
		res.pruned, res.deleted = pr.calls, pr.deleted
		res.samples = s.samples
		res.rows = prod.inserted.Load()
		b.logger.Info("bench: draining", "rows", res.rows, "left", res.rows-int64(outcomes.count()))
		dctx, cancel := context.WithTimeout(ctx, c.drain)
		defer cancel()
		if err := outcomes.wait(dctx, uint64(res.rows)); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// Reported, not an error: the phases' figures stand, and the
			// rows left are the benchmark's own, deleted at its end.
			res.undrained = res.rows - int64(outcomes.count())
			b.logger.Warn("bench: the backlog did not drain", "within", c.drain, "left", res.undrained)
			return nil
		}
		if c.pruneEvery > 0 {
			// Workers may prune too: what is left must all be done.
			var left int64
			if err := b.pool.QueryRow(ctx, sqlNotDone, Queue).Scan(&left); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if left > 0 {
				return fmt.Errorf("bench: %d rows of %d did not end done", left, res.rows)
			}
			return nil
		}
		return b.outcomes(ctx, int(res.rows))
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// steadyWorker starts one worker runtime of a steady run, with a pool of its
// own traced by trace, the listener l (nil: one of its own), and the
// server's claim times when the role may ask for them: once refused,
// *params is dropped for the runtimes started after it too.
func (b *Bench) steadyWorker(ctx context.Context, name string, slots, conns int, params *map[string]string,
	h *steadyHandler, outcomes *outcomeCount, trace *claimTrace, l *listener.Listener) (*worker.Worker, *pgxpool.Pool, error) {
	cfg := worker.Config{Handler: h, Slots: slots, Observer: outcomes, Listener: l}
	for {
		wpool, err := b.tracedPool(ctx, conns, *params, trace)
		if err != nil {
			return nil, nil, err
		}
		w, err := b.startWorker(ctx, wpool, name, cfg)
		if err == nil {
			return w, wpool, nil
		}
		wpool.Close()
		if *params == nil || !isPrivilege(err) {
			return nil, nil, err
		}
		// Not a superuser: run without the server's claim times.
		*params = nil
	}
}

// steadyPhase runs one phase, holding a snapshot through it if it says so.
func (b *Bench) steadyPhase(ctx context.Context, s *sampler, side *pgxpool.Pool, ph steadyPhase, every time.Duration, perr chan error) (*PhaseResult, error) {
	if ph.hold {
		tx, err := holdSnapshot(ctx, side)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // ends the held snapshot
	}
	b.logger.Info("bench: phase", "phase", ph.name, "duration", ph.duration, "held_snapshot", ph.hold)
	start := s.phaseStart(ph.name)
	end := time.Now().Add(ph.duration)
	for {
		next := time.Now().Add(every)
		if next.After(end) {
			next = end
		}
		select {
		case <-time.After(time.Until(next)):
		case err := <-perr:
			if err == nil {
				err = errors.New("bench: the producer stopped")
			}
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := s.sample(ctx); err != nil {
			return nil, err
		}
		if !time.Now().Before(end) {
			break
		}
	}
	pr, err := s.phaseEnd(ctx, start)
	if err != nil {
		return nil, err
	}
	pr.HeldSnapshot = ph.hold
	return pr, nil
}

// holdSnapshot opens a REPEATABLE READ transaction on a connection of its
// own and takes its snapshot, which pins the xmin horizon until the
// transaction ends; it checks that the server sees the pinned horizon.
func holdSnapshot(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("bench: open the snapshot holder: %w", err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, sqlHoldSnapshot).Scan(&pid); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("bench: take the held snapshot: %w", err)
	}
	var held bool
	if err := pool.QueryRow(ctx, sqlHolderXmin, pid).Scan(&held); err != nil || !held {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("bench: the held transaction shows no xmin in pg_stat_activity (%v)", err)
	}
	return tx, nil
}

// pruner calls files.prune as retention's pruner would, and counts.
type pruner struct {
	b       *Bench
	pool    *pgxpool.Pool
	calls   int64
	deleted int64
}

// every prunes at each interval until ctx ends; a failed call is logged.
func (p *pruner) every(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if err := p.prune(ctx); err != nil && ctx.Err() == nil {
			p.b.logger.Warn("bench: files.prune", "error", err)
		}
	}
}

// prune calls files.prune until a call deletes less than a batch.
func (p *pruner) prune(ctx context.Context) error {
	for {
		var n int64
		if err := p.pool.QueryRow(ctx, sqlPrune, pruneBatch).Scan(&n); err != nil {
			return fmt.Errorf("bench: files.prune: %w", err)
		}
		p.calls++
		p.deleted += n
		if n < pruneBatch {
			return nil
		}
	}
}

// sampler takes the samples and the phase sums of a steady run.
type sampler struct {
	b        *Bench
	h        *steadyHandler
	ws       []*worker.Worker
	outcomes *outcomeCount
	prod     *producer
	trace    *claimTrace
	notes    *notifyTrace
	t0       time.Time
	samples  []Sample
	// lastAnswer is when the last claim the samples took was answered,
	// lastNote when the last notification they took came.
	lastAnswer, lastNote time.Time

	phase string
	// at the last sample
	last              time.Time
	lastDone, lastIns int64
	lastWaits         uint64
	lastWAL           int64
	// at the phase's start
	phaseAt             time.Time
	phaseDone, phaseIns int64
	phaseClaims         uint64
	phaseWaits          uint64
	phaseFn             map[string]funcStats
	phaseStats          TableStats
	depthMax            int64
}

// workerCounts returns the claims the workers sent and the times their
// slots waited for their own outcomes.
func (s *sampler) workerCounts() (claims, waits uint64) {
	for _, w := range s.ws {
		st := w.Stats()
		claims += st.Claims
		waits += st.OutcomeWaits
	}
	return claims, waits
}

func (s *sampler) begin(ctx context.Context) error {
	s.last = time.Now()
	s.t0 = s.last
	// The workers' first looks for work are not the samples'.
	_, _, _, _, s.lastAnswer = claimSteps(s.trace.take(), time.Time{})
	s.trace.takeOutcomes()
	_, s.lastNote = longestGap(s.notes.takeNotify(), time.Time{})
	_, s.lastWaits = s.workerCounts()
	st, err := s.b.tableStats(ctx)
	s.lastWAL = st.wal
	return err
}

// walPerRow is the WAL written from one reading to another per row done
// meanwhile.
func walPerRow(from, to, rows int64) float64 {
	if rows <= 0 {
		return 0
	}
	return round(float64(to-from)/float64(rows), 1)
}

func (s *sampler) phaseStart(name string) time.Time {
	s.phase = name
	now := time.Now()
	s.phaseAt = now
	s.phaseDone, s.phaseIns = int64(s.outcomes.count()), s.prod.inserted.Load()
	s.phaseClaims, s.phaseWaits = s.workerCounts()
	s.phaseFn, _ = s.b.functionStats(context.Background())
	s.phaseStats, _ = s.b.tableStats(context.Background())
	s.depthMax = 0
	s.h.takePhase()
	s.prod.takePhaseTrips()
	return now
}

func (s *sampler) sample(ctx context.Context) error {
	now := time.Now()
	// Started before inserted: a row is counted inserted before it can be
	// started, so read in this order the depth is never below zero.
	started := s.h.started.Load()
	done, ins := int64(s.outcomes.count()), s.prod.inserted.Load()
	depth := ins - started
	st, err := s.b.tableStats(ctx)
	if err != nil {
		return err
	}
	secs := now.Sub(s.last).Seconds()
	created, returned := s.prod.pickups(s.h.takeSample())
	p, pr := percentiles(created), percentiles(returned)
	trip, outcome := percentiles(s.prod.takeTrips()), percentiles(s.trace.takeOutcomes())
	n, empty, rtt, idle, last := claimSteps(s.trace.take(), s.lastAnswer)
	s.lastAnswer = last
	quiet, lastNote := longestGap(s.notes.takeNotify(), s.lastNote)
	s.lastNote = lastNote
	_, waits := s.workerCounts()
	s.samples = append(s.samples, Sample{
		AtSec: round(now.Sub(s.t0).Seconds(), 2), Phase: s.phase,
		RowsPerSec: round(float64(done-s.lastDone)/secs, 1), InsertedPerSec: round(float64(ins-s.lastIns)/secs, 1),
		PickupP50MS: p.P50MS, PickupP99MS: p.P99MS, PickupFromReturnP50MS: pr.P50MS, PickupFromReturnP99MS: pr.P99MS,
		InsertP99MS: trip.P99MS, InsertMaxMS: trip.MaxMS, OutcomeP99MS: outcome.P99MS, OutcomeMaxMS: outcome.MaxMS,
		OutcomeWaits: waits - s.lastWaits, Claims: n, EmptyClaims: empty, ClaimP50MS: rtt.P50MS, ClaimP99MS: rtt.P99MS, ClaimMaxMS: rtt.MaxMS,
		ClaimIdleMaxMS: round(float64(idle)/float64(time.Millisecond), 3), NotifyIdleMaxMS: round(float64(quiet)/float64(time.Millisecond), 3),
		Depth: depth, WALBytesPerRow: walPerRow(s.lastWAL, st.wal, done-s.lastDone), TableStats: st,
	})
	s.last, s.lastDone, s.lastIns, s.lastWAL, s.lastWaits = now, done, ins, st.wal, waits
	s.depthMax = max(s.depthMax, depth)
	return nil
}

func (s *sampler) phaseEnd(ctx context.Context, start time.Time) (*PhaseResult, error) {
	secs := time.Since(start).Seconds()
	started := s.h.started.Load() // before inserted, as in sample
	done, ins := int64(s.outcomes.count()), s.prod.inserted.Load()
	st, err := s.b.tableStats(ctx)
	if err != nil {
		return nil, err
	}
	created, returned := s.prod.pickups(s.h.takePhase())
	claims, waits := s.workerCounts()
	pr := &PhaseResult{
		Name: s.phase, Seconds: round(secs, 1),
		RowsPerSec: round(float64(done-s.phaseDone)/secs, 1), InsertedPerSec: round(float64(ins-s.phaseIns)/secs, 1),
		Pickup: percentiles(created), PickupFromReturn: percentiles(returned), Insert: percentiles(s.prod.takePhaseTrips()),
		DepthEnd: ins - started, DepthMax: s.depthMax,
		Claims: claims - s.phaseClaims, OutcomeWaits: waits - s.phaseWaits, End: st, Vacuums: st.Vacuums - s.phaseStats.Vacuums,
		WALBytesPerRow: walPerRow(s.phaseStats.wal, st.wal, done-s.phaseDone),
	}
	if fn, err := s.b.functionStats(ctx); err == nil && s.phaseFn != nil {
		calls := fn["claim"].calls + fn["claim_batch"].calls - s.phaseFn["claim"].calls - s.phaseFn["claim_batch"].calls
		total := fn["claim"].totalMS + fn["claim_batch"].totalMS - s.phaseFn["claim"].totalMS - s.phaseFn["claim_batch"].totalMS
		if calls > 0 {
			pr.ClaimMS = round(total/float64(calls), 3)
		}
	}
	return pr, nil
}

func (b *Bench) tableStats(ctx context.Context) (TableStats, error) {
	var t TableStats
	err := b.pool.QueryRow(ctx, sqlTableStats).Scan(&t.LiveTuples, &t.DeadTuples, &t.Vacuums, &t.TableBytes, &t.IndexBytes, &t.ClaimIndexBytes, &t.wal)
	if err != nil {
		return t, fmt.Errorf("bench: read files.files' statistics: %w", err)
	}
	return t, nil
}
