package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

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
	Percentiles
	FromSend Percentiles `json:"from_send"`
	// Claims is the number of claim queries the worker sent meanwhile.
	Claims uint64 `json:"claims"`
}

// Latency starts a worker with cfg.Slots idle slots, then inserts cfg.Rows
// rows one at a time (one transaction each) at cfg.Rate per second and
// measures, per row, the time from the insert's commit returning to the
// handler's start.
func (b *Bench) Latency(ctx context.Context, cfg *LatencyConfig) (*LatencyResult, error) {
	c := LatencyConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 500)
	c.Rate = orDefault(c.Rate, 50)
	c.Slots = orDefault(c.Slots, 100)
	c.PickupTimeout = orDefault(c.PickupTimeout, 30*time.Second)
	res := &LatencyResult{Rows: c.Rows, Rate: c.Rate, Slots: c.Slots}
	err := b.run(ctx, "latency", func(ctx context.Context) error {
		res.Setup = b.setup("latency")
		var (
			mu      sync.Mutex
			started = map[int64]time.Time{}
			bell    = make(chan struct{}, 1)
		)
		h := worker.HandlerFunc(func(_ context.Context, job *worker.Job) (*worker.Result, error) {
			now := time.Now()
			mu.Lock()
			if _, ok := started[job.ID]; !ok {
				started[job.ID] = now
			}
			mu.Unlock()
			select {
			case bell <- struct{}{}:
			default:
			}
			return nil, nil
		})
		startedCount := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(started)
		}
		waitStarted := func(n int, timeout time.Duration) error {
			deadline := time.NewTimer(timeout)
			defer deadline.Stop()
			for startedCount() < n {
				select {
				case <-bell:
				case <-deadline.C:
					return fmt.Errorf("bench: %d of %d rows started %s after the last insert", startedCount(), n, timeout)
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}

		pool, err := b.workerPool(ctx, 4, nil)
		if err != nil {
			return err
		}
		defer pool.Close()
		w, err := b.startWorker(ctx, pool, "latency", worker.Config{Handler: h, Slots: c.Slots})
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
		ids := make([]int64, n)
		sent := make([]time.Time, n)
		committed := make([]time.Time, n)
		insert := func(seq int) error {
			sent[seq] = time.Now()
			if err := conn.QueryRow(ctx, sqlInsertOne, Queue, "latency/"+strconv.Itoa(seq)).Scan(&ids[seq]); err != nil {
				return fmt.Errorf("bench: insert row %d: %w", seq, explain(err))
			}
			committed[seq] = time.Now()
			return nil
		}

		interval := time.Duration(float64(time.Second) / c.Rate)
		for seq := range latencyWarmup {
			if err := insert(seq); err != nil {
				return err
			}
			if err := waitStarted(seq+1, c.PickupTimeout); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			if err := sleep(ctx, interval); err != nil {
				return err
			}
		}
		before := w.Stats().Claims
		b.logger.Info("bench: inserting", "rows", c.Rows, "rate", c.Rate, "slots", c.Slots)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := latencyWarmup; seq < n; seq++ {
			if seq > latencyWarmup {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if err := insert(seq); err != nil {
				return err
			}
		}
		if err := waitStarted(n, c.PickupTimeout); err != nil {
			return err
		}
		res.Claims = w.Stats().Claims - before

		fromCommit := make([]time.Duration, 0, c.Rows)
		fromSend := make([]time.Duration, 0, c.Rows)
		mu.Lock()
		for seq := latencyWarmup; seq < n; seq++ {
			t, ok := started[ids[seq]]
			if !ok {
				mu.Unlock()
				return fmt.Errorf("bench: row %d was not started", ids[seq])
			}
			fromCommit = append(fromCommit, t.Sub(committed[seq]))
			fromSend = append(fromSend, t.Sub(sent[seq]))
		}
		mu.Unlock()
		res.Percentiles = percentiles(fromCommit)
		res.FromSend = percentiles(fromSend)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
