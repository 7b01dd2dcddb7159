package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/retry"
)

type outcomeKind int

const (
	kindComplete outcomeKind = iota
	kindFail
	kindRelease
)

// outcome is what a handler's return asks the database to record.
type outcome struct {
	t          *task
	kind       outcomeKind
	result     *string // JSON, complete only
	report     *string // JSON: nil, or reportText's address
	reportText string
	message    string // fail: the error; release: the reason
	retryable  bool
	runAfter   time.Time // fail: when a row left pending runs again; zero when it failed for good

	ev         Event         // the row's end event, completed by finish
	handedOver bool          // finish frees the slot's token and forgets the row
	settled    chan struct{} // else, if not nil: closed by finish for the waiting slot
}

type recorded int

const (
	recordedOK      recorded = iota // the fenced call took it
	recordedNotHeld                 // the fenced call refused: the row is no longer ours
	recordedGaveUp                  // not recorded: the worker stopped first, or the database refused it
)

// report is the attempt report of files.complete and files.fail.
type report struct {
	ExitCode   *int
	Duration   time.Duration // reported in milliseconds, to the microsecond
	StderrTail string
	Output     json.RawMessage
}

// marshal encodes the report as files.complete and files.fail read it:
// {"exit_code":N,"duration_ms":F,"stderr_tail":"...","output":{...}}, the
// optional members left out when empty. It is on every row's path, so it
// avoids the reflection of encoding/json but for the strings, and a report
// of a few numbers is built on the stack: the string is its one allocation.
func (r *report) marshal() string {
	var buf [96]byte
	b := buf[:0]
	b = append(b, '{')
	if r.ExitCode != nil {
		b = append(b, `"exit_code":`...)
		b = strconv.AppendInt(b, int64(*r.ExitCode), 10)
		b = append(b, ',')
	}
	b = append(b, `"duration_ms":`...)
	b = appendMillis(b, r.Duration)
	if r.StderrTail != "" {
		tail, _ := json.Marshal(r.StderrTail) // a string always marshals
		b = append(b, `,"stderr_tail":`...)
		b = append(b, tail...)
	}
	if len(r.Output) > 0 {
		b = append(b, `,"output":`...)
		b = append(b, r.Output...)
	}
	return string(append(b, '}'))
}

// appendMillis appends d in milliseconds as a JSON number, to the microsecond
// (12.345, 7, 0.001), without the float formatting that was most of the cost
// of a report.
func appendMillis(b []byte, d time.Duration) []byte {
	us := d.Microseconds()
	if us < 0 {
		b, us = append(b, '-'), -us
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	if frac == 0 {
		return b
	}
	digits := 3
	for frac%10 == 0 {
		frac, digits = frac/10, digits-1
	}
	var buf [3]byte
	for i := digits - 1; i >= 0; i-- {
		buf[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(append(b, '.'), buf[:digits]...)
}

// Why an outcome was not recorded, for RowLost events.
var (
	errNotHeld = errors.New("outcome refused: the row is no longer held by this attempt")
	errGaveUp  = errors.New("outcome not recorded: the worker stopped first, or the database refused it")
)

// recorder records the outcomes of all slots through the fenced SQL API:
// whatever queued up while the previous statement ran goes into the next
// one, so that one statement at a time records many outcomes. It finishes
// each outcome with the database's answer through its settler.
type recorder struct {
	pool     *pgxpool.Pool
	settler  settler
	logger   *slog.Logger
	lease    time.Duration // bounds one statement
	maxBatch int
	then     *string // Config.Then; nil for none

	// cooldown is the least time between the starts of two statements
	// while outcomes keep coming (Config.ClaimCooldown); hurry, closed when
	// the worker stops, ends a wait for it.
	cooldown time.Duration
	hurry    <-chan struct{}
	deferred atomic.Uint64 // statements held back until the cooldown ended

	mu      sync.Mutex
	queue   []*outcome    // in order of submission
	waiting int           // outcomes queued whose slot waits for them
	bell    chan struct{} // rung when queue grows
	closed  bool          // run has returned: outcomes are given up
}

// settler is what the recorder needs from the Worker.
type settler interface {
	// finish settles o with the database's answer r.
	finish(o *outcome, r recorded)
	// wakeAt asks for a claim at t, when a failed row becomes claimable again.
	wakeAt(t time.Time)
}

// newRecorder returns a recorder of at most maxBatch outcomes a statement;
// it records once run runs.
func newRecorder(pool *pgxpool.Pool, s settler, logger *slog.Logger, lease time.Duration, maxBatch int) *recorder {
	return &recorder{
		pool:     pool,
		settler:  s,
		logger:   logger,
		lease:    lease,
		maxBatch: maxBatch,
		bell:     make(chan struct{}, 1),
	}
}

// submit hands o to the recorder, which finishes it once the database has
// answered; once the recorder has stopped, o is finished as given up at once.
func (r *recorder) submit(o *outcome) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.settler.finish(o, recordedGaveUp)
		return
	}
	r.queue = append(r.queue, o)
	if o.settled != nil {
		r.waiting++
	}
	r.mu.Unlock()
	select {
	case r.bell <- struct{}{}:
	default:
	}
}

// run records batches until ctx ends; the outcomes still queued then are
// given up.
func (r *recorder) run(ctx context.Context) {
	var batch []*outcome
	var last time.Time // when the last statement began
	for {
		select {
		case <-r.bell:
		case <-ctx.Done():
			r.close()
			return
		}
		r.gather(ctx, last)
		for {
			batch = r.next(batch)
			if len(batch) == 0 {
				break
			}
			last = time.Now()
			r.record(ctx, batch)
			clear(batch)
		}
	}
}

// gather holds the outcomes queued, with a cooldown, until the cooldown has
// passed since the last statement began, so that the outcomes that end
// meanwhile go in the same statement: River's trade, as for the claims. An
// outcome after a quiet spell is recorded at once, and the wait ends as soon
// as a slot waits for its own outcome (Config.MaxUnrecorded outcomes
// wait), a statement's worth is queued, or the worker stops.
func (r *recorder) gather(ctx context.Context, last time.Time) {
	if r.cooldown <= 0 || last.IsZero() {
		return
	}
	wait := time.Until(last.Add(r.cooldown))
	if wait <= 0 || r.urgent() {
		return
	}
	r.deferred.Add(1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return
		case <-r.hurry:
			return
		case <-ctx.Done():
			return
		case <-r.bell:
			if r.urgent() {
				return
			}
		}
	}
}

// urgent reports whether the queued outcomes should not wait: a slot waits
// for one of them, or they fill a statement.
func (r *recorder) urgent() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting > 0 || len(r.queue) >= r.maxBatch
}

// next moves the oldest outcomes queued, up to maxBatch, into batch.
func (r *recorder) next(batch []*outcome) []*outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(len(r.queue), r.maxBatch)
	batch = append(batch[:0], r.queue[:n]...)
	for _, o := range batch {
		if o.settled != nil {
			r.waiting--
		}
	}
	r.queue = append(r.queue[:0], r.queue[n:]...)
	return batch
}

// record sends a batch: its completions in one statement, then its failures
// in another.
func (r *recorder) record(ctx context.Context, batch []*outcome) {
	var completes, fails []*outcome
	for _, o := range batch {
		if o.kind == kindComplete {
			completes = append(completes, o)
		} else {
			fails = append(fails, o)
		}
	}
	r.flush(ctx, completes, r.completeMany)
	r.flush(ctx, fails, r.failMany)
}

// close stops taking outcomes and gives up those still queued.
func (r *recorder) close() {
	r.mu.Lock()
	r.closed = true
	left := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, o := range left {
		r.settler.finish(o, recordedGaveUp)
	}
}

// release hands a row back without spending an attempt, retrying connection
// errors until the database answers (see flush) or ctx ends. It runs on the
// slot's goroutine: a release is not batched.
func (r *recorder) release(ctx context.Context, t *task, reason string) recorded {
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return recordedGaveUp
		}
		qctx, cancel := context.WithTimeout(ctx, r.lease)
		var ok bool
		err := r.pool.QueryRow(qctx, sqlRelease, t.row.ID, t.row.WorkerID, t.row.Attempt, t.row.Token, reason).Scan(&ok)
		cancel()
		switch {
		case err == nil && ok:
			return recordedOK
		case err == nil:
			return recordedNotHeld
		case !retryable(err):
			r.logger.Error("worker: release failed; the row returns to the queue when its lease expires",
				"file_id", t.row.ID, "error", err)
			return recordedGaveUp
		}
		r.logger.Debug("worker: release failed; retrying", "file_id", t.row.ID, "error", err)
		if !retry.Sleep(ctx, backoff(n)) {
			return recordedGaveUp
		}
	}
}

// sender records outcomes in one statement and says which ones it took.
type sender func(ctx context.Context, obs []*outcome) (map[int64]bool, error)

// flush records a batch, retrying connection errors with backoff until the
// database answers or the worker stops; each outcome is finished with its
// answer. An outcome is sent however long the database was away: the
// fenced call refuses it if the row was taken back meanwhile, and records it
// if not (files.reap does not count the database's own outage against the
// lease), so finished work is not thrown away on a guess of the local clock.
func (r *recorder) flush(ctx context.Context, obs []*outcome, send sender) {
	var down time.Time
	for n := 1; len(obs) > 0; n++ {
		if ctx.Err() != nil {
			break
		}
		qctx, cancel := context.WithTimeout(ctx, r.lease)
		took, err := send(qctx, obs)
		cancel()
		if err == nil {
			for _, o := range obs {
				if took[o.t.row.ID] {
					r.settler.finish(o, recordedOK)
				} else {
					r.settler.finish(o, recordedNotHeld)
				}
			}
			if !down.IsZero() {
				r.logger.Info("worker: outcomes recorded again", "down_for", time.Since(down).Round(time.Millisecond))
			}
			return
		}
		if !retryable(err) {
			r.salvage(ctx, obs, send, err)
			return
		}
		switch {
		case claim.RaceLost(err):
			r.logger.Debug("worker: recording outcomes lost a race; retrying", "rows", len(obs), "error", err)
		case down.IsZero():
			down = time.Now()
			r.logger.Warn("worker: cannot record outcomes; retrying until the database answers", "rows", len(obs), "error", err)
		default:
			r.logger.Debug("worker: still cannot record outcomes", "rows", len(obs), "error", err)
		}
		if !retry.Sleep(ctx, backoff(n)) {
			break
		}
	}
	for _, o := range obs {
		r.settler.finish(o, recordedGaveUp)
	}
}

// salvage handles a batch the database refused (a result it cannot store, say
// a string with a NUL character): each outcome is tried alone, so that one
// bad row does not cost the others their outcomes; a refused result becomes a
// permanent failure that says why, a refused report is dropped.
func (r *recorder) salvage(ctx context.Context, obs []*outcome, send sender, err error) {
	if len(obs) > 1 {
		for _, o := range obs {
			r.flush(ctx, []*outcome{o}, send)
		}
		return
	}
	o := obs[0]
	r.logger.Error("worker: the database refused an outcome", "file_id", o.t.row.ID, "error", err)
	switch {
	case o.kind == kindComplete:
		o.kind, o.retryable, o.result = kindFail, false, nil
		o.message = "the result could not be recorded: " + err.Error()
		r.flush(ctx, obs, r.failMany)
	case o.report != nil:
		o.report = nil
		r.flush(ctx, obs, send)
	default:
		r.settler.finish(o, recordedGaveUp)
	}
}

func (r *recorder) completeMany(ctx context.Context, obs []*outcome) (map[int64]bool, error) {
	if len(obs) == 1 {
		// files.complete plans once per connection; complete_many each call.
		o := obs[0]
		var took bool
		if err := r.pool.QueryRow(ctx, sqlCompleteOne, o.t.row.ID, o.t.row.WorkerID, int32(o.t.row.Attempt),
			o.t.row.Token, o.result, o.report, r.then).Scan(&took); err != nil {
			return nil, err
		}
		return map[int64]bool{o.t.row.ID: took}, nil
	}
	ids, wids, attempts, tokens := make([]int64, len(obs)), make([]string, len(obs)), make([]int32, len(obs)), make([]string, len(obs))
	results, reports := make([]*string, len(obs)), make([]*string, len(obs))
	for i, o := range obs {
		ids[i], wids[i], attempts[i], tokens[i] = o.t.row.ID, o.t.row.WorkerID, int32(o.t.row.Attempt), o.t.row.Token
		results[i], reports[i] = o.result, o.report
	}
	rows, err := r.pool.Query(ctx, sqlComplete, ids, wids, attempts, tokens, results, reports, r.then)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	took := make(map[int64]bool, len(obs))
	var id int64
	dest := []any{&id} // one for the statement: Scan's arguments escape
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		took[id] = true
	}
	return took, rows.Err()
}

func (r *recorder) failMany(ctx context.Context, obs []*outcome) (map[int64]bool, error) {
	ids, wids, attempts, tokens := make([]int64, len(obs)), make([]string, len(obs)), make([]int32, len(obs)), make([]string, len(obs))
	errs, retry, reports := make([]string, len(obs)), make([]bool, len(obs)), make([]*string, len(obs))
	for i, o := range obs {
		ids[i], wids[i], attempts[i], tokens[i] = o.t.row.ID, o.t.row.WorkerID, int32(o.t.row.Attempt), o.t.row.Token
		errs[i], retry[i], reports[i] = o.message, o.retryable, o.report
	}
	rows, err := r.pool.Query(ctx, sqlFail, ids, wids, attempts, tokens, errs, retry, reports)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	took := make(map[int64]bool, len(obs))
	byID := make(map[int64]*outcome, len(obs))
	for _, o := range obs {
		byID[o.t.row.ID] = o
	}
	var (
		id       int64
		state    string
		runAfter time.Time
	)
	dest := []any{&id, &state, &runAfter}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		took[id] = true
		if state == "pending" {
			// Nobody announces a retry when it comes due: look then.
			r.settler.wakeAt(runAfter)
			if o := byID[id]; o != nil {
				o.runAfter = runAfter
			}
		}
	}
	return took, rows.Err()
}

// cleanText makes s storable as PostgreSQL text: valid UTF-8 without NUL
// characters (a backend's stderr can hold anything).
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// retryable reports whether a failed statement may succeed when sent again:
// connection trouble, a server restarting or failing over, lost races.
func retryable(err error) bool {
	if claim.ConnectionLost(err) || claim.RaceLost(err) { // network errors, timeouts, sessions ended
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "53300", "25006", "55P03", "57014": // too many connections, read-only (standby), lock timeout, query cancelled
		return true
	}
	return false
}

// backoff is the delay before retry n of an outcome: from 50ms up to 5s.
func backoff(n int) time.Duration { return retry.Backoff(50*time.Millisecond, 5*time.Second, n) }
