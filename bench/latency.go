package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/worker"
)

// latencyWarmup rows are picked up before Latency measures, proving the
// listener and the claimer live.
const latencyWarmup = 5

// LatencyConfig sizes a Latency run. A nil or zero config works.
type LatencyConfig struct {
	// Rows to insert, after a few warm-up rows that are not counted.
	// Defaults to 500.
	Rows int
	// Rate of inserts per second. Defaults to 50.
	Rate float64
	// Slots of the worker, all idle. Defaults to 100.
	Slots int
	// PickupTimeout bounds the wait for the last row after the last insert.
	// Defaults to 30s.
	PickupTimeout time.Duration
	// ClaimCooldown of the worker (worker.Config.ClaimCooldown). Defaults
	// to 0: each notification is answered at once.
	ClaimCooldown time.Duration
}

// LatencyResult is what Latency measured. The embedded Percentiles run from
// the moment the insert's commit returned to the start of the handler;
// FromSend runs from just before the insert was sent, so it holds the
// insert's round trip and commit too.
type LatencyResult struct {
	Setup
	Rows  int     `json:"rows"`
	Rate  float64 `json:"rate"`
	Slots int     `json:"slots"`
	// CooldownMS is the worker's claim cooldown; 0 (left out) for none.
	CooldownMS float64 `json:"claim_cooldown_ms,omitempty"`
	Percentiles
	FromSend Percentiles `json:"from_send"`
	// Steps break the pickup down, traced by the benchmark alone (a
	// subscriber of the worker's listener and a tracer on its pool): the
	// insert's commit returned → the notification reached the listener
	// (negative when it came first) → the claim query was sent → its answer
	// came back → the handler started. Not traced with a claim cooldown.
	Steps *LatencySteps `json:"steps,omitempty"`
	// Claims is the number of claim queries the worker sent meanwhile.
	Claims uint64 `json:"claims"`
}

// Latency starts a worker with cfg.Slots idle slots, then inserts cfg.Rows
// rows one at a time (one transaction each) at cfg.Rate per second and
// measures, per row, the time from the insert's commit returning to the
// handler's start.
func (b *Bench) Latency(ctx context.Context, cfg *LatencyConfig) (*LatencyResult, error) {
	c := latencyDefaults(cfg)
	res := &LatencyResult{Rows: c.Rows, Rate: c.Rate, Slots: c.Slots, CooldownMS: ms(c.ClaimCooldown)}
	err := b.run(ctx, "latency", func(ctx context.Context) error {
		res.Setup = b.setup("latency")
		starts := newPickups()
		tr := newPickupTrace()
		pool, err := b.tracedPool(ctx, 4, nil, tr)
		if err != nil {
			return err
		}
		defer pool.Close()
		// Notifications traced, but not with a claim cooldown: a subscriber
		// that never goes quiet would keep the worker's listener listening
		// through it.
		traced := c.ClaimCooldown == 0
		var notes *notifyTrace
		if traced {
			notes = &tr.notifyTrace
		}
		l, stopListen, err := listen(ctx, &pool.Config().ConnConfig.Config, notes)
		if err != nil {
			return err
		}
		defer stopListen()
		w, err := b.startWorker(ctx, pool, "latency", worker.Config{
			Handler: starts, Slots: c.Slots, Listener: l, ClaimCooldown: c.ClaimCooldown,
		})
		if err != nil {
			return err
		}
		defer stopWorker(w)

		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer conn.Release()
		n := latencyWarmup + c.Rows
		ins := newInserts(conn, n)
		interval := time.Duration(float64(time.Second) / c.Rate)
		if err := ins.warmUp(ctx, starts, interval, c.PickupTimeout); err != nil {
			return err
		}
		before := w.Stats().Claims
		b.logger.Info("bench: inserting", "rows", c.Rows, "rate", c.Rate, "slots", c.Slots)
		if err := ins.atRate(ctx, latencyWarmup, interval); err != nil {
			return err
		}
		if err := starts.wait(ctx, n, c.PickupTimeout); err != nil {
			return err
		}
		res.Claims = w.Stats().Claims - before

		fromCommit, fromSend, err := ins.latencies(starts, latencyWarmup)
		if err != nil {
			return err
		}
		res.Percentiles = percentiles(fromCommit)
		res.FromSend = percentiles(fromSend)
		if traced {
			res.Steps = tr.steps(ins, starts, latencyWarmup)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func latencyDefaults(cfg *LatencyConfig) LatencyConfig {
	c := LatencyConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 500)
	c.Rate = orDefault(c.Rate, 50)
	c.Slots = orDefault(c.Slots, 100)
	c.PickupTimeout = orDefault(c.PickupTimeout, 30*time.Second)
	return c
}

// pickups is Latency's handler: it records when it first started each row
// and rings bell at each start.
type pickups struct {
	mu      sync.Mutex
	started map[int64]time.Time
	bell    chan struct{}
}

func newPickups() *pickups {
	return &pickups{started: map[int64]time.Time{}, bell: make(chan struct{}, 1)}
}

func (p *pickups) Handle(_ context.Context, job *worker.Job) (*worker.Result, error) {
	now := time.Now()
	p.mu.Lock()
	if _, ok := p.started[job.ID]; !ok {
		p.started[job.ID] = now
	}
	p.mu.Unlock()
	select {
	case p.bell <- struct{}{}:
	default:
	}
	return nil, nil
}

func (p *pickups) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.started)
}

// at returns when the row id was started.
func (p *pickups) at(id int64) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.started[id]
	return t, ok
}

// wait returns once n rows have started, or fails when timeout passes
// first.
func (p *pickups) wait(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for p.count() < n {
		select {
		case <-p.bell:
		case <-deadline.C:
			return fmt.Errorf("bench: %d of %d rows started %s after the last insert", p.count(), n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// inserts adds Latency's rows one at a time on one connection, and records
// for each its id, when its insert was sent and when its commit returned.
type inserts struct {
	conn      *pgxpool.Conn
	ids       []int64
	sent      []time.Time
	committed []time.Time
}

func newInserts(conn *pgxpool.Conn, n int) *inserts {
	return &inserts{conn: conn, ids: make([]int64, n), sent: make([]time.Time, n), committed: make([]time.Time, n)}
}

func (in *inserts) insert(ctx context.Context, seq int) error {
	in.sent[seq] = time.Now()
	if err := in.conn.QueryRow(ctx, sqlInsertOne, Queue, "latency/"+strconv.Itoa(seq)).Scan(&in.ids[seq]); err != nil {
		return fmt.Errorf("bench: insert row %d: %w", seq, explain(err))
	}
	in.committed[seq] = time.Now()
	return nil
}

// warmUp inserts the first latencyWarmup rows, each once the previous one
// has started and interval passed, proving the listener and the claimer
// live.
func (in *inserts) warmUp(ctx context.Context, starts *pickups, interval, timeout time.Duration) error {
	for seq := range latencyWarmup {
		if err := in.insert(ctx, seq); err != nil {
			return err
		}
		if err := starts.wait(ctx, seq+1, timeout); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if err := sleep(ctx, interval); err != nil {
			return err
		}
	}
	return nil
}

// atRate inserts the rows from first on, one every interval, without
// waiting for them to start.
func (in *inserts) atRate(ctx context.Context, first int, interval time.Duration) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := first; seq < len(in.ids); seq++ {
		if seq > first {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := in.insert(ctx, seq); err != nil {
			return err
		}
	}
	return nil
}

// latencies returns, for the rows from first on, the time from the commit
// returning and from the insert being sent to the row's start.
func (in *inserts) latencies(starts *pickups, first int) (fromCommit, fromSend []time.Duration, err error) {
	fromCommit = make([]time.Duration, 0, len(in.ids)-first)
	fromSend = make([]time.Duration, 0, len(in.ids)-first)
	for seq := first; seq < len(in.ids); seq++ {
		t, ok := starts.at(in.ids[seq])
		if !ok {
			return nil, nil, fmt.Errorf("bench: row %d was not started", in.ids[seq])
		}
		fromCommit = append(fromCommit, t.Sub(in.committed[seq]))
		fromSend = append(fromSend, t.Sub(in.sent[seq]))
	}
	return fromCommit, fromSend, nil
}
