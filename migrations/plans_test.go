package migrations_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// The one-row claim and complete run generic plans, compiled by no JIT:
// planned once per connection rather than on every call, even on a server set
// to compile every statement. A generic plan is kept while the table grows,
// so it must not scan files.files even where that is the cheaper plan, as for
// the 5,000 rows here: index lookups only. The plans come from auto_explain,
// nested statements included.
func TestHotPathPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, plans := explainedConn(t)
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 5000) g")
	mustExec(t, conn, "ANALYZE files.files")
	jit := startExplaining(t, conn)
	// Whole-range searches first (none is slower than a minute).
	mustExec(t, conn, "SET pgworker.claim_hint_ms = 60000")

	// More than five times: PostgreSQL's own choice switches to a generic
	// plan after five custom ones when it finds it as cheap.
	for i := range 7 {
		if i == 3 {
			// A slow search from here on: the fourth claim starts hints, the
			// rest search from them (files.pick's other statement).
			mustExec(t, conn, "SET pgworker.claim_hint_ms = 0")
		}
		var id int64
		var worker string
		var attempt int32
		var token string
		if err := conn.QueryRow(ctx, "/* test */ SELECT id, worker_id, attempt, claim_token FROM files.claim('a:1', key => 'test-key-0123456789')").
			Scan(&id, &worker, &attempt, &token); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		var done bool
		if err := conn.QueryRow(ctx, "/* test */ SELECT files.complete($1, $2, $3, $4)", id, worker, attempt, token).Scan(&done); err != nil || !done {
			t.Fatalf("complete %d: %v, %v", i, done, err)
		}
	}

	var done int
	if err := conn.QueryRow(ctx, "/* test */ SELECT count(*) FROM files.attempts WHERE outcome = 'done'").Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done != 7 {
		t.Errorf("%d done attempts, want 7", done)
	}

	var nested, generic, whole, hinted int
	for _, p := range plans() {
		if strings.Contains(p, "/* test */") {
			continue // the test's own statements, planned under its settings
		}
		nested++
		for _, bad := range []string{"Seq Scan on files ", "Bitmap Heap Scan on files ", "Hash Join", "Merge Join"} {
			if strings.Contains(p, bad) {
				t.Errorf("a statement of the hot path plans a %s on a table of 5,000 rows:\n%s", bad, p)
			}
		}
		// The row searches (files.pick) scan ranges of files_claim_idx,
		// never the primary key: from the lowest id on, that is the whole
		// table.
		if strings.Contains(p, "unnest(pick.queues") {
			if strings.Contains(p, "unnest(pick.queues, v_hp") {
				hinted++
			} else {
				whole++
			}
			if strings.Contains(p, "files_pkey") || !strings.Contains(p, "files_claim_idx") {
				t.Errorf("the row search plans other than ranges of files_claim_idx:\n%s", p)
			}
		}
		if jit && strings.Contains(p, "JIT:") {
			t.Errorf("a statement of the hot path was compiled by JIT:\n%s", p)
		}
		// The queues lookup names its argument as a parameter ($2) only in
		// a generic plan; a custom plan has the value folded in.
		if strings.Contains(p, "array_agg(q.queue") && strings.Contains(p, "$2") {
			generic++
		}
	}
	if nested == 0 {
		t.Fatal("auto_explain reported no statement inside the functions")
	}
	if whole != 4 || hinted != 3 {
		t.Errorf("%d whole-range and %d hinted row searches, want 4 and 3", whole, hinted)
	}
	if generic != 7 {
		t.Errorf("%d generic plans of the queues lookup in 7 claims, want 7", generic)
	}
	if !jit {
		t.Log("this server has no JIT: the JIT half of the test checked nothing")
	}
}

// explainedConn is a session on a database of its own, and plans returns
// what the server has told it so far: after startExplaining, the plan of
// each statement it runs, those inside functions included.
func explainedConn(t *testing.T) (conn *pgx.Conn, plans func() []string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		notes []string
	)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notes = append(notes, n.Message)
	}
	conn, err = pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(notes)
	}
}

// startExplaining makes auto_explain report the plan of every statement of
// conn as a notice, on a server set to compile every statement with JIT,
// and returns whether the server has JIT at all.
func startExplaining(t *testing.T, conn *pgx.Conn) (jit bool) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), "SELECT pg_jit_available()").Scan(&jit); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"LOAD 'auto_explain'",
		"SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_level = notice",
		"SET jit = on",
		"SET jit_above_cost = 0",
	} {
		mustExec(t, conn, s)
	}
	return jit
}
