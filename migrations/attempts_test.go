package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// Every way an attempt ends writes its one history row, at that moment, with
// the claim time of the attempt as started_at; a running attempt has none.
func TestAttemptHistoryAtOutcome(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "SELECT files.register_worker('keeper', key => 'test-key-0123456789')") // keeps the fleet alive for reap
	mustExec(t, pool, "SELECT files.register_worker('gone', lease_timeout => '1 second', key => 'test-key-0123456789')")
	mustExec(t, pool, `INSERT INTO files.files (source, priority) VALUES
		('done', 6), ('failed', 5), ('released', 4), ('cancelled', 3), ('batch', 2), ('lost', 1)`)
	ids, tokens := map[string]int64{}, map[string]string{}
	for _, w := range []string{"done", "failed", "released", "cancelled", "batch"} {
		var id int64
		var token string
		if err := pool.QueryRow(ctx, "SELECT id, claim_token FROM files.claim($1, key => 'test-key-0123456789')", w).Scan(&id, &token); err != nil {
			t.Fatalf("claim for %s: %v", w, err)
		}
		ids[w], tokens[w] = id, token
	}
	if err := pool.QueryRow(ctx, "SELECT id FROM files.claim('gone', key => 'test-key-0123456789')").Scan(new(int64)); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 0 {
		t.Fatalf("%d history rows while every attempt runs, want 0", n)
	}
	time.Sleep(10 * time.Millisecond) // finished_at must be later than started_at

	if !queryBool(t, pool, `SELECT files.complete($1, 'done', 1, $2, '{"k":1}', '{"exit_code":0,"duration_ms":2.5,"stderr_tail":"ok"}')`, ids["done"], tokens["done"]) {
		t.Fatal("complete refused")
	}
	if !queryBool(t, pool, `SELECT files.fail($1, 'failed', 1, $2, 'boom', true, '{"exit_code":3}')`, ids["failed"], tokens["failed"]) {
		t.Fatal("fail refused")
	}
	if !queryBool(t, pool, "SELECT files.release($1, 'released', 1, $2, 'shutting down')", ids["released"], tokens["released"]) {
		t.Fatal("release refused")
	}
	if n := queryInt(t, pool, "SELECT files.cancel($1)", ids["cancelled"]); n != 1 {
		t.Fatalf("cancel took %d rows", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.complete_many(ARRAY[$1::bigint, $1], ARRAY['batch', 'batch'], ARRAY[1, 1], ARRAY[$2, $2])", ids["batch"], tokens["batch"]); n != 1 {
		t.Fatalf("complete_many with an id given twice recorded %d rows, want 1", n)
	}
	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'gone'")
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE worker_id = 'gone'")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap returned %d rows, want 1", n)
	}

	rows, err := pool.Query(ctx, `
		SELECT f.source, a.worker_id, a.attempt, a.outcome, coalesce(a.error, ''), coalesce(a.exit_code, -1),
		       a.started_at = f.claimed_at, a.finished_at > a.started_at, a.duration IS NOT NULL
		FROM files.attempts a JOIN files.files f ON f.id = a.file_id ORDER BY f.priority DESC`)
	if err != nil {
		t.Fatal(err)
	}
	type history struct {
		source, worker string
		attempt        int
		outcome, err   string
		exit           int
		startedAtClaim bool
		finishedLater  bool
		hasDuration    bool
	}
	var got []history
	for rows.Next() {
		var h history
		if err := rows.Scan(&h.source, &h.worker, &h.attempt, &h.outcome, &h.err, &h.exit,
			&h.startedAtClaim, &h.finishedLater, &h.hasDuration); err != nil {
			t.Fatal(err)
		}
		got = append(got, h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []history{
		{"done", "done", 1, "done", "", 0, true, true, true},
		{"failed", "failed", 1, "failed", "boom", 3, true, true, true},
		{"released", "released", 1, "released", "shutting down", -1, true, true, true},
		{"cancelled", "cancelled", 1, "cancelled", "cancelled", -1, true, true, true},
		{"batch", "batch", 1, "done", "", -1, true, true, true},
		{"lost", "gone", 1, "lost", "lost: worker gone stopped heartbeating", -1, true, true, true},
	}
	if len(got) != len(want) {
		t.Fatalf("history:\n got %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("history of %s:\n got %+v\nwant %+v", want[i].source, got[i], want[i])
		}
	}
	// The completing attempt's output is stored once: as its row's result.
	var duration, output, result, tail string
	if err := pool.QueryRow(ctx, `SELECT a.duration::text, coalesce(a.output::text, 'NULL'), f.result::text, a.stderr_tail
		FROM files.attempts a JOIN files.files f ON f.id = a.file_id WHERE a.file_id = $1`,
		ids["done"]).Scan(&duration, &output, &result, &tail); err != nil {
		t.Fatal(err)
	}
	if duration != "00:00:00.0025" || output != "NULL" || result != `{"k": 1}` || tail != "ok" {
		t.Fatalf("done attempt's report: duration %s, output %s, result %s, stderr tail %q", duration, output, result, tail)
	}
}

// claim_batch and complete_many stay right under the generic plans that
// PostgreSQL may switch a function's statements to after a few calls: large
// batches, a stale element refused by the fence, the others recorded.
// BenchmarkCompleteMany measures their cost per row under both kinds of plan.
func TestCompleteManyGenericPlan(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, conn, "SET plan_cache_mode = force_generic_plan")
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 3000) g")
	slots := make([]string, 1000)
	for i := range slots {
		slots[i] = fmt.Sprintf("w%d", i+1)
	}
	for round := range 3 {
		ids, workers, attempts, tokens := claimBatch(t, conn, slots)
		if len(ids) != 1000 {
			t.Fatalf("round %d: claimed %d rows, want 1000", round, len(ids))
		}
		// One stale element: the fence refuses it, the others go through.
		attempts[0]++
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM files.complete_many($1, $2, $3, $4)", ids, workers, attempts, tokens).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 999 {
			t.Fatalf("round %d: complete_many recorded %d rows, want 999", round, n)
		}
		mustExec(t, conn, "SELECT files.release($1, $2, $3, $4)", ids[0], workers[0], attempts[0]-1, tokens[0])
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'done'"); n != 2997 {
		t.Fatalf("%d done attempts, want 2997", n)
	}
}

// claimBatch claims a row for each of slots through files.claim_batch and
// returns the rows as complete_many takes them: ids, worker ids, attempts,
// claim tokens.
func claimBatch(tb testing.TB, conn *pgxpool.Conn, slots []string) (ids []int64, workers []string, attempts []int32, tokens []string) {
	tb.Helper()
	rows, err := conn.Query(context.Background(), "SELECT id, worker_id, attempt, claim_token FROM files.claim_batch($1, key => 'test-key-0123456789')", slots)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var w string
		var a int32
		var k string
		if err := rows.Scan(&id, &w, &a, &k); err != nil {
			tb.Fatal(err)
		}
		ids, workers, attempts, tokens = append(ids, id), append(workers, w), append(attempts, a), append(tokens, k)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return ids, workers, attempts, tokens
}

// Deleting files deletes their attempts, in one statement, whoever deletes
// them (pgworker_admin may delete files but has no right on files.attempts);
// TRUNCATE of files.files empties files.attempts, alone or beside it.
func TestDeletedFilesTakeTheirAttempts(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	finished := func() {
		t.Helper()
		mustExec(t, pool, "INSERT INTO files.files (source, max_attempts) SELECT 'f' || g, 2 FROM generate_series(1, 6) g")
		// Two attempts for each row: a retryable failure, then done.
		for range 2 {
			mustExec(t, pool, `SELECT CASE WHEN c.attempt = 1 THEN files.fail(c.id, c.worker_id, c.attempt, c.claim_token, 'flaky')
			                               ELSE files.complete(c.id, c.worker_id, c.attempt, c.claim_token) END
			                   FROM files.claim('w', NULL, 6, key => 'test-key-0123456789') c`)
			mustExec(t, pool, "UPDATE files.files SET run_after = now() WHERE state = 'pending'")
		}
		if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 12 {
			t.Fatalf("%d attempts, want 12", n)
		}
	}
	finished()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	mustExec(t, tx, "SET LOCAL ROLE pgworker_admin")
	mustExec(t, tx, "DELETE FROM files.files WHERE source IN ('f1', 'f2', 'f3')")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 6 {
		t.Errorf("%d attempts after deleting half the files, want 6", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id"); n != 6 {
		t.Errorf("%d attempts of the remaining files, want 6", n)
	}

	mustExec(t, pool, "TRUNCATE files.files")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 0 {
		t.Errorf("%d attempts after TRUNCATE files.files, want 0", n)
	}
	finished()
	mustExec(t, pool, "TRUNCATE files.files, files.attempts")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 0 {
		t.Errorf("%d attempts after TRUNCATE of both, want 0", n)
	}
}
