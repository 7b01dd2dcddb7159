package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/listener"
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
	// PoolConfig is what the runtimes' pools connect with, for example
	// through a transaction-pooling PgBouncer (with a statement mode that
	// suits it); each runtime's LISTEN connection then still goes to the
	// bench's own server, directly, as pgworker run --listen-url does.
	// Defaults to the bench pool's settings, for both.
	PoolConfig *pgxpool.Config
	// Idle is how long the idle fleet is watched, once every runtime has
	// settled and before the first row: the statements, function calls and
	// server CPU it costs while there is no work. Defaults to none.
	Idle time.Duration
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
	// ServerConns is the server's client connections to the database
	// once every runtime has started: the runtimes' LISTEN connections and
	// their pools' (or the pooler's) connections, the bench's own included.
	ServerConns int `json:"server_conns"`
	// IdleFleet is what the fleet cost while idle, when HerdConfig.Idle is set.
	IdleFleet *IdleCost `json:"idle,omitempty"`
}

// IdleCost is what an idle fleet costs the database per second: committed
// transactions, calls of the SQL API's functions by name, and the server's
// CPU (milliseconds per second: 1000 is one core) when it runs on this
// machine.
type IdleCost struct {
	WindowMS    float64 `json:"window_ms"`
	XactsPerSec float64 `json:"xacts_per_sec"`
	// CallsPerSec is counted by the server, whose sessions report their
	// counts within a few seconds: a short window misses some.
	CallsPerSec map[string]float64 `json:"calls_per_sec"`
	// ClaimCalls is the claim queries the runtimes sent in the window.
	ClaimCalls    int64   `json:"claim_calls"`
	ServerCPUMSPS float64 `json:"server_cpu_ms_per_sec,omitempty"`
}

// Herd starts cfg.Processes worker runtimes of cfg.Slots idle slots each,
// inserts cfg.Rows rows one at a time, each after the previous one was
// picked up and cfg.Interval passed, and counts the claim queries the server
// ran (pg_stat_user_functions, read once the statistics have settled).
func (b *Bench) Herd(ctx context.Context, cfg *HerdConfig) (*HerdResult, error) {
	c := herdDefaults(cfg)
	res := &HerdResult{Processes: c.Processes, Slots: c.Slots, Rows: c.Rows, IntervalMS: ms(c.Interval)}
	err := b.run(ctx, "herd", func(ctx context.Context) error {
		res.Setup = b.setup("herd")
		params, err := b.herdParams(ctx, c.Processes, c.PoolConfig != nil)
		if err != nil {
			return err
		}
		h, err := b.startHerd(ctx, c, params)
		if err != nil {
			return err
		}
		defer h.stop()
		if err := b.pool.QueryRow(ctx, sqlClientConns).Scan(&res.ServerConns); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if c.Idle > 0 {
			if res.IdleFleet, err = b.idleCost(ctx, h, c.Idle); err != nil {
				return err
			}
		}
		return b.measureHerd(ctx, c, h, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func herdDefaults(cfg *HerdConfig) HerdConfig {
	c := HerdConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Processes = orDefault(c.Processes, 20)
	c.Slots = orDefault(c.Slots, 50)
	c.Rows = orDefault(c.Rows, 100)
	c.Interval = orDefault(c.Interval, 50*time.Millisecond)
	return c
}

// herdParams checks that the server has room for the runtimes' connections
// and returns the session settings they need: the server counts calls only
// with track_functions, and a superuser may turn it on for the runtimes'
// sessions alone.
func (b *Bench) herdParams(ctx context.Context, processes int, pooled bool) (map[string]string, error) {
	var free int
	if err := b.pool.QueryRow(ctx, sqlFreeConns).Scan(&free); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	need := processes * (herdConns + 1)
	if pooled {
		need = processes + 1 // the listeners; the pooler's connections are its own
	}
	if need > free {
		return nil, fmt.Errorf("bench: herd with %d processes needs up to %d connections, and the server has %d free "+
			"(lower the processes or raise max_connections)", processes, need, free)
	}
	var track string
	if err := b.pool.QueryRow(ctx, sqlTrackFunctions).Scan(&track); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if track == "none" {
		if pooled {
			return nil, errors.New("bench: herd counts claims with pg_stat_user_functions, and track_functions is none " +
				"(set track_functions = 'pl' in postgresql.conf: a pooler does not pass it on for the runtimes' sessions)")
		}
		return map[string]string{"track_functions": "pl"}, nil
	}
	return nil, nil
}

// herd is the worker runtimes of a Herd run, each with a pool of its own as
// a separate process would have, and the count of rows they picked up.
type herd struct {
	workers []*worker.Worker
	pools   []*pgxpool.Pool
	picked  atomic.Int64
	// With HerdConfig.PoolConfig, the runtimes' listeners on the bench's
	// server, run here until stop.
	stopListen context.CancelFunc
	listening  sync.WaitGroup
}

// herdStarts is how many runtimes start at once.
const herdStarts = 20

// startHerd starts c.Processes runtimes of c.Slots idle slots each, whose
// sessions get params, herdStarts at a time. On an error it stops those it
// started.
func (b *Bench) startHerd(ctx context.Context, c HerdConfig, params map[string]string) (*herd, error) {
	h := &herd{
		workers: make([]*worker.Worker, c.Processes),
		pools:   make([]*pgxpool.Pool, c.Processes),
	}
	lctx, stopListen := context.WithCancel(context.WithoutCancel(ctx))
	h.stopListen = stopListen
	handler := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
		h.picked.Add(1)
		return nil, nil
	})
	b.logger.Info("bench: starting the runtimes", "processes", c.Processes, "slots", c.Slots)
	errs := make([]error, c.Processes)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(herdStarts, c.Processes) {
		wg.Go(func() {
			for i := range next {
				errs[i] = b.startOne(ctx, lctx, c, params, h, i, handler)
			}
		})
	}
	for i := range c.Processes {
		next <- i
	}
	close(next)
	wg.Wait()
	h.workers = slices.DeleteFunc(h.workers, func(w *worker.Worker) bool { return w == nil })
	h.pools = slices.DeleteFunc(h.pools, func(p *pgxpool.Pool) bool { return p == nil })
	if err := errors.Join(errs...); err != nil {
		h.stop()
		if params != nil && isPrivilege(err) {
			return nil, errors.New("bench: herd counts claims with pg_stat_user_functions, and track_functions is none " +
				"(set track_functions = 'pl' in postgresql.conf, or run the benchmark as a superuser)")
		}
		return nil, err
	}
	return h, nil
}

// startOne starts runtime i of h.
func (b *Bench) startOne(ctx, lctx context.Context, c HerdConfig, params map[string]string, h *herd, i int, handler worker.Handler) error {
	cfg := worker.Config{Handler: handler, Slots: c.Slots}
	var pool *pgxpool.Pool
	var err error
	if c.PoolConfig != nil {
		pc := c.PoolConfig.Copy()
		pc.MaxConns, pc.MinConns = herdConns, 0
		pc.ShouldPing = worker.ShouldPing
		if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return fmt.Errorf("bench: open a pool for the worker: %w", err)
		}
		l, err := listener.New(&listener.Config{ConnConfig: &b.pool.Config().ConnConfig.Config})
		if err != nil {
			pool.Close()
			return fmt.Errorf("bench: %w", err)
		}
		if err := h.listen(ctx, lctx, l); err != nil {
			pool.Close()
			return err
		}
		cfg.Listener = l
	} else if pool, err = b.workerPool(ctx, herdConns, params); err != nil {
		return err
	}
	h.pools[i] = pool
	w, err := b.startWorker(ctx, pool, "herd"+strconv.Itoa(i), cfg)
	if err != nil {
		return err
	}
	h.workers[i] = w
	return nil
}

// listen runs l until h stops, and returns once it listens. A listener that
// listens rings no later subscriber until it connects again, so that its
// worker claims once at start, not once or twice (settle).
func (h *herd) listen(ctx, lctx context.Context, l *listener.Listener) error {
	listening := make(chan struct{}, 1)
	remove := l.OnConnect(func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	})
	defer remove()
	h.listening.Go(func() { _ = l.Listen(lctx) })
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-listening:
		return nil
	case <-timer.C:
		return errors.New("bench: a listener did not listen within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop stops the runtimes, their listeners and their pools.
func (h *herd) stop() {
	var wg sync.WaitGroup
	for _, w := range h.workers {
		wg.Go(func() { stopWorker(w) })
	}
	wg.Wait()
	h.stopListen()
	h.listening.Wait()
	for _, p := range h.pools {
		p.Close()
	}
}

// idleCost watches the settled, idle fleet for window.
func (b *Bench) idleCost(ctx context.Context, h *herd, window time.Duration) (*IdleCost, error) {
	server, err := b.findServerCPU(ctx)
	if err != nil {
		b.logger.Info("bench: the idle fleet's server CPU is left out", "error", err)
		server = nil
	}
	type reading struct {
		claims uint64 // the runtimes' own count: the server's may lag
		xacts  int64
		calls  map[string]int64
		cpu    time.Duration
		at     time.Time
	}
	read := func() (reading, error) {
		r := reading{calls: map[string]int64{}, claims: h.claims()}
		flushAll(ctx, h.pools)
		if err := b.pool.QueryRow(ctx, sqlXactCommits).Scan(&r.xacts); err != nil {
			return r, fmt.Errorf("bench: %w", err)
		}
		rows, err := b.pool.Query(ctx, sqlFunctionCalls)
		if err != nil {
			return r, fmt.Errorf("bench: %w", err)
		}
		var name string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { r.calls[name] = n; return nil }); err != nil {
			return r, fmt.Errorf("bench: %w", err)
		}
		if server != nil {
			if r.cpu, err = server.total(); err != nil {
				return r, err
			}
		}
		r.at = time.Now()
		return r, nil
	}
	before, err := read()
	if err != nil {
		return nil, err
	}
	if err := sleep(ctx, window); err != nil {
		return nil, err
	}
	after, err := read()
	if err != nil {
		return nil, err
	}
	secs := after.at.Sub(before.at).Seconds()
	ic := &IdleCost{WindowMS: ms(after.at.Sub(before.at)), XactsPerSec: round(float64(after.xacts-before.xacts)/secs, 2),
		CallsPerSec: map[string]float64{}}
	for name, n := range after.calls {
		if d := n - before.calls[name]; d > 0 {
			ic.CallsPerSec[name] = round(float64(d)/secs, 2)
		}
	}
	ic.ClaimCalls = int64(after.claims - before.claims)
	if server != nil {
		ic.ServerCPUMSPS = round(ms(after.cpu-before.cpu)/secs, 2)
	}
	return ic, nil
}

// herdClients is what the runtimes' own counters say at one moment: the
// claim queries each has sent, and the races all have lost.
type herdClients struct {
	claims []uint64
	races  uint64
}

func (h *herd) clients() herdClients {
	c := herdClients{claims: make([]uint64, len(h.workers))}
	for i, w := range h.workers {
		s := w.Stats()
		c.claims[i] = s.Claims
		c.races += s.RacesLost
	}
	return c
}

func (h *herd) claims() uint64 {
	var n uint64
	for _, w := range h.workers {
		n += w.Stats().Claims
	}
	return n
}

// measureHerd inserts the rows and fills res with the claim queries that
// the server ran and that the runtimes sent meanwhile.
func (b *Bench) measureHerd(ctx context.Context, c HerdConfig, h *herd, res *HerdResult) error {
	// Every runtime has settled; let the server's counters catch up.
	flushAll(ctx, h.pools)
	before, err := b.settledFunctionStats(ctx, func(map[string]funcStats) bool { return true })
	if err != nil {
		return err
	}
	clientsBefore := h.clients()
	if err := b.insertHerdRows(ctx, c, h); err != nil {
		return err
	}
	if err := h.quiesce(ctx); err != nil {
		return err
	}
	// The runtimes' counts and the server's wait for them from one reading:
	// a late claim after it (a lost race's retry on a loaded machine) may
	// reach the server's counts, never the runtimes' alone.
	clientsAfter := h.clients()
	sent := clientsAfter.sentSince(clientsBefore)
	after, err := b.herdServerStats(ctx, h, before, sent)
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
	for i, n := range clientsAfter.claims {
		sent := n - clientsBefore.claims[i]
		res.ClientClaims += sent
		most = max(most, sent)
	}
	res.ClientRacesLost = clientsAfter.races - clientsBefore.races
	res.MaxProcessClaimsPerRow = round(float64(most)/float64(c.Rows), 3)
	return nil
}

// sentSince is the claim queries sent by all the runtimes since before.
func (c herdClients) sentSince(before herdClients) uint64 {
	var n uint64
	for i, claims := range c.claims {
		n += claims - before.claims[i]
	}
	return n
}

// insertHerdRows inserts c.Rows rows one at a time, each once the previous
// one was picked up and c.Interval passed, so that each row is a wake-up
// of its own.
func (b *Bench) insertHerdRows(ctx context.Context, c HerdConfig, h *herd) error {
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
			return h.picked.Load() >= want
		}); err != nil {
			return err
		}
		if err := sleep(ctx, c.Interval); err != nil {
			return err
		}
	}
	return nil
}

// quiesce waits until the runtimes have sent no claim for a while: the
// losers' claims may still be on their way when the last row is picked up.
func (h *herd) quiesce(ctx context.Context) error {
	last, since := h.claims(), time.Now()
	return waitFor(ctx, 30*time.Second, 5*time.Millisecond, "the runtimes to stop claiming", func() bool {
		if n := h.claims(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) > 300*time.Millisecond
	})
}

// herdServerStats reads the function statistics once the server has
// counted every claim, that is once it counts at least as many since before
// as the runtimes sent.
func (b *Bench) herdServerStats(ctx context.Context, h *herd, before map[string]funcStats, sent uint64) (map[string]funcStats, error) {
	flushAll(ctx, h.pools)
	return b.settledFunctionStats(ctx, func(m map[string]funcStats) bool {
		calls := m["claim_batch"].calls - before["claim_batch"].calls + m["claim"].calls - before["claim"].calls
		return calls >= int64(sent)
	})
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
