package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

const testKey = "test-key-0123456789"

// progress is a line of files.batch_progress.
type progress struct {
	Total, Pending, Running, Done, Failed, Cancelled int64
	Finished                                         bool
}

func batchProgress(t *testing.T, pool *pgxpool.Pool, batch string) progress {
	t.Helper()
	var p progress
	err := pool.QueryRow(context.Background(), `SELECT total, pending, running, done, failed, cancelled, finished_at IS NOT NULL
		FROM files.batch_progress WHERE batch = $1`, batch).
		Scan(&p.Total, &p.Pending, &p.Running, &p.Done, &p.Failed, &p.Cancelled, &p.Finished)
	if err != nil {
		t.Fatalf("batch_progress of %s: %v", batch, err)
	}
	return p
}

// batchNotices listens on files_batch and collects the names it carries.
// Until returns them once the marker sent after the test's statements has
// arrived: notifications arrive in commit order, so nothing sent before it
// is still on its way.
type batchNotices struct {
	conn *pgx.Conn
}

func listenBatches(t *testing.T, url string) *batchNotices {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "LISTEN files_batch"); err != nil {
		t.Fatal(err)
	}
	return &batchNotices{conn: conn}
}

func (b *batchNotices) until(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx := context.Background()
	marker := fmt.Sprintf("marker-%p", b)
	mustExec(t, pool, "SELECT pg_notify('files_batch', $1)", marker)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var got []string
	for {
		n, err := b.conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload == marker {
			return got
		}
		got = append(got, n.Payload)
	}
}

type held struct {
	id      int64
	worker  string
	attempt int
	token   string
}

func claimOne(t *testing.T, pool *pgxpool.Pool, worker string, queues ...string) held {
	t.Helper()
	h := held{worker: worker}
	var qs []string
	if len(queues) > 0 {
		qs = queues
	}
	err := pool.QueryRow(context.Background(), "SELECT id, attempt, claim_token FROM files.claim($1, $2, 1, $3)", worker, qs, testKey).
		Scan(&h.id, &h.attempt, &h.token)
	if err != nil {
		t.Fatalf("claim for %s: %v", worker, err)
	}
	return h
}

// Every way a row ends or opens again moves its batch's counts, and the batch
// finishes (finished_at, one notification) when its last row ends.
func TestBatchCountsFollowEveryOutcome(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	notices := listenBatches(t, url)
	mustExec(t, pool, "SELECT files.register_worker('keeper', key => $1)", testKey)
	mustExec(t, pool, "SELECT files.register_worker('gone', lease_timeout => '1 second', key => $1)", testKey)
	mustExec(t, pool, `INSERT INTO files.files (source, batch, max_attempts, priority)
		SELECT 's' || i, 'b1', CASE WHEN i = 4 THEN 1 ELSE 5 END, 10 - i FROM generate_series(1, 6) i`)
	mustExec(t, pool, "INSERT INTO files.files (source, batch) VALUES ('other', 'b2')")
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 6, Pending: 6}) {
		t.Fatalf("after enqueue: %+v", p)
	}

	done := claimOne(t, pool, "w-done")
	failed := claimOne(t, pool, "w-failed")
	retried := claimOne(t, pool, "w-retried")
	lost := claimOne(t, pool, "gone")
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 6, Pending: 2, Running: 4}) {
		t.Fatalf("after four claims: %+v", p)
	}
	if !queryBool(t, pool, "SELECT files.complete($1, $2, $3, $4)", done.id, done.worker, done.attempt, done.token) {
		t.Fatal("complete refused")
	}
	if !queryBool(t, pool, "SELECT files.fail($1, $2, $3, $4, 'bad input', false)", failed.id, failed.worker, failed.attempt, failed.token) {
		t.Fatal("fail refused")
	}
	if !queryBool(t, pool, "SELECT files.fail($1, $2, $3, $4, 'try again')", retried.id, retried.worker, retried.attempt, retried.token) {
		t.Fatal("fail refused")
	}
	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'gone'")
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE id = $1", lost.id)
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap returned %d rows", n)
	}
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 6, Pending: 3, Done: 1, Failed: 2}) {
		t.Fatalf("after done, failed, retry and a lost last attempt: %+v", p)
	}
	mustExec(t, pool, "SELECT files.cancel(VARIADIC array_agg(id)) FROM files.files WHERE batch = 'b1' AND state = 'pending'")
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 6, Done: 1, Failed: 2, Cancelled: 3, Finished: true}) {
		t.Fatalf("after cancelling the rest: %+v", p)
	}
	if got := notices.until(t, pool); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("notifications %q, want b1 once", got)
	}

	// A retry opens the batch again; its end finishes it again.
	if n := queryInt(t, pool, "SELECT files.retry(NULL, 'default')"); n != 2 {
		t.Fatalf("retry took %d rows, want the 2 failed", n)
	}
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 6, Pending: 2, Done: 1, Cancelled: 3}) {
		t.Fatalf("after retry: %+v", p)
	}
	mustExec(t, pool, "DELETE FROM files.files WHERE batch = 'b1' AND state = 'pending'")
	if p := batchProgress(t, pool, "b1"); p != (progress{Total: 4, Done: 1, Cancelled: 3, Finished: true}) {
		t.Fatalf("after deleting the retried rows: %+v", p)
	}
	if p := batchProgress(t, pool, "b2"); p != (progress{Total: 1, Pending: 1}) {
		t.Fatalf("the other batch: %+v", p)
	}
	if got := notices.until(t, pool); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("notifications after the retry %q, want b1 once", got)
	}
}

// When many sessions end a batch's last rows at the same moment, the batch
// finishes exactly once, by the last of them: no reap is needed.
func TestBatchFinishesOnceUnderConcurrentCompletes(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := context.Background()
	notices := listenBatches(t, url)
	mustExec(t, pool, "SELECT files.register_worker('keeper', key => $1)", testKey)
	for round := range 5 {
		batch := fmt.Sprintf("race-%d", round)
		const slots = 16
		mustExec(t, pool, "INSERT INTO files.files (source, batch) SELECT 's' || i, $1 FROM generate_series(1, $2) i", batch, slots)
		rows := make([]held, slots)
		for i := range rows {
			rows[i] = claimOne(t, pool, fmt.Sprintf("w-%d-%d", round, i))
		}
		var start, wg sync.WaitGroup
		start.Add(1)
		for _, h := range rows {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				if _, err := pool.Exec(ctx, "SELECT files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token); err != nil {
					t.Error(err)
				}
			}()
		}
		start.Done()
		wg.Wait()
		if p := batchProgress(t, pool, batch); p != (progress{Total: slots, Done: slots, Finished: true}) {
			t.Fatalf("round %d: %+v", round, p)
		}
		if got := notices.until(t, pool); len(got) != 1 || got[0] != batch {
			t.Fatalf("round %d: notifications %q, want %s once", round, got, batch)
		}
	}
}

// The last two rows of a batch end in two open transactions: the second
// waits for the first to commit before it looks, then sees both rows ended
// and finishes the batch, before any reap. (Each used to see the other's row
// still open, and the batch finished at the next reap.)
func TestBatchFinishesWhenItsLastRowsEndTogether(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := context.Background()
	notices := listenBatches(t, url)
	mustExec(t, pool, "INSERT INTO files.files (source, batch) VALUES ('a', 'together'), ('b', 'together')")
	first, second := claimOne(t, pool, "w-first"), claimOne(t, pool, "w-second")

	tx1 := begin(t, pool)
	if _, err := tx1.Exec(ctx, "SELECT files.complete($1, $2, $3, $4)", first.id, first.worker, first.attempt, first.token); err != nil {
		t.Fatal(err)
	}
	tx2 := begin(t, pool)
	pid1, pid2 := backendPid(t, tx1), backendPid(t, tx2)
	ended := make(chan error, 1)
	go func() {
		_, err := tx2.Exec(ctx, "SELECT files.complete($1, $2, $3, $4)", second.id, second.worker, second.attempt, second.token)
		ended <- err
	}()
	// The second end waits for the first transaction: seen in pg_locks.
	for !queryBool(t, pool, "SELECT $1::int = ANY (pg_blocking_pids($2))", pid1, pid2) {
		select {
		case err := <-ended:
			t.Fatalf("the second end did not wait for the first (err %v)", err)
		default:
		}
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if p := batchProgress(t, pool, "together"); p != (progress{Total: 2, Done: 2, Finished: true}) {
		t.Fatalf("after both ends, before any reap: %+v", p)
	}
	if got := notices.until(t, pool); len(got) != 1 || got[0] != "together" {
		t.Fatalf("notifications %q, want together once", got)
	}
}

// An enqueue into a batch in a long transaction holds nothing that an
// outcome of the batch waits for; the batch stays open for the new row.
func TestBatchEndDoesNotWaitForAnEnqueue(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source, batch) VALUES ('a', 'growing')")
	h := claimOne(t, pool, "w-growing")

	enqueue := begin(t, pool)
	if _, err := enqueue.Exec(ctx, "INSERT INTO files.files (source, batch) VALUES ('b', 'growing')"); err != nil {
		t.Fatal(err)
	}
	// Any wait for a lock fails the outcome instead of hanging the test.
	end := begin(t, pool)
	mustExec(t, end, "SET LOCAL lock_timeout = '5s'")
	var completed bool
	if err := end.QueryRow(ctx, "SELECT files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token).Scan(&completed); err != nil || !completed {
		t.Fatalf("complete: %v, %v", completed, err)
	}
	if err := end.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := enqueue.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if p := batchProgress(t, pool, "growing"); p != (progress{Total: 2, Done: 1, Pending: 1}) {
		t.Fatalf("after the end and the enqueue: %+v", p)
	}
}

// begin opens a transaction on pool, rolled back at the test's end unless it
// was committed.
func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func backendPid(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var pid int
	if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// A unique key is refused a second time in its queue while its row exists,
// and free again once the row is deleted.
func TestUniqueKeys(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source, unique_key) VALUES ('a', 'k1'), ('b', 'k2')")
	mustExec(t, pool, "INSERT INTO files.files (queue, source, unique_key) VALUES ('other', 'a', 'k1')")
	_, err := pool.Exec(ctx, "INSERT INTO files.files (source, unique_key) VALUES ('c', 'k3'), ('a again', 'k1')")
	if sqlState(err) != "23505" {
		t.Fatalf("a duplicate key: %v, want 23505", err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files"); n != 3 {
		t.Fatalf("%d rows after the refused insert, want 3", n)
	}
	mustExec(t, pool, "DELETE FROM files.files WHERE unique_key = 'k1' AND queue = 'default'")
	mustExec(t, pool, "INSERT INTO files.files (source, unique_key) VALUES ('a again', 'k1')")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.unique_keys"); n != 3 {
		t.Fatalf("%d unique keys, want 3", n)
	}
	mustExec(t, pool, "TRUNCATE files.files")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.unique_keys"); n != 0 {
		t.Fatalf("%d unique keys after TRUNCATE, want 0", n)
	}
}

// An outcome without then_queue enqueues nothing, so it does not run the
// enqueue trigger either (an INSERT that adds no row still runs a statement
// trigger: it cost an outcome a third of its time).
func TestCompleteWithoutThenQueueRunsNoEnqueueTrigger(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b')")
	a := claimOne(t, pool, "w-a")
	b := claimOne(t, pool, "w-b")
	for _, c := range []struct {
		name, sql string
		args      []any
	}{
		{"files.complete", "SELECT files.complete($1, $2, $3, $4, '{}')", []any{a.id, a.worker, a.attempt, a.token}},
		{"files.complete_many", "SELECT files.complete_many(ARRAY[$1::bigint], ARRAY[$2], ARRAY[$3::int], ARRAY[$4])",
			[]any{b.id, b.worker, b.attempt, b.token}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'all'"); err != nil {
			t.Fatal(err)
		}
		// The view also counts calls of the session's earlier transactions
		// until they are reported, which never happens inside this one.
		triggered := func() (n int64) {
			if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
				WHERE schemaname = 'files' AND funcname = 'notify_enqueued'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := triggered()
		if _, err := tx.Exec(ctx, c.sql, c.args...); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		calls := triggered() - before
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if calls != 0 {
			t.Errorf("%s without then_queue ran files.notify_enqueued %d times, want 0", c.name, calls)
		}
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 2 {
		t.Fatalf("%d rows done, want 2", n)
	}
}

// A completion with then_queue enqueues each output as a row of the next
// stage, keyed by its key, in the parent's batch, once.
func TestCompleteThenQueue(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "SELECT files.register_worker('keeper', key => $1)", testKey)
	mustExec(t, pool, `INSERT INTO files.files (queue, source, batch, priority, payload, unique_key, max_attempts)
		VALUES ('stage1', 'in/a', 'chain', 7, '{"lang":"en"}', 'in/a', 2), ('stage1', 'in/b', 'chain', 0, '{}', 'in/b', 2)`)
	a := claimOne(t, pool, "w-a", "stage1")
	b := claimOne(t, pool, "w-b", "stage1")
	result := `{"outputs": [{"key": "1/1-x/a.txt"}, {"key": "1/1-x/b.txt"}, {"url": "no key"}]}`

	_, err := pool.Exec(ctx, "SELECT files.complete($1, $2, $3, $4, $5, NULL, 'stage1')", a.id, a.worker, a.attempt, a.token, result)
	if sqlState(err) != "22023" {
		t.Fatalf("then_queue naming the row's own queue: %v, want 22023", err)
	}
	if !queryBool(t, pool, "SELECT files.complete($1, $2, $3, $4, $5, NULL, 'stage2')", a.id, a.worker, a.attempt, a.token, result) {
		t.Fatal("complete refused")
	}
	if queryBool(t, pool, "SELECT files.complete($1, $2, $3, $4, $5, NULL, 'stage2')", a.id, a.worker, a.attempt, a.token, result) {
		t.Fatal("a second complete of the same attempt was accepted")
	}
	_, err = pool.Exec(ctx, "SELECT files.complete($1, $2, $3, $4, $5, NULL, '')", a.id, a.worker, a.attempt, a.token, result)
	if sqlState(err) != "22023" {
		t.Fatalf("an empty then_queue on an outcome that changes nothing: %v, want 22023", err)
	}
	n := queryInt(t, pool, `SELECT count(*) FROM files.files WHERE queue = 'stage2' AND batch = 'chain' AND priority = 7
		AND payload = '{"lang":"en"}' AND max_attempts = 2 AND source = unique_key AND source IN ('1/1-x/a.txt', '1/1-x/b.txt')`)
	if n != 2 {
		t.Fatalf("%d rows in stage2 from the first completion, want 2", n)
	}
	var done []int64
	rows, err := pool.Query(ctx, "SELECT * FROM files.complete_many(ARRAY[$1::bigint], ARRAY[$2], ARRAY[$3::int], ARRAY[$4], ARRAY[$5::jsonb], NULL, 'stage2')",
		b.id, b.worker, b.attempt, b.token, `{"outputs": [{"key": "2/1-y/c.txt"}]}`)
	if err == nil {
		done, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil || len(done) != 1 {
		t.Fatalf("complete_many: %v %v", done, err)
	}
	if p := batchProgress(t, pool, "chain"); p != (progress{Total: 5, Pending: 3, Done: 2}) {
		t.Fatalf("the chain's batch: %+v", p)
	}
}
