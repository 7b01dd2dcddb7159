package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/pgworker/pgworker/worker"
)

// ThroughputConfig sizes a Throughput run. A nil or zero config works.
type ThroughputConfig struct {
	// Rows to burn down. Defaults to 20,000.
	Rows int
	// Slots of the worker. Defaults to 100.
	Slots int
	// MaxConns of the worker's pool. Defaults to 8.
	MaxConns int
	// MaxBatch is worker.Config.MaxBatch: outcomes recorded per statement.
	// Defaults to the runtime's default.
	MaxBatch int
}

// ThroughputResult is what Throughput measured.
type ThroughputResult struct {
	Setup
	Rows     int `json:"rows"`
	Slots    int `json:"slots"`
	MaxConns int `json:"max_conns"`
	// InsertMS is the COPY of the rows beforehand, not counted.
	InsertMS float64 `json:"insert_ms"`
	// StartMS is the worker's start (registering its slots, connecting its
	// listener) until it is idle, not counted.
	StartMS float64 `json:"start_ms"`
	// ElapsedMS runs from resuming the queue to the last outcome recorded.
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// Claims is the number of claim queries the worker sent meanwhile.
	Claims uint64 `json:"claims"`
}

// Throughput loads cfg.Rows rows into a paused queue with COPY, starts a
// worker with cfg.Slots slots and a no-op handler, and times it from
// resuming the queue until every outcome is recorded.
func (b *Bench) Throughput(ctx context.Context, cfg *ThroughputConfig) (*ThroughputResult, error) {
	c := ThroughputConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 20000)
	c.Slots = orDefault(c.Slots, 100)
	c.MaxConns = orDefault(c.MaxConns, 8)
	res := &ThroughputResult{Rows: c.Rows, Slots: c.Slots, MaxConns: c.MaxConns}
	err := b.run(ctx, "throughput", func(ctx context.Context) error {
		res.Setup = b.setup("throughput")
		if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
			return fmt.Errorf("bench: pause queue %s: %w", Queue, explain(err))
		}
		t := time.Now()
		if err := b.copyRows(ctx, func(i int) string { return "throughput/" + strconv.Itoa(i) }, c.Rows); err != nil {
			return err
		}
		res.InsertMS = ms(time.Since(t))
		b.vacuum(ctx)

		pool, err := b.workerPool(ctx, c.MaxConns, nil)
		if err != nil {
			return err
		}
		defer pool.Close()
		noop := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) { return nil, nil })
		t = time.Now()
		outcomes := &outcomeCount{}
		w, err := b.startWorker(ctx, pool, "throughput", worker.Config{Handler: noop, Slots: c.Slots, MaxBatch: c.MaxBatch,
			Observer: outcomes})
		if err != nil {
			return err
		}
		defer stopWorker(w)
		res.StartMS = ms(time.Since(t))
		before := w.Stats().Claims

		b.logger.Info("bench: burning down", "rows", c.Rows, "slots", c.Slots)
		t0 := time.Now()
		if _, err := b.pool.Exec(ctx, sqlResume, Queue); err != nil {
			return fmt.Errorf("bench: resume queue %s: %w", Queue, err)
		}
		err = outcomes.wait(ctx, uint64(c.Rows))
		elapsed := time.Since(t0)
		if err != nil {
			return err
		}
		res.ElapsedMS = ms(elapsed)
		res.RowsPerSec = round(float64(c.Rows)/elapsed.Seconds(), 1)
		res.Claims = w.Stats().Claims - before
		return b.outcomes(ctx, c.Rows)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func orDefault[T int | float64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
