// Package worker is the pgworker runtime: it runs a Handler on the rows of
// files.files with N slots in one process.
//
// A Worker registers its slots in files.workers (worker ids node:pid:slot),
// claims one row per idle slot in one query whenever the process's LISTEN
// connection rings (package claim, package listener), runs the handler, and
// records the outcome through the fenced SQL API, batching the outcomes of
// many slots into one statement. One heartbeat statement per process and
// interval keeps its slots alive and its leases extended; a row missing from
// the heartbeat's answer was cancelled or lost, and its handler's context is
// cancelled with ErrCancelled or ErrLeaseLost, as its attempt's recorded
// outcome says (files.attempt_outcomes). Every worker also runs files.reap on its own schedule. With
// MaxSlots above Slots the number of slots follows the backlog.
//
// Handlers report failures as errors: Permanent(err) fails the row without
// retries, Release(err) hands it back without spending an attempt. A
// Result returned with the error is recorded on the failed attempt (exit
// code, duration, stderr tail). A Gate (Config.Gate) keeps the slots from
// claiming while the node cannot work, for example while its disk is full.
//
//	w, err := worker.New(pool, &worker.Config{
//		Queues: []string{"default"},
//		Slots:  8,
//		Handler: worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
//			// process job.Source
//			return &worker.Result{Output: map[string]any{"ok": true}}, nil
//		}),
//		Logger: logger,
//	})
//	if err != nil {
//		return err
//	}
//	if err := w.Start(ctx); err != nil {
//		return err
//	}
//	<-shutdown
//	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
//	defer cancel()
//	return w.Stop(stopCtx) // lets running handlers finish, then releases what is left
package worker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/retry"
	"github.com/pgworker/pgworker/listener"
)

// The statements the runtime sends: calls of the SQL API only.
const (
	sqlRegister    = `SELECT files.register_worker($1, $2, $3::integer, $4::integer, $5, $6::text[], $7::interval, $8)`
	sqlDeregister  = `SELECT files.deregister_worker($1, $2)`
	sqlDrain       = `SELECT files.drain_worker($1, VARIADIC $2::text[])`
	sqlHeartbeat   = `SELECT worker_id, file_id, attempt FROM files.heartbeat($1, VARIADIC $2::text[])`
	sqlOutcomes    = `SELECT file_id, outcome FROM files.attempt_outcomes($1, $2::bigint[], $3::text[], $4::integer[])`
	sqlReap        = `SELECT files.reap()`
	sqlPrune       = `SELECT coalesce(sum(rows) FILTER (WHERE queue IS NOT NULL), 0)::bigint FROM files.prune($1)`
	sqlRelease     = `SELECT files.release($1::bigint, $2, $3::integer, $4, $5)`
	sqlComplete    = `SELECT * FROM files.complete_many($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::jsonb[], $6::jsonb[], $7::text)`
	sqlCompleteOne = `SELECT files.complete($1::bigint, $2, $3::integer, $4, $5::jsonb, $6::jsonb, $7::text)`
	sqlFail        = `SELECT id, state, run_after FROM files.fail_many($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::boolean[], $7::jsonb[])`
)

// Defaults of Config.HeartbeatInterval and Config.LeaseTimeout. A slot that
// names no lease gets DefaultLeaseTimeout from the SQL API too
// (files.register_worker, files.workers.lease_timeout).
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultLeaseTimeout      = 15 * time.Second
)

// minUnrecorded is the fewest outcomes Config.MaxUnrecorded lets wait by
// default, however few the slots.
const minUnrecorded = 64

// stopGrace is how long Stop waits for handlers to return once it has
// cancelled them.
const stopGrace = 5 * time.Second

// Config configures a Worker. Handler is required; every other field has a
// default.
type Config struct {
	// Handler processes the rows. Required.
	Handler Handler

	// Queues to serve. Defaults to all queues.
	Queues []string

	// PreferQueues makes Queues an order of preference: idle slots take
	// the first queue's rows while it has claimable ones, then the next
	// queue's (claim.Config.Prefer). Defaults to false: larger priority first
	// across the queues.
	PreferQueues bool

	// Slots is how many rows the process works on at once; with MaxSlots,
	// the least it keeps. Defaults to 1.
	Slots int

	// MaxSlots, when above Slots, lets the worker scale between Slots and
	// MaxSlots: while at least three quarters of its slots are busy and the
	// claimable backlog per busy slot stays above ScaleThreshold, it adds
	// slots; while it stays below half of that (or the process is idle), it
	// removes idle ones. Defaults to Slots: no scaling.
	MaxSlots int

	// ScaleThreshold is the backlog per busy slot above which a scaling
	// worker grows. Defaults to 1.
	ScaleThreshold float64

	// Timeout bounds one handler call; the attempt then fails with ErrTimeout
	// and is retried. Defaults to none.
	Timeout time.Duration

	// HeartbeatInterval is how often the process proves its slots alive and
	// extends its leases. Defaults to 5s.
	HeartbeatInterval time.Duration

	// LeaseTimeout is how long a slot may stay silent before files.reap takes
	// its row back. Keep it a few heartbeats long. Defaults to 15s.
	LeaseTimeout time.Duration

	// ReapInterval is how often this process runs files.reap (every node does;
	// the SQL makes it safe). Negative disables it. Defaults to LeaseTimeout.
	ReapInterval time.Duration

	// PruneInterval is how often this process runs files.prune, which
	// deletes finished rows past their retention in calls of PruneRows rows
	// (every node does; one prunes at a time). Negative disables it.
	// Defaults to 1m.
	PruneInterval time.Duration

	// PruneRows bounds the rows one call of files.prune deletes, in one
	// transaction. Defaults to 1000.
	PruneRows int

	// SafetyNet is the longest an idle process waits without a notification
	// before it looks for work anyway. Defaults to 30s.
	SafetyNet time.Duration

	// ClaimCooldown is the least time between two claims of the process
	// that notifications prompt (claim.Config.Cooldown): rows announced
	// sooner wait for it and are claimed together. It trades pickup latency
	// for fewer claims, which matters to a shared database when rows trickle
	// in to many processes. Outcomes take the same trade: those that end
	// less than the cooldown after the last outcome statement began are
	// recorded together when it ends, unless a slot waits for its own
	// (Config.MaxUnrecorded outcomes wait) or the worker stops; a
	// row stays running in the database that much longer, its slot free for
	// the next row. While it waits, the process's listener stops
	// listening (listener.Subscription.Quiet) when no other subscriber of it
	// needs notifications, so that the server stops waking its LISTEN
	// session for every row; a cancellation sent meanwhile reaches a running
	// row with the next heartbeat instead of at once. Defaults to 0: a
	// notification is answered at once.
	ClaimCooldown time.Duration

	// Listener is a listener shared with other users in the process; the
	// caller runs its Listen. Defaults to a listener of the worker's own, on
	// ListenURL.
	Listener *listener.Listener

	// ListenURL is the database URL of the worker's own LISTEN connection: a
	// direct or session-pooled URL when the pool goes through a
	// transaction-pooling PgBouncer. Defaults to the pool's connection settings.
	ListenURL string

	// Node is the host name recorded for the slots. Defaults to os.Hostname().
	Node string

	// WorkerIDPrefix prefixes the slot ids (prefix:slot). Defaults to
	// "node:pid", with "-2", "-3"... appended for further workers of the
	// same process.
	WorkerIDPrefix string

	// Version is recorded for the slots. Defaults to empty.
	Version string

	// MaxReleases is how many times in a row this process hands back the same
	// row with Release before failing it instead. Defaults to 3.
	MaxReleases int

	// MaxBatch caps how many outcomes one statement records. One statement
	// runs at a time, and the outcomes that arrive meanwhile make the next
	// batch; a slot takes its next row while its outcome waits. Defaults
	// to 1000.
	MaxBatch int

	// MaxUnrecorded is how many outcomes may wait to be recorded while
	// their slots run the next rows; once that many wait, a slot that ends
	// a row waits for its own outcome. It is what lets a process of few
	// slots and short rows ride out slow commits (an outcome's commit waits
	// for the WAL flush): with commits made 30 ms slow, four processes of
	// four slots moved 6.5 times as many rows allowing 64 as allowing 4
	// (BENCHMARKS.md). The price: up to that many rows whose work is done
	// may run again, when the process is killed meanwhile, stops with their
	// outcomes still waiting when Stop's context ends, or is cut off from
	// the database for longer than a lease (execution is at least once; the
	// outcome stays exactly once); and their results are held in memory
	// until recorded. Defaults to the slots (MaxSlots), and at least 64.
	MaxUnrecorded int

	// Then is the queue of the next stage: when a row completes, each
	// output of its result (Result.Output's manifest, outputs[i].key)
	// becomes a row of Then, in the same transaction, with the row's batch,
	// priority, payload and max attempts. It must not be one of Queues. Defaults to none.
	Then string

	// Observer receives an event when a row starts and when it ends, for
	// metrics and per-row logs. Defaults to none.
	Observer Observer

	// Gate, when set, is asked each time a slot's row ends: while it is
	// closed, that slot and the idle ones claim nothing until Gate.Wait
	// returns. Defaults to none.
	Gate Gate

	// Logger receives the worker's log lines. Defaults to discarding.
	Logger *slog.Logger
}

// Stats are a Worker's counters since it started.
type Stats struct {
	Claims                uint64 // claim queries
	Claimed               uint64 // rows claimed
	RacesLost             uint64 // claims that got nothing (no rows, 40001, 40P01)
	SerializationFailures uint64 // of those, claims that failed with 40001 or 40P01
	Slots                 int    // slots now (varies with MaxSlots)
	ClaimErrors           uint64 // claims that failed otherwise
	SafetyWakes           uint64 // wake-ups by the safety net, a retry's time or a look after a short or empty claim with hints
	ClaimsDeferred        uint64 // claims held back until ClaimCooldown ended
	RecordsDeferred       uint64 // outcome statements held back until ClaimCooldown ended
	OutcomeWaits          uint64 // times a slot waited for its own outcome: MaxUnrecorded others were waiting
	Done                  uint64 // rows completed
	Failed                uint64 // attempts recorded as failed (retried or not)
	Released              uint64 // rows handed back without spending an attempt
	Lost                  uint64 // outcomes not recorded: the row was no longer held
	Cancelled             uint64 // running rows cancelled by an operator
	LeaseLosses           uint64 // running rows found lost by a heartbeat
	Orphans               uint64 // rows held in the database but unknown here, released
	Heartbeats            uint64
	HeartbeatErrors       uint64
	Reaped                uint64 // rows this process's reaps returned to the queue
	Pruned                uint64 // finished rows this process's prunes deleted
	ListenerReconnects    uint64
	ListenerQuiets        uint64 // spells without listening for the rest of a ClaimCooldown
	Listening             bool   // the LISTEN connection is up
	BusySlots             int    // slots running a handler
	IdleSlots             int    // slots waiting for a row (not those that wait for their own outcome)
	Unrecorded            int    // outcomes of finished rows not yet recorded: up to MaxUnrecorded whose slots run on, and one per slot that waits for its own
}

// Worker runs a Handler on claimed rows. Create it with New.
type Worker struct {
	pool     *pgxpool.Pool
	handler  Handler
	logger   *slog.Logger
	observer Observer
	gate     Gate
	gated    sync.WaitGroup // holdSlots goroutines

	queues      []string
	prefer      bool
	maxSlots    int
	prefix      string
	key         string // the slots' key: proves them ours to the SQL API
	timeout     time.Duration
	lease       time.Duration
	reapEvery   time.Duration
	pruneEvery  time.Duration
	pruneRows   int
	safetyNet   time.Duration
	cooldown    time.Duration
	listenURL   string
	node        string
	version     string
	maxReleases int

	listener    *listener.Listener
	ownListener bool
	sub         *listener.Subscription
	stopControl func()
	stopConnect func()
	claimer     *claim.Claimer

	started   atomic.Bool
	stopping  atomic.Bool // no more scaling
	stopOnce  sync.Once
	stopped   chan struct{}
	closing   atomic.Bool // late outcomes are discarded
	startStop chan struct{}

	loopCtx     context.Context // heartbeat, reap, record, own listener
	loopCancel  context.CancelFunc
	loops       sync.WaitGroup
	claimCancel context.CancelFunc
	claimDone   chan struct{}
	handlers    sync.WaitGroup
	handoff     chan *task // unbuffered: a send succeeds only if a handler goroutine waits for a row
	rec         *recorder
	hb          *heartbeater

	mu          sync.Mutex
	ids         []string // the slots, in slot order
	nextSlot    int
	running     map[int64]*task     // rows claimed and not yet settled
	shadowed    map[*task]struct{}  // earlier attempts of rows in running, not yet settled
	handlersOff bool                // the handlers were cancelled (ErrStopping): new ones start so
	busy        int                 // handlers running
	unsettled   chan struct{}       // a token per slot freed before its outcome was recorded (Config.MaxUnrecorded)
	hinted      map[int64]time.Time // rows named by a cancellation hint (when), until the database answers
	releases    map[int64]int       // rows released by Release, in a row
	waiting     map[int64]*task     // the latest attempt of a row whose events are held, by row

	done, failed, released, lost, cancelled, leaseLosses, reaped, pruned, outcomeWaits atomic.Uint64

	ownWaits atomic.Int64 // slots waiting for their own outcomes now
}

// task is a row being worked on. Its job and its outcome are allocated
// with it: one allocation per row instead of three.
type task struct {
	row       claim.Row
	job       Job     // what the handler is given
	out       outcome // what it came to, once decided
	ctx       context.Context
	cancel    context.CancelCauseFunc
	received  time.Time // when the claim's answer arrived
	finishing bool      // the handler returned
	gone      error     // ErrLeaseLost or ErrCancelled, once known

	// The order of the row's events (see Observer), guarded by mu but for
	// waits, which emit reads without it.
	waits atomic.Bool // an earlier attempt of the row in this worker has not ended: events are held
	held  []Event     // the events held while waits
	ended bool        // the end event has been observed
	next  *task       // the row's next attempt in this worker, waiting for this one to end
}

var workersInProcess atomic.Int64

// New returns a worker that claims through pool. It starts with Start.
func New(pool *pgxpool.Pool, cfg *Config) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("worker: missing pool")
	}
	if cfg == nil || cfg.Handler == nil {
		return nil, errors.New("worker: missing handler (set Config.Handler)")
	}
	lease := retry.OrDefault(cfg.LeaseTimeout, DefaultLeaseTimeout)
	heartbeat := retry.OrDefault(cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	if heartbeat >= lease {
		return nil, fmt.Errorf("worker: heartbeat interval %s must be shorter than the lease timeout %s", heartbeat, lease)
	}
	if cfg.Then != "" && (len(cfg.Queues) == 0 || slices.Contains(cfg.Queues, cfg.Then)) {
		return nil, fmt.Errorf("worker: Then %q would feed the worker its own outputs: name the queues it serves (Queues), without Then", cfg.Then)
	}
	minSlots := max(cfg.Slots, 1)
	w := &Worker{
		pool:        pool,
		handler:     cfg.Handler,
		logger:      cfg.Logger,
		observer:    cfg.Observer,
		gate:        cfg.Gate,
		queues:      slices.Clone(cfg.Queues),
		prefer:      cfg.PreferQueues,
		maxSlots:    max(cfg.MaxSlots, minSlots),
		timeout:     max(cfg.Timeout, 0),
		lease:       lease,
		reapEvery:   cfg.ReapInterval,
		pruneEvery:  cfg.PruneInterval,
		pruneRows:   cfg.PruneRows,
		safetyNet:   retry.OrDefault(cfg.SafetyNet, 30*time.Second),
		cooldown:    max(cfg.ClaimCooldown, 0),
		listener:    cfg.Listener,
		listenURL:   cfg.ListenURL,
		node:        cfg.Node,
		version:     cfg.Version,
		maxReleases: orPositive(cfg.MaxReleases, 3),
		stopped:     make(chan struct{}),
		startStop:   make(chan struct{}),
		claimDone:   make(chan struct{}),
		handoff:     make(chan *task),
		running:     map[int64]*task{},
		shadowed:    map[*task]struct{}{},
		hinted:      map[int64]time.Time{},
		releases:    map[int64]int{},
		waiting:     map[int64]*task{},
	}
	if w.logger == nil {
		w.logger = slog.New(slog.DiscardHandler)
	}
	if len(w.queues) == 0 {
		w.queues = nil
	}
	if w.reapEvery == 0 {
		w.reapEvery = w.lease
	}
	if w.pruneEvery == 0 {
		w.pruneEvery = time.Minute
	}
	if w.pruneRows <= 0 {
		w.pruneRows = 1000
	}
	if w.node == "" {
		w.node = hostname()
	}
	w.prefix = cfg.WorkerIDPrefix
	if w.prefix == "" {
		w.prefix = processPrefix(w.node)
	}
	w.key = rand.Text()
	w.ids = w.newIDs(minSlots)
	w.unsettled = make(chan struct{}, orPositive(cfg.MaxUnrecorded, max(w.maxSlots, minUnrecorded)))

	w.rec = newRecorder(pool, w, w.logger, w.lease, orPositive(cfg.MaxBatch, 1000))
	if cfg.Then != "" {
		w.rec.then = &cfg.Then
	}
	w.rec.cooldown, w.rec.hurry = w.cooldown, w.startStop
	w.hb = newHeartbeater(pool, w, w.logger, heartbeat, w.lease, w.key)
	if w.maxSlots > minSlots {
		threshold := cfg.ScaleThreshold
		if threshold <= 0 {
			threshold = 1
		}
		w.hb.after = newScaler(pool, w, w.logger, w.queues, minSlots, w.maxSlots, threshold).check
	}
	return w, nil
}

// orPositive returns n, or def when n is not positive.
func orPositive(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// hostname returns the host name recorded for the slots by default.
func hostname() string {
	if h, _ := os.Hostname(); h != "" {
		return h
	}
	return "localhost"
}

// processPrefix returns the default prefix of the slot ids: node:pid, with
// "-2", "-3"... appended for further workers of the same process.
func processPrefix(node string) string {
	prefix := node + ":" + strconv.Itoa(os.Getpid())
	if n := workersInProcess.Add(1); n > 1 {
		prefix += "-" + strconv.FormatInt(n, 10)
	}
	return prefix
}

// newIDs numbers n more slots.
func (w *Worker) newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = w.prefix + ":" + strconv.Itoa(w.nextSlot)
		w.nextSlot++
	}
	return ids
}

// WorkerIDs returns the ids of the worker's slots.
func (w *Worker) WorkerIDs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ids)
}

// Start registers the slots and starts claiming. The worker runs until Stop
// or StopAndCancel, or until ctx ends, which stops it as StopAndCancel does.
func (w *Worker) Start(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: already started")
	}
	if w.listener == nil {
		l, err := w.newListener()
		if err != nil {
			w.started.Store(false)
			return err
		}
		w.mu.Lock() // Stats may read it meanwhile
		w.listener, w.ownListener = l, true
		w.mu.Unlock()
	}
	if err := w.register(ctx, w.ids); err != nil {
		w.started.Store(false)
		return err
	}

	w.loopCtx, w.loopCancel = context.WithCancel(context.Background())
	claimCtx, claimCancel := context.WithCancel(context.Background())
	w.claimCancel = claimCancel

	w.sub = w.listener.Subscribe(w.queues...)
	w.stopControl = w.listener.OnControl(w.onControl)
	w.stopConnect = w.listener.OnConnect(w.onListen)
	claimer := claim.New(w.pool, &claim.Config{
		Queues:    w.queues,
		Prefer:    w.prefer,
		Idle:      w.WorkerIDs(),
		Key:       w.key,
		Doorbell:  w.sub.Doorbell(),
		SafetyNet: w.safetyNet,
		Cooldown:  w.cooldown,
		Quiet:     w.sub.Quiet,
		Logger:    w.logger,
	})
	w.mu.Lock() // Stats may read it meanwhile
	w.claimer = claimer
	w.mu.Unlock()

	if w.ownListener {
		w.goLoop(func(ctx context.Context) { _ = w.listener.Listen(ctx) })
	}
	w.goLoop(w.hb.run)
	if w.reapEvery > 0 {
		w.goLoop(w.reapLoop)
	}
	if w.pruneEvery > 0 {
		w.goLoop(w.pruneLoop)
	}
	w.goLoop(w.rec.run)
	go func() {
		defer close(w.claimDone)
		_ = w.claimer.Run(claimCtx, w.deliver)
	}()
	go func() {
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.lease)
			defer cancel()
			_ = w.StopAndCancel(stopCtx)
		case <-w.startStop:
		}
	}()
	w.logger.Info("worker started", "slots", len(w.ids), "max_slots", w.maxSlots, "queues", w.queues,
		"first_worker_id", w.ids[0])
	return nil
}

func (w *Worker) newListener() (*listener.Listener, error) {
	cfg := &listener.Config{URL: w.listenURL, Logger: w.logger}
	if cfg.URL == "" {
		cfg.ConnConfig = &w.pool.Config().ConnConfig.Config
	}
	l, err := listener.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return l, nil
}

func (w *Worker) goLoop(f func(ctx context.Context)) {
	w.loops.Add(1)
	go func() {
		defer w.loops.Done()
		f(w.loopCtx)
	}()
}

func (w *Worker) register(ctx context.Context, ids []string) error {
	b := &pgx.Batch{}
	pid := os.Getpid()
	lease := pgtype.Interval{Microseconds: w.lease.Microseconds(), Valid: true}
	for _, id := range ids {
		slot, _ := strconv.Atoi(id[strings.LastIndexByte(id, ':')+1:])
		b.Queue(sqlRegister, id, w.node, pid, slot, w.version, w.queues, lease, w.key)
	}
	if err := w.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("worker: register slots: %w", err)
	}
	return nil
}

// deregister marks slots stopped; the rows they still hold are released.
func (w *Worker) deregister(ctx context.Context, ids []string) {
	b := &pgx.Batch{}
	for _, id := range ids {
		b.Queue(sqlDeregister, id, w.key)
	}
	if err := w.pool.SendBatch(ctx, b).Close(); err != nil {
		w.logger.Warn("worker: deregister slots; files.reap will return their rows", "error", err)
	}
}

// Stop stops claiming, marks the slots draining and lets running handlers
// finish and record their outcomes. When ctx ends first, it cancels the
// handlers (cause ErrStopping), releases their rows without spending an
// attempt, and returns ctx's error. The slots are deregistered at the end.
func (w *Worker) Stop(ctx context.Context) error { return w.stop(ctx, false) }

// StopAndCancel stops claiming and cancels the running handlers at once
// (cause ErrStopping); their rows are released without spending an attempt,
// unless a handler still completes. It can also hurry a Stop in progress.
func (w *Worker) StopAndCancel(ctx context.Context) error { return w.stop(ctx, true) }

func (w *Worker) stop(ctx context.Context, cancelNow bool) error {
	if !w.started.Load() {
		return nil
	}
	if cancelNow {
		w.cancelHandlers()
	}
	first := false
	w.stopOnce.Do(func() { first = true })
	if !first {
		select {
		case <-w.stopped:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer close(w.stopped)
	close(w.startStop)
	w.stopping.Store(true)

	w.claimCancel()
	<-w.claimDone
	close(w.handoff) // no row comes any more
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.lease)
	if _, err := w.pool.Exec(dctx, sqlDrain, w.key, w.WorkerIDs()); err != nil {
		w.logger.Debug("worker: mark slots draining", "error", err)
	}
	cancel()

	err := w.waitHandlers(ctx)

	// Whatever is still held (handlers that did not return) goes back to the
	// queue with the slots.
	w.closing.Store(true)
	dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), w.lease)
	w.deregister(dctx, w.WorkerIDs())
	cancel()

	w.loopCancel()
	w.loops.Wait()
	w.gated.Wait()
	w.sub.Close()
	w.stopControl()
	w.stopConnect()
	w.cancelHandlers()
	w.logger.Info("worker stopped", "done", w.done.Load(), "failed", w.failed.Load(), "released", w.released.Load())
	return err
}

// waitHandlers waits for the running handlers to return. When ctx ends
// first, it cancels them (cause ErrStopping), waits stopGrace more for them,
// and returns ctx's error.
func (w *Worker) waitHandlers(ctx context.Context) error {
	finished := make(chan struct{})
	go func() {
		w.handlers.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
	}
	w.cancelHandlers()
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-finished:
	case <-grace.C:
		w.logger.Warn("worker: handlers did not return after cancellation; their rows are released",
			"handlers", w.Stats().BusySlots)
	}
	return ctx.Err()
}

// Stats returns the worker's counters. It may be called at any time, from
// any goroutine, also while Start runs.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	busy, slots := w.busy, len(w.ids)
	claimer, l := w.claimer, w.listener
	w.mu.Unlock()
	ownWaits := w.ownWaits.Load()
	s := Stats{
		Done:            w.done.Load(),
		Failed:          w.failed.Load(),
		Released:        w.released.Load(),
		Lost:            w.lost.Load(),
		Cancelled:       w.cancelled.Load(),
		LeaseLosses:     w.leaseLosses.Load(),
		Orphans:         w.hb.orphans.Load(),
		Heartbeats:      w.hb.beats.Load(),
		HeartbeatErrors: w.hb.errors.Load(),
		Reaped:          w.reaped.Load(),
		Pruned:          w.pruned.Load(),
		RecordsDeferred: w.rec.deferred.Load(),
		OutcomeWaits:    w.outcomeWaits.Load(),
		BusySlots:       busy,
		Slots:           slots,
		IdleSlots:       max(slots-busy-int(ownWaits), 0),
		Unrecorded:      len(w.unsettled) + int(ownWaits),
	}
	if claimer != nil {
		cs := claimer.Stats()
		s.Claims, s.Claimed, s.RacesLost, s.ClaimErrors, s.SafetyWakes = cs.Claims, cs.Rows, cs.RacesLost, cs.Errors, cs.SafetyWakes
		s.SerializationFailures, s.ClaimsDeferred = cs.Serialization, cs.Deferred
	}
	if l != nil {
		ls := l.Stats()
		s.ListenerReconnects, s.ListenerQuiets, s.Listening = ls.Reconnects, ls.Quiets, ls.Connected
	}
	return s
}

// deliver hands a claimed row to a handler goroutine that waits for one, or
// starts one; it runs on the claimer's goroutine, the only sender on handoff.
func (w *Worker) deliver(r claim.Row) {
	now := time.Now()
	// Not a child of a context of the worker's: a parent's set of children
	// cost every row two writes of a map. cancelHandlers reaches the rows
	// through running and shadowed instead.
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &task{row: r, ctx: ctx, cancel: cancel, received: now}
	w.mu.Lock()
	prev := w.running[r.ID]
	if prev != nil {
		w.shadowed[prev] = struct{}{}
	} else {
		prev = w.waiting[r.ID] // settled, its events still held
	}
	if prev != nil && !prev.ended && w.observer != nil {
		// The row was handed back and claimed again before the end of its
		// previous attempt here reached the observer.
		prev.next = t
		t.waits.Store(true)
		w.waiting[r.ID] = t
	}
	w.running[r.ID] = t
	w.busy++
	off := w.handlersOff
	w.mu.Unlock()
	if off {
		cancel(ErrStopping)
	}
	w.handlers.Add(1)
	select {
	case w.handoff <- t:
	default:
		go w.handle(t)
	}
}

// handle executes t, then each row handed to it while it waits, until the
// worker stops. Reused this way, a goroutine keeps the stack it grew: one
// goroutine per row paid for its creation and its stack's growth on every
// row. There are never more of them than rows ran at once.
func (w *Worker) handle(t *task) {
	for ok := true; ok; t, ok = <-w.handoff {
		w.execute(t)
	}
}

// execute runs a row's handler and settles its outcome. The slot is free
// for the next row as soon as the handler returns, while the outcome waits
// for its batch and the recorder finishes it: at most MaxUnrecorded such
// outcomes, so that a database slower than that holds the slots back
// instead of piling outcomes up.
func (w *Worker) execute(t *task) {
	var o *outcome
	defer func() {
		if o == nil || !o.handedOver { // else the recorder finishes the row
			w.forget(t)
			w.handlers.Done()
		}
	}()

	ctx := t.ctx
	if w.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, w.timeout, ErrTimeout)
		defer cancel()
	}
	job := &t.job
	*job = Job{
		ID: t.row.ID, Queue: t.row.Queue, Priority: t.row.Priority, Source: t.row.Source,
		Payload: t.row.Payload, Attempt: t.row.Attempt, MaxAttempts: t.row.MaxAttempts,
		WorkerID: t.row.WorkerID, CreatedAt: t.row.CreatedAt, ClaimedAt: t.row.ClaimedAt,
		LastError: t.row.LastError,
	}
	w.emit(t, Event{Kind: RowStarted, Job: job})
	start := time.Now()
	res, err := w.call(ctx, job)
	elapsed := time.Since(start)

	w.mu.Lock()
	t.finishing = true
	w.busy--
	gone := t.gone
	w.mu.Unlock()
	ev := Event{Job: job, Elapsed: elapsed, Duration: elapsed}
	if res != nil && res.Duration > 0 {
		ev.Duration = res.Duration
	}
	if gone != nil {
		w.logger.Debug("worker: outcome discarded", "file_id", t.row.ID, "attempt", t.row.Attempt, "reason", gone)
		ev.Kind, ev.Err = RowLost, gone
		if gone == ErrCancelled {
			ev.Kind = RowCancelled
		}
		w.emit(t, ev)
		w.freeSlot(t)
		return
	}
	o = w.decide(t, res, err, elapsed, context.Cause(ctx))
	o.ev = ev
	if o.kind == kindRelease {
		w.finish(o, w.rec.release(w.loopCtx, t, o.message))
		w.freeSlot(t)
		return
	}
	select {
	case w.unsettled <- struct{}{}:
		o.handedOver = true
		w.freeSlot(t)
		w.rec.submit(o)
	default:
		// MaxUnrecorded outcomes wait already: this slot waits for its own.
		w.outcomeWaits.Add(1)
		w.ownWaits.Add(1)
		o.settled = make(chan struct{})
		w.rec.submit(o)
		<-o.settled
		w.ownWaits.Add(-1)
		w.freeSlot(t)
	}
}

// emit hands e, an event of t's row, to the observer, after the events of
// the row's earlier attempts in this worker: while one of them has not ended,
// e is held, and delivered when it ends.
func (w *Worker) emit(t *task, e Event) {
	if w.observer == nil {
		return
	}
	if t.waits.Load() {
		w.mu.Lock()
		if t.waits.Load() {
			t.held = append(t.held, e)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
	w.observer.Observe(e)
	if e.Kind != RowStarted {
		w.ended(t)
	}
}

// ended records that t's end event has been observed, and delivers the
// events that the row's next attempt held meanwhile; when that attempt's end
// is among them, the same for the attempt after it, and so on.
func (w *Worker) ended(t *task) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for t != nil {
		t.ended = true
		if w.waiting[t.row.ID] == t {
			delete(w.waiting, t.row.ID)
		}
		n := t.next
		t.next = nil
		t = nil
		for n != nil && t == nil {
			evs := n.held
			n.held = nil
			if len(evs) == 0 {
				n.waits.Store(false) // its later events go straight to the observer
				if w.waiting[n.row.ID] == n {
					delete(w.waiting, n.row.ID)
				}
				break
			}
			w.mu.Unlock()
			for _, e := range evs {
				w.observer.Observe(e)
				if e.Kind != RowStarted {
					t = n
				}
			}
			w.mu.Lock()
		}
	}
}

// call runs the handler, turning a panic into an error.
func (w *Worker) call(ctx context.Context, job *Job) (res *Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			w.logger.Error("worker: handler panicked", "file_id", job.ID, "panic", p)
			res, err = nil, fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return w.handler.Handle(ctx, job)
}

// freeSlot lets the slot of t take its next row, once the gate is open.
func (w *Worker) freeSlot(t *task) {
	switch {
	case w.closing.Load():
	case w.gate != nil && !w.gate.Open():
		w.holdSlots(t.row.WorkerID)
	default:
		w.claimer.Free(t.row.WorkerID)
	}
}

// forget drops a settled row. A row this task released may already be
// running again in another slot of this process, under the same id: that
// task's entry stays.
func (w *Worker) forget(t *task) {
	w.mu.Lock()
	if w.running[t.row.ID] == t {
		delete(w.running, t.row.ID)
		delete(w.hinted, t.row.ID)
	} else {
		delete(w.shadowed, t)
	}
	if !t.finishing {
		t.finishing = true
		w.busy--
	}
	w.mu.Unlock()
	t.cancel(nil)
}

// cancelHandlers cancels every handler running and any that starts later,
// with the cause ErrStopping.
func (w *Worker) cancelHandlers() {
	w.mu.Lock()
	w.handlersOff = true
	ts := make([]*task, 0, len(w.running)+len(w.shadowed))
	for _, t := range w.running {
		ts = append(ts, t)
	}
	for t := range w.shadowed {
		ts = append(ts, t)
	}
	w.mu.Unlock()
	for _, t := range ts {
		t.cancel(ErrStopping)
	}
}

// onListen runs after each LISTEN. A cancellation sent while the listener
// was away was lost with its message: with rows running, a heartbeat now
// learns from the database which of them are still this worker's, and
// stops the handlers of the others (as cancelled or lost, as their
// attempts ended: files.attempt_outcomes).
func (w *Worker) onListen() {
	w.mu.Lock()
	busy := len(w.running) > 0
	w.mu.Unlock()
	if busy {
		w.hb.soon()
	}
}

// onControl handles files_control messages. Any role that can connect can
// send one, so a message is only a hint: a cancellation hint for a row
// running here asks for a heartbeat at once, and the row stops only if the
// database no longer shows it held (files.cancel, which only pgworker_admin
// may call, took it).
func (w *Worker) onControl(c listener.Control) {
	if c.Op != "cancel" {
		return
	}
	w.mu.Lock()
	t := w.running[c.FileID]
	if t == nil || t.row.WorkerID != c.WorkerID || t.gone != nil {
		w.mu.Unlock()
		return
	}
	w.hinted[c.FileID] = time.Now()
	w.mu.Unlock()
	w.hb.soon()
}
