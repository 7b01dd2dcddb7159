package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// EnqueueConfig sizes an Enqueue run and gives it the loader to measure.
type EnqueueConfig struct {
	// Rows to enqueue. Defaults to 1,000,000.
	Rows int
	// BatchSize is the rows per COPY batch and transaction that Load is
	// asked to use. Defaults to 10,000, pgworker enqueue's default.
	BatchSize int
	// Present is the share of the sources (0 to 1) enqueued before the
	// timed run, spread evenly, as when an enqueue runs again after it
	// stopped halfway. Defaults to 0.
	Present float64
	// NoKey enqueues without keying rows by source (pgworker enqueue
	// --no-key): plain COPY, nothing skipped. Defaults to false.
	NoKey bool
	// Load enqueues the sources that r yields, one per line, into queue,
	// in batches of batchSize rows (noKey as pgworker enqueue --no-key).
	// Required: the cli package passes the `pgworker enqueue` command
	// itself, so that its code path is measured.
	Load func(ctx context.Context, queue string, batchSize int, noKey bool, r io.Reader) error
}

// EnqueueResult is what Enqueue measured.
type EnqueueResult struct {
	Setup
	Rows      int     `json:"rows"`
	BatchSize int     `json:"batch_size"`
	Present   float64 `json:"present"`
	Keyed     bool    `json:"keyed"`
	// ElapsedMS runs from the call of Load, which connects, to its return,
	// when the last batch is committed.
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// Enqueue feeds cfg.Rows generated sources (enqueue/000000001, ...) to
// cfg.Load as lines of a stream, times it, and checks that every row
// arrived.
func (b *Bench) Enqueue(ctx context.Context, cfg *EnqueueConfig) (*EnqueueResult, error) {
	if cfg == nil || cfg.Load == nil {
		return nil, errors.New("bench: EnqueueConfig.Load is required")
	}
	c := *cfg
	c.Rows = orDefault(c.Rows, 1_000_000)
	c.BatchSize = orDefault(c.BatchSize, 10_000)
	if c.Present < 0 || c.Present >= 1 || (c.Present > 0 && c.NoKey) {
		return nil, errors.New("bench: EnqueueConfig.Present is a share below 1, of keyed rows")
	}
	res := &EnqueueResult{Rows: c.Rows, BatchSize: c.BatchSize, Present: c.Present, Keyed: !c.NoKey}
	err := b.run(ctx, "enqueue", func(ctx context.Context) error {
		res.Setup = b.setup("enqueue")
		if c.Present > 0 {
			pre := newLines("enqueue/", c.Rows)
			pre.every = int(1 / c.Present)
			b.logger.Info("bench: enqueueing the rows already there", "every", pre.every)
			if err := c.Load(ctx, Queue, c.BatchSize, false, pre); err != nil {
				return fmt.Errorf("bench: enqueue: %w", err)
			}
		}
		b.logger.Info("bench: enqueueing", "rows", c.Rows, "batch_size", c.BatchSize, "present", c.Present)
		t := time.Now()
		if err := c.Load(ctx, Queue, c.BatchSize, c.NoKey, newLines("enqueue/", c.Rows)); err != nil {
			return fmt.Errorf("bench: enqueue: %w", err)
		}
		elapsed := time.Since(t)
		var n int
		if err := b.pool.QueryRow(ctx, sqlCountQueue, Queue).Scan(&n); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if n != c.Rows {
			return fmt.Errorf("bench: enqueue loaded %d rows, want %d", n, c.Rows)
		}
		res.ElapsedMS = ms(elapsed)
		res.RowsPerSec = round(float64(c.Rows)/elapsed.Seconds(), 1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// lines yields n lines prefix000000001 ... as a stream, built as read;
// with every > 1, only every every'th of them.
type lines struct {
	prefix string
	n, i   int
	every  int
	buf    []byte
}

func newLines(prefix string, n int) *lines { return &lines{prefix: prefix, n: n} }

func (l *lines) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(l.buf) < len(p) && l.i < l.n {
		l.i++
		if l.every > 1 && l.i%l.every != 0 {
			continue
		}
		l.buf = append(l.buf, l.prefix...)
		s := strconv.Itoa(l.i)
		for range 9 - len(s) {
			l.buf = append(l.buf, '0')
		}
		l.buf = append(l.buf, s...)
		l.buf = append(l.buf, '\n')
	}
	if len(l.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, l.buf)
	l.buf = l.buf[:copy(l.buf, l.buf[n:])]
	return n, nil
}
