package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/queue"
)

// A row is queued only if the transaction that records the upload commits.
func ExampleClient_EnqueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	q := queue.New(pool, nil)
	opts := &queue.EnqueueOpts{Queue: "reports", Priority: 5}

	// The caller's writes fail: neither they nor the row are kept.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := q.EnqueueTx(ctx, tx, "uploads/a.csv", opts); err != nil {
		panic(err)
	}
	tx.Rollback(ctx) //nolint:errcheck // the example's point

	// They commit: so do the rows.
	tx, err = pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := q.EnqueueManyTx(ctx, tx, []string{"uploads/b.csv", "uploads/c.csv"}, opts); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	st, err := q.Status(ctx, nil)
	if err != nil {
		panic(err)
	}
	for _, qs := range st.Queues {
		if qs.Queue == "reports" {
			fmt.Printf("%s: %d pending\n", qs.Queue, qs.Pending)
		}
	}
	// Output: reports: 2 pending
}

// Pause a queue while its input is being replaced, then resume it.
func ExampleClient_Pause() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	q := queue.New(pool, nil)

	known, err := q.Pause(ctx, "nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("known before:", known)
	if err := q.Resume(ctx, "nightly"); err != nil {
		panic(err)
	}
	err = q.Resume(ctx, "no-such-queue")
	fmt.Println(errors.Is(err, queue.ErrNoQueue))
	// Output:
	// known before: false
	// true
}

// Enqueue a data set as a batch, keyed by source, then the same data set
// again with one more object: only the new one is queued.
func ExampleClient_EnqueueMany_batch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	q := queue.New(pool, nil)
	opts := &queue.EnqueueOpts{Queue: "scans", Batch: "scans-2026-12-01", KeyBySource: true}

	n, err := q.EnqueueMany(ctx, []string{"a.tif", "b.tif", "c.tif"}, opts)
	if err != nil {
		panic(err)
	}
	fmt.Println("queued", n)
	n, err = q.EnqueueMany(ctx, []string{"a.tif", "b.tif", "c.tif", "d.tif"}, opts)
	if err != nil {
		panic(err)
	}
	fmt.Println("queued", n)

	p, err := q.Batch(ctx, "scans-2026-12-01")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s: %d rows, %d pending, finished %v\n", p.Batch, p.Total, p.Pending, p.Finished())
	// Output:
	// queued 3
	// queued 1
	// scans-2026-12-01: 4 rows, 4 pending, finished false
}
