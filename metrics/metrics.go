// Package metrics is what a pgworker process tells its monitoring: Prometheus
// metrics of its worker runtime and of the queues, and health checks.
//
// A Metrics observes a worker.Worker's rows (it is a worker.Observer), reads
// its Stats on each scrape, and reads the queues' gauges from the view
// files.scaling_hint at most once per QueueRefresh however often it is
// scraped. Its Handler serves /metrics, /healthz (the process is alive) and
// /readyz (the database answers and the worker's LISTEN connection is up);
// a Server serves it with a graceful shutdown.
//
//	m := metrics.New(pool, &metrics.Config{Logger: logger})
//	w, err := worker.New(pool, &worker.Config{Handler: h, Slots: 8, Observer: m})
//	if err != nil {
//		return err
//	}
//	m.Watch(w)
//	srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: ":9090"})
//	if err := srv.Start(ctx); err != nil {
//		return err
//	}
//	defer srv.Stop(context.Background())
//
// The queue gauges (pgworker_queue_*, pgworker_scaling_*) describe the whole
// queue, so every process of a fleet exports the same values: aggregate them
// with max by (queue), not sum.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgworker/pgworker/worker"
)

// sqlQueues reads the queue gauges: one line per queue and one for the
// fleet (queue NULL). See migrations/00005_scaling.sql.
const sqlQueues = `
SELECT queue, paused, pending, scheduled, running, oldest_pending_age, mean_attempt_time,
       needed_nodes, desired_nodes, backlog_per_instance::float8, target_backlog_per_instance::float8
FROM files.scaling_hint`

// Config configures a Metrics. A nil Config works.
type Config struct {
	// QueueRefresh is the shortest time between two reads of the queue
	// gauges: scrapes in between get the values of the last read. Defaults
	// to 10s.
	QueueRefresh time.Duration

	// QueryTimeout bounds the read of the queue gauges and the readiness
	// check's ping. Defaults to 5s.
	QueryTimeout time.Duration

	// Registry receives the collectors. Defaults to a new registry with the
	// Go runtime's and the process's collectors.
	Registry *prometheus.Registry

	// Logger receives one line when the queue gauges cannot be read, and one
	// when they can again; the same for the readiness check's ping, with the
	// error that /readyz does not show. Defaults to discarding.
	Logger *slog.Logger
}

// Metrics collects a worker process's metrics. Create it with New.
type Metrics struct {
	pool    *pgxpool.Pool
	reg     *prometheus.Registry
	logger  *slog.Logger
	refresh time.Duration
	timeout time.Duration

	mu      sync.Mutex
	workers []*worker.Worker
	checks  []func(context.Context) error // see AddReadyCheck
	dbDown  bool                          // the last readiness ping failed

	claimed, done, released, lost, cancelled *prometheus.CounterVec
	failed                                   *prometheus.CounterVec
	duration                                 *prometheus.HistogramVec

	queues *queueCollector
}

// durationBuckets spans what backends take: 10ms to an hour.
var durationBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// New returns the metrics of a process whose database is pool.
func New(pool *pgxpool.Pool, cfg *Config) *Metrics {
	if cfg == nil {
		cfg = &Config{}
	}
	m := &Metrics{
		pool:    pool,
		reg:     cfg.Registry,
		logger:  cfg.Logger,
		refresh: cfg.QueueRefresh,
		timeout: cfg.QueryTimeout,
	}
	if m.reg == nil {
		m.reg = prometheus.NewRegistry()
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	if m.refresh <= 0 {
		m.refresh = 10 * time.Second
	}
	if m.timeout <= 0 {
		m.timeout = 5 * time.Second
	}
	rows := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pgworker", Name: name, Help: help}, append([]string{"queue"}, labels...))
	}
	m.claimed = rows("rows_claimed_total", "Rows this process claimed and started.")
	m.done = rows("rows_done_total", "Rows this process completed.")
	m.failed = rows("rows_failed_total", "Attempts this process recorded as failed; final=\"true\" when the row failed for good, \"false\" when it is retried.", "final")
	m.released = rows("rows_released_total", "Rows this process handed back without spending an attempt (its own trouble, or a stop).")
	m.lost = rows("rows_lost_total", "Rows whose outcome this process could not record: lease lost, or the row was no longer held.")
	m.cancelled = rows("rows_cancelled_total", "Running rows an operator cancelled.")
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "pgworker", Name: "backend_duration_seconds",
		Help:    "Processing time of the rows that ended done or failed, as the handler reports it (pgworker run: the backend program's run time).",
		Buckets: durationBuckets,
	}, []string{"queue", "outcome"})
	m.queues = newQueueCollector(m)
	m.reg.MustRegister(m.claimed, m.done, m.failed, m.released, m.lost, m.cancelled, m.duration,
		&statsCollector{m: m}, m.queues)
	return m
}

// Registry returns the registry the metrics are in, for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Watch adds w's counters (Stats) to the metrics, and its listener to the
// readiness check. Watch several workers of one process and their counters
// add up.
func (m *Metrics) Watch(w *worker.Worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workers = append(m.workers, w)
}

// Observe counts a worker's row events; it makes Metrics a worker.Observer.
func (m *Metrics) Observe(e worker.Event) {
	q := e.Job.Queue
	switch e.Kind {
	case worker.RowStarted:
		m.claimed.WithLabelValues(q).Inc()
	case worker.RowDone:
		m.done.WithLabelValues(q).Inc()
		m.duration.WithLabelValues(q, "done").Observe(e.Duration.Seconds())
	case worker.RowFailed:
		m.failed.WithLabelValues(q, strconv.FormatBool(e.RetryAt.IsZero())).Inc()
		m.duration.WithLabelValues(q, "failed").Observe(e.Duration.Seconds())
	case worker.RowReleased:
		m.released.WithLabelValues(q).Inc()
	case worker.RowLost:
		m.lost.WithLabelValues(q).Inc()
	case worker.RowCancelled:
		m.cancelled.WithLabelValues(q).Inc()
	}
}

var _ worker.Observer = (*Metrics)(nil)

// stats returns the watched workers' counters, added up, and whether every
// one of them listens; listening is false when none is watched.
func (m *Metrics) stats() (s worker.Stats, listening bool) {
	m.mu.Lock()
	ws := append([]*worker.Worker(nil), m.workers...)
	m.mu.Unlock()
	listening = len(ws) > 0
	for _, w := range ws {
		x := w.Stats()
		s.Claims += x.Claims
		s.Claimed += x.Claimed
		s.RacesLost += x.RacesLost
		s.SerializationFailures += x.SerializationFailures
		s.Slots += x.Slots
		s.ClaimErrors += x.ClaimErrors
		s.SafetyWakes += x.SafetyWakes
		s.ClaimsDeferred += x.ClaimsDeferred
		s.RecordsDeferred += x.RecordsDeferred
		s.OutcomeWaits += x.OutcomeWaits
		s.Unrecorded += x.Unrecorded
		s.LeaseLosses += x.LeaseLosses
		s.Orphans += x.Orphans
		s.Heartbeats += x.Heartbeats
		s.HeartbeatErrors += x.HeartbeatErrors
		s.Reaped += x.Reaped
		s.Pruned += x.Pruned
		s.ListenerReconnects += x.ListenerReconnects
		s.ListenerQuiets += x.ListenerQuiets
		s.BusySlots += x.BusySlots
		s.IdleSlots += x.IdleSlots
		listening = listening && x.Listening
	}
	return s, listening
}

// statsCollector turns the workers' Stats into metrics at each scrape.
type statsCollector struct{ m *Metrics }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("pgworker_"+name, help, labels, nil)
}

var (
	descSlots            = desc("slots", "Slots of this process (varies with --slots MIN-MAX).")
	descSlotsBusy        = desc("slots_busy", "Slots working on a row.")
	descSlotsIdle        = desc("slots_idle", "Slots waiting for a row (a slot that waits for its own outcome to be recorded counts in pgworker_outcomes_unrecorded instead).")
	descClaims           = desc("claim_queries_total", "Claim statements sent (one claims a row for each idle slot).")
	descRacesLost        = desc("claim_races_lost_total", "Claims that got nothing: other workers took the rows first, or none was left (40001 and 40P01 included).")
	descSerialization    = desc("claim_serialization_failures_total", "Of the lost races, claims that failed with SQLSTATE 40001 or 40P01.")
	descClaimErrors      = desc("claim_errors_total", "Claims that failed otherwise (the database unreachable, ...).")
	descSafetyWakes      = desc("claim_safety_wakes_total", "Times the process looked for work without a notification (the safety net, a retry's backoff ending, or a look after a short or empty claim beside a held snapshot).")
	descClaimsDeferred   = desc("claims_deferred_total", "Claims held back until --claim-cooldown ended, so that one claim took the rows announced meanwhile.")
	descRecordsDeferred  = desc("outcome_records_deferred_total", "Outcome statements held back until --claim-cooldown ended, so that one statement recorded the outcomes that ended meanwhile.")
	descUnrecorded       = desc("outcomes_unrecorded", "Outcomes of finished rows not yet recorded: those whose slots run on (at most the workers' MaxUnrecorded; pgworker run: 64, or the slots if more) and one per slot that waits for its own.")
	descOutcomeWaits     = desc("outcome_waits_total", "Times a slot waited for its own outcome to be recorded because as many outcomes as allowed were waiting already: the database's commits are slower than the rows.")
	descLeaseLosses      = desc("lease_losses_total", "Running rows a heartbeat found no longer held by this process after their lease ran out (an operator's cancel counts in rows_cancelled_total); their handlers were cancelled.")
	descOrphans          = desc("orphans_released_total", "Rows held in the database but unknown to this process, released.")
	descHeartbeats       = desc("heartbeats_total", "Heartbeat statements that succeeded.")
	descHeartbeatErrors  = desc("heartbeat_errors_total", "Heartbeat statements that failed.")
	descReaped           = desc("reaped_rows_total", "Rows of silent workers that this process's files.reap returned to the queue.")
	descPruned           = desc("pruned_rows_total", "Finished rows past their retention that this process's files.prune deleted.")
	descListenerUp       = desc("listener_up", "1 while the LISTEN connection is up.")
	descListenReconnects = desc("listener_reconnects_total", "Times the LISTEN connection was re-established.")
	descListenQuiets     = desc("listener_quiets_total", "Times the LISTEN connection stopped listening for the rest of a --claim-cooldown.")
	descPoolConns        = desc("db_pool_connections", "Connections of the process's pool, by state.", "state")
	descPoolMax          = desc("db_pool_max_connections", "Size of the process's pool.")
)

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSlots, descSlotsBusy, descSlotsIdle, descClaims, descRacesLost, descSerialization,
		descClaimErrors, descSafetyWakes, descClaimsDeferred, descRecordsDeferred, descUnrecorded, descOutcomeWaits, descLeaseLosses, descOrphans, descHeartbeats, descHeartbeatErrors, descReaped, descPruned,
		descListenerUp, descListenReconnects, descListenQuiets, descPoolConns, descPoolMax} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s, listening := c.m.stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(descSlots, float64(s.Slots))
	gauge(descSlotsBusy, float64(s.BusySlots))
	gauge(descSlotsIdle, float64(s.IdleSlots))
	counter(descClaims, s.Claims)
	counter(descRacesLost, s.RacesLost)
	counter(descSerialization, s.SerializationFailures)
	counter(descClaimErrors, s.ClaimErrors)
	counter(descSafetyWakes, s.SafetyWakes)
	counter(descClaimsDeferred, s.ClaimsDeferred)
	counter(descRecordsDeferred, s.RecordsDeferred)
	gauge(descUnrecorded, float64(s.Unrecorded))
	counter(descOutcomeWaits, s.OutcomeWaits)
	counter(descLeaseLosses, s.LeaseLosses)
	counter(descOrphans, s.Orphans)
	counter(descHeartbeats, s.Heartbeats)
	counter(descHeartbeatErrors, s.HeartbeatErrors)
	counter(descReaped, s.Reaped)
	counter(descPruned, s.Pruned)
	gauge(descListenerUp, boolFloat(listening))
	counter(descListenReconnects, s.ListenerReconnects)
	counter(descListenQuiets, s.ListenerQuiets)
	if c.m.pool != nil {
		ps := c.m.pool.Stat()
		gauge(descPoolConns, float64(ps.AcquiredConns()), "acquired")
		gauge(descPoolConns, float64(ps.IdleConns()), "idle")
		gauge(descPoolConns, float64(ps.ConstructingConns()), "constructing")
		gauge(descPoolMax, float64(ps.MaxConns()))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	descPending      = desc("queue_pending_rows", "Pending rows of the queue, those waiting for a retry included.", "queue")
	descScheduled    = desc("queue_scheduled_rows", "Of the pending rows, those waiting for their retry backoff.", "queue")
	descRunning      = desc("queue_running_rows", "Rows of the queue being worked on, fleet-wide.", "queue")
	descOldest       = desc("queue_oldest_pending_age_seconds", "Age of the queue's oldest pending row; 0 when none is pending.", "queue")
	descPaused       = desc("queue_paused", "1 when the queue is paused.", "queue")
	descMeanAttempt  = desc("scaling_mean_attempt_seconds", "Mean time from claim to outcome of the fleet's recent attempts (files.scaling_hint); absent when none ended recently.")
	descNeeded       = desc("scaling_needed_nodes", "Worker nodes that would finish the outstanding rows within the target drain time (files.scaling_hint).")
	descDesired      = desc("scaling_desired_nodes", "scaling_needed_nodes within the settings' min_nodes and max_nodes: the desired capacity.")
	descPerInstance  = desc("scaling_backlog_per_instance", "(Pending + running rows) per live worker node: the custom metric for a target-tracking policy.")
	descTarget       = desc("scaling_target_backlog_per_instance", "The target value for scaling_backlog_per_instance: target drain time / mean attempt time x slots per node; absent when unknown.")
	descQueueAge     = desc("queue_stats_age_seconds", "Age of the queue gauges: time since files.scaling_hint was last read successfully.")
	descQueueReads   = desc("queue_stats_reads_total", "Reads of files.scaling_hint (at most one per refresh interval, however many scrapes).")
	descQueueErrors  = desc("queue_stats_errors_total", "Reads of files.scaling_hint that failed.")
	queueDescriptors = []*prometheus.Desc{descPending, descScheduled, descRunning, descOldest, descPaused, descMeanAttempt,
		descNeeded, descDesired, descPerInstance, descTarget, descQueueAge, descQueueReads, descQueueErrors}
)

// queueLine is one line of files.scaling_hint.
type queueLine struct {
	queue                          *string
	paused                         *bool
	pending, scheduled, running    int64
	oldest, mean                   pgtype.Interval
	needed, desired                int32
	perInstance, targetPerInstance *float64
}

// queueCollector reads files.scaling_hint when a scrape finds its last read
// older than the refresh interval; scrapes in between get the cached lines.
type queueCollector struct {
	m *Metrics

	mu       sync.Mutex
	lines    []queueLine
	readAt   time.Time // of the last successful read
	tried    time.Time // of the last attempt
	reads    uint64
	errs     uint64
	failing  bool
	disabled bool // no pool
}

func newQueueCollector(m *Metrics) *queueCollector {
	return &queueCollector{m: m, disabled: m.pool == nil}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range queueDescriptors {
		ch <- d
	}
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	if c.disabled {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.tried) >= c.m.refresh {
		c.read()
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, l := range c.lines {
		if l.queue == nil {
			gauge(descNeeded, float64(l.needed))
			gauge(descDesired, float64(l.desired))
			if l.perInstance != nil {
				gauge(descPerInstance, *l.perInstance)
			}
			if l.targetPerInstance != nil {
				gauge(descTarget, *l.targetPerInstance)
			}
			if s, ok := seconds(l.mean); ok {
				gauge(descMeanAttempt, s)
			}
			continue
		}
		q := *l.queue
		gauge(descPending, float64(l.pending), q)
		gauge(descScheduled, float64(l.scheduled), q)
		gauge(descRunning, float64(l.running), q)
		oldest, _ := seconds(l.oldest)
		gauge(descOldest, oldest, q)
		gauge(descPaused, boolFloat(l.paused != nil && *l.paused), q)
	}
	if !c.readAt.IsZero() {
		gauge(descQueueAge, time.Since(c.readAt).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(descQueueReads, prometheus.CounterValue, float64(c.reads))
	ch <- prometheus.MustNewConstMetric(descQueueErrors, prometheus.CounterValue, float64(c.errs))
}

// read reads the lines; on failure the last ones stay (their age tells).
func (c *queueCollector) read() {
	c.tried = time.Now()
	c.reads++
	ctx, cancel := context.WithTimeout(context.Background(), c.m.timeout)
	defer cancel()
	lines, err := c.query(ctx)
	if err != nil {
		c.errs++
		if !c.failing {
			c.failing = true
			c.m.logger.Warn("metrics: cannot read the queue gauges (files.scaling_hint); serving the last ones", "error", err)
		} else {
			c.m.logger.Debug("metrics: still cannot read the queue gauges", "error", err)
		}
		return
	}
	if c.failing {
		c.failing = false
		c.m.logger.Info("metrics: queue gauges read again")
	}
	c.lines, c.readAt = lines, time.Now()
}

func (c *queueCollector) query(ctx context.Context) ([]queueLine, error) {
	rows, err := c.m.pool.Query(ctx, sqlQueues)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lines []queueLine
	for rows.Next() {
		var l queueLine
		if err := rows.Scan(&l.queue, &l.paused, &l.pending, &l.scheduled, &l.running, &l.oldest, &l.mean,
			&l.needed, &l.desired, &l.perInstance, &l.targetPerInstance); err != nil {
			return nil, err
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, errors.New("files.scaling_hint returned no line: files.scaling_settings must hold one row")
	}
	return lines, nil
}

// seconds converts an interval; months count as 30 days.
func seconds(iv pgtype.Interval) (float64, bool) {
	if !iv.Valid {
		return 0, false
	}
	return float64(iv.Microseconds)/1e6 + float64(iv.Days)*86400 + float64(iv.Months)*30*86400, true
}

// ready reports whether the process can work: the database answers and every
// watched worker's LISTEN connection is up. The problems come as text.
func (m *Metrics) ready(ctx context.Context) (ok bool, problems []string) {
	if _, listening := m.stats(); !listening {
		m.mu.Lock()
		n := len(m.workers)
		m.mu.Unlock()
		if n == 0 {
			problems = append(problems, "listener: no worker started yet")
		} else {
			problems = append(problems, "listener: not listening (the LISTEN connection is down)")
		}
	}
	if m.pool != nil {
		ctx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		err := m.pool.Ping(ctx)
		m.noteDatabase(err)
		if err != nil {
			problems = append(problems, "database: unreachable")
		}
	}
	return len(problems) == 0, problems
}

// noteDatabase logs the readiness ping's error when the database stops
// answering, and one line when it answers again: once per change, not per
// probe. The error names the user, the database and the host, so it goes to
// the log only and /readyz says "database: unreachable".
func (m *Metrics) noteDatabase(err error) {
	m.mu.Lock()
	changed := (err != nil) != m.dbDown
	m.dbDown = err != nil
	m.mu.Unlock()
	switch {
	case !changed:
	case err != nil:
		m.logger.Warn("metrics: readiness: the database does not answer", "error", err)
	default:
		m.logger.Info("metrics: readiness: the database answers again")
	}
}

// Handler serves /metrics (Prometheus text format), /healthz and /readyz.
func (m *Metrics) Handler() http.Handler {
	return newMux(m)
}
