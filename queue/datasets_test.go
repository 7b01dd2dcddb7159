package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/queue"
)

// A rolled-back EnqueueTx wakes no worker; a committed one wakes them at
// its commit.
func TestEnqueueTxWakesOnlyOnCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	q := queue.New(pool, nil)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN files_pending"); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.EnqueueTx(ctx, tx, "one", &queue.EnqueueOpts{Queue: "tx-wake", Batch: "b", KeyBySource: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := q.EnqueueManyTx(ctx, tx, []string{"two", "three"}, &queue.EnqueueOpts{Queue: "tx-wake", Batch: "b", KeyBySource: true}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !commit {
			// Notifications arrive in commit order: one sent after the
			// rollback comes first unless the rollback sent one.
			if _, err := pool.Exec(ctx, "SELECT pg_notify('files_pending', 'marker')"); err != nil {
				t.Fatal(err)
			}
			if got := next(); got != "marker" {
				t.Fatalf("a rolled-back enqueue woke the workers of %q", got)
			}
			if _, err := q.Batch(ctx, "b"); !errors.Is(err, queue.ErrNoBatch) {
				t.Fatalf("the rolled-back batch: %v, want ErrNoBatch", err)
			}
			continue
		}
		if got := next(); got != "tx-wake" {
			t.Fatalf("after the commit: a notification for %q", got)
		}
		t.Logf("commit returned to notification received: %s", time.Since(start))
	}
	p, err := q.Batch(ctx, "b")
	if err != nil || p.Total != 3 || p.Pending != 3 {
		t.Fatalf("batch b: %+v, %v", p, err)
	}
}

// Enqueues of the same keys at the same time queue each key once, and a
// keyed Enqueue of a key that is there returns its row with ErrDuplicate.
func TestKeyedEnqueueRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	q := queue.New(pool, nil)
	var sources []string
	for i := range 2000 {
		sources = append(sources, fmt.Sprintf("obj/%04d", i))
	}
	opts := &queue.EnqueueOpts{Queue: "race", KeyBySource: true}
	var wg sync.WaitGroup
	added := make([]int64, 4)
	for i := range added {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each goroutine enqueues the sources in chunks of its own size,
			// so that the chunks overlap differently.
			step := 100 * (i + 1)
			for lo := 0; lo < len(sources); lo += step {
				n, err := q.EnqueueMany(ctx, sources[lo:min(lo+step, len(sources))], opts)
				if err != nil {
					t.Error(err)
					return
				}
				added[i] += n
			}
		}()
	}
	wg.Wait()
	total := added[0] + added[1] + added[2] + added[3]
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE queue = 'race'"); total != 2000 || n != 2000 {
		t.Fatalf("the enqueues added %v (%d) rows, the table has %d; want 2000", added, total, n)
	}
	id, err := q.Enqueue(ctx, "obj/0007", opts)
	if !errors.Is(err, queue.ErrDuplicate) {
		t.Fatalf("Enqueue of a key that is there: %d, %v", id, err)
	}
	if want := count(t, pool, "SELECT id FROM files.files WHERE queue = 'race' AND source = 'obj/0007'"); id != int64(want) {
		t.Errorf("Enqueue returned id %d for the duplicate, the row is %d", id, want)
	}
	if id, err := q.Enqueue(ctx, "other source", &queue.EnqueueOpts{Queue: "race", Key: "obj/0007"}); !errors.Is(err, queue.ErrDuplicate) {
		t.Errorf("Enqueue with an explicit key that is there: %d, %v", id, err)
	}
	if _, err := q.EnqueueMany(ctx, []string{"x"}, &queue.EnqueueOpts{Key: "k"}); err == nil {
		t.Error("EnqueueMany with a Key: no error")
	}
	if _, err := q.Enqueue(ctx, "x", &queue.EnqueueOpts{Batch: "bad\nname"}); !errors.Is(err, queue.ErrInvalidBatch) {
		t.Errorf("a batch name with a newline: %v", err)
	}
	// In the caller's transaction, a duplicate leaves the transaction usable.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit: a no-op
	if _, err := q.EnqueueTx(ctx, tx, "obj/0001", opts); !errors.Is(err, queue.ErrDuplicate) {
		t.Fatalf("EnqueueTx of a duplicate: %v", err)
	}
	if _, err := q.EnqueueTx(ctx, tx, "obj/new", opts); err != nil {
		t.Fatalf("EnqueueTx after a duplicate: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
