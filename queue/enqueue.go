package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxSourceBytes bounds the length of a source: an S3 key has at most 1024
// bytes, a path at most 4096.
const MaxSourceBytes = 4096

// MaxPayloadBytes bounds a payload, measured as compact JSON; the schema
// refuses a payload whose jsonb text is longer.
const MaxPayloadBytes = 1 << 20

// EnqueueOpts are the columns of enqueued rows. A nil EnqueueOpts takes
// every default.
type EnqueueOpts struct {
	// Queue is the rows' queue. Defaults to "default".
	Queue string
	// Priority orders the rows: larger runs first. Defaults to 0.
	Priority int32
	// MaxAttempts is how many attempts a row gets before it ends failed.
	// Defaults to the column default of files.files (5).
	MaxAttempts int32
	// Payload is a JSON object stored with each row and handed to the
	// program. Defaults to {}.
	Payload json.RawMessage
}

const (
	sqlInsert            = `INSERT INTO files.files (queue, priority, payload, source) VALUES ($1, $2, $3::jsonb, $4) RETURNING id`
	sqlInsertMaxAttempts = `INSERT INTO files.files (queue, priority, payload, source, max_attempts) VALUES ($1, $2, $3::jsonb, $4, $5) RETURNING id`
)

// row is EnqueueOpts checked, with its defaults applied.
type row struct {
	queue       string
	priority    int32
	payload     json.RawMessage
	maxAttempts int32 // 0: the column default
}

func (o *EnqueueOpts) row() (*row, error) {
	r := &row{queue: "default", payload: json.RawMessage("{}")}
	if o == nil {
		return r, nil
	}
	if o.Queue != "" {
		r.queue = o.Queue
	}
	if err := CheckQueue(r.queue); err != nil {
		return nil, err
	}
	if o.MaxAttempts < 0 {
		return nil, fmt.Errorf("max attempts %d: give at least 1, or 0 for the default", o.MaxAttempts)
	}
	if o.Payload != nil {
		if err := CheckPayload(o.Payload); err != nil {
			return nil, err
		}
		r.payload = o.Payload
	}
	r.priority, r.maxAttempts = o.Priority, o.MaxAttempts
	return r, nil
}

// Enqueue adds one row for source and returns its id.
func (c *Client) Enqueue(ctx context.Context, source string, opts *EnqueueOpts) (int64, error) {
	return enqueue(ctx, c.db, source, opts)
}

// EnqueueTx is Enqueue inside tx: the row is queued only if tx commits.
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, source string, opts *EnqueueOpts) (int64, error) {
	return enqueue(ctx, tx, source, opts)
}

func enqueue(ctx context.Context, db executor, source string, opts *EnqueueOpts) (int64, error) {
	r, err := opts.row()
	if err != nil {
		return 0, err
	}
	if err := CheckSource(source); err != nil {
		return 0, err
	}
	var id int64
	if r.maxAttempts > 0 {
		err = db.QueryRow(ctx, sqlInsertMaxAttempts, r.queue, r.priority, string(r.payload), source, r.maxAttempts).Scan(&id)
	} else {
		err = db.QueryRow(ctx, sqlInsert, r.queue, r.priority, string(r.payload), source).Scan(&id)
	}
	if err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	return id, nil
}

// EnqueueMany adds one row per source with COPY, in one transaction: all
// of them or none. It returns the number of rows added.
func (c *Client) EnqueueMany(ctx context.Context, sources []string, opts *EnqueueOpts) (int64, error) {
	r, err := checkMany(sources, opts)
	if err != nil || len(sources) == 0 {
		return 0, err
	}
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: a no-op
	n, err := copyRows(ctx, tx, sources, r)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("enqueue: commit: %w", err)
	}
	c.logger.Debug("enqueue: rows loaded", "rows", n, "queue", r.queue)
	return n, nil
}

// EnqueueManyTx is EnqueueMany inside tx: the rows are queued only if tx
// commits.
func (c *Client) EnqueueManyTx(ctx context.Context, tx pgx.Tx, sources []string, opts *EnqueueOpts) (int64, error) {
	r, err := checkMany(sources, opts)
	if err != nil || len(sources) == 0 {
		return 0, err
	}
	return copyRows(ctx, tx, sources, r)
}

func checkMany(sources []string, opts *EnqueueOpts) (*row, error) {
	r, err := opts.row()
	if err != nil {
		return nil, err
	}
	for i, s := range sources {
		if err := CheckSource(s); err != nil {
			return nil, fmt.Errorf("source %d: %w", i+1, err)
		}
	}
	return r, nil
}

func copyRows(ctx context.Context, db executor, sources []string, r *row) (int64, error) {
	cols := []string{"queue", "priority", "payload", "source"}
	values := []any{r.queue, r.priority, r.payload, nil}
	if r.maxAttempts > 0 {
		cols = append(cols, "max_attempts")
		values = append(values, r.maxAttempts)
	}
	n, err := db.CopyFrom(ctx, pgx.Identifier{"files", "files"}, cols, &copySource{sources: sources, values: values, i: -1})
	if err != nil {
		return 0, fmt.Errorf("COPY into files.files: %w", err)
	}
	return n, nil
}

// copySource feeds the sources to CopyFrom. pgx encodes each row before
// asking for the next, so one values slice serves every row.
type copySource struct {
	sources []string
	values  []any // queue, priority, payload, source[, max_attempts]
	i       int
}

func (s *copySource) Next() bool {
	s.i++
	return s.i < len(s.sources)
}

func (s *copySource) Values() ([]any, error) {
	s.values[3] = s.sources[s.i]
	return s.values, nil
}

func (s *copySource) Err() error { return nil }

// invalid is an error that is one of the sentinels and says why.
type invalid struct {
	kind error
	why  string
}

func (e *invalid) Error() string        { return e.why }
func (e *invalid) Is(target error) bool { return target == e.kind }

// CheckSource returns an error that is ErrInvalidSource, and says what is
// wrong, unless files.files can hold s as a source.
func CheckSource(s string) error {
	bad := func(format string, args ...any) error {
		return &invalid{kind: ErrInvalidSource, why: fmt.Sprintf(format, args...)}
	}
	switch {
	case s == "":
		return bad("empty source")
	case len(s) > MaxSourceBytes:
		return bad("source of %d bytes is longer than %d bytes", len(s), MaxSourceBytes)
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return bad("NUL byte at byte %d", i+1)
	}
	if !utf8.ValidString(s) {
		for i, r := range s {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
					return bad("invalid UTF-8 at byte %d", i+1)
				}
			}
		}
	}
	return nil
}

// CheckPayload returns an error that is ErrInvalidPayload or
// ErrPayloadTooLarge unless p is one JSON object, of at most
// MaxPayloadBytes as compact JSON, that jsonb can hold.
func CheckPayload(p json.RawMessage) error {
	var compact bytes.Buffer
	if err := json.Compact(&compact, p); err != nil {
		return &invalid{kind: ErrInvalidPayload, why: "payload is not valid JSON: " + err.Error()}
	}
	if compact.Len() > MaxPayloadBytes {
		return &invalid{kind: ErrPayloadTooLarge,
			why: fmt.Sprintf("payload of %d bytes is over the bound of %d bytes (1 MiB): store large data as an object and put its key in the payload", compact.Len(), MaxPayloadBytes)}
	}
	if b := compact.Bytes(); len(b) == 0 || b[0] != '{' {
		return &invalid{kind: ErrInvalidPayload, why: "payload is valid JSON but not an object"}
	}
	if bytes.Contains(p, []byte(`\u0000`)) {
		return &invalid{kind: ErrInvalidPayload, why: `payload holds \u0000, which jsonb cannot hold`}
	}
	return nil
}
