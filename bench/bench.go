package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/worker"
)

// Queue is the queue that holds a benchmark's scratch rows. A Bench deletes
// the rows of this queue before and after each mode, and no others.
const Queue = "pgworker-bench"

// workerPrefix starts the ids of the benchmark's worker slots, so that its
// own slots are told apart from a user's.
const workerPrefix = "pgworker-bench:"

// The statements a Bench runs besides the worker runtime's: calls of the SQL
// API, reads of the statistics views, and the plain statements that set up
// and remove scratch rows of Queue.
const (
	sqlSchemaExists   = `SELECT to_regclass('files.files') IS NOT NULL`
	sqlServerVersion  = `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'), current_setting('shared_buffers')`
	sqlLockBench      = `SELECT pg_try_advisory_lock(hashtext('pgworker bench'))`
	sqlUnlockBench    = `SELECT pg_advisory_unlock(hashtext('pgworker bench'))`
	sqlOtherRows      = `SELECT EXISTS (SELECT 1 FROM files.files WHERE queue <> $1)`
	sqlOtherWorkers   = `SELECT count(*) FROM files.workers WHERE state IN ('active', 'draining') AND worker_id NOT LIKE $1`
	sqlLockFiles      = `LOCK TABLE files.files, files.attempts IN ACCESS EXCLUSIVE MODE`
	sqlTruncate       = `TRUNCATE files.files, files.attempts`
	sqlDeleteRows     = `DELETE FROM files.files WHERE queue = $1`
	sqlDeleteWorkers  = `DELETE FROM files.workers WHERE worker_id LIKE $1 AND state IN ('stopped', 'dead')`
	sqlDeleteQueue    = `DELETE FROM files.queues WHERE queue = $1`
	sqlSetMaxRunning  = `SELECT files.set_max_running($1, $2)`
	sqlSetFairShare   = `SELECT files.set_fair_share($1, $2)`
	sqlVacuum         = `VACUUM ANALYZE files.files`
	sqlPause          = `SELECT files.pause_queue($1)`
	sqlResume         = `SELECT files.resume_queue($1)`
	sqlInsertOne      = `INSERT INTO files.files (queue, source, max_attempts) VALUES ($1, $2, 1) RETURNING id`
	sqlQueueOutcomes  = `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'failed'), max(last_error) FROM files.files WHERE queue = $1`
	sqlCountQueue     = `SELECT count(*) FROM files.files WHERE queue = $1`
	sqlFreeConns      = `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`
	sqlTrackFunctions = `SELECT current_setting('track_functions')`
	sqlForceFlush     = `SELECT pg_stat_force_next_flush()`
	sqlFunctionStats  = `SELECT funcname, calls, total_time FROM pg_stat_user_functions WHERE schemaname = 'files' AND funcname IN ('claim', 'claim_batch')`
	sqlFunctionCalls  = `SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = 'files'`
	sqlClientConns    = `SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = current_database()`
)

// ErrNotScratch is returned when the database holds rows of other queues or
// live worker slots and Config.Force is not set.
var ErrNotScratch = errors.New("bench: the database is in use")

// ErrBusy is returned when another benchmark runs on the same database.
var ErrBusy = errors.New("bench: another pgworker bench is running on this database")

// Config configures a Bench. A nil Config works.
type Config struct {
	// Force runs beside rows of other queues and live worker slots. The
	// benchmark still touches only rows of Queue, but live workers that serve
	// every queue will take some of its rows, and the figures then mean
	// little. Defaults to false: such a database is refused with
	// ErrNotScratch.
	Force bool

	// Version is the pgworker version recorded in the results. Defaults to
	// "devel".
	Version string

	// Logger receives progress lines (at info level) and the worker
	// runtime's warnings. Defaults to discarding.
	Logger *slog.Logger
}

// Bench runs the benchmark modes on one database. Create it with New. Its
// modes must not run concurrently.
type Bench struct {
	pool    *pgxpool.Pool
	force   bool
	version string
	logger  *slog.Logger
	pg      string            // server version
	pgSet   map[string]string // and settings
	runs    atomic.Int64
}

// New returns a Bench on the database of pool, whose user must own the files
// schema or be a superuser (it inserts and deletes rows directly). The pool
// needs room for three connections; the worker runtimes that the modes start
// open pools of their own.
func New(pool *pgxpool.Pool, cfg *Config) (*Bench, error) {
	if pool == nil {
		return nil, errors.New("bench: missing pool")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	b := &Bench{pool: pool, force: cfg.Force, version: cfg.Version, logger: cfg.Logger}
	if b.version == "" {
		b.version = "devel"
	}
	if b.logger == nil {
		b.logger = slog.New(slog.DiscardHandler)
	}
	return b, nil
}

// Setup is what every result records about where it was measured.
type Setup struct {
	Mode            string `json:"mode"`
	System          string `json:"system"` // "pgworker"
	Version         string `json:"version"`
	GoVersion       string `json:"go_version"`
	PostgresVersion string `json:"postgres_version"`
	// PostgresSettings are the server's settings that weigh most on the
	// figures: fsync, synchronous_commit, shared_buffers.
	PostgresSettings map[string]string `json:"postgres_settings"`
	CPUs             int               `json:"cpus"`
	Queue            string            `json:"queue"`
}

func (b *Bench) setup(mode string) Setup {
	return Setup{
		Mode: mode, System: "pgworker", Version: b.version, GoVersion: runtime.Version(),
		PostgresVersion: b.pg, PostgresSettings: b.pgSet, CPUs: runtime.NumCPU(), Queue: Queue,
	}
}

// Percentiles summarise latencies in milliseconds (nearest rank).
type Percentiles struct {
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	MeanMS float64 `json:"mean_ms"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Percentiles{
		P50MS: rank(50), P90MS: rank(90), P99MS: rank(99), MaxMS: ms(s[len(s)-1]),
		MeanMS: ms(sum / time.Duration(len(s))),
	}
}

// ms is d in milliseconds, rounded to microseconds.
func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

func round(f float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(f*p) / p
}

// run prepares the database for a mode, runs it, and removes the scratch
// rows afterwards, whatever happened.
func (b *Bench) run(ctx context.Context, mode string, f func(ctx context.Context) error) (err error) {
	if b.runs.Add(1) != 1 {
		b.runs.Add(-1)
		return errors.New("bench: modes of one Bench cannot run at once")
	}
	defer b.runs.Add(-1)
	lock, err := b.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer lock.Release()
	if err := b.check(ctx, lock.Conn()); err != nil {
		_, _ = lock.Exec(context.WithoutCancel(ctx), sqlUnlockBench) // not held: a warning, no error
		return err
	}
	defer func() {
		// Keep the lock until the rows are gone, even when ctx was cancelled.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		defer cancel()
		err = errors.Join(err, b.cleanup(cctx))
		if _, uerr := lock.Exec(cctx, sqlUnlockBench); uerr != nil {
			lock.Conn().Close(cctx) // a closed session drops its lock
		}
	}()
	if err := b.cleanup(ctx); err != nil {
		return err
	}
	b.logger.Info("bench: starting", "mode", mode)
	return f(ctx)
}

// check makes sure the database has the schema, that no other benchmark
// runs on it (taking the lock on conn), and that it is a scratch database
// unless forced.
func (b *Bench) check(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, sqlSchemaExists).Scan(&ok); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if !ok {
		return errors.New("bench: the files schema is missing (run 'pgworker migrate up' on this database first)")
	}
	var fsync, syncCommit, buffers string
	if err := conn.QueryRow(ctx, sqlServerVersion).Scan(&b.pg, &fsync, &syncCommit, &buffers); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	b.pgSet = map[string]string{"fsync": fsync, "synchronous_commit": syncCommit, "shared_buffers": buffers}
	if err := conn.QueryRow(ctx, sqlLockBench).Scan(&ok); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if !ok {
		return ErrBusy
	}
	var others bool
	var live int64
	if err := conn.QueryRow(ctx, sqlOtherRows, Queue).Scan(&others); err != nil {
		return fmt.Errorf("bench: %w", explain(err))
	}
	if err := conn.QueryRow(ctx, sqlOtherWorkers, workerPrefix+"%").Scan(&live); err != nil {
		return fmt.Errorf("bench: %w", explain(err))
	}
	if !others && live == 0 {
		return nil
	}
	what := "rows of other queues in files.files"
	switch {
	case others && live > 0:
		what += fmt.Sprintf(" and %d live worker slots", live)
	case live > 0:
		what = fmt.Sprintf("%d live worker slots (they would take the benchmark's rows)", live)
	}
	if b.force {
		b.logger.Warn("bench: running beside "+what+"; only rows of queue "+Queue+" are touched", "queue", Queue)
		return nil
	}
	return fmt.Errorf("%w: it holds %s; run the benchmark on a scratch database "+
		"(createdb pgworker_bench, then pgworker migrate up), or force it to run beside them (--force) "+
		"(only rows of queue %s are ever deleted)", ErrNotScratch, what, Queue)
}

// cleanup removes the benchmark's rows, slots and queue. When the table
// holds nothing else, one TRUNCATE under an exclusive lock does it at once;
// otherwise the rows of Queue are deleted.
func (b *Bench) cleanup(ctx context.Context) error {
	truncated, err := b.truncate(ctx)
	if err != nil {
		return err
	}
	if !truncated {
		if _, err := b.pool.Exec(ctx, sqlDeleteRows, Queue); err != nil {
			return fmt.Errorf("bench: delete the rows of queue %s: %w", Queue, explain(err))
		}
	}
	// The slots and the queue are bookkeeping: without the privilege, they stay.
	if _, err := b.pool.Exec(ctx, sqlDeleteWorkers, workerPrefix+"%"); err != nil {
		b.logger.Debug("bench: delete the benchmark's stopped slots", "error", err)
	}
	if _, err := b.pool.Exec(ctx, sqlDeleteQueue, Queue); err != nil {
		b.logger.Debug("bench: delete the benchmark's queue", "error", err)
	}
	return nil
}

// truncate empties files.files and files.attempts if, under an exclusive
// lock, files.files holds no row outside Queue.
func (b *Bench) truncate(ctx context.Context) (bool, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("bench: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: a no-op
	if _, err := tx.Exec(ctx, sqlLockFiles); err != nil {
		if isPrivilege(err) {
			return false, nil
		}
		return false, fmt.Errorf("bench: %w", err)
	}
	var others bool
	if err := tx.QueryRow(ctx, sqlOtherRows, Queue).Scan(&others); err != nil {
		return false, fmt.Errorf("bench: %w", err)
	}
	if others {
		return false, nil
	}
	if _, err := tx.Exec(ctx, sqlTruncate); err != nil {
		if isPrivilege(err) {
			return false, nil
		}
		return false, fmt.Errorf("bench: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("bench: %w", err)
	}
	return true, nil
}

func isPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// explain adds what to do to a missing privilege.
func explain(err error) error {
	if isPrivilege(err) {
		return fmt.Errorf("%w (the benchmark writes files.files directly: run it as the owner of the files schema, "+
			"the user that ran pgworker migrate up)", err)
	}
	return err
}

// copyRows loads sources into Queue with COPY, each allowed one attempt, so
// that a failing row ends at once instead of being retried with backoff.
func (b *Bench) copyRows(ctx context.Context, sources func(i int) string, n int) error {
	return b.copyRowsWith(ctx, sources, n, 0, nil)
}

// vacuum gives the planner fresh statistics of the scratch rows, as
// autovacuum would in a while.
func (b *Bench) vacuum(ctx context.Context) {
	if _, err := b.pool.Exec(ctx, sqlVacuum); err != nil {
		b.logger.Debug("bench: VACUUM ANALYZE files.files", "error", err)
	}
}

// outcomes checks that every row of Queue ended done.
func (b *Bench) outcomes(ctx context.Context, want int) error {
	var done, failed int64
	var lastErr *string
	if err := b.pool.QueryRow(ctx, sqlQueueOutcomes, Queue).Scan(&done, &failed, &lastErr); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if failed > 0 {
		msg := ""
		if lastErr != nil {
			msg = ": " + *lastErr
		}
		return fmt.Errorf("bench: %d of %d rows failed%s", failed, want, msg)
	}
	if done != int64(want) {
		return fmt.Errorf("bench: %d of %d rows done", done, want)
	}
	return nil
}

// workerPoolConfig is the configuration of a worker runtime's own pool of
// conns connections, as a separate process would have, set up as pgworker
// run sets up its own.
func (b *Bench) workerPoolConfig(conns int) *pgxpool.Config {
	cfg := b.pool.Config().Copy()
	cfg.MaxConns = int32(max(conns, 1))
	cfg.MinConns = 0
	cfg.ShouldPing = worker.ShouldPing
	return cfg
}

// workerPool opens a pool of its own for a worker runtime (workerPoolConfig).
func (b *Bench) workerPool(ctx context.Context, conns int, params map[string]string) (*pgxpool.Pool, error) {
	return b.tracedPool(ctx, conns, params, nil)
}

// startWorker starts a worker on Queue and waits until it listens and has
// looked for work, so that from then on only notifications make it claim.
func (b *Bench) startWorker(ctx context.Context, pool *pgxpool.Pool, name string, cfg worker.Config) (*worker.Worker, error) {
	cfg.Queues = []string{Queue}
	cfg.WorkerIDPrefix = workerPrefix + strconv.Itoa(os.Getpid()) + ":" + name
	cfg.Version = b.version
	if cfg.SafetyNet == 0 {
		// Only notifications should wake the slots while a mode measures.
		cfg.SafetyNet = time.Hour
	}
	if cfg.Logger == nil {
		// The runtime's start and stop lines would drown the benchmark's.
		cfg.Logger = slog.New(&minLevel{Handler: b.logger.Handler(), min: slog.LevelWarn}).With("worker", name)
	}
	w, err := worker.New(pool, &cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := w.Start(ctx); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := settle(ctx, w, cfg.Listener == nil); err != nil {
		stopWorker(w)
		return nil, err
	}
	return w, nil
}

// settle waits until w listens and has sent the claims that starting sends,
// then for a spell without claims: one claim at start, and one more when a
// listener of its own first listens and rings. A listener given in the
// Config must already listen (it rings no later subscriber): its worker
// claims once.
func settle(ctx context.Context, w *worker.Worker, ownListener bool) error {
	const quiet = 200 * time.Millisecond
	startup := uint64(1)
	if ownListener {
		startup = 2
	}
	deadline := time.Now().Add(30 * time.Second)
	var last uint64
	since := time.Now()
	for {
		s := w.Stats()
		if s.Claims != last {
			last, since = s.Claims, time.Now()
		}
		if s.Listening && s.Claims >= startup && time.Since(since) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the worker did not start listening within 30s (claims %d, listening %v)", s.Claims, s.Listening)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// stopWorker stops w softly, and hard when that takes too long.
func stopWorker(w *worker.Worker) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		hctx, hcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer hcancel()
		_ = w.StopAndCancel(hctx)
	}
}

// waitFor polls cond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout, every time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: timed out after %s waiting for %s", timeout, what)
		}
		if err := sleep(ctx, every); err != nil {
			return err
		}
	}
	return nil
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

// minLevel passes on the records of at least min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (m *minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.Handler.Enabled(ctx, l)
}

func (m *minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &minLevel{Handler: m.Handler.WithAttrs(attrs), min: m.min}
}

func (m *minLevel) WithGroup(name string) slog.Handler {
	return &minLevel{Handler: m.Handler.WithGroup(name), min: m.min}
}

// outcomeCount counts the rows a worker has carried to an outcome (done or
// failed) and lets a mode wait for a count without polling the worker: the
// poll would spend, on the queued side only, the CPU that the figures
// compare. Use it as the worker's Observer.
type outcomeCount struct {
	mu      sync.Mutex
	n       uint64
	want    uint64
	reached chan struct{}
}

func (s *outcomeCount) Observe(e worker.Event) {
	if e.Kind != worker.RowDone && e.Kind != worker.RowFailed {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.reached != nil && s.n >= s.want {
		close(s.reached)
		s.reached = nil
	}
}

// count returns the rows outcomeCount so far.
func (s *outcomeCount) count() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// wait returns once want rows in all have outcomeCount, or when ctx ends.
func (s *outcomeCount) wait(ctx context.Context, want uint64) error {
	s.mu.Lock()
	if s.n >= want {
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	s.want, s.reached = want, ch
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bench: waiting for %d rows to settle: %w", want, ctx.Err())
	}
}
