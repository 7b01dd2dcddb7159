package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// decide turns a handler's return into the outcome to record.
func (w *Worker) decide(t *task, res *Result, err error, elapsed time.Duration, cause error) *outcome {
	o := &t.out
	*o = outcome{t: t}
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
		o.reportText = rep.marshal()
		o.report = &o.reportText
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
		w.logger.Warn("worker: outcome lost: not recorded (the worker stopped first, or the database refused it); the row runs again",
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

// wakeAt makes the claimer look for work at t, when a failed row runs again.
func (w *Worker) wakeAt(t time.Time) { w.claimer.WakeAt(t) }
