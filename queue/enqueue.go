package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/migrations"
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
	// RunAfter is when the rows may run first. Defaults to now.
	RunAfter time.Time
	// Batch names the batch (data set) the rows belong to: it is created
	// by its first row, and files.batch_progress follows it. Defaults to
	// none.
	Batch string
	// Key is the unique key of the one row Enqueue adds: while a row with
	// this key is in the queue, Enqueue adds nothing and returns that
	// row's id with ErrDuplicate. EnqueueMany refuses it; see KeyBySource.
	// Defaults to none.
	Key string
	// KeyBySource makes each row's source its unique key, so that
	// enqueueing the same sources again adds only those not queued yet
	// (whatever state their rows are in). Defaults to false.
	KeyBySource bool
}

// ErrDuplicate is what Enqueue returns, with the id of the row already
// there, when a row with the same unique key is in the queue.
var ErrDuplicate = errors.New("a row with this key is already in the queue")

const (
	sqlInsert            = `INSERT INTO files.files (queue, priority, payload, source, run_after, batch, unique_key) VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now()), $6, $7) RETURNING id`
	sqlInsertMaxAttempts = `INSERT INTO files.files (queue, priority, payload, source, run_after, batch, unique_key, max_attempts) VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now()), $6, $7, $8) RETURNING id`
	sqlKeyedID           = `SELECT file_id FROM files.unique_keys WHERE queue = $1 AND key = $2`

	// EnqueueMany with keys or a batch: the rows are copied into a
	// temporary table shaped like files.files, and those whose key is not
	// in the queue yet move on in the order they came.
	sqlStage   = `CREATE TEMP TABLE IF NOT EXISTS pgworker_staged (LIKE files.files INCLUDING DEFAULTS INCLUDING IDENTITY) ON COMMIT DROP`
	sqlUnstage = `TRUNCATE pgworker_staged`
	sqlMoveIn  = `
INSERT INTO files.files (queue, priority, payload, source, max_attempts, run_after, batch, unique_key)
SELECT s.queue, s.priority, s.payload, s.source, s.max_attempts, s.run_after, s.batch, s.unique_key
FROM pgworker_staged s
WHERE s.unique_key IS NULL
   OR NOT EXISTS (SELECT 1 FROM files.unique_keys k WHERE k.queue = s.queue AND k.key = s.unique_key)
ORDER BY s.id`
)

// row is EnqueueOpts checked, with its defaults applied.
type row struct {
	queue       string
	priority    int32
	payload     json.RawMessage
	maxAttempts int32 // 0: the column default
	runAfter    *time.Time
	batch       *string
	key         *string
	bySource    bool
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
	if o.Batch != "" {
		if err := CheckBatch(o.Batch); err != nil {
			return nil, err
		}
		r.batch = &o.Batch
	}
	if o.Key != "" {
		if err := checkKey(o.Key); err != nil {
			return nil, err
		}
		r.key = &o.Key
	}
	if !o.RunAfter.IsZero() {
		r.runAfter = &o.RunAfter
	}
	r.bySource = o.KeyBySource
	if o.Payload != nil {
		if err := CheckPayload(o.Payload); err != nil {
			return nil, err
		}
		r.payload = o.Payload
	}
	r.priority, r.maxAttempts = o.Priority, o.MaxAttempts
	return r, nil
}

// Enqueue adds one row for source and returns its id. With a unique key
// (Key, or KeyBySource) already in the queue it adds nothing and returns
// the id of the row that holds the key, with ErrDuplicate.
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
	key := r.key
	if key == nil && r.bySource {
		key = &source
	}
	if key == nil {
		return insertOne(ctx, db, r, source, nil)
	}
	// A key: look first, and insert in a savepoint, so that a key taken
	// meanwhile by another session leaves the caller's transaction usable.
	for {
		var id int64
		err := db.QueryRow(ctx, sqlKeyedID, r.queue, *key).Scan(&id)
		if err == nil {
			return id, fmt.Errorf("enqueue %q: %w", *key, ErrDuplicate)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("enqueue: %w", err)
		}
		err = pgx.BeginFunc(ctx, db, func(sp pgx.Tx) error {
			id, err = insertOne(ctx, sp, r, source, key)
			return err
		})
		if !isUniqueViolation(err) {
			return id, err
		}
	}
}

func insertOne(ctx context.Context, db executor, r *row, source string, key *string) (int64, error) {
	var id int64
	var err error
	if r.maxAttempts > 0 {
		err = db.QueryRow(ctx, sqlInsertMaxAttempts, r.queue, r.priority, string(r.payload), source, r.runAfter, r.batch, key, r.maxAttempts).Scan(&id)
	} else {
		err = db.QueryRow(ctx, sqlInsert, r.queue, r.priority, string(r.payload), source, r.runAfter, r.batch, key).Scan(&id)
	}
	if err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	return id, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// EnqueueMany adds one row per source with COPY, in one transaction: all
// of them or none. It returns the number of rows added: with KeyBySource,
// sources already in the queue (or given twice) are skipped.
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
	if r.key != nil {
		return nil, errors.New("EnqueueOpts.Key names one row: use KeyBySource with EnqueueMany")
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
	if r.runAfter != nil {
		cols = append(cols, "run_after")
		values = append(values, *r.runAfter)
	}
	if r.batch != nil {
		cols = append(cols, "batch")
		values = append(values, *r.batch)
	}
	if !r.bySource && r.batch == nil {
		return copyInto(ctx, db, pgx.Identifier{"files", "files"}, cols, &copySource{sources: sources, values: values, i: -1})
	}
	if r.bySource {
		cols = append(cols, "unique_key")
		values = append(values, nil)
		sources = distinct(sources)
	}
	if _, err := db.Exec(ctx, sqlStage); err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	if _, err := db.Exec(ctx, sqlUnstage); err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	if _, err := copyInto(ctx, db, pgx.Identifier{"pgworker_staged"}, cols, &copySource{sources: sources, values: values, i: -1, key: r.bySource}); err != nil {
		return 0, err
	}
	// A key taken meanwhile by another session fails the move; it goes
	// again, in a savepoint, without the rows that are now there.
	for {
		var n int64
		err := pgx.BeginFunc(ctx, db, func(sp pgx.Tx) error {
			tag, err := sp.Exec(ctx, sqlMoveIn)
			n = tag.RowsAffected()
			return err
		})
		if err == nil {
			return n, nil
		}
		if !isUniqueViolation(err) {
			return 0, fmt.Errorf("enqueue: %w", err)
		}
	}
}

func copyInto(ctx context.Context, db executor, table pgx.Identifier, cols []string, src *copySource) (int64, error) {
	n, err := db.CopyFrom(ctx, table, cols, src)
	if err != nil {
		return 0, fmt.Errorf("COPY into files.files: %w", err)
	}
	return n, nil
}

// distinct returns sources without repeats, in their first order.
func distinct(sources []string) []string {
	seen := make(map[string]struct{}, len(sources))
	out := make([]string, 0, len(sources))
	for _, s := range sources {
		if _, dup := seen[s]; !dup {
			seen[s] = struct{}{}
			out = append(out, s)
		}
	}
	return out
}

// copySource feeds the sources to CopyFrom. pgx encodes each row before
// asking for the next, so one values slice serves every row.
type copySource struct {
	sources []string
	values  []any // queue, priority, payload, source[, max_attempts][, run_after][, batch][, unique_key]
	i       int
	key     bool // the last value is the source again, as its unique key
}

func (s *copySource) Next() bool {
	s.i++
	return s.i < len(s.sources)
}

func (s *copySource) Values() ([]any, error) {
	s.values[3] = s.sources[s.i]
	if s.key {
		s.values[len(s.values)-1] = s.sources[s.i]
	}
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

// CheckBatch returns an error that is ErrInvalidBatch (wrapped, with the
// name) unless name is a valid batch name (migrations.ValidBatchName).
func CheckBatch(name string) error {
	if !migrations.ValidBatchName(name) {
		return fmt.Errorf("batch %q: %w", name, ErrInvalidBatch)
	}
	return nil
}

func checkKey(key string) error {
	if len(key) > MaxSourceBytes || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
		return fmt.Errorf("key of %d bytes: a unique key is UTF-8 text of at most %d bytes without NUL", len(key), MaxSourceBytes)
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
