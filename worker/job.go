package worker

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Causes of a handler's context cancellation, read with context.Cause.
var (
	// ErrLeaseLost: the row is no longer held by this attempt (its lease
	// expired and it was reaped, or it was taken back). The outcome is
	// discarded.
	ErrLeaseLost = errors.New("worker: lease lost")

	// ErrCancelled: an operator cancelled the row (files.cancel). The outcome
	// is discarded.
	ErrCancelled = errors.New("worker: row cancelled")

	// ErrStopping: the worker is stopping (StopAndCancel, or Stop's context
	// ended). A handler that returns an error then has its row released
	// without spending an attempt.
	ErrStopping = errors.New("worker: stopping")

	// ErrTimeout: the handler ran longer than Config.Timeout. The attempt
	// fails and the row is retried.
	ErrTimeout = errors.New("worker: handler timed out")
)

// Job is a claimed row, as a handler sees it.
type Job struct {
	ID          int64
	Queue       string
	Priority    int
	Source      string          // object key or URI of the input
	Payload     json.RawMessage // a JSON object
	Attempt     int             // from 1
	MaxAttempts int
	WorkerID    string // the slot running the job
	CreatedAt   time.Time
	ClaimedAt   time.Time
	LastError   string // error of the previous attempt, if any
}

// Result is what a handler reports. Returned with a nil error it completes
// the row; returned with an error its report fields are recorded on the failed
// attempt too.
type Result struct {
	// Output is recorded as the row's result (JSON). Nil records NULL. On
	// failure it is kept in the attempt's output.
	Output any

	// ExitCode of the backend program, if there was one.
	ExitCode *int

	// Duration of the processing. Defaults to the handler's run time.
	Duration time.Duration

	// StderrTail is the last part of the backend's standard error.
	StderrTail string
}

// Handler processes one job. It should return soon after ctx is cancelled;
// context.Cause(ctx) tells why (ErrLeaseLost, ErrCancelled, ErrStopping,
// ErrTimeout).
type Handler interface {
	Handle(ctx context.Context, job *Job) (*Result, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) (*Result, error)

// Handle calls f(ctx, job).
func (f HandlerFunc) Handle(ctx context.Context, job *Job) (*Result, error) { return f(ctx, job) }

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the row fails at once, without retries.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type releaseError struct{ err error }

func (e *releaseError) Error() string { return e.err.Error() }
func (e *releaseError) Unwrap() error { return e.err }

// Release asks for the row to be handed back to the queue without spending an
// attempt, because the trouble is this worker's rather than the row's (a full
// local disk, a missing tool). err is recorded as the reason. So that a row
// cannot bounce forever, a row this process released Config.MaxReleases times
// in a row fails (retryably) the next time instead.
func Release(err error) error {
	if err == nil {
		err = errors.New("released by handler")
	}
	return &releaseError{err: err}
}

// IsRelease reports whether err was made by Release.
func IsRelease(err error) bool {
	var r *releaseError
	return errors.As(err, &r)
}
