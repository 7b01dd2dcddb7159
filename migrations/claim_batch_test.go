package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// files.claim_batch claims the usual way in one statement and every other
// way in three (00007_claim_batch_one_statement.sql): each case here is one
// or the other, or the one statement finding that the claim is not usual,
// locking nothing, and handing it to the three. Either way, the i-th best
// row goes to the i-th slot. Each case runs as a claim of every queue and as
// a claim of the one queue, whose usual statement is its own
// (00011_claim_of_one_queue.sql).
func TestClaimBatchUsualAndNot(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup []string // run as the test's owner before the claim
		slots []string
		key   string
		want  string // the rows, "slot=source" in claim order
		state string // the SQLSTATE the claim fails with instead
	}{
		{name: "usual", slots: []string{"s1", "s2"}, want: "[s1=p3 s2=p2]"},
		{name: "more slots than rows", slots: []string{"s1", "s2", "s3", "s4"}, want: "[s1=p3 s2=p2 s3=p1]"},
		{name: "a slot named twice", slots: []string{"s2", "s1", "s2"}, want: "[s2=p3 s1=p2]"},
		{name: "an unknown slot", slots: []string{"s1", "new"}, want: "[s1=p3 new=p2]"},
		{name: "a draining slot", setup: []string{"SELECT files.drain_worker('" + testKey + "', 's1')"},
			slots: []string{"s1", "s2"}, want: "[s2=p3]"},
		{name: "a stopped slot", setup: []string{"SELECT files.deregister_worker('s1', '" + testKey + "')"},
			slots: []string{"s1", "s2"}, want: "[s1=p3 s2=p2]"},
		{name: "another key", slots: []string{"s1", "s2"}, key: "another-key-0123456789", state: "42501"},
		{name: "a capped queue", setup: []string{"SELECT files.set_max_running('default', 1)"},
			slots: []string{"s1", "s2"}, want: "[s1=p3]"},
		{name: "a full capped queue", setup: []string{"SELECT files.set_max_running('default', 0)"},
			slots: []string{"s1", "s2"}, want: "[]"},
		{name: "an unknown slot and a capped queue", setup: []string{"SELECT files.set_max_running('default', 1)"},
			slots: []string{"new", "s1"}, want: "[new=p3]"},
		{name: "a fair-share queue", setup: []string{"SELECT files.set_fair_share('default', true)"},
			slots: []string{"s1", "s2"}, want: "[s1=p3 s2=p2]"},
		{name: "a paused queue", setup: []string{"SELECT files.pause_queue('default')"},
			slots: []string{"s1", "s2"}, want: "[]"},
	}
	for _, queues := range []string{"NULL", "ARRAY['default']"} {
		for _, tc := range cases {
			t.Run(queues+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				pool := pgtest.Pool(t)
				mustExec(t, pool, "INSERT INTO files.files (source, priority) VALUES ('p1', 1), ('p3', 3), ('p2', 2)")
				for _, s := range []string{"s1", "s2", "s3", "s4"} {
					mustExec(t, pool, "SELECT files.register_worker($1, key => $2)", s, testKey)
				}
				for _, s := range tc.setup {
					mustExec(t, pool, s)
				}
				key := testKey
				if tc.key != "" {
					key = tc.key
				}
				sql := "SELECT worker_id || '=' || source FROM files.claim_batch($1, " + queues + ", $2)"
				if tc.state != "" {
					if _, err := pool.Exec(context.Background(), sql, tc.slots, key); sqlState(err) != tc.state {
						t.Fatalf("claim: %v, want SQLSTATE %s", err, tc.state)
					}
					if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'pending'"); n != 3 {
						t.Fatalf("%d rows pending after a refused claim, want 3", n)
					}
					return
				}
				got := claimSources(t, pool, sql, tc.slots, key)
				if fmt.Sprint(got) != tc.want {
					t.Fatalf("claimed %v, want %s", got, tc.want)
				}
				if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'running'"); n != len(got) {
					t.Fatalf("%d rows running after claiming %d", n, len(got))
				}
			})
		}
	}
}

// A claim of one queue takes that queue's rows only, and of a queue that
// has none, nothing; a claim of every queue takes the best of all.
func TestClaimBatchOfOneQueue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ queues, want string }{
		{"ARRAY['default']", "[s1=p3 s2=p2]"},
		{"ARRAY['nobody']", "[]"},
		{"NULL", "[s1=o9 s2=p3]"},
	} {
		t.Run(tc.queues, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			mustExec(t, pool, "INSERT INTO files.files (source, priority) VALUES ('p1', 1), ('p3', 3), ('p2', 2)")
			mustExec(t, pool, "INSERT INTO files.files (queue, source, priority) VALUES ('other', 'o9', 9)")
			mustExec(t, pool, "SELECT files.register_worker(s, key => $1) FROM unnest(ARRAY['s1', 's2']) s", testKey)
			got := claimSources(t, pool, "SELECT worker_id || '=' || source FROM files.claim_batch($1, "+tc.queues+", $2)",
				[]string{"s1", "s2"}, testKey)
			if fmt.Sprint(got) != tc.want {
				t.Fatalf("claimed %v, want %s", got, tc.want)
			}
		})
	}
}

// A usual claim's statement counts the pages of files_claim_idx its search
// read: as many as the bound of files.pick hand the session's next claim to
// files.pick, which counts its whole-range search again and keeps hints from
// there on when that is slow too. Fewer leave the session without hints.
func TestClaimBatchSlowStatementHandsOffToPick(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	conn := plainConn(t, url)
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")

	mustExec(t, conn, "SET pgworker.claim_hint_pages = 999999999")
	if got := claimBatchOn(t, conn, []string{"w1", "w2"}); len(got) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(got))
	}
	if h := hints(t, conn); h != "" {
		t.Fatalf("hints %s after a fast claim, want none", h)
	}

	// Every search reads at least no page: with a bound of 0, each is slow.
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 0")
	if got := claimBatchOn(t, conn, []string{"w1", "w2"}); len(got) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(got))
	}
	if h := hints(t, conn); !strings.Contains(h, `"n": 63`) || !strings.Contains(h, `"q": {}`) {
		t.Fatalf("hints %q after a slow claim, want a whole-range search next and no hint yet", h)
	}
	got := claimBatchOn(t, conn, []string{"w1", "w2"})
	if len(got) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(got))
	}
	last := slices.MaxFunc(got, func(a, b claimed) int { return int(a.ID - b.ID) })
	if h := hints(t, conn); !strings.Contains(h, fmt.Sprintf(`"default": [0, %d]`, last.ID+1)) {
		t.Fatalf("hints %q after files.pick's slow search, want the default queue's past row %d", h, last.ID)
	}
}

// The usual claim's one statement runs a generic plan without JIT, as the
// statements of files.claim do (TestHotPathPlans): index lookups only, the
// rows found in ranges of files_claim_idx. And it is the only statement:
// files.pick is not called. So too the one statement of a claim of one queue.
func TestClaimBatchOneStatementPlan(t *testing.T) {
	t.Parallel()
	for _, queues := range []string{"NULL", "ARRAY['default']"} {
		t.Run(queues, func(t *testing.T) {
			t.Parallel()
			testClaimBatchOneStatementPlan(t, queues)
		})
	}
}

func testClaimBatchOneStatementPlan(t *testing.T, queues string) {
	ctx := context.Background()
	conn, plans := explainedConn(t)
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 5000) g")
	mustExec(t, conn, "ANALYZE files.files")
	mustExec(t, conn, "SELECT files.register_worker('a:' || g, key => $1) FROM generate_series(1, 3) g", testKey)
	startExplaining(t, conn)
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 999999999")
	for i := range 7 {
		rows, err := conn.Query(ctx, "/* test */ SELECT id FROM files.claim_batch(ARRAY['a:1', 'a:2', 'a:3'], "+queues+", $1)", testKey)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(ids) != 3 {
			t.Fatalf("claim %d: %d rows, %v", i, len(ids), err)
		}
	}

	var one int
	for _, p := range plans() {
		if strings.Contains(p, "/* test */") {
			continue
		}
		if strings.Contains(p, "unnest(pick.queues") {
			t.Errorf("a usual claim called files.pick:\n%s", p)
		}
		if !strings.Contains(p, "WITH slots AS") {
			continue
		}
		one++
		for _, bad := range []string{"Seq Scan on files ", "Seq Scan on workers ", "Bitmap Heap Scan", "Hash Join", "Merge Join", "JIT:"} {
			if strings.Contains(p, bad) {
				t.Errorf("the one statement plans a %s:\n%s", bad, p)
			}
		}
		for _, good := range []string{"Index Scan using files_claim_idx", "Index Scan using files_pkey", "Index Scan using workers_pkey"} {
			if !strings.Contains(p, good) {
				t.Errorf("the one statement plans no %s:\n%s", good, p)
			}
		}
	}
	if one != 7 {
		t.Errorf("%d plans of the one statement in 7 usual claims, want 7", one)
	}
}
