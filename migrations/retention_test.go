package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// summaryMatchesTable compares files.queue_summary, which adds up the counts
// the SQL API keeps, with a count of the table itself.
func summaryMatchesTable(t *testing.T, pool *pgxpool.Pool, step string) {
	t.Helper()
	const kept = `SELECT queue, pending, running, done, failed, cancelled, scheduled FROM files.queue_summary ORDER BY queue`
	const counted = `
SELECT q.queue,
       count(f.id) FILTER (WHERE f.state = 'pending'),
       count(f.id) FILTER (WHERE f.state = 'running'),
       count(f.id) FILTER (WHERE f.state = 'done'),
       count(f.id) FILTER (WHERE f.state = 'failed'),
       count(f.id) FILTER (WHERE f.state = 'cancelled'),
       count(f.id) FILTER (WHERE f.state = 'pending' AND f.run_after > now())
FROM files.queues q LEFT JOIN files.files f ON f.queue = q.queue
GROUP BY q.queue ORDER BY q.queue`
	// One transaction: one snapshot and one now() for both reads.
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	read := func(sql string) string {
		rows, err := tx.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var q string
			var n [6]int64
			err := r.Scan(&q, &n[0], &n[1], &n[2], &n[3], &n[4], &n[5])
			return fmt.Sprintf("%s pending=%d running=%d done=%d failed=%d cancelled=%d scheduled=%d", q, n[0], n[1], n[2], n[3], n[4], n[5]), err
		})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		return strings.Join(lines, "\n")
	}
	if got, want := read(kept), read(counted); got != want {
		t.Fatalf("%s: files.queue_summary says\n%s\nthe table holds\n%s", step, got, want)
	}
}

// Every way a row is added, ends, opens again or goes moves its queue's
// counts, in the statement that does it, and folding them changes nothing.
func TestQueueCountsFollowEveryChange(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "SELECT files.register_worker('gone', lease_timeout => '1 second', key => $1)", testKey)
	mustExec(t, pool, `INSERT INTO files.files (queue, source, batch, max_attempts)
		SELECT CASE WHEN i % 3 = 0 THEN 'b' ELSE 'a' END, 's' || i, CASE WHEN i % 4 = 0 THEN 'set' END,
		       CASE WHEN i % 5 = 0 THEN 1 ELSE 5 END
		FROM generate_series(1, 40) i`)
	summaryMatchesTable(t, pool, "after enqueue")
	// The usual insert (pending rows of one known queue, no key, no batch),
	// one row and many, and the same into a queue not known yet.
	mustExec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('a', 'one more')")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'b', 'more ' || i FROM generate_series(1, 5) i")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'new', 'new ' || i FROM generate_series(1, 3) i")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'a', 'none' WHERE false")
	summaryMatchesTable(t, pool, "after the usual inserts")

	var held []held
	for i := range 16 {
		held = append(held, claimOne(t, pool, fmt.Sprintf("w%d", i)))
	}
	held = append(held, claimOne(t, pool, "gone"))
	summaryMatchesTable(t, pool, "after claims")

	h := held[0]
	if !queryBool(t, pool, "SELECT files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token) {
		t.Fatal("complete refused")
	}
	var ids []int64
	var workers, tokens []string
	var attempts []int32
	for _, h := range held[1:5] {
		ids, workers, attempts, tokens = append(ids, h.id), append(workers, h.worker), append(attempts, int32(h.attempt)), append(tokens, h.token)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.complete_many($1, $2, $3, $4)", ids, workers, attempts, tokens); n != 4 {
		t.Fatalf("complete_many marked %d rows", n)
	}
	summaryMatchesTable(t, pool, "after completes")
	for i, h := range held[5:9] {
		if !queryBool(t, pool, "SELECT files.fail($1, $2, $3, $4, 'no', $5)", h.id, h.worker, h.attempt, h.token, i%2 == 0) {
			t.Fatal("fail refused")
		}
	}
	h = held[9]
	if !queryBool(t, pool, "SELECT files.release($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token) {
		t.Fatal("release refused")
	}
	summaryMatchesTable(t, pool, "after failures and a release")

	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'gone'")
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE worker_id = 'gone'")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap returned %d rows", n)
	}
	summaryMatchesTable(t, pool, "after a reap")

	mustExec(t, pool, "SELECT files.cancel($1, $2)", held[10].id, held[11].id)
	mustExec(t, pool, "SELECT files.cancel(VARIADIC array_agg(id)) FROM (SELECT id FROM files.files WHERE state = 'pending' ORDER BY id LIMIT 3) p")
	summaryMatchesTable(t, pool, "after cancels")
	mustExec(t, pool, "SELECT files.retry(NULL, NULL)")
	mustExec(t, pool, "SELECT files.retry(array_agg(id)) FROM files.files WHERE state IN ('done', 'cancelled') AND id % 2 = 0")
	summaryMatchesTable(t, pool, "after retries")
	mustExec(t, pool, "DELETE FROM files.files WHERE id % 7 = 0")
	mustExec(t, pool, "INSERT INTO files.files (queue, source, state, finished_at) VALUES ('c', 'imported', 'done', now())")
	summaryMatchesTable(t, pool, "after deletes and an insert of a finished row")

	mustExec(t, pool, "SELECT files.fold_counts()")
	mustExec(t, pool, "SELECT files.fold_counts()")
	summaryMatchesTable(t, pool, "after folds")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.queue_counts WHERE NOT folded"); n != 0 {
		t.Fatalf("%d lines left unfolded", n)
	}
	// An hour later the minutes fold into one line per queue, with the same sums.
	mustExec(t, pool, "UPDATE files.queue_counts SET at = at - interval '2 hours'")
	mustExec(t, pool, "SELECT files.fold_counts()")
	summaryMatchesTable(t, pool, "after folding the minutes older than an hour")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.queue_counts WHERE at > '-infinity'"); n != 0 {
		t.Fatalf("%d lines of old minutes left", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.queue_summary WHERE done_last_hour + failed_last_hour + cancelled_last_hour > 0"); n != 0 {
		t.Fatal("rows that ended two hours ago still count in the last hour")
	}

	mustExec(t, pool, "TRUNCATE files.files")
	summaryMatchesTable(t, pool, "after TRUNCATE")
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('again')")
	mustExec(t, pool, "SELECT files.recount()")
	summaryMatchesTable(t, pool, "after recount")
}

// The rates of the last minute and hour count each row that ended once.
func TestQueueSummaryRates(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "INSERT INTO files.files (source) SELECT 's' || i FROM generate_series(1, 5) i")
	for i := range 5 {
		h := claimOne(t, pool, fmt.Sprintf("w%d", i))
		if i < 3 {
			queryBool(t, pool, "SELECT files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token)
		} else {
			queryBool(t, pool, "SELECT files.fail($1, $2, $3, $4, 'no', false)", h.id, h.worker, h.attempt, h.token)
		}
	}
	mustExec(t, pool, "SELECT files.fold_counts()")
	var doneHour, failedHour, doneMinute int
	var age *string
	if err := pool.QueryRow(context.Background(),
		"SELECT done_last_hour, failed_last_hour, done_last_minute, oldest_pending_age::text FROM files.queue_summary WHERE queue = 'default'").
		Scan(&doneHour, &failedHour, &doneMinute, &age); err != nil {
		t.Fatal(err)
	}
	// A minute that ended since the rows did counts in part: never more.
	if doneHour != 3 || failedHour != 2 || doneMinute < 1 || doneMinute > 3 || age != nil {
		t.Fatalf("done last hour %d, failed last hour %d, done last minute %d, oldest pending %v; want 3, 2, 1-3, none",
			doneHour, failedHour, doneMinute, age)
	}
	if n := queryInt(t, pool, "SELECT finished_last_hour FROM files.queue_stats WHERE queue = 'default' AND state = 'done'"); n != 3 {
		t.Fatalf("queue_stats: %d done in the last hour, want 3", n)
	}

	// The oldest pending row is found across priorities.
	mustExec(t, pool, `INSERT INTO files.files (source, priority, created_at) VALUES
		('new-high', 10, now()), ('old-low', -5, now() - interval '1 hour'), ('mid', 0, now() - interval '10 minutes')`)
	if !queryBool(t, pool, "SELECT oldest_pending_age BETWEEN interval '59 minutes' AND interval '2 hours' FROM files.queue_summary WHERE queue = 'default'") {
		t.Fatal("the oldest pending row of the lowest priority was not found")
	}
}

// finishedAgo enqueues a row of queue q (and batch, unless empty) that ended
// in state the given interval ago, and returns its id.
func finishedAgo(t *testing.T, pool *pgxpool.Pool, q, batch, state, ago string) int64 {
	t.Helper()
	var id int64
	var b *string
	if batch != "" {
		b = &batch
	}
	if err := pool.QueryRow(context.Background(), `INSERT INTO files.files (queue, source, batch, state, finished_at)
		VALUES ($1, $2, $3, $4, now() - $5::interval) RETURNING id`, q, fmt.Sprintf("%s-%s-%s", state, ago, batch), b, state, ago).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func exists(t *testing.T, pool *pgxpool.Pool, id int64) bool {
	t.Helper()
	return queryBool(t, pool, "SELECT EXISTS (SELECT 1 FROM files.files WHERE id = $1)", id)
}

// The pruner deletes finished rows past their queue's or batch's retention,
// at most max_rows per call, and never a row that is not finished, a row of
// a batch that is not finished, or the attempts of a row that is running.
func TestPruneKeepsWhatIsNeeded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	// Queue q keeps done rows a week and failed ones 30 days (the defaults);
	// queue forever keeps everything.
	mustExec(t, pool, "SELECT files.keep_queue('forever', NULL, NULL)")
	mustExec(t, pool, "SELECT files.keep_queue('short', '1 hour', '2 hours')")
	gone := []int64{
		finishedAgo(t, pool, "default", "", "done", "8 days"),
		finishedAgo(t, pool, "default", "", "cancelled", "9 days"),
		finishedAgo(t, pool, "default", "", "failed", "31 days"),
		finishedAgo(t, pool, "short", "", "done", "2 hours"),
		finishedAgo(t, pool, "short", "", "failed", "3 hours"),
	}
	kept := []int64{
		finishedAgo(t, pool, "default", "", "done", "6 days"),
		finishedAgo(t, pool, "default", "", "failed", "10 days"),
		finishedAgo(t, pool, "short", "", "failed", "90 minutes"),
		finishedAgo(t, pool, "forever", "", "done", "1000 days"),
		finishedAgo(t, pool, "forever", "", "failed", "1000 days"),
	}
	// Unfinished rows, however old.
	var pendingID int64
	if err := pool.QueryRow(context.Background(),
		"INSERT INTO files.files (queue, source, created_at) VALUES ('short', 'old-pending', now() - interval '1 year') RETURNING id").Scan(&pendingID); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, pendingID)
	// A running row with a failed attempt before this one.
	mustExec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('busy', 'twice')")
	first := claimOne(t, pool, "w1", "busy")
	queryBool(t, pool, "SELECT files.fail($1, $2, $3, $4, 'once')", first.id, first.worker, first.attempt, first.token)
	mustExec(t, pool, "UPDATE files.files SET run_after = now() WHERE id = $1", first.id)
	claimOne(t, pool, "w2", "busy")
	mustExec(t, pool, "UPDATE files.attempts SET finished_at = now() - interval '1 year', started_at = now() - interval '1 year' WHERE file_id = $1", first.id)
	mustExec(t, pool, "SELECT files.keep_queue('busy', '0', '0')")
	kept = append(kept, first.id)

	// Batches: one still open (an old finished row in it), one finished and
	// kept (no keep set), one finished longer ago than its keep.
	kept = append(kept, finishedAgo(t, pool, "default", "open", "done", "100 days"))
	mustExec(t, pool, "INSERT INTO files.files (source, batch) VALUES ('open-pending', 'open')")
	kept = append(kept, finishedAgo(t, pool, "default", "kept", "done", "100 days"))
	for i := range 3 {
		gone = append(gone, finishedAgo(t, pool, "default", "expired", "done", fmt.Sprintf("%d days", 50+i)))
	}
	gone = append(gone, finishedAgo(t, pool, "other", "expired", "failed", "50 days"))
	mustExec(t, pool, "UPDATE files.batches SET finished_at = now() - interval '40 days' WHERE batch IN ('kept', 'expired')")
	mustExec(t, pool, "SELECT files.keep_batch('expired', '30 days')")
	mustExec(t, pool, "SELECT files.keep_batch('open', '0')")

	// Worker slots: stopped long ago, stopped lately, alive.
	for _, w := range []string{"old", "recent"} {
		mustExec(t, pool, "SELECT files.register_worker($1, key => $2)", w, testKey)
		mustExec(t, pool, "SELECT files.deregister_worker($1, $2)", w, testKey)
	}
	mustExec(t, pool, "UPDATE files.workers SET stopped_at = now() - interval '8 days' WHERE worker_id = 'old'")

	// A dry run deletes nothing and counts everything.
	if n := queryInt(t, pool, "SELECT coalesce(sum(rows), 0) FROM files.prune(1, dry_run => true) WHERE queue IS NOT NULL"); n != len(gone) {
		t.Fatalf("dry run counts %d rows, want %d", n, len(gone))
	}
	for _, id := range gone {
		if !exists(t, pool, id) {
			t.Fatalf("a dry run deleted row %d", id)
		}
	}

	// Two rows per call: the pruner is called until it deletes fewer.
	var calls, deleted int
	for {
		n := queryInt(t, pool, "SELECT coalesce(sum(rows), 0) FROM files.prune(2) WHERE queue IS NOT NULL")
		if n > 2 {
			t.Fatalf("a call with max_rows 2 deleted %d rows", n)
		}
		deleted += n
		calls++
		if n < 2 {
			break
		}
		if calls > 20 {
			t.Fatal("the pruner does not come to an end")
		}
	}
	if deleted != len(gone) {
		t.Errorf("deleted %d rows, want %d", deleted, len(gone))
	}
	for _, id := range gone {
		if exists(t, pool, id) {
			t.Errorf("row %d past its retention is still there", id)
		}
	}
	for _, id := range kept {
		if !exists(t, pool, id) {
			t.Errorf("row %d was deleted", id)
		}
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1", first.id); n != 1 {
		t.Errorf("the running row has %d attempts in its history, want 1", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.batches WHERE batch = 'expired'"); n != 0 {
		t.Error("the expired batch is still there")
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.batch_counts WHERE batch = 'expired'"); n != 0 {
		t.Error("the expired batch's counts are still there")
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.batch_progress WHERE batch IN ('open', 'kept')"); n != 2 {
		t.Error("a batch that is open or kept was deleted")
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE worker_id IN ('old', 'recent', 'w1', 'w2')"); got != 3 {
		t.Errorf("%d of the slots old, recent, w1 and w2 left, want all but old", got)
	}
	summaryMatchesTable(t, pool, "after pruning")
}

// One pruner at a time: a second returns at once with nothing while the
// first holds its turn, or waits for it with wait.
func TestPruneRunsOnOneNodeAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	for range 3 {
		finishedAgo(t, pool, "default", "", "done", "8 days")
	}
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	var n int
	if err := first.QueryRow(ctx, "SELECT coalesce(sum(rows), 0) FROM files.prune(1)").Scan(&n); err != nil || n != 1 {
		t.Fatalf("first pruner: %d rows, %v", n, err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.prune(10)"); n != 0 {
		t.Fatalf("a second pruner ran beside the first: %d lines", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.prune(10, dry_run => true)"); n != 0 {
		t.Fatalf("a dry run ran beside the pruner: %d lines", n)
	}

	// With wait, it waits for its turn: seen in pg_stat_activity, not guessed.
	waited := make(chan int, 1)
	go func() {
		var n int
		if err := pool.QueryRow(ctx, "SELECT coalesce(sum(rows), 0) FROM files.prune(10, wait => true) /* waiting pruner */").Scan(&n); err != nil {
			t.Errorf("waiting pruner: %v", err)
		}
		waited <- n
	}()
	for !queryBool(t, pool, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE query LIKE '%waiting pruner%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`) {
		select {
		case n := <-waited:
			t.Fatalf("the waiting pruner did not wait: %d rows", n)
		default:
		}
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := <-waited; n != 2 {
		t.Fatalf("the waiting pruner deleted %d rows after the first, want the other 2", n)
	}
}

func TestPruneBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, sql := range []string{
		"SELECT * FROM files.prune(0)",
		"SELECT * FROM files.prune(100001)",
		"SELECT files.keep_queue('', '1 day', '1 day')",
		"SELECT files.keep_queue('q', '-1 day', '1 day')",
		"SELECT files.keep_batch('none', '1 day')",
	} {
		if _, err := pool.Exec(context.Background(), sql); err == nil {
			t.Errorf("%s: no error", sql)
		} else if s := sqlState(err); s != "22023" && s != "23514" && s != "P0002" {
			t.Errorf("%s: SQLSTATE %s (%v)", sql, s, err)
		}
	}
}
