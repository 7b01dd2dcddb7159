package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/worker"
)

// Outcomes that cannot be recorded before the worker stops are given up:
// Stop returns at its deadline, each row ends once, as lost, and stays
// running in the database for its lease to bring it back; none is recorded.
func TestOutcomesGivenUpWhenTheDatabaseIsGone(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	test := pgtest.PoolFor(t, url)
	proxy := pgtest.StartProxy(t, url)
	pool := pgtest.PoolFor(t, proxy.URL(t, url))

	var mu sync.Mutex
	ends := map[int64][]worker.EventKind{}
	obs := worker.ObserverFunc(func(e worker.Event) {
		if e.Kind != worker.RowStarted {
			mu.Lock()
			ends[e.Job.ID] = append(ends[e.Job.ID], e.Kind)
			mu.Unlock()
		}
	})
	g := newGate()
	w := start(t, pool, &worker.Config{Handler: g, Slots: 3, SafetyNet: time.Hour, Observer: obs})
	settled(t, w)
	ids := insert(t, test, 3)
	for range ids {
		g.next(t, "the three rows")
	}

	proxy.Refuse()
	proxy.Drop()
	close(g.open) // the handlers complete, and nothing can record it
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := w.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline's error", err)
	}

	if s := w.Stats(); s.Lost != 3 || s.Done != 0 {
		t.Errorf("lost %d, done %d; want 3 and 0", s.Lost, s.Done)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if got := ends[id]; len(got) != 1 || got[0] != worker.RowLost {
			t.Errorf("row %d ended %v, want once as lost", id, got)
		}
	}
	if n := count(t, test, "SELECT count(*) FROM files.files WHERE state = 'running'"); n != 3 {
		t.Errorf("%d rows still running in the database, want 3", n)
	}
	if n := count(t, test, "SELECT count(*) FROM files.attempts"); n != 0 {
		t.Errorf("%d attempts recorded, want 0", n)
	}
}
