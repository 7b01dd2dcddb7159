package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

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
	// MaxRunning caps the queue's running rows (files.queues.max_running),
	// to measure what the cap costs. Defaults to 0: no cap.
	MaxRunning int
	// FairShare makes the queue's batches take turns
	// (files.queues.fair_share). Defaults to false.
	FairShare bool
	// Batches spreads the rows over this many batches, row i in batch
	// i % Batches. Defaults to 0: rows without a batch.
	Batches int
	// PayloadBytes gives each row a payload of about this many bytes as
	// text: a list of small objects, as a row's metadata often is.
	// Defaults to 0: the empty object.
	PayloadBytes int
}

// ThroughputResult is what Throughput measured.
type ThroughputResult struct {
	Setup
	Rows     int `json:"rows"`
	Slots    int `json:"slots"`
	MaxConns int `json:"max_conns"`
	// The queue's settings: MaxRunning 0 is no cap.
	MaxRunning int  `json:"max_running"`
	FairShare  bool `json:"fair_share"`
	Batches    int  `json:"batches"`
	// PayloadBytes is each row's payload as text; 0 is the empty object.
	PayloadBytes int `json:"payload_bytes,omitempty"`
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
	res := &ThroughputResult{Rows: c.Rows, Slots: c.Slots, MaxConns: c.MaxConns,
		MaxRunning: max(c.MaxRunning, 0), FairShare: c.FairShare, Batches: max(c.Batches, 0)}
	payload := payloadOf(c.PayloadBytes)
	res.PayloadBytes = len(payload)
	err := b.run(ctx, "throughput", func(ctx context.Context) (err error) {
		res.Setup = b.setup("throughput")
		if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
			return fmt.Errorf("bench: pause queue %s: %w", Queue, explain(err))
		}
		if err := b.queueSettings(ctx, res.MaxRunning, res.FairShare); err != nil {
			return err
		}
		t := time.Now()
		source := func(i int) string { return "throughput/" + strconv.Itoa(i) }
		if res.Batches > 0 {
			defer b.deleteBatches(context.WithoutCancel(ctx))
		}
		err = b.copyRowsWith(ctx, source, c.Rows, res.Batches, payload)
		if err != nil {
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

// queueSettings gives Queue a cap on its running rows (none for 0) and fair
// share between its batches.
func (b *Bench) queueSettings(ctx context.Context, maxRunning int, fairShare bool) error {
	if maxRunning > 0 {
		if _, err := b.pool.Exec(ctx, sqlSetMaxRunning, Queue, maxRunning); err != nil {
			return fmt.Errorf("bench: cap queue %s: %w", Queue, explain(err))
		}
	}
	if fairShare {
		if _, err := b.pool.Exec(ctx, sqlSetFairShare, Queue, true); err != nil {
			return fmt.Errorf("bench: fair share in queue %s: %w", Queue, explain(err))
		}
	}
	return nil
}

// copyRowsWith is copyRows with row i in batch pgworker-bench-(i % batches)
// when batches is above 0, and payload (JSON) in every row when not nil.
func (b *Bench) copyRowsWith(ctx context.Context, sources func(i int) string, n, batches int, payload []byte) error {
	cols := []string{"queue", "source", "max_attempts"}
	if batches > 0 {
		cols = append(cols, "batch")
	}
	if payload != nil {
		cols = append(cols, "payload")
	}
	vals := make([]any, len(cols))
	i := -1
	src := pgx.CopyFromFunc(func() ([]any, error) {
		i++
		if i >= n {
			return nil, nil
		}
		vals[0], vals[1], vals[2] = Queue, sources(i), int32(1)
		k := 3
		if batches > 0 {
			vals[k] = batchPrefix + strconv.Itoa(i%batches)
			k++
		}
		if payload != nil {
			vals[k] = payload
		}
		return vals, nil
	})
	got, err := b.pool.CopyFrom(ctx, pgx.Identifier{"files", "files"}, cols, src)
	if err != nil {
		return fmt.Errorf("bench: COPY scratch rows: %w", explain(err))
	}
	if got != int64(n) {
		return fmt.Errorf("bench: COPY loaded %d rows, want %d", got, n)
	}
	return nil
}

// payloadOf returns a JSON object of about n bytes (never more), a list of
// small objects as a row's metadata often is ({"items":[{"i":0,"v":"..."},
// ...]}, 8 hex digits of a fixed pseudo-random sequence in each), or nil for
// n too small to hold one item.
func payloadOf(n int) []byte {
	const head, tail = `{"items":[`, `]}`
	r := rand.New(rand.NewPCG(1, 2))
	out := []byte(head)
	for i, sep := 0, ""; ; i, sep = i+1, "," {
		item := fmt.Appendf(nil, `%s{"i":%d,"v":"%08x"}`, sep, i, r.Uint32())
		if len(out)+len(item)+len(tail) > n {
			if i == 0 {
				return nil
			}
			return append(out, tail...)
		}
		out = append(out, item...)
	}
}

// deleteBatches removes the benchmark's batches.
func (b *Bench) deleteBatches(ctx context.Context) {
	if _, err := b.pool.Exec(ctx, sqlDeleteBatches); err != nil {
		b.logger.Debug("bench: delete the benchmark's batches", "error", err)
	}
}
