package dashboard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/dashboard"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/listener"
)

// TestStreamsShareOneRefresh shows what fifty open browsers cost the
// database next to one: the same refreshes and the same queries. Periodic
// refreshes are set an hour apart, so that only the notifications of the
// rows enqueued drive the loop.
func TestStreamsShareOneRefresh(t *testing.T) {
	t.Parallel()
	cost := map[int]dashboard.Stats{}
	for _, streams := range []int{1, 50} {
		cost[streams] = refreshCost(t, streams, 3)
	}
	one, fifty := cost[1], cost[50]
	t.Logf("3 rows enqueued, each shown by every stream: 1 stream: %d refreshes, %d queries; 50 streams: %d refreshes, %d queries",
		one.Refreshes, one.Queries, fifty.Refreshes, fifty.Queries)
	if one.Refreshes != 3 || fifty.Refreshes != one.Refreshes || fifty.Queries != one.Queries {
		t.Errorf("50 streams cost %d refreshes and %d queries, 1 stream %d and %d: want 3 refreshes each, the same queries",
			fifty.Refreshes, fifty.Queries, one.Refreshes, one.Queries)
	}
}

// refreshCost opens n streams on the Overview, enqueues rows one at a time
// and waits until every stream showed each, and returns what the loop
// spent meanwhile.
func refreshCost(t *testing.T, n, rows int) dashboard.Stats {
	dbURL := pgtest.URL(t)
	pool := pgtest.PoolFor(t, dbURL)
	// A listener already listening, so that no connect rings the loop
	// during the measure.
	l, err := listener.New(&listener.Config{URL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Listen(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testhelp.WaitFor(t, time.Minute, "the listener to listen", func() bool { return l.Stats().Connected })

	s := newStack(t, pool, &dashboard.Config{Listener: l, Interval: time.Hour, SlowInterval: time.Hour, MinInterval: 10 * time.Millisecond})
	streams := make([]*sse, n)
	for i := range streams {
		streams[i] = s.openEvents("overview")
		streams[i].await(t, "the first snapshot", func(sseEvent) bool { return true })
	}
	before := s.dash.Stats()
	if before.Streams != n {
		t.Fatalf("%d streams open, want %d", before.Streams, n)
	}
	for i := 1; i <= rows; i++ {
		s.enqueue("q", fmt.Sprintf("row-%d", i))
		want := fmt.Sprintf(`value="0" max="%d"`, i)
		for _, st := range streams {
			st.await(t, "row "+fmt.Sprint(i), func(ev sseEvent) bool { return strings.Contains(ev.HTML, want) })
		}
	}
	after := s.dash.Stats()
	return dashboard.Stats{Refreshes: after.Refreshes - before.Refreshes, Queries: after.Queries - before.Queries}
}

// TestEveryRefreshMovesTheCounts: a refresh that a notification starts (the
// clock's are an hour apart here) shows every row that moved since the last.
func TestEveryRefreshMovesTheCounts(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, &dashboard.Config{Interval: time.Hour, SlowInterval: time.Hour, MinInterval: 10 * time.Millisecond})
	s.enqueue("photos", "a.jpg", "b.jpg")
	c := s.claim("vm:1:0", "photos")
	s.refresh()
	st := s.openEvents("overview")
	st.await(t, "one running, one pending", func(ev sseEvent) bool {
		return strings.Contains(ev.HTML, `n-pending">1<`) && strings.Contains(ev.HTML, `n-running">1<`)
	})
	s.complete(c, `{}`)
	s.enqueue("other", "x") // its notification starts a refresh
	ev := st.await(t, "the row done and the new queue", func(ev sseEvent) bool {
		return strings.Contains(ev.HTML, `data-queue="other"`)
	})
	if !strings.Contains(ev.HTML, `value="1" max="2"`) || !strings.Contains(ev.HTML, `n-done">1<`) {
		t.Errorf("photos after its row was done:\n%s", ev.HTML)
	}
}
