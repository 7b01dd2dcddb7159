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

	"github.com/pgworker/pgworker/migrations"
	"github.com/pgworker/pgworker/queue"
)

// defaultBatchSize is how many rows enqueue loads per transaction.
const defaultBatchSize = 10000

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

Each row's source is its unique key in the queue (--no-key turns this off):
a source already in the queue, whatever the state of its row, is skipped, so
the same enqueue can run again, also after it was stopped halfway, and
queues each source once. It says how many rows it queued and how many were
already there. To run finished rows again, use pgworker retry.

--batch names the data set the rows belong to (created by its first row;
--labels adds a JSON object describing it): pgworker status shows its
progress, pgworker wait waits for its end, pgworker results lists what came
out.

Rows are loaded with COPY in chunks (--chunk-size), each in its own
transaction: a chunk is in the queue whole or not at all. When the load
stops, the message says which rows were loaded and from where to go on
(or run the same enqueue again).

--payload is one JSON object of at most 1 MiB; store larger data as an object
and put its key in the payload.`,
	examples: `
pgworker enqueue photos/a.jpg photos/b.jpg
find /srv/photos -name '*.jpg' -printf '%P\n' | pgworker enqueue --queue thumbs
pgworker enqueue --queue urgent --priority 10 --max-attempts 3 --payload '{"size": 200}' < keys.txt
pgworker enqueue --from s3://photos/2024/
pgworker enqueue --batch scans-2026-12-01 --labels '{"owner": "ocr"}' --from s3://scans/2026-12-01/`,
}

func (c *CLI) enqueue(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(enqueueCommand)
	var f enqueueFlags
	f.add(inv.fs)
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	opts, err := f.check(inv.fs)
	if err != nil {
		return err
	}
	if err := checkSourceArgs(inv.fs.Args(), f.from); err != nil {
		return err
	}
	if err := inv.resolve(); err != nil {
		return err
	}
	var lister Lister
	if f.from != "" {
		if lister, err = c.cfg.OpenLister(ctx, f.from); err != nil {
			return fmt.Errorf("--from %s: %w", f.from, err)
		}
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	if f.batch != "" && f.labels != nil {
		if err := q.CreateBatch(ctx, f.batch, f.labels); err != nil {
			return explain(err)
		}
	}
	l := &loader{q: q, opts: opts, logger: inv.logger(), size: f.batchSize, batch: make([]string, 0, f.batchSize)}
	if err := l.load(ctx, e, lister, inv.fs.Args()); err != nil {
		return l.stopped(err)
	}
	into := fmt.Sprintf("queue %q", opts.Queue)
	if f.batch != "" {
		into += fmt.Sprintf(", batch %q", f.batch)
	}
	if opts.KeyBySource {
		fmt.Fprintf(e.stdout, "queued %d, already there %d (%s)\n", l.committed, l.existing, into)
	} else {
		fmt.Fprintf(e.stdout, "queued %d %s (%s)\n", l.committed, plural(l.committed, "row", "rows"), into)
	}
	return nil
}

// enqueueFlags are the flags of pgworker enqueue.
type enqueueFlags struct {
	queue       string
	priority    int
	maxAttempts int
	payload     string
	batchSize   int
	from        string
	batch       string
	labelsText  string
	labels      json.RawMessage
	noKey       bool
}

func (f *enqueueFlags) add(fs *flagSet) {
	fs.StringVar(&f.queue, "queue", "default", "`QUEUE` to add the rows to")
	fs.env("queue", "PGWORKER_QUEUE")
	fs.IntVar(&f.priority, "priority", 0, "row priority `N`: larger runs first")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "`N` attempts before a row ends failed (default: the table's, 5)")
	fs.StringVar(&f.payload, "payload", "{}", "`JSON` object stored with every row and handed to the program (PGWORKER_PAYLOAD); at most 1 MiB")
	fs.IntVar(&f.batchSize, "chunk-size", defaultBatchSize, "`N` rows per COPY batch and transaction")
	fs.env("chunk-size", "PGWORKER_CHUNK_SIZE")
	fs.StringVar(&f.from, "from", "", "enqueue every object under this `URL` (s3://bucket/prefix or file:///dir)")
	fs.StringVar(&f.batch, "batch", "", "the batch (data set) `NAME` the rows belong to")
	fs.env("batch", "PGWORKER_BATCH")
	fs.StringVar(&f.labelsText, "labels", "", "`JSON` object describing the batch (with --batch)")
	fs.BoolVar(&f.noKey, "no-key", false, "do not key rows by their source: the same source enqueued twice is queued twice")
}

// check validates the flags, before anything touches the database, and
// returns the rows' columns.
func (f *enqueueFlags) check(fs *flagSet) (*queue.EnqueueOpts, error) {
	if f.queue == "" {
		return nil, usagef("--queue is empty: give a queue name, or leave --queue out for the queue \"default\"")
	}
	if !migrations.ValidQueueName(f.queue) {
		return nil, usagef("--queue must have 1 to %d characters", migrations.MaxQueueNameLength)
	}
	if f.priority < math.MinInt32 || f.priority > math.MaxInt32 {
		return nil, usagef("--priority %d is out of range (it is a 32-bit integer)", f.priority)
	}
	if fs.given("max-attempts") && (f.maxAttempts < 1 || f.maxAttempts > math.MaxInt32) {
		return nil, usagef("--max-attempts must be at least 1")
	}
	if f.batchSize < 1 || f.batchSize > 1_000_000 {
		return nil, usagef("--chunk-size must be between 1 and 1000000")
	}
	payload, err := checkPayload(f.payload)
	if err != nil {
		return nil, err
	}
	if f.batch != "" {
		if err := queue.CheckBatch(f.batch); err != nil {
			return nil, usagef("--batch: %v", err)
		}
	}
	if f.labelsText != "" {
		if f.batch == "" {
			return nil, usagef("--labels describes a batch: give --batch too")
		}
		if f.labels, err = checkPayload(f.labelsText); err != nil {
			return nil, usagef("--labels: %s", strings.TrimPrefix(err.Error(), "--payload "))
		}
	}
	opts := &queue.EnqueueOpts{Queue: f.queue, Priority: int32(f.priority), Payload: payload, Batch: f.batch, KeyBySource: !f.noKey}
	if fs.given("max-attempts") {
		opts.MaxAttempts = int32(f.maxAttempts)
	}
	return opts, nil
}

// checkPayload accepts a JSON object of at most 1 MiB.
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
	if err := queue.CheckPayload(json.RawMessage(s)); err != nil {
		return nil, usagef("--payload: %v", err)
	}
	return json.RawMessage(s), nil
}

// checkSourceArgs checks the sources given as arguments.
func checkSourceArgs(sources []string, from string) error {
	if from != "" && len(sources) > 0 {
		return usagef("give sources as arguments, on standard input or with --from, not several of these")
	}
	stdinArgs := 0
	for i, s := range sources {
		if s == "-" {
			stdinArgs++
		} else if err := queue.CheckSource(s); err != nil {
			return usagef("argument %d: %v", i+1, err)
		}
	}
	if stdinArgs > 1 {
		return usagef("- (standard input) may be given once")
	}
	return nil
}

// position is where a source came from, for messages.
type position struct {
	kind string // "stdin line", "argument", "object"
	n    int
}

func (p position) String() string { return fmt.Sprintf("%s %d", p.kind, p.n) }

// loader enqueues sources in batches, one transaction each, and keeps
// track of where they came from.
type loader struct {
	q         *queue.Client
	opts      *queue.EnqueueOpts
	logger    *slog.Logger
	size      int
	batch     []string
	first     position // of the batch being filled
	last      position // of the last source added
	committed int64
	existing  int64    // sources skipped: their key was in the queue already
	lastDone  position // last source of the last committed batch
}

// load adds the sources that lister lists, or the arguments (- for
// standard input), or standard input when there is neither.
func (l *loader) load(ctx context.Context, e *env, lister Lister, args []string) error {
	var err error
	switch {
	case lister != nil:
		n := 0
		err = lister.List(ctx, func(src string) error {
			n++
			return l.add(ctx, src, position{kind: "object", n: n})
		})
	case len(args) == 0:
		err = l.readLines(ctx, e, "stdin line")
	default:
		for i, s := range args {
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
	if err != nil {
		return err
	}
	return l.flush(ctx)
}

func (l *loader) add(ctx context.Context, src string, pos position) error {
	if err := queue.CheckSource(src); err != nil {
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
			return &sourceError{pos: position{kind, n}, err: fmt.Errorf("line longer than %d bytes", queue.MaxSourceBytes)}
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
	n, err := l.q.EnqueueMany(ctx, l.batch, l.opts)
	if err != nil {
		return explain(err)
	}
	l.committed += n
	l.existing += int64(len(l.batch)) - n
	l.lastDone = l.last
	l.logger.Debug("enqueue: batch loaded", "rows", n, "total", l.committed, "up_to", l.last.String())
	l.batch = l.batch[:0]
	return nil
}

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
		what = fmt.Sprintf("the chunk from %s on was not enqueued; the %d rows up to %s were", l.first, l.committed, l.lastDone)
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
