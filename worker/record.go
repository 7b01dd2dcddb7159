package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
	t         *task
	kind      outcomeKind
	result    *string // JSON, complete only
	report    *string // JSON
	message   string  // fail: the error; release: the reason
	retryable bool
	runAfter  time.Time // fail: when a row left pending runs again; zero when it failed for good

	ev         Event         // the row's end event, completed by finish
	handedOver bool          // finish frees the slot's token and forgets the row
	settled    chan struct{} // else, if not nil: closed by finish for the waiting slot
}

type recorded int

const (
	recordedOK      recorded = iota // the fenced call took it
	recordedNotHeld                 // the fenced call refused: the row is no longer ours
	recordedGaveUp                  // the worker stopped before the database could be reached
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
// avoids the reflection of encoding/json but for the strings.
func (r *report) marshal() string {
	b := make([]byte, 0, 64+len(r.StderrTail)+len(r.Output))
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

// decide turns a handler's return into the outcome to record.
func (w *Worker) decide(t *task, res *Result, err error, elapsed time.Duration, cause error) *outcome {
	o := &outcome{t: t}
	rep := report{Duration: elapsed}
	var output json.RawMessage
	if res != nil {
		rep.ExitCode, rep.StderrTail = res.ExitCode, cleanText(res.StderrTail)
		if res.Duration > 0 {
			rep.Duration = res.Duration
		}
		if res.Output != nil {
			b, mErr := json.Marshal(res.Output)
			if mErr != nil && err == nil {
				err = Permanent(fmt.Errorf("result is not JSON-marshalable: %w", mErr))
			}
			output = b
		}
	}

	switch {
	case err == nil:
		o.kind = kindComplete
		if output != nil {
			s := string(output)
			o.result = &s
		}
		w.forgetReleases(t.row.ID)
	case errors.Is(cause, ErrStopping):
		o.kind, o.message = kindRelease, "worker stopping: "+err.Error()
	case IsRelease(err):
		if w.countRelease(t.row.ID) > w.maxReleases {
			o.kind, o.retryable = kindFail, true
			o.message = fmt.Sprintf("released %d times in a row by this worker: %v", w.maxReleases, err)
			w.forgetReleases(t.row.ID)
		} else {
			o.kind, o.message = kindRelease, err.Error()
		}
	case errors.Is(cause, ErrTimeout):
		o.kind, o.retryable = kindFail, true
		o.message = fmt.Sprintf("handler timed out after %s: %v", w.timeout, err)
	default:
		o.kind, o.retryable = kindFail, !IsPermanent(err)
		o.message = err.Error()
	}
	o.message = cleanText(o.message)
	if o.kind == kindFail {
		rep.Output = output
		if o.message == "" {
			o.message = "failed without an error message"
		}
	}
	if o.kind != kindRelease {
		s := rep.marshal()
		o.report = &s
	}
	return o
}

func (w *Worker) countRelease(id int64) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.releases) > 10000 {
		clear(w.releases)
	}
	w.releases[id]++
	return w.releases[id]
}

func (w *Worker) forgetReleases(id int64) {
	w.mu.Lock()
	delete(w.releases, id)
	w.mu.Unlock()
}

// submit hands o to the recorder, which finishes it once the database has
// answered; once the recorder has stopped, o is finished as given up at once.
func (w *Worker) submit(o *outcome) {
	w.recordMu.Lock()
	if w.recordClosed {
		w.recordMu.Unlock()
		w.finish(o, recordedGaveUp)
		return
	}
	w.recordQueue = append(w.recordQueue, o)
	w.recordMu.Unlock()
	select {
	case w.recordBell <- struct{}{}:
	default:
	}
}

// finish settles an outcome with the database's answer r: the counters, the
// row's end event and, for an outcome handed over by its slot, the slot's
// token and the row's entry. It runs on the recorder's goroutine, or on the
// slot's for a release.
func (w *Worker) finish(o *outcome, r recorded) {
	t, ev := o.t, o.ev
	switch r {
	case recordedOK:
		switch o.kind {
		case kindComplete:
			w.done.Add(1)
			ev.Kind = RowDone
		case kindFail:
			w.failed.Add(1)
			ev.Kind, ev.Err, ev.RetryAt = RowFailed, errors.New(o.message), o.runAfter
			if !o.retryable {
				w.logger.Debug("worker: row failed permanently", "file_id", t.row.ID, "error", o.message)
			}
		case kindRelease:
			w.released.Add(1)
			ev.Kind, ev.Err = RowReleased, errors.New(o.message)
		}
	case recordedNotHeld:
		w.mu.Lock()
		gone := t.gone
		w.mu.Unlock()
		ev.Kind, ev.Err = RowLost, errNotHeld
		if gone == nil {
			w.lost.Add(1)
			w.logger.Warn("worker: outcome refused: the row is no longer held by this attempt",
				"file_id", t.row.ID, "attempt", t.row.Attempt, "worker_id", t.row.WorkerID)
		} else {
			ev.Err = gone
			if gone == ErrCancelled {
				ev.Kind = RowCancelled
			}
		}
	case recordedGaveUp:
		w.lost.Add(1)
		ev.Kind, ev.Err = RowLost, errGaveUp
		w.logger.Warn("worker: outcome lost: the database could not be reached before the worker stopped",
			"file_id", t.row.ID, "attempt", t.row.Attempt, "worker_id", t.row.WorkerID)
	}
	w.emit(t, ev)
	switch {
	case o.handedOver:
		<-w.unsettled
		w.forget(t)
		w.handlers.Done()
	case o.settled != nil:
		close(o.settled)
	}
}

// Why an outcome was not recorded, for RowLost events.
var (
	errNotHeld = errors.New("outcome refused: the row is no longer held by this attempt")
	errGaveUp  = errors.New("outcome not recorded: the database could not be reached before the worker stopped")
)

// release hands a row back without spending an attempt, retrying connection
// errors until the database answers (see flush) or the worker stops.
func (w *Worker) release(t *task, reason string) recorded {
	ctx := w.loopCtx
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return recordedGaveUp
		}
		qctx, cancel := context.WithTimeout(ctx, w.lease)
		var ok bool
		err := w.pool.QueryRow(qctx, sqlRelease, t.row.ID, t.row.WorkerID, t.row.Attempt, t.row.Token, reason).Scan(&ok)
		cancel()
		switch {
		case err == nil && ok:
			return recordedOK
		case err == nil:
			return recordedNotHeld
		case !retryable(err):
			w.logger.Error("worker: release failed; the row returns to the queue when its lease expires",
				"file_id", t.row.ID, "error", err)
			return recordedGaveUp
		}
		w.logger.Debug("worker: release failed; retrying", "file_id", t.row.ID, "error", err)
		if !retry.Sleep(ctx, backoff(n)) {
			return recordedGaveUp
		}
	}
}

// recordLoop batches the outcomes of all slots: whatever queued up while the
// previous statement ran goes into the next one. When it stops, the outcomes
// still queued are given up.
func (w *Worker) recordLoop(ctx context.Context) {
	var batch []*outcome
	for {
		select {
		case <-w.recordBell:
		case <-ctx.Done():
			w.recordMu.Lock()
			w.recordClosed = true
			left := w.recordQueue
			w.recordQueue = nil
			w.recordMu.Unlock()
			for _, o := range left {
				w.finish(o, recordedGaveUp)
			}
			return
		}
		for {
			w.recordMu.Lock()
			n := min(len(w.recordQueue), w.maxBatch)
			batch = append(batch[:0], w.recordQueue[:n]...)
			w.recordQueue = append(w.recordQueue[:0], w.recordQueue[n:]...)
			w.recordMu.Unlock()
			if n == 0 {
				break
			}
			var completes, fails []*outcome
			for _, o := range batch {
				if o.kind == kindComplete {
					completes = append(completes, o)
				} else {
					fails = append(fails, o)
				}
			}
			w.flush(ctx, completes, w.completeMany)
			w.flush(ctx, fails, w.failMany)
			clear(batch)
		}
	}
}

// flush records a batch, retrying connection errors with backoff until the
// database answers or the worker stops; each outcome is finished with its
// answer. An outcome is sent however long the database was away: the
// fenced call refuses it if the row was taken back meanwhile, and records it
// if not (files.reap does not count the database's own outage against the
// lease), so finished work is not thrown away on a guess of the local clock.
func (w *Worker) flush(ctx context.Context, obs []*outcome, send func(context.Context, []*outcome) (map[int64]bool, error)) {
	var down time.Time
	for n := 1; len(obs) > 0; n++ {
		if ctx.Err() != nil {
			break
		}
		qctx, cancel := context.WithTimeout(ctx, w.lease)
		took, err := send(qctx, obs)
		cancel()
		if err == nil {
			for _, o := range obs {
				if took[o.t.row.ID] {
					w.finish(o, recordedOK)
				} else {
					w.finish(o, recordedNotHeld)
				}
			}
			if !down.IsZero() {
				w.logger.Info("worker: outcomes recorded again", "down_for", time.Since(down).Round(time.Millisecond))
			}
			return
		}
		if !retryable(err) {
			w.salvage(ctx, obs, send, err)
			return
		}
		switch {
		case claim.RaceLost(err):
			w.logger.Debug("worker: recording outcomes lost a race; retrying", "rows", len(obs), "error", err)
		case down.IsZero():
			down = time.Now()
			w.logger.Warn("worker: cannot record outcomes; retrying until the database answers", "rows", len(obs), "error", err)
		default:
			w.logger.Debug("worker: still cannot record outcomes", "rows", len(obs), "error", err)
		}
		if !retry.Sleep(ctx, backoff(n)) {
			break
		}
	}
	for _, o := range obs {
		w.finish(o, recordedGaveUp)
	}
}

// salvage handles a batch the database refused (a result it cannot store, say
// a string with a NUL character): each outcome is tried alone, so that one
// bad row does not cost the others their outcomes; a refused result becomes a
// permanent failure that says why, a refused report is dropped.
func (w *Worker) salvage(ctx context.Context, obs []*outcome, send func(context.Context, []*outcome) (map[int64]bool, error), err error) {
	if len(obs) > 1 {
		for _, o := range obs {
			w.flush(ctx, []*outcome{o}, send)
		}
		return
	}
	o := obs[0]
	w.logger.Error("worker: the database refused an outcome", "file_id", o.t.row.ID, "error", err)
	switch {
	case o.kind == kindComplete:
		o.kind, o.retryable, o.result = kindFail, false, nil
		o.message = "the result could not be recorded: " + err.Error()
		w.flush(ctx, obs, w.failMany)
	case o.report != nil:
		o.report = nil
		w.flush(ctx, obs, send)
	default:
		w.finish(o, recordedGaveUp)
	}
}

func (w *Worker) completeMany(ctx context.Context, obs []*outcome) (map[int64]bool, error) {
	if len(obs) == 1 {
		// files.complete plans once per connection; complete_many each call.
		o := obs[0]
		var took bool
		if err := w.pool.QueryRow(ctx, sqlCompleteOne, o.t.row.ID, o.t.row.WorkerID, int32(o.t.row.Attempt),
			o.t.row.Token, o.result, o.report).Scan(&took); err != nil {
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
	rows, err := w.pool.Query(ctx, sqlComplete, ids, wids, attempts, tokens, results, reports)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	took := make(map[int64]bool, len(obs))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		took[id] = true
	}
	return took, rows.Err()
}

func (w *Worker) failMany(ctx context.Context, obs []*outcome) (map[int64]bool, error) {
	ids, wids, attempts, tokens := make([]int64, len(obs)), make([]string, len(obs)), make([]int32, len(obs)), make([]string, len(obs))
	errs, retry, reports := make([]string, len(obs)), make([]bool, len(obs)), make([]*string, len(obs))
	for i, o := range obs {
		ids[i], wids[i], attempts[i], tokens[i] = o.t.row.ID, o.t.row.WorkerID, int32(o.t.row.Attempt), o.t.row.Token
		errs[i], retry[i], reports[i] = o.message, o.retryable, o.report
	}
	rows, err := w.pool.Query(ctx, sqlFail, ids, wids, attempts, tokens, errs, retry, reports)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	took := make(map[int64]bool, len(obs))
	byID := make(map[int64]*outcome, len(obs))
	for _, o := range obs {
		byID[o.t.row.ID] = o
	}
	for rows.Next() {
		var (
			id       int64
			state    string
			runAfter time.Time
		)
		if err := rows.Scan(&id, &state, &runAfter); err != nil {
			return nil, err
		}
		took[id] = true
		if state == "pending" {
			// Nobody announces a retry when it comes due: look then.
			w.claimer.WakeAt(runAfter)
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
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true // network errors and timeouts
	}
	if strings.HasPrefix(pgErr.Code, "08") { // connection exception
		return true
	}
	switch pgErr.Code {
	case "40001", "40P01", // serialization failure, deadlock
		"57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
		"53300", "25006", "55P03", "57014": // too many connections, read-only (standby), lock timeout, query cancelled
		return true
	}
	return false
}

// backoff is the delay before retry n of an outcome: from 50ms up to 5s.
func backoff(n int) time.Duration { return retry.Backoff(50*time.Millisecond, 5*time.Second, n) }
