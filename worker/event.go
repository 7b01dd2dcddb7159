package worker

import "time"

// EventKind says what happened to a row in a slot.
type EventKind int

const (
	// RowStarted: a slot claimed the row and its handler starts.
	RowStarted EventKind = iota
	// RowDone: the handler succeeded and the row's completion was recorded.
	RowDone
	// RowFailed: the attempt failed and was recorded; Event.RetryAt tells
	// whether the row runs again.
	RowFailed
	// RowReleased: the row went back to the queue without spending an
	// attempt (Release, or the worker stopping).
	RowReleased
	// RowLost: no outcome was recorded: the lease was lost (Event.Err is
	// ErrLeaseLost), the fenced call refused it, or the database could not
	// be reached before the lease expired.
	RowLost
	// RowCancelled: an operator cancelled the row while it ran.
	RowCancelled
)

var eventNames = [...]string{"started", "done", "failed", "released", "lost", "cancelled"}

// String returns the kind in lower case: "started", "done", "failed",
// "released", "lost" or "cancelled".
func (k EventKind) String() string {
	if k < 0 || int(k) >= len(eventNames) {
		return "unknown"
	}
	return eventNames[k]
}

// Event is one row starting or ending in a slot. Every started row ends
// with exactly one event of another kind.
type Event struct {
	Kind EventKind
	// Job is the row as the handler sees it. Do not modify it.
	Job *Job
	// Elapsed is how long the handler ran; zero for RowStarted.
	Elapsed time.Duration
	// Duration is the processing time the handler reported
	// (Result.Duration, e.g. the backend program's run time), else Elapsed.
	Duration time.Duration
	// Err says why a row failed, was released or lost; nil otherwise.
	Err error
	// RetryAt is, for RowFailed, when the row becomes claimable again; zero
	// when it failed for good.
	RetryAt time.Time
}

// Observer receives a Worker's events, for metrics and logs. Observe is
// called from the slots' goroutines and, for most row ends, from the one that
// records outcomes in batches, so it must return quickly.
//
// Events of different rows come concurrently and in no particular order. The
// events of one row come one at a time and in order: an attempt's start
// before its end, and its end before the start of the row's next attempt in
// the same Worker, even when the row was handed back (a retry, a release, a
// reap) and claimed again before that end was observed. The next attempt
// runs meanwhile; only its events wait. An attempt that lost its lease ends
// when its handler returns, so a handler that ignores its context's
// cancellation holds back the events of the row's later attempts in this
// Worker until it returns. Attempts in other Workers are not ordered with
// these.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// Observers returns an Observer that hands each event to every non-nil one
// of obs, in order.
func Observers(obs ...Observer) Observer {
	var list []Observer
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	return ObserverFunc(func(e Event) {
		for _, o := range list {
			o.Observe(e)
		}
	})
}
