package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/retry"
	"github.com/pgworker/pgworker/queue"
)

// The exit statuses of pgworker wait besides ExitOK (every row done),
// ExitError and ExitUsage.
const (
	ExitBatchFailed = 3 // the batch ended with rows failed or cancelled
	ExitTimeout     = 4 // --timeout passed before the batch ended
)

var waitCommand = &command{
	name:    "wait",
	args:    "--batch NAME [--timeout D] [flags]",
	summary: "wait until every row of a batch has ended",
	help: `
Waits until every row of the batch has ended (done, failed or cancelled),
woken by the notification on channel files_batch that the last row's end
sends. On a terminal it draws a progress bar; otherwise it prints a line
every --interval. It survives a restart or failover of the database: it
connects again and goes on waiting.

Exit status: 0 when every row is done; 3 when the batch ended with rows
failed or cancelled; 4 when --timeout passed first; 1 on other errors (an
unknown batch among them); 2 for a mistake in the command line.

Behind a transaction-pooling PgBouncer, point --listen-url at the primary or
a session pool: LISTEN needs a session.`,
	examples: `
pgworker wait --batch scans-2026-12-01
pgworker wait --batch nightly --timeout 6h || echo "not all done: $?"`,
}

var resultsCommand = &command{
	name:    "results",
	args:    "--batch NAME [--format jsonl|csv] [--state S]... [--queue Q]... [--download DIR] [flags]",
	summary: "list the rows of a batch and what they produced; download the outputs",
	help: `
Writes one line per row of the batch, in id order: id, queue, source, state,
attempts, the outputs the row produced (key, size, sha256) and the last
error. The rows are read in pages, so memory stays small for any batch.

--format jsonl (the default) writes one JSON object per line:
  {"id", "queue", "source", "state", "attempts",
   "outputs": [{"key", "url", "size", "sha256"}], "last_error", "finished_at"}
--format csv writes a header and the columns id, queue, source, state,
attempts, outputs (a JSON array as above), last_error.

--download DIR fetches every output from --output-store into DIR, under its
key; each is streamed, checked against its sha256, and a key that would
leave DIR is refused. The stages of a chain write to stores of their own:
download each with --queue STAGE and its --output-store.`,
	examples: `
pgworker results --batch scans-2026-12-01 > results.jsonl
pgworker results --batch nightly --state failed --format csv
pgworker results --batch nightly --download ./out --output-store s3://results/nightly
pgworker results --batch films --queue thumbnails --download ./thumbs --output-store s3://thumbs`,
}

// batchFlag adds --batch, required.
func batchFlag(fs *flagSet, name *string) {
	fs.StringVar(name, "batch", "", "the batch `NAME`")
	fs.env("batch", "PGWORKER_BATCH")
}

// parseBatchArgs parses the command line of a command about one batch,
// which takes no arguments; help is true when --help was printed.
func parseBatchArgs(inv *invocation, args []string, batch *string) (help bool, err error) {
	if help, err := inv.parse(args); help || err != nil {
		return help, err
	}
	if err := inv.noArgs(); err != nil {
		return false, err
	}
	return false, checkBatchFlag(*batch)
}

func checkBatchFlag(name string) error {
	if name == "" {
		return usagef("--batch is missing: name the batch (as given to pgworker enqueue --batch)")
	}
	if err := queue.CheckBatch(name); err != nil {
		return usagef("--batch: %v", err)
	}
	return nil
}

func (c *CLI) wait(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(waitCommand)
	var batch, listenURL string
	var timeout, interval time.Duration
	batchFlag(inv.fs, &batch)
	inv.fs.DurationVar(&timeout, "timeout", 0, "give up after `D` with exit status 4 (default: wait as long as it takes)")
	inv.fs.env("timeout", "PGWORKER_WAIT_TIMEOUT")
	inv.fs.DurationVar(&interval, "interval", 10*time.Second, "print a progress line every `D` when not on a terminal")
	inv.fs.StringVar(&listenURL, "listen-url", "", "database `URL` for LISTEN when --database-url goes through a transaction-pooling PgBouncer (default: --database-url)")
	inv.fs.env("listen-url", "PGWORKER_LISTEN_URL")
	if help, err := parseBatchArgs(inv, args, &batch); help || err != nil {
		return err
	}
	if timeout < 0 || interval <= 0 {
		return usagef("--timeout must not be negative and --interval must be positive")
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	if _, err := q.Batch(ctx, batch); err != nil {
		return explain(err)
	}
	if listenURL == "" {
		listenURL = inv.db.url
	}
	w := &waiter{q: q, batch: batch, listenURL: listenURL, logger: inv.logger(), out: e.stderr,
		bar: isTerminal(e.stderr), interval: interval}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	p, err := w.wait(ctx)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{code: ExitTimeout, msg: fmt.Sprintf("batch %q did not end within %s: %s", batch, timeout, w.lastLine())}
	case err != nil:
		return err
	}
	fmt.Fprintf(e.stdout, "batch %s ended: %d done, %d failed, %d cancelled of %d\n",
		printable(batch), p.Done, p.Failed, p.Cancelled, p.Total)
	if p.Failed+p.Cancelled > 0 {
		return &exitError{code: ExitBatchFailed, msg: fmt.Sprintf("batch %q ended with %d failed and %d cancelled rows (pgworker results --batch %s --state failed)",
			batch, p.Failed, p.Cancelled, batch)}
	}
	return nil
}

// exitError ends a command with an exit status of its own.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// waiter waits for one batch: a LISTEN connection of its own rings it when
// a batch ends (or after it reconnected), and the progress is read again
// then, and every refresh for the display.
type waiter struct {
	q         *queue.Client
	batch     string
	listenURL string
	logger    *slog.Logger
	out       io.Writer
	bar       bool
	interval  time.Duration
	last      *queue.BatchProgress
	printed   time.Time
}

func (w *waiter) wait(ctx context.Context) (*queue.BatchProgress, error) {
	rang := make(chan struct{}, 1)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go w.listen(lctx, rang)
	refresh := w.interval
	if w.bar {
		refresh = time.Second
	}
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	failing := false
	for {
		p, err := w.q.Batch(ctx, w.batch)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, queue.ErrNoBatch):
			return nil, err
		case err != nil:
			if !failing {
				w.logger.Warn("wait: cannot read the batch's progress; trying again", "error", err)
			}
			failing = true
		default:
			failing = false
			w.show(p)
			if p.Finished() {
				w.endLine()
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			w.endLine()
			return nil, ctx.Err()
		case <-rang:
		case <-tick.C:
		}
	}
}

// listen rings when files_batch carries the batch's name, and after every
// LISTEN (a batch may have ended while the connection was away).
func (w *waiter) listen(ctx context.Context, rang chan<- struct{}) {
	ring := func() {
		select {
		case rang <- struct{}{}:
		default:
		}
	}
	for n := 1; ctx.Err() == nil; n++ {
		err := w.listenOnce(ctx, ring)
		if ctx.Err() != nil {
			return
		}
		w.logger.Debug("wait: LISTEN connection lost; connecting again", "error", err)
		if !retry.Sleep(ctx, retry.Backoff(100*time.Millisecond, 5*time.Second, n)) {
			return
		}
	}
}

func (w *waiter) listenOnce(ctx context.Context, ring func()) error {
	conn, err := pgx.Connect(ctx, w.listenURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+queue.ChannelBatch); err != nil {
		return err
	}
	ring()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == w.batch {
			ring()
		}
	}
}

func (w *waiter) show(p *queue.BatchProgress) {
	w.last = p
	if w.bar {
		fmt.Fprintf(w.out, "\r\x1b[K%s", progressLine(p, 30))
		return
	}
	if time.Since(w.printed) >= w.interval || p.Finished() {
		fmt.Fprintln(w.out, progressLine(p, 0))
		w.printed = time.Now()
	}
}

func (w *waiter) endLine() {
	if w.bar && w.last != nil {
		fmt.Fprintln(w.out)
	}
}

func (w *waiter) lastLine() string {
	if w.last == nil {
		return "no progress read"
	}
	return progressLine(w.last, 0)
}

// progressLine describes a batch in one line, with a bar of width
// characters when width > 0.
func progressLine(p *queue.BatchProgress, width int) string {
	var b strings.Builder
	b.WriteString(printable(p.Batch))
	b.WriteString(" ")
	if width > 0 {
		b.WriteString(bar(p.Percent, width))
		b.WriteString(" ")
	}
	fmt.Fprintf(&b, "%.1f%% (%d/%d) done %d, failed %d, cancelled %d, running %d, pending %d",
		p.Percent, p.Ended(), p.Total, p.Done, p.Failed, p.Cancelled, p.Running, p.Pending)
	if p.Rate > 0 && !p.Finished() {
		fmt.Fprintf(&b, ", %.1f rows/s", p.Rate)
	}
	if p.ETASeconds != nil {
		fmt.Fprintf(&b, ", ETA %s", (time.Duration(*p.ETASeconds) * time.Second).String())
	}
	return b.String()
}

// bar draws percent as a bar of width cells.
func bar(percent float64, width int) string {
	full := int(percent / 100 * float64(width))
	full = max(0, min(width, full))
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}

func (c *CLI) results(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(resultsCommand)
	var batch, format, download, outputStore string
	var states, queues listFlag
	batchFlag(inv.fs, &batch)
	inv.fs.Var(&queues, "queue", "only rows of `QUEUE` (a stage of a chain); repeat for several")
	inv.fs.StringVar(&format, "format", "jsonl", "`FORMAT` of the lines: jsonl or csv")
	inv.fs.Var(&states, "state", "only rows in `STATE` (pending, running, done, failed, cancelled); repeat for several")
	inv.fs.StringVar(&download, "download", "", "fetch every output into `DIR`, checked against its sha256")
	inv.fs.StringVar(&outputStore, "output-store", "", "the store `URL` the outputs were uploaded to (s3://bucket/prefix or file:///dir), for --download")
	inv.fs.env("output-store", "PGWORKER_OUTPUT_STORE")
	if help, err := parseBatchArgs(inv, args, &batch); help || err != nil {
		return err
	}
	if format != "jsonl" && format != "csv" {
		return usagef("--format %q: use jsonl or csv", format)
	}
	if download != "" && outputStore == "" {
		return usagef("--download needs --output-store (or PGWORKER_OUTPUT_STORE): the store the outputs were uploaded to")
	}
	var fetch *downloader
	if download != "" {
		var err error
		if fetch, err = newDownloader(ctx, outputStore, download); err != nil {
			return err
		}
		defer fetch.close()
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	out := newResultWriter(e.stdout, format)
	err = q.Results(ctx, batch, &queue.ResultsOpts{States: states, Queues: queues}, func(r *queue.ResultRow) error {
		if fetch != nil {
			if err := fetch.row(ctx, r); err != nil {
				return err
			}
		}
		return out.write(r)
	})
	if flushErr := out.flush(); err == nil {
		err = flushErr
	}
	if err != nil {
		return explain(err)
	}
	if fetch != nil {
		fmt.Fprintf(e.stderr, "downloaded %d %s (%d bytes) into %s\n", fetch.files, plural(fetch.files, "file", "files"), fetch.bytes, download)
	}
	return nil
}

// resultWriter writes result rows as JSON lines or CSV.
type resultWriter struct {
	enc *json.Encoder
	csv *csv.Writer
}

func newResultWriter(w io.Writer, format string) *resultWriter {
	if format == "csv" {
		cw := csv.NewWriter(w)
		cw.Write([]string{"id", "queue", "source", "state", "attempts", "outputs", "last_error"}) //nolint:errcheck // reported by Flush
		return &resultWriter{csv: cw}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &resultWriter{enc: enc}
}

func (rw *resultWriter) write(r *queue.ResultRow) error {
	if r.Outputs == nil {
		r.Outputs = []queue.Asset{}
	}
	if rw.enc != nil {
		return rw.enc.Encode(r)
	}
	outputs, err := json.Marshal(r.Outputs)
	if err != nil {
		return err
	}
	lastError := ""
	if r.LastError != nil {
		lastError = *r.LastError
	}
	return rw.csv.Write([]string{strconv.FormatInt(r.ID, 10), r.Queue, r.Source, r.State,
		strconv.Itoa(int(r.Attempts)), string(outputs), lastError})
}

func (rw *resultWriter) flush() error {
	if rw.csv == nil {
		return nil
	}
	rw.csv.Flush()
	return rw.csv.Error()
}

// downloader fetches the outputs of result rows into a directory.
type downloader struct {
	store blob.Store
	dir   string
	files int64
	bytes int64
}

func newDownloader(ctx context.Context, storeURL, dir string) (*downloader, error) {
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return nil, err
	}
	st, err := blob.Open(ctx, storeURL, &opts)
	if err != nil {
		return nil, usagef("--output-store %s: %v", storeURL, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		st.Close()
		return nil, fmt.Errorf("--download: %w", err)
	}
	return &downloader{store: st, dir: dir}, nil
}

func (d *downloader) close() { d.store.Close() }

// row downloads the outputs of r, each checked against the size and sha256
// of its manifest.
func (d *downloader) row(ctx context.Context, r *queue.ResultRow) error {
	for _, a := range r.Outputs {
		path, err := blob.LocalPath(d.dir, a.Key)
		if err != nil {
			return fmt.Errorf("row %d: output %s: %w", r.ID, printable(a.Key), err)
		}
		info, err := d.store.GetFile(ctx, a.Key, path)
		if err != nil {
			return fmt.Errorf("row %d: %w", r.ID, err)
		}
		if info.Size != a.Size || (a.SHA256 != "" && info.SHA256 != a.SHA256) {
			os.Remove(path) //nolint:errcheck // it is wrong either way
			return fmt.Errorf("row %d: output %s does not match its manifest (size %d, sha256 %s; the store gave %d, %s)",
				r.ID, printable(a.Key), a.Size, a.SHA256, info.Size, info.SHA256)
		}
		d.files++
		d.bytes += info.Size
	}
	return nil
}
