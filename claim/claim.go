// Package claim takes rows of files.files for the idle slots of a process.
//
// A Claimer waits for a doorbell (a files_pending notification fanned out by
// package listener), for a slot to free up after a claim that filled every
// slot it asked for, or for a safety-net timer, and then claims one row for
// each of its idle slots, or of as many as recent claims suggest, in a single
// query: files.claim_batch, or files.claim when one slot is idle (its plans
// are made once per connection, where claim_batch plans each call). A claim
// names about twice as many slots as the last one found rows, and twice as
// many again while claims come back full, so that a lone row does not cost a
// claim for every idle slot. It never polls at a fixed cadence: an idle
// process sends no claim query but the safety net's, and each wake-up sends
// one claim, followed by another only when the first filled every slot it
// named, or, after a short or empty claim while the sessions keep claim
// hints (a long transaction holds back vacuum: files.pick), by one more a
// second later if nothing else has claimed meanwhile, and after a look that
// found fewer again by another at twice the wait, until the safety net's.
// With Config.Cooldown, a wake-up within the cooldown of the last claim
// waits for its end, and one claim takes what came meanwhile.
//
// A lost race (no rows, or SQLSTATE 40001 or 40P01 under stricter isolation)
// only means "wait again": it is counted, never reported as an error.
// Errors are retried with backoff; a claim whose connection was lost (one
// that broke while it sat in the pool) is first tried again at once, on
// another connection. The claimer keeps no session
// state and uses no SQL but calls of the SQL API, so it works through a
// transaction-pooling PgBouncer; the pool's configuration decides how
// statements are sent.
//
//	sub := l.Subscribe("default")
//	c := claim.New(pool, &claim.Config{
//		Queues:   []string{"default"},
//		Doorbell: sub.Doorbell(),
//		Idle:     []string{"node:42:0", "node:42:1"},
//	})
//	go c.Run(ctx, func(r claim.Row) {
//		// hand r to the slot r.WorkerID; call c.Free(r.WorkerID) when it is done
//	})
package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/retry"
)

// sqlClaim claims at most one row per worker id ($1) in queues $2 (NULL:
// all) with the slots' key $3, in the order of $2 when $4 prefers it;
// sqlClaimOne the row of one worker id.
//
// A claim that took rows commits without waiting for its WAL to be flushed
// (or to reach a synchronous standby): set_config(..., true) lasts until
// the claim's own transaction ends, so nothing else the session does is
// touched. A claim lost in a crash just before the flush leaves its rows
// pending again: they are claimed again, and this slot's outcome is refused
// by the fence, which the worker already handles as a row taken back. An
// outcome is recorded durably, and its commit flushes the claim's WAL
// before it.
const (
	claimColumns = `SELECT id, queue, priority, source, payload, attempt, max_attempts, worker_id,
       created_at, claimed_at, lease_expires_at, coalesce(last_error, ''), claim_token,
       coalesce(current_setting('pgworker.claim_hints', true), '') <> ''`
	claimAsync  = ` WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL`
	sqlClaim    = claimColumns + ` FROM files.claim_batch($1::text[], $2::text[], $3, $4)` + claimAsync
	sqlClaimOne = claimColumns + ` FROM files.claim($1, $2::text[], 1, $3, $4)` + claimAsync
)

// minAsk is the fewest idle slots a claim asks rows for when more are idle.
// Two, not one: a claim that fills every slot it asked for is followed at
// once by another, and a lone row taken by a claim for two leaves no second
// query behind it.
const minAsk = 2

// lookAgain is how long after a claim that found fewer rows than it asked
// for, none included, while the sessions keep claim hints, the claimer
// looks once more if it has not claimed meanwhile; a look that finds fewer
// too is followed by another after twice as long, until the wait reaches
// the safety net's. Such a claim does not read the rows behind its hints
// (files.pick: their entries are those a held snapshot keeps), so a row
// that became claimable there (a retry, a release, an insert that
// committed late) waits for the next whole-range search, which the
// sessions claiming from the same queues take turns at: the first claim of
// any of them once it is due, a second or more after the last.
const lookAgain = time.Second

// minQuiet is the shortest rest of a cooldown for which the claimer asks
// Config.Quiet to stop listening: a shorter one costs the LISTEN session more
// (UNLISTEN, then LISTEN) than the notifications it would spare.
const minQuiet = 10 * time.Millisecond

// maxWakeTimes bounds how many retry times a Claimer remembers; the safety net
// covers the others.
const maxWakeTimes = 1024

// Row is a claimed row of files.files.
type Row struct {
	ID             int64
	Queue          string
	Priority       int
	Source         string
	Payload        []byte // JSON object
	Attempt        int
	MaxAttempts    int
	WorkerID       string // the slot that holds the row
	CreatedAt      time.Time
	ClaimedAt      time.Time
	LeaseExpiresAt time.Time // as set by the server's clock
	LastError      string    // of the previous attempt, if any
	Token          string    // the claim's secret: files.complete, fail and release require it
}

// Config configures a Claimer. A nil or zero Config works.
type Config struct {
	// Queues to claim from. Defaults to all queues.
	Queues []string

	// Prefer makes Queues an order of preference: a claim takes the rows
	// of the first queue while it has claimable ones, and those of the next
	// only for the slots left over, in the same single query. Defaults to
	// false: larger priority first across the queues, then id.
	Prefer bool

	// Idle are the worker ids of the slots that start idle. More can be
	// added with Free.
	Idle []string

	// Key is the slots' key (files.register_worker): a slot registered with
	// a key claims only with it, and an unknown slot is registered with it.
	// Defaults to none: the slots must have no key.
	Key string

	// Doorbell rings when there may be claimable rows (a listener
	// subscription's Doorbell). Defaults to none: only the safety net and freed
	// slots wake the claimer.
	Doorbell <-chan struct{}

	// SafetyNet is the longest the claimer waits without a doorbell before it
	// looks anyway (notifications can be lost). WakeAt can make one wait
	// shorter. Defaults to 30s.
	SafetyNet time.Duration

	// Cooldown is the least time from the start of one claim to the start
	// of the next one that a doorbell, a freed slot or a wake-up time
	// prompts: a doorbell that rings sooner is answered when the cooldown
	// ends, by one claim for every row announced meanwhile. A row that comes
	// after a quiet spell longer than Cooldown is claimed at once; a claim
	// that filled every slot it named is followed at once whatever the
	// cooldown, so a backlog is not slowed. It trades pickup latency (up to
	// Cooldown) for fewer claims: at most one per Cooldown per process
	// while rows trickle in. Defaults to 0: every doorbell is answered at once.
	Cooldown time.Duration

	// Quiet, when set, is asked to ring Doorbell at the end of a cooldown
	// instead of each time a row comes meanwhile (a listener's Quiet: the
	// server stops waking the process's LISTEN session until then). It
	// returns false when it cannot; the claimer then waits on its own.
	// Defaults to none.
	Quiet func(until time.Time) bool

	// BackoffMin is the first delay after a failed claim; it doubles up to
	// BackoffMax, with jitter. Defaults to 100ms.
	BackoffMin time.Duration

	// BackoffMax caps the delay after failed claims. Defaults to 5s.
	BackoffMax time.Duration

	// Logger receives one line per database outage; lost races are counted,
	// not logged. Defaults to discarding.
	Logger *slog.Logger
}

// Stats are a Claimer's counters.
type Stats struct {
	Claims        uint64 // claim queries answered (or failed)
	Rows          uint64 // rows claimed
	RacesLost     uint64 // claims that got nothing: no rows, 40001 or 40P01
	Serialization uint64 // of those, the 40001 and 40P01 errors
	Errors        uint64 // claims that failed otherwise (connection errors...)
	SafetyWakes   uint64 // wake-ups by the safety net, a WakeAt time or a look after a short or empty claim with hints
	Deferred      uint64 // claims held back until the cooldown ended
	IdleSlots     int    // slots waiting for a row
	LastClaimErr  string // the last error, empty once a claim succeeds again
}

// Claimer claims rows for a set of idle slots. Create it with New.
type Claimer struct {
	pool       *pgxpool.Pool
	queues     []string
	prefer     bool
	key        *string
	doorbell   <-chan struct{}
	safetyNet  time.Duration
	cooldown   time.Duration
	quiet      func(until time.Time) bool
	backoffMin time.Duration
	backoffMax time.Duration
	logger     *slog.Logger

	mu      sync.Mutex
	idle    []string
	wakes   []wake // sorted by at
	lastErr string

	scratch []Row // the rows of the last claim, delivered; Run's alone

	freed       chan struct{} // a slot became idle
	rescheduled chan struct{} // wakes changed

	claims      atomic.Uint64
	inFlight    atomic.Int64 // claims sent whose rows are not all delivered
	rows        atomic.Uint64
	races       atomic.Uint64
	serial      atomic.Uint64
	errs        atomic.Uint64
	safetyWakes atomic.Uint64
	deferred    atomic.Uint64
}

// New returns a Claimer that claims through pool.
func New(pool *pgxpool.Pool, cfg *Config) *Claimer {
	if cfg == nil {
		cfg = &Config{}
	}
	c := &Claimer{
		pool:        pool,
		queues:      slices.Clone(cfg.Queues),
		prefer:      cfg.Prefer,
		idle:        slices.Clone(cfg.Idle),
		doorbell:    cfg.Doorbell,
		safetyNet:   retry.OrDefault(cfg.SafetyNet, 30*time.Second),
		cooldown:    max(cfg.Cooldown, 0),
		quiet:       cfg.Quiet,
		backoffMin:  retry.OrDefault(cfg.BackoffMin, 100*time.Millisecond),
		backoffMax:  retry.OrDefault(cfg.BackoffMax, 5*time.Second),
		logger:      cfg.Logger,
		freed:       make(chan struct{}, 1),
		rescheduled: make(chan struct{}, 1),
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if len(c.queues) == 0 {
		c.queues = nil
	}
	if cfg.Key != "" {
		c.key = &cfg.Key
	}
	c.backoffMax = max(c.backoffMax, c.backoffMin)
	return c
}

// InFlight reports whether Run has a claim whose rows are not all delivered
// yet: rows the database shows as held by an idle slot may be on their way.
func (c *Claimer) InFlight() bool { return c.inFlight.Load() > 0 }

// claim sends one claim for workerIDs and returns its rows, and whether its
// session keeps claim hints (files.pick) after it.
func (c *Claimer) claim(ctx context.Context, workerIDs []string) (rows []Row, hinted bool, err error) {
	defer c.claims.Add(1) // counted once answered, so that a count includes its outcome
	sql, ids := sqlClaim, any(workerIDs)
	if len(workerIDs) == 1 {
		sql, ids = sqlClaimOne, workerIDs[0]
	}
	rs, err := c.pool.Query(ctx, sql, ids, c.queues, c.key, c.prefer)
	if err != nil {
		return nil, false, c.countErr(err)
	}
	defer rs.Close()
	// At most one row per slot, appended to the rows of the last claim,
	// which Run has delivered by value. The rows of a claim share its token
	// and mostly their queue: one string for each, not one a row. Scan's
	// arguments escape to the heap, so they are made once for the claim:
	// each row is scanned into r, emptied first so that no row shares
	// memory with the one before, and then appended.
	out := c.scratch[:0]
	var (
		r                              Row
		priority, attempt, maxAttempts int32
		queue, token                   pgtype.DriverBytes
		lastQueue, lastToken           string
	)
	dest := []any{&r.ID, &queue, &priority, &r.Source, &r.Payload, &attempt, &maxAttempts,
		&r.WorkerID, &r.CreatedAt, &r.ClaimedAt, &r.LeaseExpiresAt, &r.LastError, &token, &hinted}
	for rs.Next() {
		r = Row{}
		if err := rs.Scan(dest...); err != nil {
			return nil, false, c.countErr(fmt.Errorf("claim: scan row: %w", err))
		}
		r.Priority, r.Attempt, r.MaxAttempts = int(priority), int(attempt), int(maxAttempts)
		lastQueue, lastToken = spelled(lastQueue, queue), spelled(lastToken, token)
		r.Queue, r.Token = lastQueue, lastToken
		out = append(out, r)
	}
	c.scratch = out
	if err := rs.Err(); err != nil {
		// The rows read so far are not committed: the statement failed as a whole.
		return nil, false, c.countErr(err)
	}
	c.rows.Add(uint64(len(out)))
	if len(out) == 0 {
		c.races.Add(1)
	}
	return out, hinted, nil
}

// spelled returns last when b spells it, else b as a new string.
func spelled(last string, b []byte) string {
	if string(b) == last {
		return last
	}
	return string(b)
}

func (c *Claimer) countErr(err error) error {
	if RaceLost(err) {
		c.races.Add(1)
		c.serial.Add(1)
		return err
	}
	c.errs.Add(1)
	return fmt.Errorf("claim: %w", err)
}

// ConnectionLost reports whether err says that the connection it came
// through is gone (no answer, or the server ended the session: 08xxx,
// 57P01-57P03) rather than that the statement was refused.
func ConnectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
		return true
	}
	return strings.HasPrefix(pgErr.Code, "08")
}

// RaceLost reports whether err means another claimer won the rows:
// serialization failure (40001) or deadlock (40P01).
func RaceLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// Free makes workerID idle again (its row is done) and lets the claimer look
// for work for it at once if the last claim filled every slot it named.
func (c *Claimer) Free(workerID string) {
	c.mu.Lock()
	c.idle = append(c.idle, workerID)
	c.mu.Unlock()
	ring(c.freed)
}

// Remove takes workerID out of the idle set, so that it gets no more rows,
// and reports whether it was idle; a slot that holds a row, or whose claim is
// in flight, is not removed.
func (c *Claimer) Remove(workerID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.idle, workerID)
	if i < 0 {
		return false
	}
	c.idle = slices.Delete(c.idle, i, i+1)
	return true
}

// WakeAt makes the claimer look no later than t, for example when a row this
// process failed becomes claimable again.
func (c *Claimer) WakeAt(t time.Time) {
	c.mu.Lock()
	i, _ := slices.BinarySearchFunc(c.wakes, t, func(w wake, t time.Time) int { return w.at.Compare(t) })
	c.wakes = slices.Insert(c.wakes, i, wake{at: t, set: time.Now()})
	if len(c.wakes) > maxWakeTimes {
		c.wakes = c.wakes[:maxWakeTimes]
	}
	c.mu.Unlock()
	ring(c.rescheduled)
}

// Stats returns the claimer's counters.
func (c *Claimer) Stats() Stats {
	c.mu.Lock()
	idle, lastErr := len(c.idle), c.lastErr
	c.mu.Unlock()
	return Stats{
		Claims:        c.claims.Load(),
		Rows:          c.rows.Load(),
		RacesLost:     c.races.Load(),
		Serialization: c.serial.Load(),
		Errors:        c.errs.Load(),
		SafetyWakes:   c.safetyWakes.Load(),
		Deferred:      c.deferred.Load(),
		IdleSlots:     idle,
		LastClaimErr:  lastErr,
	}
}

// Run claims rows for the idle slots and hands each to deliver, from Run's
// goroutine, until ctx ends; then it returns nil. A claim in flight when ctx
// ends is finished and its rows are delivered, so none is left held unseen.
func (c *Claimer) Run(ctx context.Context, deliver func(Row)) error {
	pending := true // look once at start: there may be a backlog
	// How many idle slots the next claim asks rows for. A claim's cost grows
	// with the slots it names (each is looked up in files.workers and given
	// a lease), so it names about twice as many as the last claim found,
	// and twice as many again while claims come back full: a lone row costs
	// a claim for two slots, not for every idle one, and a backlog fills the
	// idle slots within a few claims, each of which found rows.
	ask := minAsk
	timer := time.NewTimer(c.untilSafety())
	defer timer.Stop()
	races, failures := 0, 0
	var downSince, lastStart time.Time
	var heldBack time.Time // the lastStart of the claim after which one was held back
	var again time.Time    // when to look once more after a short or empty claim with hints (lookAgain)
	look := lookAgain      // the wait before that look
	looking := false       // the claim about to be sent is that look
	hints := false         // whether the last claim that found rows left its session with hints
	followUp := true       // the claim at start is not held back

	for {
		for !pending || c.idleCount() == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-c.doorbell:
				pending = true
				looking = false
			case <-c.freed:
			case <-c.rescheduled:
				timer.Reset(c.untilWake(again))
			case <-timer.C:
				c.safetyWakes.Add(1)
				pending = true
				if !again.IsZero() && !time.Now().Before(again) {
					again = time.Time{} // the claim this wake-up sends looks
					looking = true
				}
				timer.Reset(c.safetyNet)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if wait := c.cooldown - time.Since(lastStart); wait > 0 && !followUp {
			// The doorbells that ring meanwhile are answered by the claim
			// after it. Slots may have been removed meanwhile: look again.
			if heldBack != lastStart {
				heldBack = lastStart
				c.deferred.Add(1)
			}
			// Long enough to be worth two statements on the LISTEN session:
			// let it stop listening and ring when the cooldown ends.
			if wait >= minQuiet && c.quiet != nil && c.quiet(lastStart.Add(c.cooldown)) {
				pending = false
				continue
			}
			if !retry.Sleep(ctx, wait) {
				return nil
			}
			continue
		}

		ids := c.takeIdle(ask)
		started := time.Now()
		lastStart = started
		c.inFlight.Add(1)
		// Not cancelled with ctx: a claim committed on the server must reach its slots.
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		rows, hinted, err := c.claim(qctx, ids)
		cancel()
		c.giveBack(ids, rows)
		for _, r := range rows {
			deliver(r)
		}
		clear(rows) // what they point to is the slots' now
		c.inFlight.Add(-1)
		c.dropWakes(started)
		if err == nil {
			// Short or empty while the sessions keep hints: rows behind them
			// may not have been read. An empty answer says nothing of its
			// session's hints; those of the last claim that found rows stand
			// for them (a held snapshot gives every session hints). Any
			// claim that answers moves or ends this look, and a look that
			// finds fewer again waits twice as long, until the safety net
			// would wake the claimer as soon.
			if len(rows) > 0 {
				hints = hinted
			}
			if !looking {
				look = lookAgain
			} else {
				look *= 2
			}
			again = time.Time{}
			if hints && len(rows) < len(ids) && look < c.safetyNet {
				again = started.Add(look)
			}
		}
		looking = false
		timer.Reset(c.untilWake(again))

		switch {
		case err == nil:
			ask = nextAsk(ask, len(ids), len(rows))
			if !downSince.IsZero() {
				c.logger.Info("claim: database reachable again", "down_for", time.Since(downSince).Round(time.Millisecond))
				downSince = time.Time{}
			}
			c.setLastErr("")
			races, failures = 0, 0
			// Every slot asked for got a row: there may be more, so look
			// again at once for the other idle slots, or as soon as a slot
			// frees up, without waiting for a notification.
			pending = len(rows) == len(ids)
			followUp = pending
		case RaceLost(err):
			// Someone else took rows we saw. Rows may remain that nobody
			// will announce again: look a couple more times, spread out.
			races++
			pending = races < 3
			followUp = false
			if pending && !retry.Sleep(ctx, time.Duration(races)*(5*time.Millisecond+rand.N(20*time.Millisecond))) {
				return nil
			}
		default:
			failures++
			c.setLastErr(err.Error())
			pending, followUp = true, false
			// A connection that broke while it sat in the pool fails the
			// claim that takes it: pgworker run's pool hands out a
			// connection idle for less than a minute without a round trip
			// to check it first (worker.ShouldPing). The first failure of
			// a run that lost its connection is tried again at once, on
			// another connection; backoff starts with the second.
			if failures == 1 && ConnectionLost(err) {
				c.logger.Debug("claim: connection lost; claiming again at once", "error", err)
				followUp = true
				continue
			}
			if downSince.IsZero() {
				downSince = time.Now()
				c.logger.Warn("claim: cannot claim; retrying with backoff", "error", err)
			} else {
				c.logger.Debug("claim: still cannot claim", "attempts", failures, "error", err)
			}
			if !retry.Sleep(ctx, retry.Backoff(c.backoffMin, c.backoffMax, failures)) {
				return nil
			}
		}
	}
}

func (c *Claimer) idleCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// takeIdle takes up to n idle slots (at least one when any is idle).
func (c *Claimer) takeIdle(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n = min(max(n, 1), len(c.idle))
	ids := slices.Clone(c.idle[:n])
	c.idle = slices.Delete(c.idle, 0, n)
	return ids
}

// nextAsk is how many slots the claim after one that asked for asked and
// got got rows asks for, given that ask was the plan.
func nextAsk(ask, asked, got int) int {
	if got == asked {
		// Full: there may be more; never fewer than planned.
		return max(ask, 2*asked)
	}
	return max(2*got, minAsk)
}

// giveBack returns to the idle set the ids that got no row.
func (c *Claimer) giveBack(ids []string, rows []Row) {
	if len(rows) == len(ids) {
		return
	}
	held := make(map[string]bool, len(rows))
	for _, r := range rows {
		held[r.WorkerID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if !held[id] {
			c.idle = append(c.idle, id)
		}
	}
}

// untilSafety is how long to wait before looking anyway.
func (c *Claimer) untilSafety() time.Duration {
	d := c.safetyNet
	c.mu.Lock()
	if len(c.wakes) > 0 {
		d = min(d, time.Until(c.wakes[0].at))
	}
	c.mu.Unlock()
	return max(d, 0)
}

// untilWake is how long to wait before looking anyway, or at again (if not
// zero).
func (c *Claimer) untilWake(again time.Time) time.Duration {
	d := c.untilSafety()
	if !again.IsZero() {
		d = min(d, max(time.Until(again), 0))
	}
	return d
}

// wake is a time to look for rows at, and when it was asked for.
type wake struct{ at, set time.Time }

// dropWakes forgets the wake times that a claim started at t has covered:
// those due by t and asked for before t. A time asked for while the claim ran
// is kept even if already due: the row behind it may have become claimable
// after the claim's snapshot (a retry whose backoff ended before its failure
// was committed).
func (c *Claimer) dropWakes(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wakes = slices.DeleteFunc(c.wakes, func(w wake) bool { return !w.at.After(t) && w.set.Before(t) })
}

func (c *Claimer) setLastErr(s string) {
	c.mu.Lock()
	c.lastErr = s
	c.mu.Unlock()
}

func ring(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
