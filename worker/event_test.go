package worker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/worker"
)

// eventLog collects a worker's events.
type eventLog struct {
	mu      sync.Mutex
	events  []worker.Event
	changed chan struct{} // rung on every event
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{}, 1)} }

func (l *eventLog) Observe(e worker.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// of returns the events of one row, in the order observed.
func (l *eventLog) of(id int64) []worker.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []worker.Event
	for _, e := range l.events {
		if e.Job.ID == id {
			out = append(out, e)
		}
	}
	return out
}

// await waits until cond holds, checking it after each event.
func (l *eventLog) await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timeout := time.NewTimer(patience)
	defer timeout.Stop()
	for !cond() {
		select {
		case <-l.changed:
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func kinds(evs []worker.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Kind.String()
	}
	return out
}

// Every row that starts ends with exactly one event that tells its outcome:
// done, a failure that is retried (with the time of the retry), a permanent
// failure, a release. A row's events reach the observer one at a time and in
// order, also when the row runs again before the end of its previous attempt
// has been observed: here the observer holds the end event of each attempt
// that is retried or released until the next attempt's handler has started,
// and the next attempt's start still comes after it.
func TestObserverSeesEveryRowStartAndEnd(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var released, ranAgain sync.Map
	nextRun := map[string]chan struct{}{"src-3": make(chan struct{}), "src-4": make(chan struct{})}
	runsAgain := func(job *worker.Job) {
		if _, twice := ranAgain.LoadOrStore(job.Source, true); !twice {
			close(nextRun[job.Source])
		}
	}
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		switch job.Source {
		case "src-1":
			return &worker.Result{Output: "ok", Duration: 1500 * time.Millisecond}, nil
		case "src-2":
			return nil, worker.Permanent(errors.New("bad input"))
		case "src-3":
			if job.Attempt == 1 {
				return nil, errors.New("flaky")
			}
			runsAgain(job)
			return nil, nil
		default:
			if _, twice := released.LoadOrStore(job.ID, true); !twice {
				return nil, worker.Release(errors.New("disk full"))
			}
			runsAgain(job)
			return nil, nil
		}
	})
	log := newEventLog()
	slow := worker.ObserverFunc(func(e worker.Event) {
		if e.Kind != worker.RowReleased && (e.Kind != worker.RowFailed || e.RetryAt.IsZero()) {
			return
		}
		select {
		case <-nextRun[e.Job.Source]:
		case <-time.After(patience):
			t.Errorf("row %d: its next attempt did not start while its %s event was held", e.Job.ID, e.Kind)
		}
	})
	// Slots to spare: the row released runs again in another slot while its
	// release is being observed in the first.
	start(t, pool, &worker.Config{Handler: h, Slots: 6, Observer: worker.Observers(nil, slow, log)})
	if _, err := pool.Exec(context.Background(), "INSERT INTO files.queues (queue, backoff_base, backoff_max) VALUES ('default', '10 ms', '20 ms')"); err != nil {
		t.Fatal(err)
	}
	ids := insert(t, pool, 4)
	want := map[int64][]string{
		ids[0]: {"started", "done"},
		ids[1]: {"started", "failed"},
		ids[2]: {"started", "failed", "started", "done"},
		ids[3]: {"started", "released", "started", "done"},
	}
	log.await(t, "every row's last event", func() bool {
		for _, id := range ids {
			if len(log.of(id)) < len(want[id]) {
				return false
			}
		}
		return true
	})

	for _, id := range ids {
		evs := log.of(id)
		if got := kinds(evs); !slices.Equal(got, want[id]) {
			t.Errorf("row %d: events %v, want %v", id, got, want[id])
			continue
		}
		for _, e := range evs {
			if e.Job.Queue != "default" || e.Job.WorkerID == "" || e.Job.Attempt < 1 {
				t.Errorf("row %d: event %s with job %+v", id, e.Kind, e.Job)
			}
		}
	}
	if t.Failed() {
		return
	}
	if evs := log.of(ids[0]); evs[1].Duration != 1500*time.Millisecond || evs[1].Elapsed <= 0 || evs[1].Err != nil {
		t.Errorf("done event: %+v", evs[1])
	}
	if evs := log.of(ids[1]); !evs[1].RetryAt.IsZero() || evs[1].Err == nil || evs[1].Err.Error() != "bad input" {
		t.Errorf("permanent failure: retry at %v, err %v", evs[1].RetryAt, evs[1].Err)
	}
	if evs := log.of(ids[2]); evs[1].RetryAt.IsZero() || evs[1].Err == nil || evs[1].Err.Error() != "flaky" || evs[2].Job.Attempt != 2 {
		t.Errorf("retried failure: retry at %v, err %v, next attempt %d", evs[1].RetryAt, evs[1].Err, evs[2].Job.Attempt)
	}
	if evs := log.of(ids[3]); evs[1].Err == nil || evs[1].Err.Error() != "disk full" {
		t.Errorf("release: err %v", evs[1].Err)
	}
}

func TestEventKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[worker.EventKind]string{
		worker.RowStarted: "started", worker.RowDone: "done", worker.RowFailed: "failed", worker.RowReleased: "released",
		worker.RowLost: "lost", worker.RowCancelled: "cancelled", worker.EventKind(99): "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", k, got, want)
		}
	}
}
