// Package listener keeps one LISTEN connection per process and fans its
// wake-ups out to local subscribers as coalescing doorbells.
//
// The connection listens on files_pending (a queue has claimable rows) and
// files_control (operator messages such as the cancellation of a running row).
// It reconnects with backoff and jitter until its context ends, pings the idle
// connection so that a peer that vanished is noticed within seconds, and rings
// every doorbell after each (re)connect, since notifications sent while it was
// away are lost.
//
// A process that will look for work at a known time anyway (a claim cooldown)
// can let the listener stop listening until then with Quiet: the server wakes
// every listening session of a database for each notification, whatever its
// channel, and a quiet one costs it nothing.
//
// A doorbell is a channel of capacity one: a busy subscriber misses nothing
// (one ring waits for it), and a slow one never blocks the others.
//
//	l, err := listener.New(&listener.Config{URL: os.Getenv("PGWORKER_LISTEN_URL")})
//	if err != nil {
//		return err
//	}
//	go l.Listen(ctx)
//
//	sub := l.Subscribe("default")
//	defer sub.Close()
//	for {
//		select {
//		case <-sub.Doorbell():
//			// claim work
//		case <-ctx.Done():
//			return nil
//		}
//	}
//
// LISTEN needs a session: behind a transaction-pooling PgBouncer, give the
// listener a direct or session-pooled URL.
//
// # Why not pgxlisten
//
// The package is written on pgconn rather than github.com/jackc/pgxlisten,
// which reconnects too and whose BacklogHandler could ring the doorbells after
// each connect. pgxlisten waits in WaitForNotification with no deadline, and
// that call owns the connection, so nothing can check an idle one. Behind a
// middlebox that keeps the TCP session open after the server is gone
// (PgBouncer, HAProxy, a load balancer during a failover) it waits forever:
// the middlebox answers the TCP keepalives that its Connect hook can set, and
// the server has nothing to send. This package pings an idle connection and
// replaces one that does not answer. pgxlisten recovers from a restart and
// from a standby that refuses LISTEN, but after one fixed delay (a minute
// unless set) rather than backoff with jitter, and reports every failed
// attempt where this package logs one line per outage. The tests in
// pgxlisten_test.go drive it through these faults; when pgxlisten learns to
// check an idle connection, TestPgxlistenStaysOnHalfOpenConnection fails, and
// building on it is worth another look.
package listener

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/internal/retry"
)

// Channels the listener listens on.
const (
	// ChannelPending carries the name of a queue that has claimable rows.
	ChannelPending = "files_pending"
	// ChannelControl carries JSON messages such as {"op":"cancel","file_id":N,"worker_id":"..."}.
	ChannelControl = "files_control"
)

// sqlListen subscribes the session to both channels in one round trip;
// sqlUnlisten ends both, so that the server stops waking the session.
const (
	sqlListen   = "LISTEN files_pending; LISTEN files_control"
	sqlUnlisten = "UNLISTEN *"
)

// sqlStateReadOnly is what a standby answers to LISTEN ("cannot execute LISTEN
// during recovery").
const sqlStateReadOnly = "25006"

// ErrListening is returned by Listen when the listener is already listening.
var ErrListening = errors.New("listener: Listen is already running")

// Config configures a Listener. URL or ConnConfig is required.
type Config struct {
	// URL is the database URL of the LISTEN connection. It needs a session: a
	// direct or session-pooled URL, not a transaction-pooling PgBouncer.
	URL string

	// ConnConfig is used when URL is empty, for example a copy of a pool's
	// pgxpool.Config().ConnConfig.Config. It is copied, not modified.
	ConnConfig *pgconn.Config

	// Logger receives one line per outage, not one per attempt. Defaults to
	// discarding.
	Logger *slog.Logger

	// PingInterval is how long the connection may stay silent before the
	// listener checks it with a ping. Defaults to 5s.
	PingInterval time.Duration

	// PingTimeout bounds the ping and the connect; a connection that does not
	// answer in time is replaced. Defaults to 5s.
	PingTimeout time.Duration

	// BackoffMin is the first delay before reconnecting after a failed attempt;
	// it doubles up to BackoffMax, with jitter. Defaults to 100ms.
	BackoffMin time.Duration

	// BackoffMax caps the reconnect delay. Defaults to 5s.
	BackoffMax time.Duration
}

// Control is a message received on ChannelControl.
type Control struct {
	Op       string `json:"op"` // "cancel"
	FileID   int64  `json:"file_id"`
	WorkerID string `json:"worker_id"`
}

// Stats are the listener's counters since it was created.
type Stats struct {
	Connected     bool   // listening right now
	Connects      uint64 // sessions that reached LISTEN
	Reconnects    uint64 // of those, the ones after the first
	Failures      uint64 // connection attempts and sessions that failed
	Notifications uint64 // notifications received
	Malformed     uint64 // control messages that were not JSON of the form of Control, ignored
	Pings         uint64 // health checks of the idle connection
	Quiets        uint64 // spells without listening, asked for with Quiet
}

// Listener owns the process's LISTEN connection. Create it with New and run it
// with Listen.
type Listener struct {
	connect      func(ctx context.Context) (*pgconn.PgConn, error)
	logger       *slog.Logger
	pingInterval time.Duration
	pingTimeout  time.Duration
	backoffMin   time.Duration
	backoffMax   time.Duration

	running atomic.Bool

	mu       sync.RWMutex
	subs     []*Subscription
	controls []*controlSub
	hooks    []*connectHook

	connected     atomic.Bool
	connects      atomic.Uint64
	failures      atomic.Uint64
	notifications atomic.Uint64
	malformed     atomic.Uint64
	pings         atomic.Uint64
	quiets        atomic.Uint64

	// Quiet's request, and how to wake the session waiting for a
	// notification so that it sees one.
	qmu        sync.Mutex
	quietUntil time.Time // zero: none asked for
	interrupt  func()    // ends the session's wait; nil when it is not waiting
	listening  bool      // a session is up and will see a request

	// Outage bookkeeping, touched by the Listen goroutine only.
	dropErr   error     // why the last healthy session ended
	downSince time.Time // start of the current outage; zero while connected
	announced bool      // the outage has been logged
	attempts  int       // failed attempts in the current outage
}

// New returns a listener; it connects when Listen runs.
func New(cfg *Config) (*Listener, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	l := &Listener{
		logger:       cfg.Logger,
		pingInterval: retry.OrDefault(cfg.PingInterval, 5*time.Second),
		pingTimeout:  retry.OrDefault(cfg.PingTimeout, 5*time.Second),
		backoffMin:   retry.OrDefault(cfg.BackoffMin, 100*time.Millisecond),
		backoffMax:   retry.OrDefault(cfg.BackoffMax, 5*time.Second),
	}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if l.backoffMax < l.backoffMin {
		l.backoffMax = l.backoffMin
	}

	base := cfg.ConnConfig
	if base == nil {
		if cfg.URL == "" {
			return nil, errors.New("listener: missing database URL (set Config.URL or Config.ConnConfig)")
		}
		var err error
		base, err = pgconn.ParseConfig(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("listener: parse URL: %w", err)
		}
	}
	connCfg := connConfigFor(base, l.pingTimeout)
	connCfg.OnNotification = l.onNotification
	l.connect = func(ctx context.Context) (*pgconn.PgConn, error) {
		return pgconn.ConnectConfig(ctx, connCfg)
	}
	return l, nil
}

// connConfigFor returns a copy of base fit for a LISTEN connection: TCP
// keepalives that notice a vanished peer within seconds, a connect timeout
// (kept if base has one, else timeout), and application_name "pgworker
// listener" unless base sets one.
func connConfigFor(base *pgconn.Config, timeout time.Duration) *pgconn.Config {
	cfg := base.Copy()
	if cfg.ConnectTimeout > 0 {
		timeout = cfg.ConnectTimeout
	}
	cfg.ConnectTimeout = timeout
	dialer := &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     5 * time.Second,
			Interval: 2 * time.Second,
			Count:    3,
		},
	}
	cfg.DialFunc = dialer.DialContext
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pgworker listener"
	}
	return cfg
}

// Subscription is one subscriber's doorbell. Close it when done.
type Subscription struct {
	l      *Listener
	queues []string // nil: every queue
	bell   chan struct{}
	quiet  time.Time // until when it needs no ring (Quiet), under l.mu
}

// Subscribe returns a doorbell rung when one of queues has claimable rows (no
// queues: any queue) and after every (re)connect of the listener.
func (l *Listener) Subscribe(queues ...string) *Subscription {
	s := &Subscription{l: l, bell: make(chan struct{}, 1)}
	if len(queues) > 0 {
		s.queues = slices.Clone(queues)
	}
	l.mu.Lock()
	l.subs = append(l.subs, s)
	l.mu.Unlock()
	return s
}

// Doorbell receives a value when there may be work. Rings coalesce: while the
// subscriber is busy, at most one ring waits for it.
func (s *Subscription) Doorbell() <-chan struct{} { return s.bell }

// Ring rings this doorbell only, as a notification would.
func (s *Subscription) Ring() {
	select {
	case s.bell <- struct{}{}:
	default:
	}
}

// Quiet tells the listener that this subscriber needs no ring until until:
// it will look for work then anyway (a claim cooldown). Once every
// subscription has said so for a time still ahead, the listener stops
// listening, and the server stops waking its session for each notification
// (it wakes every listening session of the database, whatever the channel).
// At the soonest of those times the listener listens again and rings every
// doorbell. Notifications sent meanwhile are lost, files_control's too, and
// the OnConnect hooks do not run for it.
//
// Quiet reports whether the listener is quiet now, so that this doorbell
// rings by until; when it reports false (another subscriber still listens,
// or no session is up) the caller waits on its own. A time not ahead
// withdraws the request, and a quiet listener listens again at once.
func (s *Subscription) Quiet(until time.Time) bool {
	l := s.l
	now := time.Now()
	l.mu.Lock()
	s.quiet = until
	end, all := until, slices.Contains(l.subs, s)
	for _, x := range l.subs {
		if !x.quiet.After(now) {
			all = false
			break
		}
		if x.quiet.Before(end) {
			end = x.quiet
		}
	}
	l.mu.Unlock()
	switch {
	case all:
		return l.goQuiet(end)
	case !until.After(now) && !l.quietAsked().IsZero():
		l.goQuiet(now) // withdrawn: listen again at once
	}
	return false
}

// Close stops the rings. It is safe to call more than once.
func (s *Subscription) Close() {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	s.l.subs = slices.DeleteFunc(s.l.subs, func(x *Subscription) bool { return x == s })
}

func (s *Subscription) wants(queue string) bool {
	return s.queues == nil || slices.Contains(s.queues, queue)
}

type controlSub struct{ fn func(Control) }

// OnControl calls fn for each message received on ChannelControl, from the
// listener's goroutine: fn must return quickly. The returned function removes it.
func (l *Listener) OnControl(fn func(Control)) (remove func()) {
	c := &controlSub{fn: fn}
	l.mu.Lock()
	l.controls = append(l.controls, c)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.controls = slices.DeleteFunc(l.controls, func(x *controlSub) bool { return x == c })
	}
}

type connectHook struct{ fn func() }

// OnConnect calls fn each time a session reaches LISTEN, the first and every
// reconnect, from the listener's goroutine: fn must return quickly. Control
// messages sent while the listener was away are lost, so a subscriber that
// acts on them checks the database here instead. The returned function
// removes it.
func (l *Listener) OnConnect(fn func()) (remove func()) {
	h := &connectHook{fn: fn}
	l.mu.Lock()
	l.hooks = append(l.hooks, h)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.hooks = slices.DeleteFunc(l.hooks, func(x *connectHook) bool { return x == h })
	}
}

// RingAll rings every doorbell.
func (l *Listener) RingAll() {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, s := range l.subs {
		s.Ring()
	}
}

func (l *Listener) onNotification(_ *pgconn.PgConn, n *pgconn.Notification) {
	l.notifications.Add(1)
	switch n.Channel {
	case ChannelPending:
		l.mu.RLock()
		for _, s := range l.subs {
			if s.wants(n.Payload) {
				s.Ring()
			}
		}
		l.mu.RUnlock()
	case ChannelControl:
		var c Control
		if err := json.Unmarshal([]byte(n.Payload), &c); err != nil {
			// Any role that can connect may send one: a counter and a debug
			// line, never a warning per message or the payload itself.
			l.malformed.Add(1)
			l.logger.Debug("listener: ignoring malformed control message", "bytes", len(n.Payload), "error", err)
			return
		}
		l.mu.RLock()
		controls := slices.Clone(l.controls)
		l.mu.RUnlock()
		for _, cs := range controls {
			cs.fn(c)
		}
	}
}

// Stats returns the listener's counters.
func (l *Listener) Stats() Stats {
	connects := l.connects.Load()
	return Stats{
		Connected:     l.connected.Load(),
		Connects:      connects,
		Reconnects:    max(connects, 1) - 1,
		Failures:      l.failures.Load(),
		Notifications: l.notifications.Load(),
		Malformed:     l.malformed.Load(),
		Pings:         l.pings.Load(),
		Quiets:        l.quiets.Load(),
	}
}

// goQuiet asks the session for a quiet spell that ends at until (a new
// end for one under way), and reports whether a session will see it.
func (l *Listener) goQuiet(until time.Time) bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	if !l.listening {
		return false
	}
	l.quietUntil = until
	if l.interrupt != nil {
		l.interrupt()
	}
	return true
}

// waitArmed lets Quiet end the session's wait through stop (nil once the
// wait is over), or ends it at once when a request is already there.
func (l *Listener) waitArmed(stop func()) {
	l.qmu.Lock()
	l.interrupt = stop
	asked := !l.quietUntil.IsZero()
	l.qmu.Unlock()
	if asked && stop != nil {
		stop()
	}
}

// quietAsked returns the end of the quiet spell asked for, zero for none.
func (l *Listener) quietAsked() time.Time {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.quietUntil
}

// setListening tells Quiet whether a session will see its request.
func (l *Listener) setListening(on bool) {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	l.listening, l.interrupt = on, nil
	if !on {
		l.quietUntil = time.Time{} // the next session listens and rings anyway
	}
}

// quiet runs one quiet spell on conn: UNLISTEN, wait for the end asked for
// (which may move meanwhile), LISTEN again and ring every doorbell.
func (l *Listener) quiet(ctx context.Context, conn *pgconn.PgConn) error {
	uctx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	_, err := conn.Exec(uctx, sqlUnlisten).ReadAll()
	cancel()
	if err != nil {
		return fmt.Errorf("unlisten: %w", err)
	}
	l.quiets.Add(1)
	// A new end asked for meanwhile wakes the wait.
	moved := make(chan struct{}, 1)
	l.waitArmed(func() {
		select {
		case moved <- struct{}{}:
		default:
		}
	})
	defer l.waitArmed(nil)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		l.qmu.Lock()
		until := l.quietUntil
		if !time.Now().Before(until) {
			l.quietUntil = time.Time{}
			l.qmu.Unlock()
			break
		}
		l.qmu.Unlock()
		timer.Reset(time.Until(until))
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-moved:
		}
	}
	lctx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	_, err = conn.Exec(lctx, sqlListen).ReadAll()
	cancel()
	if err != nil {
		return fmt.Errorf("listen after a quiet spell: %w", err)
	}
	l.RingAll()
	return nil
}

// Listen connects, listens and dispatches notifications until ctx ends, then
// returns nil. Connection failures are retried forever, with backoff.
func (l *Listener) Listen(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return ErrListening
	}
	defer l.running.Store(false)

	failed := 0 // consecutive attempts that did not reach LISTEN
	for {
		up, err := l.session(ctx)
		l.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		l.failures.Add(1)
		var delay time.Duration
		if up {
			// A session that was working dropped: reconnect at once (a little
			// jitter spreads a fleet that lost the server together).
			failed = 0
			l.dropErr, l.downSince, l.announced, l.attempts = err, time.Now(), false, 0
			delay = rand.N(l.backoffMin)
		} else {
			failed++
			l.attempts++
			if l.downSince.IsZero() {
				l.downSince = time.Now()
			}
			l.reportFailure(err)
			delay = retry.Backoff(l.backoffMin, l.backoffMax, failed)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// reportFailure logs the first failed attempt of an outage at warn level and
// the others at debug level.
func (l *Listener) reportFailure(err error) {
	hint := ""
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlStateReadOnly {
		hint = "the server is a standby or in recovery; LISTEN needs the primary"
	}
	if l.announced {
		l.logger.Debug("listener: still cannot listen", "attempts", l.attempts, "error", err)
		return
	}
	l.announced = true
	args := []any{"error", err, "down_for", time.Since(l.downSince).Round(time.Millisecond)}
	if l.dropErr != nil {
		args = append(args, "cause", l.dropErr)
	}
	if hint != "" {
		args = append(args, "hint", hint)
	}
	l.logger.Warn("listener: cannot listen; retrying with backoff until the database is back", args...)
}

// reportUp logs the end of an outage, if any, in one line.
func (l *Listener) reportUp() {
	switch {
	case l.announced:
		l.logger.Info("listener: listening again", "down_for", time.Since(l.downSince).Round(time.Millisecond),
			"attempts", l.attempts)
	case l.dropErr != nil:
		l.logger.Info("listener: connection lost and re-established", "cause", l.dropErr)
	default:
		l.logger.Debug("listener: listening", "channels", []string{ChannelPending, ChannelControl})
	}
	l.dropErr, l.downSince, l.announced, l.attempts = nil, time.Time{}, false, 0
}

// session runs one connection: connect, LISTEN, ring everyone, then wait for
// notifications, pinging when idle. up tells whether it reached LISTEN.
func (l *Listener) session(ctx context.Context) (up bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, l.pingTimeout*2)
	conn, err := l.connect(cctx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}()

	lctx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	_, err = conn.Exec(lctx, sqlListen).ReadAll()
	cancel()
	if err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	l.connected.Store(true)
	l.connects.Add(1)
	l.setListening(true)
	defer l.setListening(false)
	l.reportUp()
	// Whatever was sent while we were away is lost: everyone looks once.
	l.RingAll()
	l.mu.RLock()
	hooks := slices.Clone(l.hooks)
	l.mu.RUnlock()
	for _, h := range hooks {
		h.fn()
	}

	for {
		if !l.quietAsked().IsZero() {
			if err := l.quiet(ctx, conn); err != nil || ctx.Err() != nil {
				return true, err
			}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, l.pingInterval)
		l.waitArmed(cancel)
		err := conn.WaitForNotification(wctx)
		l.waitArmed(nil)
		cancel()
		switch {
		case err == nil:
			continue // dispatched by onNotification
		case ctx.Err() != nil:
			return true, nil
		case !l.quietAsked().IsZero() && !conn.IsClosed():
			continue // ended by Quiet (as a cancelled wait): no ping needed
		case !pgconn.Timeout(err) || conn.IsClosed():
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		// Silent for a while: make sure the server is still there.
		l.pings.Add(1)
		pctx, cancel := context.WithTimeout(ctx, l.pingTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return true, nil
			}
			return true, fmt.Errorf("health check: %w", err)
		}
	}
}
