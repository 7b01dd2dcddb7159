package riverbench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	// DefaultThroughputRows is Config.Rows for Throughput when it is zero.
	DefaultThroughputRows = 20000
	// DefaultLatencyRows is Config.Rows for Latency when it is zero.
	DefaultLatencyRows = 500
	// DefaultSlots is Config.Slots when it is zero.
	DefaultSlots = 100
	// DefaultRate is Config.Rate when it is zero.
	DefaultRate = 50.0

	insertBatch = 10000
	// warmupJobs are picked up before Latency starts measuring, so that the
	// LISTEN connection and the producer are known to be live.
	warmupJobs = 5
	// pickupTimeout bounds the wait for the last jobs after the last insert.
	pickupTimeout = 30 * time.Second
	stopTimeout   = 30 * time.Second
	kind          = "riverbench_noop"
)

// Config selects the size of a run and River's fetch settings. A nil or zero
// Config works.
type Config struct {
	// Rows is the number of jobs. Defaults to DefaultThroughputRows for
	// Throughput and DefaultLatencyRows for Latency.
	Rows int

	// Slots is River's MaxWorkers on the one queue the run uses (River allows
	// 1 to 10,000). Defaults to 100.
	Slots int

	// Rate is Latency's insert rate in jobs per second. Defaults to 50.
	Rate float64

	// FetchCooldown is River's Config.FetchCooldown: the least time between
	// two fetches, and between two insert notifications of a queue. Defaults
	// to River's default (100ms); river.FetchCooldownMin (1ms) is the lowest.
	FetchCooldown time.Duration

	// FetchPollInterval is River's Config.FetchPollInterval: the fallback
	// poll when no notification comes. Defaults to River's default (1s).
	FetchPollInterval time.Duration

	// Logger receives River's log lines. Defaults to discarding them; pass a
	// warn-level logger to see River's warnings.
	Logger *slog.Logger
}

func (c *Config) withDefaults(rows int) Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Rows <= 0 {
		out.Rows = rows
	}
	if out.Slots <= 0 {
		out.Slots = DefaultSlots
	}
	if out.Rate <= 0 {
		out.Rate = DefaultRate
	}
	if out.FetchCooldown <= 0 {
		out.FetchCooldown = river.FetchCooldownDefault
	}
	if out.FetchPollInterval <= 0 {
		out.FetchPollInterval = river.FetchPollIntervalDefault
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Setup describes what a run measured; both results embed it.
type Setup struct {
	Mode                string  `json:"mode"`
	System              string  `json:"system"`
	RiverVersion        string  `json:"river_version"`
	GoVersion           string  `json:"go_version"`
	Rows                int     `json:"rows"`
	Slots               int     `json:"slots"`
	MaxConns            int32   `json:"max_conns"`
	FetchCooldownMS     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMS float64 `json:"fetch_poll_interval_ms"`
}

// ThroughputResult is what Throughput measured.
type ThroughputResult struct {
	Setup
	// InsertMS is the time spent inserting the jobs beforehand (not counted).
	InsertMS float64 `json:"insert_ms"`
	// ElapsedMS runs from Client.Start to the completion of the last job.
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// Percentiles summarises a set of latencies in milliseconds (nearest rank).
type Percentiles struct {
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	MeanMS float64 `json:"mean_ms"`
}

// LatencyResult is what Latency measured. The embedded Percentiles run from
// the moment the insert's commit returned to the start of the worker;
// FromSend runs from just before the insert was sent, so it also holds the
// insert's own round trips and commit.
type LatencyResult struct {
	Setup
	Rate float64 `json:"rate"`
	Percentiles
	FromSend Percentiles `json:"from_send"`
}

// Migrate runs River's migrations up in the pool's database (in the schema
// that search_path selects). It is idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate River's schema: %w", err)
	}
	return nil
}

// Throughput inserts cfg.Rows jobs (not timed), then starts a River client
// with cfg.Slots workers and times it from Start until River reports the
// last job completed.
func Throughput(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*ThroughputResult, error) {
	c := cfg.withDefaults(DefaultThroughputRows)
	client, err := newClient(pool, &c, &noopWorker{})
	if err != nil {
		return nil, err
	}

	t := time.Now()
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
	insert := time.Since(t)
	// The burn-down should meet planner statistics that know the table.
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
		return nil, fmt.Errorf("vacuum river_job: %w", err)
	}

	// Events that overflow a subscription are dropped, so make room for all.
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: c.Rows + 1,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled, river.EventKindJobSnoozed},
	})
	defer cancel()

	t0 := time.Now()
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("start River client: %w", err)
	}
	defer stop(client)
	for done := 0; done < c.Rows; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return nil, fmt.Errorf("job %d: %s, want completed", ev.Job.ID, ev.Kind)
			}
			done++
		case <-ctx.Done():
			return nil, fmt.Errorf("throughput: %d of %d jobs completed: %w", done, c.Rows, ctx.Err())
		}
	}
	elapsed := time.Since(t0)

	return &ThroughputResult{
		Setup:      setup("throughput", pool, &c),
		InsertMS:   ms(insert),
		ElapsedMS:  ms(elapsed),
		RowsPerSec: float64(c.Rows) / elapsed.Seconds(),
	}, nil
}

// Latency starts a River client with cfg.Slots idle workers, then inserts
// cfg.Rows jobs one at a time (one transaction each) at cfg.Rate per second
// and measures, per job, the time from the insert's commit returning to the
// worker's start.
func Latency(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*LatencyResult, error) {
	c := cfg.withDefaults(DefaultLatencyRows)
	n := warmupJobs + c.Rows
	run := newLatencyRun(n)
	client, err := newClient(pool, &c, run.worker())
	if err != nil {
		return nil, err
	}
	run.client = client
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("start River client: %w", err)
	}
	defer stop(client)

	interval := time.Duration(float64(time.Second) / c.Rate)
	if err := run.warmUp(ctx, interval); err != nil {
		return nil, err
	}
	if err := run.atRate(ctx, warmupJobs, interval); err != nil {
		return nil, err
	}
	if err := run.wait(ctx, n, pickupTimeout); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	fromCommit, fromSend := run.latencies(warmupJobs)
	return &LatencyResult{
		Setup:       setup("latency", pool, &c),
		Rate:        c.Rate,
		Percentiles: percentiles(fromCommit),
		FromSend:    percentiles(fromSend),
	}, nil
}

// latencyRun holds, per job of a Latency run, when its insert was sent,
// when its commit returned and when its worker started. Each slice index is
// written by one goroutine and read after startedCh hands the index over.
type latencyRun struct {
	client    *river.Client[pgx.Tx]
	sent      []time.Time
	committed []time.Time
	started   []time.Time
	startedCh chan int
	// seen and got are the starts received from startedCh so far.
	seen []bool
	got  int
}

func newLatencyRun(n int) *latencyRun {
	return &latencyRun{
		sent: make([]time.Time, n), committed: make([]time.Time, n), started: make([]time.Time, n),
		startedCh: make(chan int, n), seen: make([]bool, n),
	}
}

// worker is the run's River worker, which records each job's first start.
func (r *latencyRun) worker() *noopWorker {
	return &noopWorker{started: func(seq int) {
		now := time.Now()
		if seq < 0 || seq >= len(r.started) {
			return
		}
		r.started[seq] = now
		select {
		case r.startedCh <- seq:
		default: // a second run of the same job; the first one counts
		}
	}}
}

func (r *latencyRun) receive(seq int) {
	if !r.seen[seq] {
		r.seen[seq] = true
		r.got++
	}
}

// drain receives the starts already handed over, without waiting.
func (r *latencyRun) drain() {
	for {
		select {
		case seq := <-r.startedCh:
			r.receive(seq)
		default:
			return
		}
	}
}

// wait returns once want jobs have started, or fails when timeout passes
// first.
func (r *latencyRun) wait(ctx context.Context, want int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for r.got < want {
		select {
		case seq := <-r.startedCh:
			r.receive(seq)
		case <-deadline.C:
			return fmt.Errorf("%d of %d jobs started %s after the last insert", r.got, want, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *latencyRun) insert(ctx context.Context, seq int) error {
	r.sent[seq] = time.Now()
	if _, err := r.client.Insert(ctx, noopArgs{Seq: seq}, nil); err != nil {
		return fmt.Errorf("insert job %d: %w", seq, err)
	}
	r.committed[seq] = time.Now()
	return nil
}

// warmUp inserts the first warmupJobs jobs, each once the previous one has
// started and interval passed: they prove the pipeline live and are not
// counted.
func (r *latencyRun) warmUp(ctx context.Context, interval time.Duration) error {
	for seq := range warmupJobs {
		if err := r.insert(ctx, seq); err != nil {
			return err
		}
		if err := r.wait(ctx, seq+1, pickupTimeout); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if err := sleep(ctx, interval); err != nil {
			return err
		}
	}
	return nil
}

// atRate inserts the jobs from first on, one every interval, keeping the
// started channel drained meanwhile.
func (r *latencyRun) atRate(ctx context.Context, first int, interval time.Duration) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := first; seq < len(r.sent); seq++ {
		if seq > first {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := r.insert(ctx, seq); err != nil {
			return err
		}
		r.drain()
	}
	return nil
}

// latencies returns, for the jobs from first on, the time from the commit
// returning and from the insert being sent to the worker's start.
func (r *latencyRun) latencies(first int) (fromCommit, fromSend []time.Duration) {
	for seq := first; seq < len(r.sent); seq++ {
		fromCommit = append(fromCommit, r.started[seq].Sub(r.committed[seq]))
		fromSend = append(fromSend, r.started[seq].Sub(r.sent[seq]))
	}
	return fromCommit, fromSend
}

type noopArgs struct {
	Seq int `json:"seq"`
}

func (noopArgs) Kind() string { return kind }

// noopWorker does nothing but, when started is set, report its start.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	started func(seq int)
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	if w.started != nil {
		w.started(job.Args.Seq)
	}
	return nil
}

func newClient(pool *pgxpool.Pool, c *Config, w *noopWorker) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, w); err != nil {
		return nil, fmt.Errorf("register worker: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     c.FetchCooldown,
		FetchPollInterval: c.FetchPollInterval,
		Logger:            c.Logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: c.Slots}},
		Workers:           workers,
	})
	if err != nil {
		return nil, fmt.Errorf("new River client: %w", err)
	}
	return client, nil
}

// stop stops the client softly, whatever became of the run's context, and
// hard when that takes too long.
func stop(client *river.Client[pgx.Tx]) {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := client.Stop(ctx); err != nil {
		hctx, hcancel := context.WithTimeout(context.Background(), stopTimeout)
		defer hcancel()
		_ = client.StopAndCancel(hctx)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func setup(mode string, pool *pgxpool.Pool, c *Config) Setup {
	return Setup{
		Mode:                mode,
		System:              "river",
		RiverVersion:        RiverVersion(),
		GoVersion:           runtime.Version(),
		Rows:                c.Rows,
		Slots:               c.Slots,
		MaxConns:            pool.Config().MaxConns,
		FetchCooldownMS:     ms(c.FetchCooldown),
		FetchPollIntervalMS: ms(c.FetchPollInterval),
	}
}

// RiverVersion is the version of River built into this program.
func RiverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return "unknown"
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Percentiles{
		P50MS:  ms(rank(0.50)),
		P90MS:  ms(rank(0.90)),
		P99MS:  ms(rank(0.99)),
		MaxMS:  ms(s[len(s)-1]),
		MeanMS: ms(sum / time.Duration(len(s))),
	}
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
