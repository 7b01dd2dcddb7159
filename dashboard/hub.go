package dashboard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// snapshot is what one refresh read: every page but Row and the rows of a
// failure group is rendered from it. It is never changed once published,
// except for its cache of rendered fragments.
type snapshot struct {
	gen   uint64
	at    time.Time // when the data were read
	tried time.Time // when the refresh that made it ran

	// err is why the last refresh failed, since errSince; the data are
	// then those of the last refresh that worked (at).
	err      error
	errSince time.Time

	loaded   bool // data were read at least once
	queues   []queueView
	batches  []batchView
	nodes    []nodeView
	groups   []failureGroup
	chart    chartData
	slowAt   time.Time // when groups and chart were read
	slowRead bool      // groups and chart were read at least once

	mu    sync.Mutex
	frags map[string]*frag // rendered live parts by page
}

// hub is the refresh loop that every page and stream shares.
type hub struct {
	d      *Dashboard
	demand chan struct{} // a page wants fresh data
	slow   atomic.Bool   // the next refresh reads the slow part too

	mu      sync.Mutex
	cur     *snapshot
	next    chan struct{} // closed when the next snapshot is published
	streams map[*stream]struct{}
	closed  bool

	refreshes, queries, pageQueries atomic.Uint64
	refreshNanos                    atomic.Int64
}

func newHub(d *Dashboard) *hub {
	return &hub{
		d:       d,
		demand:  make(chan struct{}, 1),
		cur:     &snapshot{},
		next:    make(chan struct{}),
		streams: map[*stream]struct{}{},
	}
}

func (h *hub) stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Stats{
		Refreshes:   h.refreshes.Load(),
		RefreshTime: time.Duration(h.refreshNanos.Load()),
		Queries:     h.queries.Load(),
		PageQueries: h.pageQueries.Load(),
		Streams:     len(h.streams),
		Generation:  h.cur.gen,
	}
}

// current returns the latest snapshot, and the channel closed when the
// next one is published.
func (h *hub) current() (*snapshot, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.next
}

// fresh returns a snapshot at most an Interval old, asking the loop for
// one and waiting for it (until ctx ends) when the latest is older.
func (h *hub) fresh(ctx context.Context) *snapshot {
	s, next := h.current()
	if !s.tried.IsZero() && time.Since(s.tried) < h.d.cfg.Interval {
		return s
	}
	h.ask(false)
	select {
	case <-next:
		s, _ = h.current()
	case <-ctx.Done():
	}
	return s
}

// since returns the first snapshot of a whole refresh that started after t,
// asking the loop for it, or the latest when ctx ends first.
func (h *hub) since(ctx context.Context, t time.Time) (*snapshot, error) {
	for {
		s, next := h.current()
		if s.tried.After(t) && (!s.slowRead || s.slowAt.After(t)) {
			return s, nil
		}
		h.ask(true)
		select {
		case <-next:
		case <-ctx.Done():
			return s, ctx.Err()
		}
	}
}

// ask wakes the loop; slow makes it read the failure groups and the chart
// too (after an action).
func (h *hub) ask(slow bool) {
	if slow {
		h.slow.Store(true)
	}
	select {
	case h.demand <- struct{}{}:
	default:
	}
}

// run refreshes on notifications, on demand, and every Interval while a
// stream is open, at most once per MinInterval (or twice the time the last
// refresh took), until ctx ends.
func (h *hub) run(ctx context.Context) {
	sub := h.d.lis.Subscribe() // every queue; also rung after each (re)connect
	defer sub.Close()
	tick := time.NewTicker(h.d.cfg.Interval)
	defer tick.Stop()
	var (
		last time.Time     // when the last refresh started
		took time.Duration // how long it took
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.Doorbell():
		case <-h.demand:
		case <-tick.C:
			if h.stats().Streams == 0 {
				continue
			}
		}
		// Twice as long as the last refresh took, at least: on a table so
		// large that the queries take seconds, the database does other
		// work at least two thirds of the time.
		if wait := time.Until(last.Add(max(h.d.cfg.MinInterval, 2*took))); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// What rang while waiting is served by this refresh.
		select {
		case <-sub.Doorbell():
		default:
		}
		select {
		case <-h.demand:
		default:
		}
		last = time.Now()
		h.refresh(ctx)
		took = time.Since(last)
		h.refreshNanos.Add(int64(took))
	}
}

// refresh reads a snapshot in one read-only transaction and publishes it;
// on failure it publishes the previous data with the error.
func (h *hub) refresh(ctx context.Context) {
	prev, _ := h.current()
	now := time.Now()
	forced := h.slow.Swap(false)
	slow := forced || !prev.slowRead || now.Sub(prev.slowAt) >= h.d.cfg.SlowInterval
	s := &snapshot{gen: prev.gen + 1, tried: now}
	qctx, cancel := context.WithTimeout(ctx, h.d.cfg.QueryTimeout)
	defer cancel()
	h.refreshes.Add(1)
	err := pgx.BeginTxFunc(qctx, h.d.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error { return h.read(qctx, tx, s, slow) })
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		*s = snapshot{gen: s.gen, tried: now, err: err, errSince: prev.errSince, at: prev.at, loaded: prev.loaded,
			queues: prev.queues, batches: prev.batches, nodes: prev.nodes, groups: prev.groups, chart: prev.chart,
			slowAt: prev.slowAt, slowRead: prev.slowRead}
		if prev.err == nil {
			s.errSince = now
			h.d.logger.Warn("dashboard: cannot read the database; showing the last data until it answers", "error", err)
		}
	} else {
		if prev.err != nil {
			h.d.logger.Info("dashboard: the database answers again", "down_for", now.Sub(prev.errSince).Round(time.Second))
		}
		s.at, s.loaded = now, true
		if !slow {
			s.groups, s.chart, s.slowAt, s.slowRead = prev.groups, prev.chart, prev.slowAt, prev.slowRead
		}
	}
	h.publish(s)
}

// read reads what every refresh shows: the queues (files.queue_stats,
// from the counts the SQL API keeps), the batches and the slots; and, when
// slow, the failure groups and the chart. Each statement is bounded.
func (h *hub) read(ctx context.Context, tx pgx.Tx, s *snapshot, slow bool) error {
	var err error
	h.queries.Add(1)
	if s.queues, err = readQueues(ctx, tx); err != nil {
		return err
	}
	h.queries.Add(1)
	if s.batches, err = readBatches(ctx, tx); err != nil {
		return err
	}
	h.queries.Add(1)
	if s.nodes, err = readWorkers(ctx, tx); err != nil {
		return err
	}
	if !slow {
		return nil
	}
	h.queries.Add(1)
	if s.groups, err = readFailureGroups(ctx, tx); err != nil {
		return err
	}
	h.queries.Add(1)
	if s.chart, err = readChart(ctx, tx, time.Now()); err != nil {
		return err
	}
	s.slowAt, s.slowRead = time.Now(), true
	return nil
}

// publish makes s the current snapshot and hands it to every stream.
func (h *hub) publish(s *snapshot) {
	h.mu.Lock()
	h.cur = s
	close(h.next)
	h.next = make(chan struct{})
	for st := range h.streams {
		st.offer(s)
	}
	h.mu.Unlock()
}

// stream is one open event stream: it receives the latest snapshot, older
// ones dropped when it is slow.
type stream struct {
	ch     chan *snapshot
	closed chan struct{}
}

func (st *stream) offer(s *snapshot) {
	select {
	case <-st.ch: // drop the one not yet sent
	default:
	}
	st.ch <- s
}

// maxStreams bounds the open event streams: each holds a connection and a
// goroutine.
const maxStreams = 1000

// open registers a stream; nil once the hub is closed or full.
func (h *hub) open() *stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || len(h.streams) >= maxStreams {
		return nil
	}
	st := &stream{ch: make(chan *snapshot, 1), closed: make(chan struct{})}
	h.streams[st] = struct{}{}
	return st
}

func (h *hub) closeStream(st *stream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.streams[st]; ok {
		delete(h.streams, st)
		close(st.closed)
	}
}

// closeStreams ends every stream, and refuses new ones.
func (h *hub) closeStreams() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for st := range h.streams {
		delete(h.streams, st)
		close(st.closed)
	}
}
