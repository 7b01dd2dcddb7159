// Package queue is the producer and operator API of pgworker: it enqueues
// rows into files.files (one by INSERT, many by COPY), retries, cancels,
// pauses and resumes them, and reads the status and the scaling hint that
// `pgworker status` and `pgworker scale-hint` print. The pgworker command
// line is a layer over it.
//
//	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
//	...
//	q := queue.New(pool, nil)
//	id, err := q.Enqueue(ctx, "photos/a.jpg", &queue.EnqueueOpts{Queue: "thumbs", Priority: 10})
//
// Every write has a …Tx variant that runs inside the caller's transaction,
// so that a row is queued only if the caller's own writes commit:
//
//	tx, err := pool.Begin(ctx)
//	...
//	if _, err := tx.Exec(ctx, "INSERT INTO uploads (key) VALUES ($1)", key); err != nil { ... }
//	if _, err := q.EnqueueTx(ctx, tx, key, nil); err != nil { ... }
//	err = tx.Commit(ctx) // the upload and its row, or neither
//
// A data set is a batch: rows enqueued with EnqueueOpts.Batch, keyed by
// their source (EnqueueOpts.KeyBySource) so that enqueueing it again, or
// after an enqueue stopped halfway, queues each source once. Batch reads its
// progress (files.batch_progress), Results streams its rows with their
// outputs, and channel ChannelBatch carries its name when its last row ends.
//
// The statements are calls of the SQL API (files.retry, files.cancel,
// files.pause_queue, files.resume_queue, files.scaling_hint), reads of its
// views, and inserts into files.files, whose trigger wakes the workers once
// per statement and queue.
package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/migrations"
)

// DB is what a Client runs its statements on: a *pgxpool.Pool or a
// *pgx.Conn.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// executor is what the statements need: a DB or a pgx.Tx.
type executor interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Config configures a Client. A nil Config works.
type Config struct {
	// Logger receives debug lines about loaded batches. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Client enqueues and manages rows of files.files on one database.
type Client struct {
	db     DB
	logger *slog.Logger
}

// New returns a Client that runs its statements on db.
func New(db DB, cfg *Config) *Client {
	c := &Client{db: db, logger: slog.New(slog.DiscardHandler)}
	if cfg != nil && cfg.Logger != nil {
		c.logger = cfg.Logger
	}
	return c
}

// Errors that callers branch on.
var (
	// ErrInvalidQueue is a queue name that is empty or longer than
	// migrations.MaxQueueNameLength characters.
	ErrInvalidQueue = fmt.Errorf("a queue name has 1 to %d characters", migrations.MaxQueueNameLength)
	// ErrInvalidSource is a source that files.files cannot hold: empty,
	// longer than MaxSourceBytes, or not UTF-8 text without NUL bytes.
	ErrInvalidSource = errors.New("invalid source")
	// ErrInvalidPayload is a payload that is not one JSON object that
	// jsonb can hold.
	ErrInvalidPayload = errors.New("invalid payload")
	// ErrPayloadTooLarge is a payload over MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrNoQueue is a queue that does not exist (Resume).
	ErrNoQueue = errors.New("no such queue")
	// ErrInvalidBatch is a batch name that is empty, longer than
	// migrations.MaxBatchNameLength characters or holds a control
	// character.
	ErrInvalidBatch = fmt.Errorf("a batch name has 1 to %d characters and no control characters", migrations.MaxBatchNameLength)
	// ErrNoBatch is a batch that does not exist.
	ErrNoBatch = errors.New("no such batch")
)

// CheckQueue returns ErrInvalidQueue (wrapped, with the name) unless q is a
// valid queue name (migrations.ValidQueueName).
func CheckQueue(q string) error {
	if !migrations.ValidQueueName(q) {
		return fmt.Errorf("queue %q: %w", q, ErrInvalidQueue)
	}
	return nil
}

// ChannelBatch is the channel on which the SQL API sends a batch's name when
// its last row ends (NOTIFY files_batch).
const ChannelBatch = "files_batch"
