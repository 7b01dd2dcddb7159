package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	sqlPrune = `SELECT coalesce(queue, ''), coalesce(batch, ''), state, rows, queue IS NULL
FROM files.prune($1, dry_run => $2, wait => $3)`
	sqlKeepQueue = `SELECT files.keep_queue($1, $2::bigint * interval '1 microsecond', $3::bigint * interval '1 microsecond')`
	sqlKeepBatch = `SELECT total, finished_at IS NOT NULL FROM files.keep_batch($1, $2::bigint * interval '1 microsecond')`
	sqlRetention = `
SELECT 'queue', queue, (extract(epoch FROM keep_done) * 1e6)::bigint, (extract(epoch FROM keep_failed) * 1e6)::bigint, NULL::boolean
FROM files.queues
UNION ALL
SELECT 'batch', batch, (extract(epoch FROM keep) * 1e6)::bigint, NULL, finished_at IS NOT NULL
FROM files.batches
ORDER BY 1 DESC, 2`
)

// DefaultPruneRows is how many rows one call of files.prune deletes at most
// when PruneOpts.MaxRows is not set.
const DefaultPruneRows = 1000

// PruneOpts says how to prune. A nil PruneOpts prunes in calls of
// DefaultPruneRows rows, skipping the turn when another pruner runs.
type PruneOpts struct {
	// MaxRows bounds the rows one call of files.prune deletes (one
	// transaction each); Prune calls it again while it deletes that many.
	// Defaults to DefaultPruneRows.
	MaxRows int

	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool

	// Wait waits for the turn of a pruner that is running on another node,
	// instead of returning with nothing.
	Wait bool
}

// Pruned is one line of what Prune deleted (or, in a dry run, would delete):
// the rows of a queue (and batch) in a state, or worker slots in a state.
type Pruned struct {
	Queue string `json:"queue,omitempty"` // empty for worker slots
	Batch string `json:"batch,omitempty"` // the batch, for rows of a batch
	State string `json:"state"`           // done, failed or cancelled; stopped or dead for slots
	Rows  int64  `json:"rows"`
	Slots bool   `json:"slots,omitempty"` // the line counts worker slots (files.workers)
}

// Prune deletes finished rows past their retention (files.prune): rows
// without a batch by their queue's settings, finished batches by theirs, and
// worker slots stopped for a week. It never deletes a pending or running row
// nor a row of a batch that is not finished. It calls files.prune until a
// call deletes fewer than MaxRows rows, so that no transaction holds many
// rows, and returns the lines of all calls summed.
func (c *Client) Prune(ctx context.Context, opts *PruneOpts) ([]Pruned, error) {
	var o PruneOpts
	if opts != nil {
		o = *opts
	}
	if o.MaxRows == 0 {
		o.MaxRows = DefaultPruneRows
	}
	if o.MaxRows < 1 || o.MaxRows > 100000 {
		return nil, fmt.Errorf("prune: MaxRows %d is not between 1 and 100000", o.MaxRows)
	}
	var (
		out   []Pruned
		index = map[Pruned]int{}
	)
	for {
		rows, err := c.db.Query(ctx, sqlPrune, o.MaxRows, o.DryRun, o.Wait)
		if err != nil {
			return out, fmt.Errorf("prune: %w", err)
		}
		lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pruned, error) {
			var p Pruned
			err := r.Scan(&p.Queue, &p.Batch, &p.State, &p.Rows, &p.Slots)
			return p, err
		})
		if err != nil {
			return out, fmt.Errorf("prune: %w", err)
		}
		var n int64
		for _, l := range lines {
			if !l.Slots {
				n += l.Rows
			}
			key := l
			key.Rows = 0
			if i, ok := index[key]; ok {
				out[i].Rows += l.Rows
				continue
			}
			index[key] = len(out)
			out = append(out, l)
		}
		if o.DryRun || n < int64(o.MaxRows) {
			return out, nil
		}
	}
}

// Retention is how long a queue's or a batch's finished rows are kept. A
// nil duration keeps them for good (for a batch: until one is set). In JSON
// the durations are seconds, null for none.
type Retention struct {
	Queue string
	Batch string

	// Done is how long a queue's done and cancelled rows without a batch are
	// kept after they finished; Failed, its failed rows. Queues only.
	Done   *time.Duration
	Failed *time.Duration

	// Keep is how long a batch and its rows are kept after it finished;
	// Finished says whether it has. Batches only.
	Keep     *time.Duration
	Finished bool
}

func durationSeconds(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	s := d.Seconds()
	return &s
}

// MarshalJSON writes a queue's retention as {"queue", "keep_done_seconds",
// "keep_failed_seconds"} and a batch's as {"batch", "keep_seconds",
// "finished"}.
func (r Retention) MarshalJSON() ([]byte, error) {
	if r.Batch != "" {
		return json.Marshal(struct {
			Batch    string   `json:"batch"`
			Keep     *float64 `json:"keep_seconds"`
			Finished bool     `json:"finished"`
		}{r.Batch, durationSeconds(r.Keep), r.Finished})
	}
	return json.Marshal(struct {
		Queue  string   `json:"queue"`
		Done   *float64 `json:"keep_done_seconds"`
		Failed *float64 `json:"keep_failed_seconds"`
	}{r.Queue, durationSeconds(r.Done), durationSeconds(r.Failed)})
}

func micros(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	n := d.Microseconds()
	return &n
}

func fromMicros(n *int64) *time.Duration {
	if n == nil {
		return nil
	}
	d := time.Duration(*n) * time.Microsecond
	return &d
}

// KeepQueue sets how long the finished rows of a queue that belong to no
// batch are kept (files.keep_queue): done and cancelled rows done, failed
// rows failed, after they finished. Nil keeps them for good. A new queue is
// created.
func (c *Client) KeepQueue(ctx context.Context, queue string, done, failed *time.Duration) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if _, err := c.db.Exec(ctx, sqlKeepQueue, queue, micros(done), micros(failed)); err != nil {
		return fmt.Errorf("keep queue %q: %w", queue, err)
	}
	return nil
}

// KeepBatch sets how long a batch and its rows are kept after it finished
// (files.keep_batch); nil keeps them until it is set again, and zero lets
// the next prune delete them once the batch has finished. It says whether
// the batch has finished, and how many rows it has.
func (c *Client) KeepBatch(ctx context.Context, batch string, keep *time.Duration) (finished bool, total int64, err error) {
	if err := CheckBatch(batch); err != nil {
		return false, 0, err
	}
	err = c.db.QueryRow(ctx, sqlKeepBatch, batch, micros(keep)).Scan(&total, &finished)
	if isNoBatch(err) {
		return false, 0, fmt.Errorf("keep batch %q: %w", batch, ErrNoBatch)
	}
	if err != nil {
		return false, 0, fmt.Errorf("keep batch %q: %w", batch, err)
	}
	return finished, total, nil
}

// Retentions lists the retention of every queue, then of every batch.
func (c *Client) Retentions(ctx context.Context) ([]Retention, error) {
	rows, err := c.db.Query(ctx, sqlRetention)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Retention, error) {
		var (
			kind, name string
			a, b       *int64
			finished   *bool
		)
		if err := r.Scan(&kind, &name, &a, &b, &finished); err != nil {
			return Retention{}, err
		}
		if kind == "queue" {
			return Retention{Queue: name, Done: fromMicros(a), Failed: fromMicros(b)}, nil
		}
		return Retention{Batch: name, Keep: fromMicros(a), Finished: finished != nil && *finished}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	return out, nil
}

// isNoBatch reports files.keep_batch's error for a batch that does not exist.
func isNoBatch(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "P0002"
}
