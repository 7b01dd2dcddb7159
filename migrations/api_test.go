package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

type claimed struct {
	ID       int64
	Priority int
	Attempt  int
	Token    string
}

func mustExec(t testing.TB, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) {
	t.Helper()
	if _, err := q.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func queryBool(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) bool {
	t.Helper()
	var b bool
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&b); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return b
}

func claim(t *testing.T, pool *pgxpool.Pool, worker string, max int) []claimed {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id, priority, attempt, claim_token FROM files.claim($1, NULL, $2, key => 'test-key-0123456789')", worker, max)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return out
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestClaimRace: 32 connections claim 20,000 rows at once, through files.claim
// and files.get_unprocessed_entry_by_priority, under each isolation level.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(isolation, func(t *testing.T) {
			t.Parallel()
			const rows, conns = 20_000, 32
			url := pgtest.URL(t)
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = conns
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			mustExec(t, pool, `INSERT INTO files.files (source, priority)
				SELECT 'obj-' || g, (g * 7919) % 10 FROM generate_series(1, $1) g`, rows)

			var (
				mu       sync.Mutex
				seen     = make(map[int64]string, rows)
				retries  int
				firstErr error
				wg       sync.WaitGroup
			)
			for c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker := fmt.Sprintf("race-%d", c)
					sql := "SELECT id, priority, attempt, claim_token FROM files.get_unprocessed_entry_by_priority($1, 'test-key-0123456789')"
					args := []any{worker}
					if c%2 == 1 {
						sql = "SELECT id, priority, attempt, claim_token FROM files.claim($1, NULL, $2, key => 'test-key-0123456789')"
						args = append(args, 1+c%5)
					}
					last := claimed{Priority: 1 << 30}
					for {
						r, err := pool.Query(context.Background(), sql, args...)
						var got []claimed
						if err == nil {
							got, err = pgx.CollectRows(r, pgx.RowToStructByPos[claimed])
						}
						if s := sqlState(err); s == "40001" || s == "40P01" {
							mu.Lock()
							retries++
							mu.Unlock()
							continue // a lost race: wait again
						}
						mu.Lock()
						if err != nil && firstErr == nil {
							firstErr = fmt.Errorf("%s: %w", worker, err)
						}
						for _, g := range got {
							if prev, dup := seen[g.ID]; dup && firstErr == nil {
								firstErr = fmt.Errorf("row %d claimed by %s and by %s", g.ID, prev, worker)
							}
							seen[g.ID] = worker
							// Rows never return to pending here, so each connection sees
							// priorities that never increase. (Under stricter isolation a
							// claim that raised 40001 frees the rows it had locked, so a
							// later claim may find a better row again.)
							if isolation == "read committed" && g.Priority > last.Priority && firstErr == nil {
								firstErr = fmt.Errorf("%s claimed priority %d (row %d) after priority %d (row %d)",
									worker, g.Priority, g.ID, last.Priority, last.ID)
							}
							last = g
						}
						done := err != nil || len(got) == 0
						mu.Unlock()
						if done {
							return
						}
					}
				}()
			}
			wg.Wait()
			if firstErr != nil {
				t.Fatal(firstErr)
			}
			if len(seen) != rows {
				t.Fatalf("%d distinct rows claimed, want %d", len(seen), rows)
			}
			if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'running' AND attempt = 1"); n != rows {
				t.Fatalf("%d rows running with attempt 1, want %d", n, rows)
			}
			// A running attempt is its files.files row; history comes at the outcome.
			if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts"); n != 0 {
				t.Fatalf("%d attempt records before any outcome, want 0", n)
			}
			t.Logf("%s: %d claims lost a race with 40001/40P01", isolation, retries)
		})
	}
}

func TestClaimOrderQueuesAndSchedule(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO files.files (source, priority, queue, run_after) VALUES
		('low', 0, 'a', now()), ('high', 9, 'a', now()), ('mid', 5, 'b', now()),
		('later', 99, 'a', now() + interval '1 hour'), ('high2', 9, 'a', now()), ('paused', 50, 'p', now())`)
	mustExec(t, pool, "SELECT files.pause_queue('p')")

	got := claim(t, pool, "w", 10)
	var order []int
	for _, g := range got {
		order = append(order, g.Priority)
	}
	if fmt.Sprint(order) != "[9 9 5 0]" {
		t.Fatalf("claimed priorities %v, want [9 9 5 0] (paused queue and future run_after skipped)", order)
	}
	var sources []string
	rows, _ := pool.Query(ctx, "SELECT source FROM files.files WHERE state = 'running' ORDER BY priority DESC, id")
	sources, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sources) != "[high high2 mid low]" {
		t.Fatalf("running sources %v", sources)
	}

	// A claim restricted to a queue sees only that queue.
	mustExec(t, pool, "INSERT INTO files.files (source, queue) VALUES ('b1', 'b'), ('a1', 'a')")
	var src string
	if err := pool.QueryRow(ctx, "SELECT source FROM files.claim('w2', ARRAY['b'], 5, key => 'test-key-0123456789')").Scan(&src); err != nil || src != "b1" {
		t.Fatalf("claim of queue b: %q, %v", src, err)
	}
	// Resuming the paused queue makes its row claimable.
	mustExec(t, pool, "SELECT files.resume_queue('p')")
	if err := pool.QueryRow(ctx, "SELECT source FROM files.claim('w3', ARRAY['p'], key => 'test-key-0123456789')").Scan(&src); err != nil || src != "paused" {
		t.Fatalf("claim of resumed queue p: %q, %v", src, err)
	}
}

func TestFencing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "SELECT files.register_worker('w1', lease_timeout => '1 second', key => 'test-key-0123456789')")
	// w2, the reaper, is alive: when the whole fleet is silent, reap blames
	// the database (files.fleet_heard).
	mustExec(t, pool, "SELECT files.register_worker('w2', key => 'test-key-0123456789')")
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b'), ('c')")
	rows := claim(t, pool, "w1", 3)
	if len(rows) != 3 {
		t.Fatalf("claimed %d rows", len(rows))
	}
	id := rows[0].ID

	for _, tc := range []struct {
		name, sql string
		args      []any
	}{
		{"complete by another worker", "SELECT files.complete($1, 'w2', 1, $2, '{}')", []any{id, rows[0].Token}},
		{"complete of another attempt", "SELECT files.complete($1, 'w1', 2, $2, '{}')", []any{id, rows[0].Token}},
		{"fail by another worker", "SELECT files.fail($1, 'w2', 1, $2, 'x')", []any{id, rows[0].Token}},
		{"fail of another attempt", "SELECT files.fail($1, 'w1', 0, $2, 'x')", []any{id, rows[0].Token}},
		{"release by another worker", "SELECT files.release($1, 'w2', 1, $2)", []any{id, rows[0].Token}},
		{"complete of an unknown row", "SELECT files.complete(-1, 'w1', 1, $1, '{}')", []any{rows[0].Token}},
	} {
		if queryBool(t, pool, tc.sql, tc.args...) {
			t.Errorf("%s: returned true", tc.name)
		}
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'running' AND worker_id = 'w1'"); n != 3 {
		t.Fatalf("stale calls changed rows: %d still running, want 3", n)
	}

	// After reap hands the row to someone else, the original worker is refused.
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE id = $1", id)
	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'w1'")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap returned %d rows, want 1", n)
	}
	if s := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE worker_id = 'w1' AND state = 'dead'"); s != 1 {
		t.Fatal("silent worker not declared dead")
	}
	again := claim(t, pool, "w2", 1)
	if len(again) != 1 || again[0].ID != id || again[0].Attempt != 2 {
		t.Fatalf("reclaim after reap: %+v", again)
	}
	if queryBool(t, pool, "SELECT files.complete($1, 'w1', 1, $2, '{\"from\":\"w1\"}')", id, rows[0].Token) {
		t.Fatal("the reaped worker's complete was accepted")
	}
	if !queryBool(t, pool, "SELECT files.complete($1, 'w2', 2, $2, '{\"from\":\"w2\"}')", id, again[0].Token) {
		t.Fatal("the new holder's complete was refused")
	}
	var from string
	if err := pool.QueryRow(context.Background(), "SELECT result->>'from' FROM files.files WHERE id = $1", id).Scan(&from); err != nil || from != "w2" {
		t.Fatalf("result from %q (%v), want w2", from, err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1 AND outcome = 'lost'", id); n != 1 {
		t.Fatalf("%d lost attempts, want 1", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1 AND outcome = 'done'", id); n != 1 {
		t.Fatalf("%d done attempts, want 1", n)
	}
	// A second complete of a finished row is refused too.
	if queryBool(t, pool, "SELECT files.complete($1, 'w2', 2, $2, '{}')", id, again[0].Token) {
		t.Fatal("second complete accepted")
	}
}

func TestHeartbeatExtendsLeases(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "SELECT files.register_worker('hb1', lease_timeout => '1 second', key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT files.register_worker('hb2', lease_timeout => '1 second', key => 'test-key-0123456789')")
	// The reaper is alive: when the whole fleet is silent, reap blames the
	// database (files.fleet_heard).
	mustExec(t, pool, "SELECT files.register_worker('hb-reaper', key => 'test-key-0123456789')")
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b')")
	claim(t, pool, "hb1", 1)
	claim(t, pool, "hb2", 1)
	// Leases run out in an hour's time at the latest: a heartbeat must bring them to now() + 1s.
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 hour'")
	n := queryInt(t, pool, "SELECT count(*) FROM files.heartbeat('test-key-0123456789', 'hb1', 'hb2', 'unknown')")
	if n != 2 {
		t.Fatalf("heartbeat returned %d held rows, want 2", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE lease_expires_at > now()"); n != 2 {
		t.Fatalf("%d leases extended, want 2", n)
	}
	// A slot declared dead that heartbeats again is alive, but no longer holds reaped rows.
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE worker_id = 'hb1'")
	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '2 hours' WHERE worker_id = 'hb1'")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap: %d", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.heartbeat('test-key-0123456789', 'hb1')"); n != 0 {
		t.Fatalf("reaped slot still holds %d rows", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE worker_id = 'hb1' AND state = 'active'"); n != 1 {
		t.Fatal("heartbeat did not revive the slot")
	}
}

func TestRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source, max_attempts) VALUES ('flaky', 4)")
	mustExec(t, pool, "UPDATE files.queues SET backoff_base = '10 seconds', backoff_max = '1 hour'")
	var delays []time.Duration
	for attempt := 1; attempt <= 4; attempt++ {
		// Make the scheduled retry due now instead of waiting for it.
		mustExec(t, pool, "UPDATE files.files SET run_after = now()")
		got := claim(t, pool, "w", 1)
		if len(got) != 1 || got[0].Attempt != attempt {
			t.Fatalf("attempt %d: claimed %+v", attempt, got)
		}
		if !queryBool(t, pool, "SELECT files.fail($1, 'w', $2, $3, $4)", got[0].ID, attempt, got[0].Token, fmt.Sprintf("boom %d", attempt)) {
			t.Fatalf("attempt %d: fail refused", attempt)
		}
		var state string
		var delay time.Duration
		if err := pool.QueryRow(ctx, "SELECT state, run_after - now() FROM files.files").Scan(&state, &delay); err != nil {
			t.Fatal(err)
		}
		if attempt < 4 {
			if state != "pending" {
				t.Fatalf("after failed attempt %d: state %s, want pending", attempt, state)
			}
			// Equal jitter: between half and all of 10s * 2^(attempt-1).
			full := 10 * time.Second << (attempt - 1)
			if delay < full/2-time.Second || delay > full {
				t.Fatalf("attempt %d: retry in %v, want between %v and %v", attempt, delay, full/2, full)
			}
			delays = append(delays, delay)
		} else if state != "failed" {
			t.Fatalf("after the last attempt: state %s, want failed", state)
		}
	}
	if !(delays[0] < delays[2]) {
		t.Fatalf("backoff does not grow: %v", delays)
	}
	var lastErr string
	if err := pool.QueryRow(ctx, "SELECT last_error FROM files.files WHERE state = 'failed' AND finished_at IS NOT NULL").Scan(&lastErr); err != nil || lastErr != "boom 4" {
		t.Fatalf("last_error %q, %v", lastErr, err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'failed'"); n != 4 {
		t.Fatalf("%d failed attempts recorded, want 4", n)
	}

	// files.retry brings it back with a fresh budget.
	if n := queryInt(t, pool, "SELECT files.retry()"); n != 1 {
		t.Fatalf("retry requeued %d rows", n)
	}
	if got := claim(t, pool, "w", 1); len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("claim after retry: %+v", got)
	}

	// A permanent error fails at once, whatever the budget.
	mustExec(t, pool, "INSERT INTO files.files (source, max_attempts) VALUES ('bad', 10)")
	got := claim(t, pool, "w9", 1)
	if !queryBool(t, pool, "SELECT files.fail($1, 'w9', 1, $2, 'unsupported format', retryable => false)", got[0].ID, got[0].Token) {
		t.Fatal("fail refused")
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE source = 'bad' AND state = 'failed'"); n != 1 {
		t.Fatal("a non-retryable failure did not end the row")
	}
}

func TestReleaseAndDeregisterKeepAttempts(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b')")
	got := claim(t, pool, "w", 2)
	if !queryBool(t, pool, "SELECT files.release($1, 'w', 1, $2, 'shutting down')", got[0].ID, got[0].Token) {
		t.Fatal("release refused")
	}
	if n := queryInt(t, pool, "SELECT files.deregister_worker('w', 'test-key-0123456789')"); n != 1 {
		t.Fatalf("deregister released %d rows, want 1", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'pending' AND attempt = 0"); n != 2 {
		t.Fatalf("%d rows pending with attempt 0, want 2", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'released'"); n != 2 {
		t.Fatalf("%d released attempts, want 2", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE state = 'stopped'"); n != 1 {
		t.Fatal("worker not stopped")
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b'), ('c')")
	got := claim(t, pool, "w", 1)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, conn, "LISTEN files_control")

	if n := queryInt(t, pool, "SELECT files.cancel($1, $2)", got[0].ID, got[0].ID+1); n != 2 {
		t.Fatalf("cancelled %d rows, want 2", n)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(waitCtx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"op" : "cancel", "file_id" : %d, "worker_id" : "w"}`, got[0].ID)
	if n.Payload != want {
		t.Fatalf("control notification %q, want %q", n.Payload, want)
	}
	if queryBool(t, pool, "SELECT files.complete($1, 'w', 1, $2, '{}')", got[0].ID, got[0].Token) {
		t.Fatal("complete of a cancelled row accepted")
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'cancelled'"); n != 2 {
		t.Fatalf("%d cancelled rows", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'cancelled'"); n != 1 {
		t.Fatalf("%d cancelled attempts", n)
	}
}

// TestNotify: one notification per statement and queue for everything that makes
// rows claimable, none for claim or complete.
func TestNotify(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	listen, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Release()
	mustExec(t, listen, "LISTEN files_pending")

	// received runs f, then a sentinel notification, and returns the payloads
	// that arrived before the sentinel.
	received := func(f func(conn *pgxpool.Conn)) []string {
		t.Helper()
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f(c)
		mustExec(t, c, "SELECT pg_notify('files_pending', 'sentinel')")
		c.Release()
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := listen.Conn().WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("wait for notifications: %v", err)
			}
			if n.Payload == "sentinel" {
				return got
			}
			got = append(got, n.Payload)
		}
	}
	expect := func(name string, want string, f func(conn *pgxpool.Conn)) {
		t.Helper()
		if got := fmt.Sprint(received(f)); got != want {
			t.Errorf("%s: notifications %s, want %s", name, got, want)
		}
	}
	exec := func(sql string, args ...any) func(*pgxpool.Conn) {
		return func(c *pgxpool.Conn) { mustExec(t, c, sql, args...) }
	}

	expect("single insert", "[default]", exec("INSERT INTO files.files (source) VALUES ('a')"))
	expect("single insert into a new queue", "[fresh]", exec("INSERT INTO files.files (source, queue) VALUES ('a', 'fresh')"))
	if n := queryInt(t, pool, "SELECT count(*) FROM files.queues WHERE queue = 'fresh'"); n != 1 {
		t.Errorf("an insert into a new queue registered it %d times", n)
	}
	expect("insert with a unique key", "[fresh]", exec("INSERT INTO files.files (source, queue, unique_key) VALUES ('k', 'fresh', 'k')"))
	expect("insert into a batch", "[fresh]", exec("INSERT INTO files.files (source, queue, batch) VALUES ('b', 'fresh', 'set')"))
	expect("insert of ended rows into a new queue", "[]",
		exec("INSERT INTO files.files (source, queue, state, finished_at) VALUES ('old', 'archive', 'done', now())"))
	expect("insert of no row", "[]", exec("INSERT INTO files.files (source) SELECT 'x' WHERE false"))
	expect("multi-row insert, two queues", "[q1 q2]",
		exec("INSERT INTO files.files (source, queue) SELECT 'x' || g, 'q' || (g % 2 + 1) FROM generate_series(1, 1000) g"))
	expect("COPY of 100,000 rows", "[bulk]", func(c *pgxpool.Conn) {
		src := make([][]any, 100_000)
		for i := range src {
			src[i] = []any{"bulk", fmt.Sprintf("obj-%d", i)}
		}
		n, err := c.Conn().CopyFrom(ctx, pgx.Identifier{"files", "files"}, []string{"queue", "source"}, pgx.CopyFromRows(src))
		if err != nil || n != 100_000 {
			t.Fatalf("copy: %d, %v", n, err)
		}
	})
	// reap counts no silence before the server's start: w's lease must be
	// shorter than the server has been up, and a live keeper tells reap the
	// fleet was not silent.
	mustExec(t, pool, "SELECT files.register_worker('keeper', key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT files.register_worker('w', lease_timeout => '1 second', key => 'test-key-0123456789')")
	testhelp.WaitServerUp(t, pool, time.Second)
	expect("claim", "[]", exec("CREATE TABLE first AS SELECT id, worker_id, attempt, claim_token FROM files.claim('w', ARRAY['default'], 10, key => 'test-key-0123456789')"))
	expect("complete", "[]", exec("SELECT files.complete(id, worker_id, attempt, claim_token, '{}') FROM first ORDER BY id LIMIT 1"))
	expect("claim of two queues", "[]", exec("CREATE TABLE claimed AS SELECT id, worker_id, attempt, claim_token, queue FROM files.claim('w', ARRAY['q1', 'q2'], 10, key => 'test-key-0123456789')"))
	expect("release", "[q1]", exec("SELECT files.release(id, worker_id, attempt, claim_token) FROM claimed WHERE queue = 'q1' ORDER BY id LIMIT 1"))
	expect("fail with a retry later", "[]", exec("SELECT files.fail(id, worker_id, attempt, claim_token, 'x') FROM claimed WHERE queue = 'q2' ORDER BY id LIMIT 1"))
	expect("failing one", "[]", exec("SELECT files.fail(id, worker_id, attempt, claim_token, 'x', false) FROM claimed WHERE queue = 'q2' ORDER BY id OFFSET 1 LIMIT 1"))
	expect("retry", "[q2]", exec("SELECT files.retry()"))
	expect("reap of many rows", "[q1 q2]", func(c *pgxpool.Conn) {
		mustExec(t, c, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE state = 'running'")
		mustExec(t, c, "SELECT files.reap()")
	})
	expect("pause", "[]", exec("SELECT files.pause_queue('bulk')"))
	expect("resume", "[bulk]", exec("SELECT files.resume_queue('bulk')"))
}

func TestRoles(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b')")

	as := func(role string, f func(tx pgx.Tx)) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		mustExec(t, tx, "SET LOCAL ROLE "+role)
		f(tx)
	}
	refused := func(tx pgx.Tx, sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, sql)
		if sqlState(err) != "42501" {
			t.Errorf("%s: got %v, want insufficient_privilege (42501)", sql, err)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
			t.Fatal(err)
		}
	}

	as("pgworker_worker", func(tx pgx.Tx) {
		var id int64
		var attempt int
		var token string
		if err := tx.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim('rw', NULL, 1, key => 'test-key-0123456789')").Scan(&id, &attempt, &token); err != nil {
			t.Fatalf("worker claim: %v", err)
		}
		var ok bool
		if err := tx.QueryRow(ctx, "SELECT files.complete($1, 'rw', $2, $3, '{}')", id, attempt, token).Scan(&ok); err != nil || !ok {
			t.Fatalf("worker complete: %v %v", ok, err)
		}
		mustExec(t, tx, "SELECT * FROM files.heartbeat('test-key-0123456789', 'rw')")
		mustExec(t, tx, "SELECT files.reap()")
		mustExec(t, tx, "SELECT * FROM files.active_workers")
		mustExec(t, tx, "SELECT * FROM files.queue_stats")
		mustExec(t, tx, "SELECT * FROM files.worker_metrics")
		refused(tx, "UPDATE files.files SET state = 'done'")
		refused(tx, "DELETE FROM files.files")
		refused(tx, "INSERT INTO files.files (source) VALUES ('x')")
		refused(tx, "UPDATE files.workers SET state = 'dead'")
		refused(tx, "SELECT files.cancel(1)")
		refused(tx, "SELECT files.pause_queue('default')")
		refused(tx, "SELECT files.set_max_running('default', 1000)")
		refused(tx, "SELECT files.set_fair_share('default', true)")
		refused(tx, "UPDATE files.queues SET max_running = NULL")
		// The claims' helpers run inside them only.
		refused(tx, "SELECT files.cap_room(ARRAY['default'])")
		refused(tx, "SELECT * FROM files.fair_rows('default', 10000)")
		refused(tx, "SELECT files.wake_capped(ARRAY['default'])")
	})
	as("pgworker_reader", func(tx pgx.Tx) {
		mustExec(t, tx, "SELECT * FROM files.files")
		mustExec(t, tx, "SELECT * FROM files.attempts")
		mustExec(t, tx, "SELECT * FROM files.queue_stats")
		refused(tx, "UPDATE files.files SET priority = 1")
		refused(tx, "INSERT INTO files.files (source) VALUES ('x')")
		refused(tx, "DELETE FROM files.attempts")
		refused(tx, "UPDATE files.queues SET paused = true")
		refused(tx, "SELECT * FROM files.claim('r', key => 'test-key-0123456789')")
		refused(tx, "SELECT files.reap()")
		refused(tx, "SELECT files.retry()")
		refused(tx, "SELECT files.set_max_running('default', 1)")
	})
	as("pgworker_admin", func(tx pgx.Tx) {
		mustExec(t, tx, "INSERT INTO files.files (source) VALUES ('c')")
		mustExec(t, tx, "SELECT files.pause_queue('default')")
		mustExec(t, tx, "SELECT files.resume_queue('default')")
		mustExec(t, tx, "SELECT files.cancel(2)")
		mustExec(t, tx, "SELECT files.retry(ARRAY[2::bigint])")
		mustExec(t, tx, "SELECT files.set_max_running('default', 3)")
		mustExec(t, tx, "SELECT files.set_fair_share('default', true)")
		refused(tx, "UPDATE files.files SET state = 'done'")
		refused(tx, "UPDATE files.queues SET max_running = NULL")
	})
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, tc := range []struct {
		name, sql, state, constraint string
	}{
		{"empty source", "INSERT INTO files.files (source) VALUES ('')", "23514", "files_source_not_empty"},
		{"NULL source", "INSERT INTO files.files (source) VALUES (NULL)", "23502", ""},
		{"negative max_attempts", "INSERT INTO files.files (source, max_attempts) VALUES ('a', -1)", "23514", "files_max_attempts_positive"},
		{"payload not an object", "INSERT INTO files.files (source, payload) VALUES ('a', '[1]')", "23514", "files_payload_is_object"},
		{"empty queue", "INSERT INTO files.files (source, queue) VALUES ('a', '')", "23514", "files_queue_valid"},
		{"unknown state", "INSERT INTO files.files (source, state) VALUES ('a', 'done?')", "23514", "files_state_valid"},
		{"NULL worker id in claim", "SELECT * FROM files.claim(NULL, key => 'test-key-0123456789')", "22004", ""},
		{"empty worker id in claim", "SELECT * FROM files.claim('', key => 'test-key-0123456789')", "22004", ""},
		{"NULL worker id in get_unprocessed_entry_by_priority", "SELECT * FROM files.get_unprocessed_entry_by_priority(NULL, 'test-key-0123456789')", "22004", ""},
		{"max below 1 in claim", "SELECT * FROM files.claim('w', NULL, 0, key => 'test-key-0123456789')", "22023", ""},
		{"resume of an unknown queue", "SELECT files.resume_queue('nope')", "P0002", ""},
	} {
		_, err := pool.Exec(context.Background(), tc.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.state || pgErr.ConstraintName != tc.constraint {
			t.Errorf("%s: got %v, want SQLSTATE %s %s", tc.name, err, tc.state, tc.constraint)
		}
	}
}

// TestStatsViews checks the views on a known state.
func TestStatsViews(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "SELECT files.register_worker('v1', node => 'n1', pid => 42, slot => 0, key => 'test-key-0123456789')")
	mustExec(t, pool, "INSERT INTO files.files (source) SELECT 'o' || g FROM generate_series(1, 5) g")
	for i, outcome := range []string{"done", "done", "failed", "running"} {
		got := claim(t, pool, "v1", 1)
		switch outcome {
		case "done":
			mustExec(t, pool, "SELECT files.complete($1, 'v1', 1, $3, '{}', jsonb_build_object('duration_ms', $2::int))", got[0].ID, 100*(i+1), got[0].Token)
		case "failed":
			mustExec(t, pool, "SELECT files.fail($1, 'v1', 1, $2, 'x', false, '{\"duration_ms\": 300}')", got[0].ID, got[0].Token)
		}
	}
	var processed, done, failed int
	var rate float64
	var mean time.Duration
	if err := pool.QueryRow(ctx, "SELECT processed, done, failed, failure_rate, mean_duration FROM files.worker_metrics WHERE worker_id = 'v1'").
		Scan(&processed, &done, &failed, &rate, &mean); err != nil {
		t.Fatal(err)
	}
	if processed != 3 || done != 2 || failed != 1 || rate < 0.33 || rate > 0.34 || mean != 200*time.Millisecond {
		t.Fatalf("worker_metrics: processed %d done %d failed %d rate %v mean %v", processed, done, failed, rate, mean)
	}
	var fileID int64
	if err := pool.QueryRow(ctx, "SELECT file_id FROM files.active_workers WHERE worker_id = 'v1'").Scan(&fileID); err != nil || fileID == 0 {
		t.Fatalf("active_workers: %v %v", fileID, err)
	}
	counts := map[string]int{}
	rows, err := pool.Query(ctx, "SELECT state, files FROM files.queue_stats WHERE queue = 'default'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		counts[s] = n
	}
	if fmt.Sprint(counts) != "map[cancelled:0 done:2 failed:1 pending:1 running:1]" {
		t.Fatalf("queue_stats: %v", counts)
	}
}

// files.attempt_outcomes tells a worker why a row its heartbeat no longer
// shows is gone: cancelled by an operator, or lost when its lease ran out;
// only with the slots' key, and nothing for an attempt still running.
func TestAttemptOutcomes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	mustExec(t, pool, "SELECT files.register_worker('o-live', key => $1)", testKey)
	mustExec(t, pool, "SELECT files.register_worker('o-gone', lease_timeout => '1 second', key => $1)", testKey)
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('a'), ('b'), ('c')")
	cancelled, lost, running := claimOne(t, pool, "o-live"), claimOne(t, pool, "o-gone"), claimOne(t, pool, "o-live")
	mustExec(t, pool, "SELECT files.cancel($1)", cancelled.id)
	mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'o-gone'")
	mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE id = $1", lost.id)
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap returned %d rows, want 1", n)
	}

	ids := []int64{cancelled.id, lost.id, running.id}
	workers := []string{cancelled.worker, lost.worker, running.worker}
	attempts := []int32{int32(cancelled.attempt), int32(lost.attempt), int32(running.attempt)}
	rows, err := pool.Query(ctx, "SELECT file_id, outcome FROM files.attempt_outcomes($1, $2, $3, $4)", testKey, ids, workers, attempts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for rows.Next() {
		var id int64
		var outcome string
		if err := rows.Scan(&id, &outcome); err != nil {
			t.Fatal(err)
		}
		got[id] = outcome
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[int64]string{cancelled.id: "cancelled", lost.id: "lost"}; !maps.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}

	for _, c := range []struct {
		key      string
		ids      []int64
		workers  []string
		attempts []int32
		state    string
	}{
		{"another-key-0123456789", ids, workers, attempts, "42501"},
		{testKey, ids, workers[:2], attempts, "22023"},
	} {
		_, err := pool.Exec(ctx, "SELECT * FROM files.attempt_outcomes($1, $2, $3, $4)", c.key, c.ids, c.workers, c.attempts)
		if s := sqlState(err); s != c.state {
			t.Errorf("key %q, %d ids, %d workers: SQLSTATE %q (%v), want %s", c.key, len(c.ids), len(c.workers), s, err, c.state)
		}
	}
}
