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

// testGate is a worker.Gate that the test opens and closes.
type testGate struct {
	mu      sync.Mutex
	closed  bool
	opened  chan struct{} // closed when the gate opens
	waiting chan struct{} // closed at the first Wait
	once    sync.Once
}

func newTestGate() *testGate {
	return &testGate{opened: make(chan struct{}), waiting: make(chan struct{})}
}

func (g *testGate) Open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.closed
}

func (g *testGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (g *testGate) open() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
	close(g.opened)
}

func (g *testGate) Wait(ctx context.Context) error {
	g.once.Do(func() { close(g.waiting) })
	select {
	case <-g.opened:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// While the gate is closed, the slots claim nothing: a node that cannot
// work hands back at most the rows its slots already held, without
// spending their attempts, and claims again by itself once the gate opens.
func TestGateHoldsSlotsBack(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	const slots = 3
	g := newTestGate()
	var (
		mu          sync.Mutex
		first       = true
		whileClosed int
		releases    int
	)
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		if first {
			// The node's disk fills up with this row.
			first = false
			g.close()
			releases++
			return nil, worker.Release(errors.New("work directory out of space"))
		}
		if !g.Open() {
			whileClosed++
			releases++
			return nil, worker.Release(errors.New("work directory out of space"))
		}
		return &worker.Result{}, nil
	})
	w := start(t, pool, &worker.Config{Handler: h, Slots: slots, SafetyNet: time.Hour, Gate: g})
	settled(t, w)
	insert(t, pool, 20)

	select {
	case <-g.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("no slot waited at the closed gate")
	}
	g.open()
	waitCount(t, pool, 20, "SELECT count(*) FROM files.files WHERE state = 'done'")

	mu.Lock()
	defer mu.Unlock()
	if whileClosed >= slots {
		t.Errorf("%d rows started while the gate was closed, want fewer than the %d slots", whileClosed, slots)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'failed'"); n != 0 {
		t.Errorf("%d attempts failed, want none: rows met the closed gate are released", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'released'"); n != releases {
		t.Errorf("%d attempts released, want %d", n, releases)
	}
}
