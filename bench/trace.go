package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/listener"
)

// LatencySteps are the parts of a pickup, each summarised over the rows.
type LatencySteps struct {
	// Traced is how many rows every step was found for.
	Traced int `json:"traced"`
	// CommitToNotify: the insert's commit returned → the notification
	// reached the listener.
	CommitToNotify Percentiles `json:"commit_to_notify"`
	// NotifyToClaim: the notification → the claim query was sent.
	NotifyToClaim Percentiles `json:"notify_to_claim"`
	// Claim: the claim query was sent → its answer came back.
	Claim Percentiles `json:"claim"`
	// ClaimToHandler: the claim's answer → the handler started.
	ClaimToHandler Percentiles `json:"claim_to_handler"`
}

// pickupTrace records, for Latency, when notifications reached the worker's
// listener and when each claim query was sent and answered. It is the
// benchmark's: the worker runtime knows nothing of it.
type pickupTrace struct {
	claimTrace
	notifyTrace
}

// notifyTrace records when notifications reached a listener.
type notifyTrace struct {
	mu     sync.Mutex
	notify []time.Time
}

type span struct{ sent, answered time.Time }

type traceKey struct{}

func newPickupTrace() *pickupTrace { return &pickupTrace{} }

// tracedPool opens a pool of its own for a worker runtime
// (workerPoolConfig) with params set on its connections and t, if not nil,
// tracing its queries.
func (b *Bench) tracedPool(ctx context.Context, conns int, params map[string]string, t pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg := b.workerPoolConfig(conns)
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ConnConfig.Tracer = t
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: open a pool for the worker: %w", err)
	}
	return pool, nil
}

// notifications records each ring of bell until ctx ends.
func (t *notifyTrace) notifications(ctx context.Context, bell <-chan struct{}) {
	for {
		select {
		case <-bell:
			now := time.Now()
			t.mu.Lock()
			t.notify = append(t.notify, now)
			t.mu.Unlock()
		case <-ctx.Done():
			return
		}
	}
}

// listen starts a listener on cfg's server for a worker runtime to be
// given and, when t is not nil, a subscriber of Queue subscribed before the
// runtime (rung first on each notification) that records each in t. stop
// ends both and waits for them: call it once the runtime has stopped.
func listen(ctx context.Context, cfg *pgconn.Config, t *notifyTrace) (l *listener.Listener, stop func(), err error) {
	l, err = listener.New(&listener.Config{ConnConfig: cfg})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	var sub *listener.Subscription
	if t != nil {
		sub = l.Subscribe(Queue)
		running.Go(func() { t.notifications(lctx, sub.Doorbell()) })
	}
	running.Go(func() { _ = l.Listen(lctx) })
	return l, func() {
		cancel()
		running.Wait()
		if sub != nil {
			sub.Close()
		}
	}, nil
}

// takeNotify returns the notifications recorded since the last call, in
// order.
func (t *notifyTrace) takeNotify() []time.Time {
	n := take(&t.mu, &t.notify)
	slices.SortFunc(n, func(a, b time.Time) int { return a.Compare(b) })
	return n
}

// longestGap is the longest time between one of ts (in order) and the one
// before it, the first from after on (unless after is zero), and the last
// of them (after when there are none).
func longestGap(ts []time.Time, after time.Time) (gap time.Duration, last time.Time) {
	last = after
	for _, t := range ts {
		if !last.IsZero() {
			gap = max(gap, t.Sub(last))
		}
		last = t
	}
	return gap, last
}

// steps matches each row from first on with the first notification after
// its insert was sent, and with the last claim answered before its handler
// started (the one that returned it).
func (t *pickupTrace) steps(in *inserts, starts *pickups, first int) *LatencySteps {
	t.notifyTrace.mu.Lock()
	notify := slices.Clone(t.notify)
	t.notifyTrace.mu.Unlock()
	t.claimTrace.mu.Lock()
	claims := slices.Clone(t.claims)
	t.claimTrace.mu.Unlock()
	slices.SortFunc(notify, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(claims, func(a, b claimSpan) int { return a.answered.Compare(b.answered) })
	var c2n, n2c, cl, c2h []time.Duration
	for seq := first; seq < len(in.ids); seq++ {
		h, ok := starts.at(in.ids[seq])
		if !ok {
			continue
		}
		i, _ := slices.BinarySearchFunc(notify, in.sent[seq], func(a, b time.Time) int { return a.Compare(b) })
		j, _ := slices.BinarySearchFunc(claims, h, func(a claimSpan, b time.Time) int { return a.answered.Compare(b) })
		if i >= len(notify) || j == 0 {
			continue
		}
		n, c := notify[i], claims[j-1]
		if n.After(h) || c.sent.Before(in.sent[seq]) {
			continue // not this row's: a notification or claim of another
		}
		c2n = append(c2n, n.Sub(in.committed[seq]))
		n2c = append(n2c, c.sent.Sub(n))
		cl = append(cl, c.answered.Sub(c.sent))
		c2h = append(c2h, h.Sub(c.answered))
	}
	return &LatencySteps{Traced: len(cl), CommitToNotify: percentiles(c2n), NotifyToClaim: percentiles(n2c),
		Claim: percentiles(cl), ClaimToHandler: percentiles(c2h)}
}

// claimTrace records each claim query of the pools it traces: when it was
// sent, when its answer came back and whether it returned rows; and the
// round trips of the outcome calls (files.complete and complete_many), whose
// commits the slots of a process wait for once as many outcomes are
// unrecorded as it has slots. It is the benchmark's: the worker runtime
// knows nothing of it.
type claimTrace struct {
	mu       sync.Mutex
	claims   []claimSpan // in the order they ended
	outcomes []time.Duration
}

// outcomeKey marks an outcome call's trace, as traceKey a claim's.
type outcomeKey struct{}

type claimSpan struct {
	span
	empty bool
}

// TraceQueryStart notes when a claim query or an outcome call is sent.
func (t *claimTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.Contains(d.SQL, "files.claim"):
		return context.WithValue(ctx, traceKey{}, time.Now())
	case strings.Contains(d.SQL, "files.complete"):
		return context.WithValue(ctx, outcomeKey{}, time.Now())
	}
	return ctx
}

// TraceQueryEnd notes its answer: pgx ends the trace once the rows are
// read, with the command tag that counts them.
func (t *claimTrace) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if sent, ok := ctx.Value(outcomeKey{}).(time.Time); ok {
		rtt := time.Since(sent)
		t.mu.Lock()
		t.outcomes = append(t.outcomes, rtt)
		t.mu.Unlock()
		return
	}
	sent, ok := ctx.Value(traceKey{}).(time.Time)
	if !ok {
		return
	}
	c := claimSpan{span: span{sent: sent, answered: time.Now()}, empty: d.Err == nil && d.CommandTag.RowsAffected() == 0}
	t.mu.Lock()
	t.claims = append(t.claims, c)
	t.mu.Unlock()
}

// take returns the claims that ended since the last call, in the order
// they were sent.
func (t *claimTrace) take() []claimSpan {
	c := take(&t.mu, &t.claims)
	slices.SortFunc(c, func(a, b claimSpan) int { return a.sent.Compare(b.sent) })
	return c
}

// takeOutcomes returns the round trips of the outcome calls that ended
// since the last call.
func (t *claimTrace) takeOutcomes() []time.Duration { return take(&t.mu, &t.outcomes) }

// claimSteps sums up claims (as take returns them) for a sample: how many,
// how many returned no row, their round trips, and the longest time during
// which the workers had no claim under way, from after (the last answer
// before them) on.
func claimSteps(claims []claimSpan, after time.Time) (n, empty int, rtt Percentiles, idle time.Duration, last time.Time) {
	ds := make([]time.Duration, 0, len(claims))
	last = after
	for _, c := range claims {
		if c.empty {
			empty++
		}
		ds = append(ds, c.answered.Sub(c.sent))
		if !last.IsZero() && c.sent.After(last) {
			idle = max(idle, c.sent.Sub(last))
		}
		if c.answered.After(last) {
			last = c.answered
		}
	}
	return len(claims), empty, percentiles(ds), idle, last
}
