package migrations_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
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
	// Whole-range searches first: none reads 999,999,999 pages.
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 999999999")

	// More than five times: PostgreSQL's own choice switches to a generic
	// plan after five custom ones when it finds it as cheap.
	for i := range 7 {
		if i == 3 {
			// A slow search from here on: the fourth claim starts hints, the
			// rest search from them (files.pick's other statement).
			mustExec(t, conn, "SET pgworker.claim_hint_pages = 0")
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
	explainEach(t, conn, "SET jit = on", "SET jit_above_cost = 0")
	return jit
}

// explainEach makes auto_explain report the plan of every statement of conn
// as a notice, those inside functions included, then runs settings.
func explainEach(t *testing.T, conn *pgx.Conn, settings ...string) {
	t.Helper()
	for _, s := range append([]string{
		"LOAD 'auto_explain'",
		"SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_level = notice",
	}, settings...) {
		mustExec(t, conn, s)
	}
}

// A session keeps the plans it made at its first calls while files.files
// grows; autovacuum analyzing the table is what makes it plan again. Planned
// on a table of a few analyzed rows, where reading the whole table is the
// cheaper plan, every call of the hot path must still look its rows up by
// id once the table holds 20,000: no node of any plan inside it reads more
// than a few rows.
func TestHotPathPlansOnAGrownTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, plans := explainedConn(t)
	// A second session claims through files.pick's hints (claim_batch's
	// three statements), the first in claim_batch's one statement; its
	// plans are told to the same list.
	hinted, err := pgx.ConnectConfig(ctx, conn.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hinted.Close(context.Background()) })
	mustExec(t, conn, "ALTER TABLE files.files SET (autovacuum_enabled = false)")
	mustExec(t, conn, "INSERT INTO files.files (queue, source) SELECT 'q', 'x' || g FROM generate_series(1, 3) g")
	mustExec(t, conn, "ANALYZE files.files")
	mustExec(t, conn, "SELECT files.register_worker('g:' || g, key => $1) FROM generate_series(1, 6) g", testKey)
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 999999999")
	mustExec(t, hinted, "SET pgworker.claim_hint_pages = 0")

	take := func(c *pgx.Conn, sql string, args ...any) []held {
		t.Helper()
		rows, err := c.Query(ctx, "/* test */ SELECT id, worker_id, attempt, claim_token FROM "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (h held, err error) {
			return h, r.Scan(&h.id, &h.worker, &h.attempt, &h.token)
		})
		if err != nil || len(got) == 0 {
			t.Fatalf("%s: %d rows, %v", sql, len(got), err)
		}
		return got
	}
	ok := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		var done bool
		if err := c.QueryRow(ctx, "/* test */ SELECT "+sql, args...).Scan(&done); err != nil || !done {
			t.Fatalf("%s: %v, %v", sql, done, err)
		}
	}
	// Each call a worker makes on the way of a row: claims of each kind,
	// the heartbeat, each outcome, the reaper. Each round's rows come first
	// (a higher priority), so the last round claims the newest rows, those
	// after the 20,000 in id order.
	round := func(n int) {
		t.Helper()
		mustExec(t, conn, "INSERT INTO files.files (queue, source, priority) SELECT 'q', 'r' || g, $1 FROM generate_series(1, 8) g", n)
		batch := take(conn, "files.claim_batch(ARRAY['g:1', 'g:2'], ARRAY['q'], $1)", testKey)
		three := take(hinted, "files.claim_batch(ARRAY['g:3', 'g:4'], ARRAY['q'], $1)", testKey)
		one := take(conn, "files.claim('g:5', ARRAY['q'], 2, $1)", testKey)
		last := take(conn, "files.claim('g:6', ARRAY['q'], 1, $1)", testKey)[0]
		mustExec(t, conn, "/* test */ SELECT * FROM files.heartbeat($1, 'g:1', 'g:2', 'g:3', 'g:4', 'g:5', 'g:6')", testKey)
		ids, workers, attempts, tokens := []int64{}, []string{}, []int{}, []string{}
		for _, h := range batch {
			ids, workers, attempts, tokens = append(ids, h.id), append(workers, h.worker), append(attempts, h.attempt), append(tokens, h.token)
		}
		mustExec(t, conn, "/* test */ SELECT files.complete_many($1, $2, $3, $4)", ids, workers, attempts, tokens)
		h := three[0]
		mustExec(t, conn, "/* test */ SELECT * FROM files.fail_many(ARRAY[$1::bigint], ARRAY[$2], ARRAY[$3::integer], ARRAY[$4], ARRAY['boom'])",
			h.id, h.worker, h.attempt, h.token)
		for _, h := range three[1:] {
			ok(conn, "files.release($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token)
		}
		// An outcome for a row no longer held: left out of the answer once
		// files.refuse_forged found no row held with another token.
		h = three[len(three)-1]
		var marked int
		if err := conn.QueryRow(ctx, "/* test */ SELECT count(*) FROM files.complete_many(ARRAY[$1::bigint], ARRAY[$2], ARRAY[$3::integer], ARRAY[$4])",
			h.id, h.worker, h.attempt, h.token).Scan(&marked); err != nil || marked != 0 {
			t.Fatalf("complete_many of a row no longer held: %d rows, %v", marked, err)
		}
		h = one[0]
		ok(conn, "files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token)
		for _, h := range one[1:] {
			ok(conn, "files.fail($1, $2, $3, $4, 'boom')", h.id, h.worker, h.attempt, h.token)
		}
		ok(conn, "files.release($1, $2, $3, $4)", last.id, last.worker, last.attempt, last.token)
		mustExec(t, conn, "/* test */ SELECT files.reap()")
		if n < 7 {
			// The table stays as small as it was analyzed while the
			// session plans.
			mustExec(t, conn, "/* test */ DELETE FROM files.files WHERE queue = 'q'")
		}
	}
	// More than five times: PostgreSQL's own choice of a generic plan comes
	// after five custom ones.
	for n := range 7 {
		round(n)
	}

	mustExec(t, conn, "INSERT INTO files.files (queue, source) SELECT 'big', 'y' || g FROM generate_series(1, 20000) g")
	for _, c := range []*pgx.Conn{conn, hinted} {
		explainEach(t, c, "SET auto_explain.log_analyze = on", "SET auto_explain.log_timing = off")
	}
	round(7)

	read := regexp.MustCompile(`actual rows=(\d+) loops=(\d+)`)
	var nested int
	for _, p := range plans() {
		if strings.Contains(p, "/* test */") || !strings.Contains(p, "actual rows=") {
			continue
		}
		nested++
		for _, m := range read.FindAllStringSubmatch(p, -1) {
			rows, _ := strconv.Atoi(m[1])
			loops, _ := strconv.Atoi(m[2])
			if rows*loops > 100 {
				t.Errorf("a plan made on a few rows reads %d rows of a grown table:\n%s", rows*loops, p)
				break
			}
		}
	}
	if nested == 0 {
		t.Fatal("auto_explain reported no statement inside the functions")
	}
}
