package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	sqlRetry       = `SELECT files.retry($1::bigint[], $2::text)`
	sqlCancel      = `SELECT files.cancel(VARIADIC $1::bigint[])`
	sqlPause       = `SELECT files.pause_queue($1)`
	sqlResume      = `SELECT files.resume_queue($1)`
	sqlQueueExists = `SELECT EXISTS (SELECT 1 FROM files.queue_stats WHERE queue = $1)`
)

// RetryOpts narrows a retry. A nil RetryOpts retries in every queue.
type RetryOpts struct {
	// Queue limits the retry to the rows of this queue. Defaults to every
	// queue.
	Queue string
}

func (o *RetryOpts) queue() *string {
	if o == nil || o.Queue == "" {
		return nil
	}
	return &o.Queue
}

// Retry puts the rows with the given ids that are failed, cancelled or done
// back to pending with a fresh attempt budget (files.retry), and returns
// how many it requeued. Rows in another state are left alone.
func (c *Client) Retry(ctx context.Context, ids []int64, opts *RetryOpts) (int64, error) {
	return retry(ctx, c.db, ids, opts)
}

// RetryTx is Retry inside tx.
func (c *Client) RetryTx(ctx context.Context, tx pgx.Tx, ids []int64, opts *RetryOpts) (int64, error) {
	return retry(ctx, tx, ids, opts)
}

func retry(ctx context.Context, db executor, ids []int64, opts *RetryOpts) (int64, error) {
	if len(ids) == 0 {
		return 0, nil // files.retry takes NULL ids as every failed row
	}
	return retryRows(ctx, db, ids, opts)
}

// RetryFailed puts every failed row (of opts.Queue) back to pending with a
// fresh attempt budget, and returns how many it requeued.
func (c *Client) RetryFailed(ctx context.Context, opts *RetryOpts) (int64, error) {
	return retryRows(ctx, c.db, nil, opts)
}

// RetryFailedTx is RetryFailed inside tx.
func (c *Client) RetryFailedTx(ctx context.Context, tx pgx.Tx, opts *RetryOpts) (int64, error) {
	return retryRows(ctx, tx, nil, opts)
}

func retryRows(ctx context.Context, db executor, ids []int64, opts *RetryOpts) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, sqlRetry, ids, opts.queue()).Scan(&n); err != nil {
		return 0, fmt.Errorf("retry: %w", err)
	}
	return n, nil
}

// Cancel cancels the rows with the given ids that are pending or running
// (files.cancel), and returns how many it cancelled. The worker of a
// running row is told to stop its program; its late outcome is refused.
func (c *Client) Cancel(ctx context.Context, ids []int64) (int64, error) {
	return cancel(ctx, c.db, ids)
}

// CancelTx is Cancel inside tx.
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, ids []int64) (int64, error) {
	return cancel(ctx, tx, ids)
}

func cancel(ctx context.Context, db executor, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	if err := db.QueryRow(ctx, sqlCancel, ids).Scan(&n); err != nil {
		return 0, fmt.Errorf("cancel: %w", err)
	}
	return n, nil
}

// Pause stops handing out rows of queue (files.pause_queue); running rows
// go on. A queue that does not exist yet is created paused, so that rows
// enqueued later wait. known reports whether the queue had rows or settings
// before.
func (c *Client) Pause(ctx context.Context, queue string) (known bool, err error) {
	return pause(ctx, c.db, queue)
}

// PauseTx is Pause inside tx.
func (c *Client) PauseTx(ctx context.Context, tx pgx.Tx, queue string) (known bool, err error) {
	return pause(ctx, tx, queue)
}

func pause(ctx context.Context, db executor, queue string) (bool, error) {
	if err := CheckQueue(queue); err != nil {
		return false, err
	}
	var known bool
	if err := db.QueryRow(ctx, sqlQueueExists, queue).Scan(&known); err != nil {
		return false, fmt.Errorf("pause: %w", err)
	}
	if _, err := db.Exec(ctx, sqlPause, queue); err != nil {
		return false, fmt.Errorf("pause: %w", err)
	}
	return known, nil
}

// Resume hands out the rows of a paused queue again and wakes the idle
// workers (files.resume_queue). A queue that does not exist is ErrNoQueue.
func (c *Client) Resume(ctx context.Context, queue string) error {
	return resume(ctx, c.db, queue)
}

// ResumeTx is Resume inside tx.
func (c *Client) ResumeTx(ctx context.Context, tx pgx.Tx, queue string) error {
	return resume(ctx, tx, queue)
}

func resume(ctx context.Context, db executor, queue string) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sqlResume, queue); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "P0002" {
			return fmt.Errorf("resume %q: %w", queue, ErrNoQueue)
		}
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}
