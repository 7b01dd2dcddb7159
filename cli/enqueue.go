package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxSourceBytes bounds the length of a source: an S3 key has at most 1024
// bytes, a path at most 4096.
const MaxSourceBytes = 4096

// DefaultBatchSize is how many rows enqueue loads per transaction.
const DefaultBatchSize = 10000

// Lister lists the objects of a location for `pgworker enqueue --from`.
type Lister interface {
	// List calls fn with the source of each object (the string to store in
	// files.files.source) until the listing ends or fn returns an error,
	// which List then returns.
	List(ctx context.Context, fn func(source string) error) error
}

// ListerFunc adapts a function to Lister.
type ListerFunc func(ctx context.Context, fn func(source string) error) error

// List calls f.
func (f ListerFunc) List(ctx context.Context, fn func(source string) error) error { return f(ctx, fn) }

var enqueueCommand = &command{
	name:    "enqueue",
	args:    "[flags] [SOURCE...]",
	summary: "add sources (input objects) to a queue",
	help: `
Adds one row per source to files.files. Sources come from the arguments, or
from standard input one per line when there is none (or where an argument is
-), or from listing an object store location with --from.

Lines are taken byte for byte, without trimming; a line ending in CR LF loses
its CR, and blank lines are skipped. A line that holds a NUL byte or invalid
UTF-8, or is longer than 4096 bytes, stops the load with its line number.

A source that starts with - follows -- (pgworker enqueue -- -odd-name).

Rows are loaded with COPY in batches (--batch-size), each in its own
transaction: a batch is in the queue whole or not at all. When the load
stops, the message says which rows were loaded and from where to go on.`,
	examples: `
pgworker enqueue photos/a.jpg photos/b.jpg
find /srv/photos -name '*.jpg' -printf '%P\n' | pgworker enqueue --queue thumbs
pgworker enqueue --queue urgent --priority 10 --max-attempts 3 --payload '{"size": 200}' < keys.txt
pgworker enqueue --from s3://photos/2024/`,
}

func (c *CLI) enqueue(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(enqueueCommand)
	var (
		db          dbFlags
		logs        logFlags
		queue       string
		priority    int
		maxAttempts int
		payload     string
		batchSize   int
		from        string
	)
	db.add(fs)
	logs.add(fs)
	fs.StringVar(&queue, "queue", "default", "`QUEUE` to add the rows to")
	fs.env("queue", "PGWORKER_QUEUE")
	fs.IntVar(&priority, "priority", 0, "row priority `N`: larger runs first")
	fs.IntVar(&maxAttempts, "max-attempts", 0, "`N` attempts before a row ends failed (default: the table's, 5)")
	fs.StringVar(&payload, "payload", "{}", "`JSON` object stored with every row and handed to the program (PGWORKER_PAYLOAD)")
	fs.IntVar(&batchSize, "batch-size", DefaultBatchSize, "`N` rows per COPY batch and transaction")
	fs.env("batch-size", "PGWORKER_BATCH_SIZE")
	fs.StringVar(&from, "from", "", "enqueue every object under this `URL` (s3://bucket/prefix or file:///dir)")
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	if err := logs.validate(); err != nil {
		return err
	}
	if queue == "" || len(queue) > 128 {
		return usagef("--queue must have 1 to 128 characters")
	}
	if priority < math.MinInt32 || priority > math.MaxInt32 {
		return usagef("--priority %d is out of range (it is a 32-bit integer)", priority)
	}
	if fs.given("max-attempts") && (maxAttempts < 1 || maxAttempts > math.MaxInt32) {
		return usagef("--max-attempts must be at least 1")
	}
	if batchSize < 1 || batchSize > 1_000_000 {
		return usagef("--batch-size must be between 1 and 1000000")
	}
	payloadJSON, err := checkPayload(payload)
	if err != nil {
		return err
	}
	sources := fs.Args()
	if from != "" && len(sources) > 0 {
		return usagef("give sources as arguments, on standard input or with --from, not several of these")
	}
	stdinArgs := 0
	for i, s := range sources {
		if s == "-" {
			stdinArgs++
		} else if err := checkSource(s); err != nil {
			return usagef("argument %d: %v", i+1, err)
		}
	}
	if stdinArgs > 1 {
		return usagef("- (standard input) may be given once")
	}
	if err := db.resolve(fs, e.lookup); err != nil {
		return err
	}
	logger := logs.logger(e.stderr, e.lookup)

	var lister Lister
	if from != "" {
		if c.cfg.OpenLister == nil {
			return fmt.Errorf("--from %s: listing object stores is not available in this build; "+
				"list the keys another way and pipe them in, one per line", from)
		}
		if lister, err = c.cfg.OpenLister(ctx, from); err != nil {
			return fmt.Errorf("--from %s: %w", from, err)
		}
	}

	pool, err := db.connect(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()

	l := newLoader(pool, logger, batchSize, queue, int32(priority), payloadJSON)
	if fs.given("max-attempts") {
		l.withMaxAttempts(int32(maxAttempts))
	}
	switch {
	case lister != nil:
		n := 0
		err = lister.List(ctx, func(src string) error {
			n++
			return l.add(ctx, src, position{kind: "object", n: n})
		})
	case len(sources) == 0:
		err = l.readLines(ctx, e, "stdin line")
	default:
		for i, s := range sources {
			if s == "-" {
				err = l.readLines(ctx, e, "stdin line")
			} else {
				err = l.add(ctx, s, position{kind: "argument", n: i + 1})
			}
			if err != nil {
				break
			}
		}
	}
	if err == nil {
		err = l.flush(ctx)
	}
	if err != nil {
		return l.stopped(err)
	}
	fmt.Fprintf(e.stdout, "enqueued %d %s into queue %q\n", l.committed, plural(l.committed, "row", "rows"), queue)
	return nil
}

// checkPayload accepts a JSON object, before anything touches the database.
func checkPayload(s string) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&obj); err != nil || obj == nil {
		what := "not valid JSON"
		if err == nil || json.Valid([]byte(s)) {
			what = "valid JSON but not an object"
		}
		return nil, usagef(`--payload must be a JSON object such as '{"size": 200}': %s is %s`, clip(s, 60), what)
	}
	if dec.More() {
		return nil, usagef("--payload must be one JSON object: %s has more after it", clip(s, 60))
	}
	if strings.Contains(s, `\u0000`) {
		return nil, usagef(`--payload: PostgreSQL's jsonb cannot hold \u0000`)
	}
	return json.RawMessage(s), nil
}

// checkSource says what makes a source unloadable.
func checkSource(s string) error {
	switch {
	case s == "":
		return errors.New("empty source")
	case len(s) > MaxSourceBytes:
		return fmt.Errorf("source of %d bytes is longer than %d bytes", len(s), MaxSourceBytes)
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return fmt.Errorf("NUL byte at byte %d", i+1)
	}
	if !utf8.ValidString(s) {
		for i, r := range s {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
					return fmt.Errorf("invalid UTF-8 at byte %d", i+1)
				}
			}
		}
	}
	return nil
}

// position is where a source came from, for messages.
type position struct {
	kind string // "stdin line", "argument", "object"
	n    int
}

func (p position) String() string { return fmt.Sprintf("%s %d", p.kind, p.n) }

// loader COPYs sources into files.files in batches, one transaction each.
type loader struct {
	pool      *pgxpool.Pool
	logger    *slog.Logger
	size      int
	cols      []string
	fixed     []any // queue, priority, payload[, max_attempts]
	batch     []string
	first     position // of the batch being filled
	last      position // of the last source added
	committed int64
	lastDone  position // last source of the last committed batch
}

func newLoader(pool *pgxpool.Pool, logger *slog.Logger, size int, queue string, priority int32, payload json.RawMessage) *loader {
	return &loader{
		pool:   pool,
		logger: logger,
		size:   size,
		cols:   []string{"queue", "priority", "payload", "source"},
		fixed:  []any{queue, priority, payload},
		batch:  make([]string, 0, size),
	}
}

// withMaxAttempts sets max_attempts instead of leaving the column default.
func (l *loader) withMaxAttempts(n int32) {
	l.cols = append(l.cols, "max_attempts")
	l.fixed = append(l.fixed, n)
}

func (l *loader) add(ctx context.Context, src string, pos position) error {
	if err := checkSource(src); err != nil {
		return &sourceError{pos: pos, err: err}
	}
	if len(l.batch) == 0 {
		l.first = pos
	}
	l.batch = append(l.batch, src)
	l.last = pos
	if len(l.batch) >= l.size {
		return l.flush(ctx)
	}
	return nil
}

// readLines adds the lines of standard input.
func (l *loader) readLines(ctx context.Context, e *env, kind string) error {
	if isTerminal(e.stdin) {
		fmt.Fprintln(e.stderr, "pgworker: reading sources from the terminal, one per line; end with Ctrl-D")
	}
	br := bufio.NewReaderSize(e.stdin, 64<<10)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return &sourceError{pos: position{kind, n}, err: fmt.Errorf("line longer than %d bytes", MaxSourceBytes)}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read standard input: %w", err)
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if len(bytes.TrimSpace(line)) > 0 {
			if addErr := l.add(ctx, string(line), position{kind, n}); addErr != nil {
				return addErr
			}
		}
		if err != nil {
			return nil // EOF
		}
	}
}

// flush loads the batch in one transaction.
func (l *loader) flush(ctx context.Context) error {
	if len(l.batch) == 0 {
		return nil
	}
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: a no-op
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"files", "files"}, l.cols, &batchSource{l: l, i: -1})
	if err != nil {
		return fmt.Errorf("COPY into files.files: %w", explain(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", explain(err))
	}
	l.committed += n
	l.lastDone = l.last
	l.logger.Debug("enqueue: batch loaded", "rows", n, "total", l.committed, "up_to", l.last.String())
	l.batch = l.batch[:0]
	return nil
}

// batchSource feeds the batch to CopyFrom. pgx encodes each row before
// asking for the next, so one values slice serves every row.
type batchSource struct {
	l      *loader
	i      int
	values []any
}

func (b *batchSource) Next() bool {
	b.i++
	return b.i < len(b.l.batch)
}

func (b *batchSource) Values() ([]any, error) {
	if b.values == nil {
		b.values = make([]any, len(b.l.cols))
		copy(b.values, b.l.fixed[:3])
		if len(b.l.fixed) > 3 {
			b.values[4] = b.l.fixed[3]
		}
	}
	b.values[3] = b.l.batch[b.i]
	return b.values, nil
}

func (b *batchSource) Err() error { return nil }

// sourceError is a source that cannot be loaded.
type sourceError struct {
	pos position
	err error
}

func (e *sourceError) Error() string { return fmt.Sprintf("%s: %v", e.pos, e.err) }
func (e *sourceError) Unwrap() error { return e.err }

// stopped explains what a stopped load left behind.
func (l *loader) stopped(err error) error {
	var what string
	switch {
	case l.committed == 0:
		what = "nothing was enqueued"
	case len(l.batch) == 0:
		what = fmt.Sprintf("the %d rows up to %s were enqueued", l.committed, l.lastDone)
	default:
		what = fmt.Sprintf("the batch from %s on was not enqueued; the %d rows up to %s were", l.first, l.committed, l.lastDone)
		if l.first.kind == "stdin line" {
			what += fmt.Sprintf(" (to go on, feed line %d on: tail -n +%d FILE | pgworker enqueue ...)", l.first.n, l.first.n)
		}
	}
	var se *sourceError
	if errors.As(err, &se) && len(l.batch) == 0 && se.pos.kind == "stdin line" && l.committed > 0 {
		what += fmt.Sprintf(" (to go on, feed line %d on: tail -n +%d FILE | pgworker enqueue ...)", se.pos.n, se.pos.n)
	}
	return fmt.Errorf("%w; %s", err, what)
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// clip shortens s for a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q...", s[:cut])
}
