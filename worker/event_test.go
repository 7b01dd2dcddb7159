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
	mu     sync.Mutex
	events []worker.Event
}

func (l *eventLog) Observe(e worker.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// of returns the kinds of the events of one row, in order.
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

func kinds(evs []worker.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Kind.String()
	}
	return out
}

// Every row that starts ends with exactly one event that tells its outcome:
// done, a failure that is retried (with the time of the retry), a permanent
// failure, a release.
func TestObserverSeesEveryRowStartAndEnd(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var released sync.Map
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
			return nil, nil
		default:
			if _, again := released.LoadOrStore(job.ID, true); !again {
				return nil, worker.Release(errors.New("disk full"))
			}
			return nil, nil
		}
	})
	var log eventLog
	start(t, pool, &worker.Config{Handler: h, Slots: 4, Observer: worker.Observers(nil, &log)})
	if _, err := pool.Exec(context.Background(), "INSERT INTO files.queues (queue, backoff_base, backoff_max) VALUES ('default', '10 ms', '20 ms')"); err != nil {
		t.Fatal(err)
	}
	ids := insert(t, pool, 4)
	waitCount(t, pool, 4, "SELECT count(*) FROM files.files WHERE state IN ('done', 'failed')")
	waitFor(t, "the last end event", func() bool { return len(log.of(ids[2])) == 4 && len(log.of(ids[3])) == 4 })

	want := map[int64][]string{
		ids[0]: {"started", "done"},
		ids[1]: {"started", "failed"},
		ids[2]: {"started", "failed", "started", "done"},
		ids[3]: {"started", "released", "started", "done"},
	}
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
