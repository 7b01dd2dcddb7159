package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

const (
	sqlSetMaxRunning = `SELECT files.set_max_running($1, $2)`
	sqlSetFairShare  = `SELECT files.set_fair_share($1, $2)`
)

// ErrInvalidMaxRunning is a negative cap.
var ErrInvalidMaxRunning = errors.New("the cap must be 0 or more")

// SetMaxRunning caps the queue's running rows across the whole fleet
// (files.set_max_running): however many workers claim at once, no claim
// takes a row while max rows of the queue run. 0 lets none start. Rows
// running above a lowered cap go on. A queue that does not exist yet is
// created with the cap.
func (c *Client) SetMaxRunning(ctx context.Context, queue string, max int) error {
	return setMaxRunning(ctx, c.db, queue, &max)
}

// SetMaxRunningTx is SetMaxRunning inside tx.
func (c *Client) SetMaxRunningTx(ctx context.Context, tx pgx.Tx, queue string, max int) error {
	return setMaxRunning(ctx, tx, queue, &max)
}

// ClearMaxRunning lifts the queue's cap and wakes the idle workers.
func (c *Client) ClearMaxRunning(ctx context.Context, queue string) error {
	return setMaxRunning(ctx, c.db, queue, nil)
}

// ClearMaxRunningTx is ClearMaxRunning inside tx.
func (c *Client) ClearMaxRunningTx(ctx context.Context, tx pgx.Tx, queue string) error {
	return setMaxRunning(ctx, tx, queue, nil)
}

func setMaxRunning(ctx context.Context, db executor, queue string, max *int) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if max != nil && *max < 0 {
		return fmt.Errorf("set max running of %q to %d: %w", queue, *max, ErrInvalidMaxRunning)
	}
	if _, err := db.Exec(ctx, sqlSetMaxRunning, queue, max); err != nil {
		return fmt.Errorf("set max running of %q: %w", queue, err)
	}
	return nil
}

// SetFairShare turns fair share between the queue's batches on or off
// (files.set_fair_share). With it on, claims take the queue's rows of equal
// priority from its batches in turn, so that a small batch enqueued while a
// large one drains is done early rather than last. A queue that does not
// exist yet is created with the setting.
func (c *Client) SetFairShare(ctx context.Context, queue string, on bool) error {
	return setFairShare(ctx, c.db, queue, on)
}

// SetFairShareTx is SetFairShare inside tx.
func (c *Client) SetFairShareTx(ctx context.Context, tx pgx.Tx, queue string, on bool) error {
	return setFairShare(ctx, tx, queue, on)
}

func setFairShare(ctx context.Context, db executor, queue string, on bool) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sqlSetFairShare, queue, on); err != nil {
		return fmt.Errorf("set fair share of %q: %w", queue, err)
	}
	return nil
}
