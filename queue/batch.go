package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgworker/pgworker/migrations"
)

const (
	sqlCreateBatch = `
INSERT INTO files.batches AS b (batch, labels) VALUES ($1, $2::jsonb)
ON CONFLICT (batch) DO UPDATE SET labels = b.labels || EXCLUDED.labels`

	sqlBatchProgress = `
SELECT batch, labels, total, pending, running, done, failed, cancelled, percent, rate, eta, created_at, finished_at
FROM files.batch_progress`

	// Open batches, and those finished since $1.
	sqlBatchesSince = sqlBatchProgress + `
WHERE finished_at IS NULL OR finished_at > $1
ORDER BY created_at, batch
LIMIT $2`

	sqlOneBatch = sqlBatchProgress + ` WHERE batch = $1`

	// The ids a batch's rows have had.
	sqlBatchBounds = `SELECT coalesce(first_id, 0), coalesce(last_id, 0) FROM files.batches WHERE batch = $1`

	// A page of a batch's rows after id $2 and up to id $3: a range of the
	// primary key, however large the table.
	sqlBatchRows = `
SELECT f.id, f.queue, f.source, f.state, f.attempt, f.result, f.last_error, f.finished_at
FROM files.files f
WHERE f.id > $2 AND f.id <= $3 AND f.batch = $1
  AND ($4::text[] IS NULL OR f.state = ANY ($4))
  AND ($6::text[] IS NULL OR f.queue = ANY ($6))
ORDER BY f.id
LIMIT $5`
)

// BatchProgress is one line of files.batch_progress.
type BatchProgress struct {
	Batch     string          `json:"batch"`
	Labels    json.RawMessage `json:"labels"`
	Total     int64           `json:"total"`
	Pending   int64           `json:"pending"`
	Running   int64           `json:"running"`
	Done      int64           `json:"done"`
	Failed    int64           `json:"failed"`
	Cancelled int64           `json:"cancelled"`
	// Percent is the share of rows ended (done, failed or cancelled).
	Percent float64 `json:"percent"`
	// Rate is rows ended per second, over about the last minute.
	Rate float64 `json:"rate"`
	// ETASeconds is the time left at Rate; nil when finished or idle.
	ETASeconds *float64   `json:"eta_seconds"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// Ended is the number of rows done, failed or cancelled.
func (p *BatchProgress) Ended() int64 { return p.Done + p.Failed + p.Cancelled }

// Finished reports whether every row of the batch has ended.
func (p *BatchProgress) Finished() bool { return p.Total > 0 && p.Ended() == p.Total }

func scanBatch(row pgx.Row) (*BatchProgress, error) {
	var p BatchProgress
	var percent, rate pgtype.Numeric
	var eta pgtype.Interval
	var labels []byte
	if err := row.Scan(&p.Batch, &labels, &p.Total, &p.Pending, &p.Running, &p.Done, &p.Failed, &p.Cancelled,
		&percent, &rate, &eta, &p.CreatedAt, &p.FinishedAt); err != nil {
		return nil, err
	}
	p.Labels = labels
	if f, err := percent.Float64Value(); err == nil && f.Valid {
		p.Percent = f.Float64
	}
	if f, err := rate.Float64Value(); err == nil && f.Valid {
		p.Rate = f.Float64
	}
	p.ETASeconds = seconds(eta)
	return &p, nil
}

// CreateBatch creates the batch name with labels (a JSON object; nil for
// none), or adds labels to it when it exists. A batch also comes into being
// with its first row (EnqueueOpts.Batch).
func (c *Client) CreateBatch(ctx context.Context, name string, labels json.RawMessage) error {
	return createBatch(ctx, c.db, name, labels)
}

// CreateBatchTx is CreateBatch inside tx.
func (c *Client) CreateBatchTx(ctx context.Context, tx pgx.Tx, name string, labels json.RawMessage) error {
	return createBatch(ctx, tx, name, labels)
}

func createBatch(ctx context.Context, db executor, name string, labels json.RawMessage) error {
	if err := CheckBatch(name); err != nil {
		return err
	}
	if labels == nil {
		labels = json.RawMessage("{}")
	}
	if err := CheckPayload(labels); err != nil {
		return fmt.Errorf("labels: %w", err)
	}
	if _, err := db.Exec(ctx, sqlCreateBatch, name, string(labels)); err != nil {
		return fmt.Errorf("create batch %q: %w", name, err)
	}
	return nil
}

// Batch returns the progress of one batch, or ErrNoBatch.
func (c *Client) Batch(ctx context.Context, name string) (*BatchProgress, error) {
	if err := CheckBatch(name); err != nil {
		return nil, err
	}
	p, err := scanBatch(c.db.QueryRow(ctx, sqlOneBatch, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("batch %q: %w", name, ErrNoBatch)
	}
	if err != nil {
		return nil, fmt.Errorf("batch %q: %w", name, err)
	}
	return p, nil
}

// statusBatches is how many batches Status lists.
const statusBatches = 100

// Batches returns the open batches and those finished since since, oldest
// first, at most limit of them.
func (c *Client) Batches(ctx context.Context, since time.Time, limit int) ([]BatchProgress, error) {
	return readBatches(ctx, c.db, since, limit)
}

func readBatches(ctx context.Context, db executor, since time.Time, limit int) ([]BatchProgress, error) {
	return scanBatches(db.Query(ctx, sqlBatchesSince, since, limit))
}

// scanBatches scans the lines of sqlBatchesSince.
func scanBatches(rows pgx.Rows, err error) ([]BatchProgress, error) {
	if err != nil {
		return nil, fmt.Errorf("batches: %w", err)
	}
	defer rows.Close()
	out := []BatchProgress{}
	for rows.Next() {
		p, err := scanBatch(rows)
		if err != nil {
			return nil, fmt.Errorf("batches: %w", err)
		}
		out = append(out, *p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("batches: %w", err)
	}
	return out, nil
}

// ResultRow is one row of a batch as Results reads it.
type ResultRow struct {
	ID       int64   `json:"id"`
	Queue    string  `json:"queue"`
	Source   string  `json:"source"`
	State    string  `json:"state"`
	Attempts int32   `json:"attempts"`
	Outputs  []Asset `json:"outputs"`
	// Result is the row's whole result (for pgworker run, its manifest).
	Result     json.RawMessage `json:"-"`
	LastError  *string         `json:"last_error"`
	FinishedAt *time.Time      `json:"finished_at"`
}

// Asset is one output of a completed row, from its result manifest.
type Asset struct {
	Key    string `json:"key"`
	URL    string `json:"url,omitempty"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
}

// ResultsOpts chooses what Results reads. A nil ResultsOpts reads every
// row of the batch.
type ResultsOpts struct {
	// States keeps only rows in these states. Defaults to all.
	States []string
	// Queues keeps only rows of these queues (the stages of a chain are
	// queues of one batch). Defaults to all.
	Queues []string
	// PageSize is how many rows one query reads. Defaults to 5000.
	PageSize int
}

// Results calls fn with each row of batch in id order, reading pages of
// rows so that memory stays bounded however large the batch is. It stops
// at the first error fn returns.
func (c *Client) Results(ctx context.Context, batch string, opts *ResultsOpts, fn func(*ResultRow) error) error {
	if err := CheckBatch(batch); err != nil {
		return err
	}
	var first, last int64
	err := c.db.QueryRow(ctx, sqlBatchBounds, batch).Scan(&first, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("batch %q: %w", batch, ErrNoBatch)
	}
	if err != nil {
		return fmt.Errorf("results of %q: %w", batch, err)
	}
	var states, queues []string
	page := 5000
	if opts != nil {
		queues = opts.Queues
		for _, s := range opts.States {
			if !validState(s) {
				return fmt.Errorf("state %q: give pending, running, done, failed or cancelled", s)
			}
		}
		states = opts.States
		if opts.PageSize > 0 {
			page = opts.PageSize
		}
	}
	after := first - 1
	for {
		n, seen, err := c.resultsPage(ctx, batch, after, last, states, queues, page, fn)
		if err != nil || n < page {
			return err
		}
		after = seen
	}
}

func (c *Client) resultsPage(ctx context.Context, batch string, after, upTo int64, states, queues []string, page int, fn func(*ResultRow) error) (int, int64, error) {
	rows, err := c.db.Query(ctx, sqlBatchRows, batch, after, upTo, states, page, queues)
	if err != nil {
		return 0, 0, fmt.Errorf("results of %q: %w", batch, err)
	}
	defer rows.Close()
	n, last := 0, after
	var r ResultRow
	for rows.Next() {
		r = ResultRow{}
		var result []byte
		if err := rows.Scan(&r.ID, &r.Queue, &r.Source, &r.State, &r.Attempts, &result, &r.LastError, &r.FinishedAt); err != nil {
			return 0, 0, fmt.Errorf("results of %q: %w", batch, err)
		}
		r.Result = result
		r.Outputs = assets(result)
		n, last = n+1, r.ID
		if err := fn(&r); err != nil {
			return 0, 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("results of %q: %w", batch, err)
	}
	return n, last, nil
}

// assets reads the outputs of a result manifest; a result of another shape
// has none.
func assets(result []byte) []Asset {
	if len(result) == 0 {
		return nil
	}
	var m struct {
		Outputs []Asset `json:"outputs"`
	}
	if json.Unmarshal(result, &m) != nil {
		return nil
	}
	out := m.Outputs[:0]
	for _, a := range m.Outputs {
		if a.Key != "" {
			out = append(out, a)
		}
	}
	return out
}

func validState(s string) bool {
	switch s {
	case migrations.StatePending, migrations.StateRunning, migrations.StateDone, migrations.StateFailed, migrations.StateCancelled:
		return true
	}
	return false
}
