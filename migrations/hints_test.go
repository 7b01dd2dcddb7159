package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// Once a session's whole-range search is slow, its claims start their
// search where its last claim ended (files.pick). These tests hold rows
// behind that hint and prove each is still claimed: found by the session's
// next whole-range search, due a second after its last one or later. They
// set when it is due (walkDue) rather than wait for it. Their sessions keep
// hints from the first claim on (pgworker.claim_hint_pages = 0: every
// search is slow); TestClaimHintsStartWhenSearchIsSlow tests when hints
// start and stop.

// hintConn is one session on the database of url that keeps hints from its
// first claim on, so that they carry from claim to claim.
func hintConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn := plainConn(t, url)
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 0")
	return conn
}

// plainConn is one session on the database of url.
func plainConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// hints is the session's pgworker.claim_hints ("" when it keeps none).
func hints(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var v *string
	if err := conn.QueryRow(context.Background(), "SELECT current_setting('pgworker.claim_hints', true)").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v == nil {
		return ""
	}
	return *v
}

// walkDue makes the session's next claim search the whole range (due) or
// search past its hints only (not due, for an hour), by setting when its
// next whole-range search is due in its hints, and clearing the turn its
// queues' sessions take (files.claim_search_due), so that its own spacing
// decides.
func walkDue(t *testing.T, conn *pgx.Conn, due bool) {
	t.Helper()
	ownDue(t, conn, due)
	mustExec(t, conn, "SELECT setval('files.claim_search_due', 1, false)")
}

// ownDue sets when the session's own next whole-range search is due: now
// (due) or in an hour.
func ownDue(t *testing.T, conn *pgx.Conn, due bool) {
	t.Helper()
	next := "0"
	if !due {
		next = "extract(epoch FROM clock_timestamp()) + 3600"
	}
	mustExec(t, conn, `SELECT set_config('pgworker.claim_hints', jsonb_set(current_setting('pgworker.claim_hints')::jsonb,
		'{next}', to_jsonb(`+next+`))::text, false)`)
}

// setTurn writes the turn of the sessions that claim from queues
// (files.claim_search_due): their next whole-range search is due in secs
// seconds (before now if negative).
func setTurn(t *testing.T, conn *pgx.Conn, queues []string, secs float64) {
	t.Helper()
	mustExec(t, conn, `SELECT setval('files.claim_search_due',
		((1000 * (extract(epoch FROM clock_timestamp()) + $2))::bigint << 21) | (hashtext($1::text[]::text) & 2097151))`,
		queues, secs)
}

// turnAfter runs claim and returns the turn it leaves: the key of the queues
// it is for, and when it is due in seconds after the claim started, no
// earlier than a second unless it is no turn of the claim's, no later than a
// second or a hundred times as long as the claim took.
func turnAfter(t *testing.T, conn *pgx.Conn, claim func()) (key int64, in float64, ok bool) {
	t.Helper()
	ctx := context.Background()
	var start, end float64
	if err := conn.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp())").Scan(&start); err != nil {
		t.Fatal(err)
	}
	claim()
	if err := conn.QueryRow(ctx, `SELECT v & 2097151, (v >> 21) / 1000.0, extract(epoch FROM clock_timestamp())
		FROM pg_sequence_last_value('files.claim_search_due') v`).Scan(&key, &in, &end); err != nil {
		t.Fatal(err)
	}
	in -= start
	return key, in, in >= 0.999 && in <= end-start+max(1, 100*(end-start))+0.001
}

func claimOn(t *testing.T, conn *pgx.Conn, worker string, max int) []claimed {
	t.Helper()
	return claimFromOn(t, conn, worker, nil, max)
}

// claimFromOn claims from queues (nil: all of them).
func claimFromOn(t *testing.T, conn *pgx.Conn, worker string, queues []string, max int) []claimed {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		"SELECT id, priority, attempt, claim_token FROM files.claim($1, $2, $3, key => 'test-key-0123456789')", worker, queues, max)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return out
}

func claimBatchOn(t *testing.T, conn *pgx.Conn, workers []string) []claimed {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		"SELECT id, priority, attempt, claim_token FROM files.claim_batch($1, NULL, 'test-key-0123456789')", workers)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		t.Fatalf("claim_batch: %v", err)
	}
	return out
}

// TestClaimHintNeverStarvesARow: rows that come back behind the hint, by
// release, by reap, by a retry whose backoff passed and by a claim that
// rolled back, are left by the claims before the session's next whole-range
// search is due, while newer rows keep every hinted search busy, and taken
// by the first claim once it is, in both claim functions.
func TestClaimHintNeverStarvesARow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		back func(t *testing.T, conn *pgx.Conn, other *pgx.Conn) int64 // puts a row behind the hint, returns its id
	}{
		{"released", func(t *testing.T, conn, _ *pgx.Conn) int64 {
			r := claimOn(t, conn, "w1", 1)[0]
			claimOn(t, conn, "w1", 5) // the hint moves past r
			mustExec(t, conn, "SELECT files.release($1, 'w1', $2, $3)", r.ID, r.Attempt, r.Token)
			return r.ID
		}},
		{"reaped", func(t *testing.T, conn, _ *pgx.Conn) int64 {
			mustExec(t, conn, "SELECT files.register_worker('w2', lease_timeout => '1 second', key => 'test-key-0123456789')")
			rows, err := conn.Query(context.Background(),
				"SELECT id, priority, attempt, claim_token FROM files.claim('w2', NULL, 1, key => 'test-key-0123456789')")
			if err != nil {
				t.Fatal(err)
			}
			r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[claimed])
			if err != nil {
				t.Fatal(err)
			}
			claimOn(t, conn, "w1", 5)
			mustExec(t, conn, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE id = $1", r.ID)
			mustExec(t, conn, "UPDATE files.workers SET last_heartbeat_at = now() - interval '1 minute' WHERE worker_id = 'w2'")
			var n int
			if err := conn.QueryRow(context.Background(), "SELECT files.reap()").Scan(&n); err != nil || n != 1 {
				t.Fatalf("reap: %d rows, %v", n, err)
			}
			return r.ID
		}},
		{"retried", func(t *testing.T, conn, _ *pgx.Conn) int64 {
			r := claimOn(t, conn, "w1", 1)[0]
			claimOn(t, conn, "w1", 5)
			mustExec(t, conn, "SELECT files.fail($1, 'w1', $2, $3, 'boom')", r.ID, r.Attempt, r.Token)
			// The backoff passes.
			mustExec(t, conn, "UPDATE files.files SET run_after = now() - interval '1 second' WHERE id = $1", r.ID)
			return r.ID
		}},
		{"rolled back", func(t *testing.T, conn, other *pgx.Conn) int64 {
			// Another session holds the first row in a claim that rolls
			// back; this session's claims skip it and move on.
			ctx := context.Background()
			tx, err := other.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id int64
			if err := tx.QueryRow(ctx, "SELECT id FROM files.claim('w3', NULL, 1, key => 'test-key-0123456789')").Scan(&id); err != nil {
				t.Fatal(err)
			}
			claimOn(t, conn, "w1", 5)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			return id
		}},
	} {
		batch := len(tc.name)%2 == 0 // either claim function takes the row
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			conn, other := hintConn(t, url), hintConn(t, url)
			mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 200) g")
			id := tc.back(t, conn, other)
			var state string
			if err := conn.QueryRow(context.Background(), "SELECT state FROM files.files WHERE id = $1", id).Scan(&state); err != nil || state != "pending" {
				t.Fatalf("row %d is %q (%v), want pending", id, state, err)
			}
			// Newer rows than the hint are there for every claim: only the
			// whole-range search can take the row.
			walkDue(t, conn, false)
			for i := range 4 {
				var got []claimed
				if i%2 == 1 {
					got = claimBatchOn(t, conn, []string{"w1"})
				} else {
					got = claimOn(t, conn, "w1", 1)
				}
				if len(got) != 1 || got[0].ID == id {
					t.Fatalf("claim %d before the whole-range search: %+v, want a row past the hint, not %d", i, got, id)
				}
			}
			walkDue(t, conn, true)
			var got []claimed
			if batch {
				got = claimBatchOn(t, conn, []string{"w1"})
			} else {
				got = claimOn(t, conn, "w1", 1)
			}
			if len(got) != 1 || got[0].ID != id {
				t.Fatalf("whole-range search (batch %v): claimed %+v, want row %d", batch, got, id)
			}
		})
	}
}

// TestClaimHintWaitsForTheWholeRangeSearch: when the only claimable rows
// are behind the hint, a claim before the session's next whole-range search
// is due finds nothing, and the first claim once it is takes them all, in
// both claim functions. A claim that finds rows past the hint, fewer than it
// asked for, does not read behind it either (their entries are those a held
// snapshot keeps, which the hints are for). pgworker run looks once more
// after such answers (TestRunLooksAgainAfterAShortHintedClaim).
func TestClaimHintWaitsForTheWholeRangeSearch(t *testing.T) {
	t.Parallel()
	conn := hintConn(t, pgtest.URL(t))
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	for _, batch := range []bool{false, true} {
		claimFor := func(workers ...string) []claimed {
			if batch {
				return claimBatchOn(t, conn, workers)
			}
			return claimOn(t, conn, workers[0], len(workers))
		}
		release := func(rs []claimed) {
			for _, r := range rs {
				var w string
				if err := conn.QueryRow(context.Background(), "SELECT worker_id FROM files.files WHERE id = $1", r.ID).Scan(&w); err != nil {
					t.Fatal(err)
				}
				mustExec(t, conn, "SELECT files.release($1, $2, $3, $4)", r.ID, w, r.Attempt, r.Token)
			}
		}
		mustExec(t, conn, "SELECT set_config('pgworker.claim_hints', '', false)") // no hints left by the round before
		first := claimOn(t, conn, "w1", 4)
		more := claimOn(t, conn, "w1", 4) // the hint moves past the eighth row
		if len(first) != 4 || len(more) != 4 {
			t.Fatalf("claimed %d and %d rows", len(first), len(more))
		}
		release(first[:1])
		walkDue(t, conn, false)
		short := claimFor("w2", "w3", "w4", "w5")
		if len(short) != 2 || short[0].ID == first[0].ID || short[1].ID == first[0].ID {
			t.Fatalf("batch %v: claimed %+v, want the 2 rows past the hint and not row %d behind it", batch, short, first[0].ID)
		}
		if got := claimFor("w6", "w7"); len(got) != 0 {
			t.Fatalf("batch %v: claimed %+v past the hint, want nothing", batch, got)
		}
		release(append(first[1:], more...))
		if got := claimFor("w6", "w7"); len(got) != 0 {
			t.Fatalf("batch %v: claimed %+v with every row behind the hint, want nothing", batch, got)
		}
		walkDue(t, conn, true)
		got := claimFor("w11", "w12", "w13", "w14", "w15", "w16", "w17", "w18", "w19", "w20")
		if len(got) != 8 || got[0].ID != first[0].ID {
			t.Fatalf("batch %v: the whole-range search claimed %+v, want the 8 rows behind the hint from %d on", batch, got, first[0].ID)
		}
		release(append(short, got...))
	}
}

// TestClaimHintWholeRangeSearchSpacing: after a whole-range search that
// keeps hints, the next is due a second later, or a hundred times as long
// as the search took; and five minutes after the last at the latest,
// whatever a session's setting says.
func TestClaimHintWholeRangeSearchSpacing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := hintConn(t, pgtest.URL(t))
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	for i := range 3 {
		start := time.Now()
		if got := claimOn(t, conn, "w1", 1); len(got) != 1 {
			t.Fatalf("claim %d: %d rows, want 1", i, len(got))
		}
		took := time.Since(start).Seconds()
		var every float64
		if err := conn.QueryRow(ctx, `SELECT (h ->> 'next')::float8 - (h ->> 'at')::float8
			FROM (SELECT current_setting('pgworker.claim_hints')::jsonb AS h) s`).Scan(&every); err != nil {
			t.Fatal(err)
		}
		if every < 1 || every > max(1, 100*took) {
			t.Fatalf("claim %d took %.4fs: the next whole-range search is due %.4fs after it, want 1s or 100 times as long", i, took, every)
		}
		walkDue(t, conn, true)
	}
	// A hint past every row, and a next search never due: five minutes
	// after the last, it is due all the same.
	for _, c := range []struct {
		ago  int
		want int
	}{{10, 0}, {301, 1}} {
		mustExec(t, conn, `SELECT set_config('pgworker.claim_hints', jsonb_build_object(
			'at', extract(epoch FROM clock_timestamp()) - $1, 'next', 1e300,
			'q', jsonb_build_object('default', jsonb_build_array(0, 9223372036854775806)))::text, false)`, c.ago)
		if got := claimOn(t, conn, "w1", 1); len(got) != c.want {
			t.Fatalf("last whole-range search %ds ago, the next never due: claimed %d rows, want %d", c.ago, len(got), c.want)
		}
	}
}

// TestClaimHintSessionsTakeTurns: the sessions that claim from the same
// queues take turns at the whole-range search. One session's search writes
// the next turn, a second ahead; until it is due another session searches
// past its hints only, also when its own spacing says its search is due;
// once it is, the first claim searches the whole range, also when its own
// spacing says not yet. A session whose queues are not the turn's keeps its
// own spacing, and so does one that reads a turn more than five minutes
// ahead (the clock went back). A session searches five minutes after its
// own last search at the latest, whatever the turn says.
func TestClaimHintSessionsTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	a, b := hintConn(t, url), hintConn(t, url)
	mustExec(t, a, "INSERT INTO files.files (source, queue) SELECT 'x' || g, q FROM generate_series(1, 60) g, unnest(ARRAY['default', 'other']) q")
	claimOf := func(conn *pgx.Conn, queue string, max int) []claimed {
		t.Helper()
		return claimFromOn(t, conn, "w1", []string{queue}, max)
	}
	// behind puts a row of queue behind the session's hint and returns it.
	behind := func(conn *pgx.Conn, queue string) int64 {
		t.Helper()
		r := claimOf(conn, queue, 1)[0]
		claimOf(conn, queue, 3) // the hint moves past r
		mustExec(t, conn, "SELECT files.release($1, 'w1', $2, $3)", r.ID, r.Attempt, r.Token)
		return r.ID
	}
	// takes claims one row of queue and reports whether it is id.
	takes := func(conn *pgx.Conn, queue string, id int64) bool {
		t.Helper()
		got := claimOf(conn, queue, 1)
		if len(got) != 1 {
			t.Fatalf("claimed %+v of %s, want one row", got, queue)
		}
		return got[0].ID == id
	}
	def := []string{"default"}
	var key int64
	if err := a.QueryRow(ctx, "SELECT hashtext(ARRAY['default']::text) & 2097151").Scan(&key); err != nil {
		t.Fatal(err)
	}
	claimOf(a, "default", 1) // both sessions keep hints from here on
	claimOf(b, "default", 1)

	// a's whole-range search writes the turn, a second ahead.
	walkDue(t, a, true)
	if k, in, ok := turnAfter(t, a, func() { claimOf(a, "default", 1) }); k != key || !ok {
		t.Fatalf("after a whole-range search the turn is key %d, due %.3fs after the claim started; want key %d, a second or more", k, in, key)
	}

	id := behind(b, "default")
	setTurn(t, a, def, 200)
	ownDue(t, b, true)
	if takes(b, "default", id) {
		t.Fatalf("a session whose own search was due took row %d behind its hint before the turn was due", id)
	}
	setTurn(t, a, def, -0.001)
	ownDue(t, b, false)
	var took bool
	if k, in, ok := turnAfter(t, b, func() { took = takes(b, "default", id) }); !took || k != key || !ok {
		t.Fatalf("the first claim once the turn was due: took row %d behind the hint %v; the turn after it is key %d, due %.3fs after it started; want key %d, a second or more",
			id, took, k, in, key)
	}

	// Another set of queues keeps its own spacing.
	claimOf(a, "other", 1)
	id = behind(a, "other")
	setTurn(t, a, def, 200)
	ownDue(t, a, true)
	if !takes(a, "other", id) {
		t.Fatalf("a session of other queues than the turn's, its own search due, did not take row %d behind its hint", id)
	}
	ownDue(t, a, false)
	id = behind(a, "other")
	setTurn(t, a, def, -1)
	if takes(a, "other", id) {
		t.Fatalf("a session of other queues than the turn's took row %d behind its hint when the turn was due, its own search not", id)
	}
	ownDue(t, a, true)
	if !takes(a, "other", id) {
		t.Fatalf("row %d was not taken once its session's own search was due", id)
	}

	// A turn more than five minutes ahead is not one; and a session
	// searches five minutes after its own last search at the latest.
	id = behind(b, "default")
	setTurn(t, a, def, 3600)
	ownDue(t, b, true)
	if !takes(b, "default", id) {
		t.Fatalf("a turn an hour ahead held back row %d from a session whose own search was due", id)
	}
	id = behind(b, "default")
	setTurn(t, a, def, 200)
	mustExec(t, b, `SELECT set_config('pgworker.claim_hints', jsonb_set(jsonb_set(current_setting('pgworker.claim_hints')::jsonb,
		'{at}', to_jsonb(extract(epoch FROM clock_timestamp()) - 301)), '{next}', to_jsonb(1e300))::text, false)`)
	if !takes(b, "default", id) {
		t.Fatalf("five minutes after its own last search, a session did not take row %d behind its hint", id)
	}
}

// TestClaimHintKeepsPriority: a row of a higher priority than the hint's,
// enqueued after it, is the next claimed; one of a lower priority waits for
// the hint's priority to run out.
func TestClaimHintKeepsPriority(t *testing.T) {
	t.Parallel()
	conn := hintConn(t, pgtest.URL(t))
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	claimOn(t, conn, "w1", 2)
	claimOn(t, conn, "w1", 2) // hinted from here on
	var high, low int64
	if err := conn.QueryRow(context.Background(), "INSERT INTO files.files (source, priority) VALUES ('high', 5) RETURNING id").Scan(&high); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(context.Background(), "INSERT INTO files.files (source, priority) VALUES ('low', -5) RETURNING id").Scan(&low); err != nil {
		t.Fatal(err)
	}
	if got := claimOn(t, conn, "w1", 1); len(got) != 1 || got[0].ID != high {
		t.Fatalf("claimed %+v, want the priority 5 row %d", got, high)
	}
	got := claimOn(t, conn, "w1", 10)
	if len(got) != 7 || got[6].ID != low {
		t.Fatalf("claimed %+v, want the 6 left of priority 0, then the priority -5 row %d", got, low)
	}
}

// TestClaimHintIgnoresForgedSettings: pgworker.claim_hints is a setting any
// session may write; a value that does not parse is no hint, and claims
// still work.
func TestClaimHintIgnoresForgedSettings(t *testing.T) {
	t.Parallel()
	conn := hintConn(t, pgtest.URL(t))
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 20) g")
	for _, n := range []string{"garbage", "-1", "1e400", "99999999999999", "0.5", "1.5.5"} {
		mustExec(t, conn, "SELECT set_config('pgworker.claim_hint_pages', $1, false)", n)
		if got := claimOn(t, conn, "w1", 1); len(got) != 1 {
			t.Fatalf("with pgworker.claim_hint_pages = %s: claimed %d rows, want 1", n, len(got))
		}
	}
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 0")
	for _, v := range []string{
		"garbage", "[]", `{"at": "x"}`, `{"at": 1e12, "n": 0, "q": []}`, `{"at": 1e12, "n": 0, "q": {"default": ["x", 1]}}`,
		`{"at": 1e12, "n": 0, "q": {"default": [0, "y"]}}`, `{"at": 1e300, "n": 1e300, "q": {}}`,
		`{"at": 0, "next": "x", "q": {}}`, `{"at": 1e12, "next": 1e300, "q": {"default": [0, 9223372036854775806]}}`,
	} {
		mustExec(t, conn, "SELECT set_config('pgworker.claim_hints', $1, false)", v)
		if got := claimOn(t, conn, "w1", 1); len(got) != 1 {
			t.Fatalf("with pgworker.claim_hints = %s: claimed %d rows, want 1", v, len(got))
		}
	}
}

// TestClaimHintsStartWhenSearchIsSlow: a session searches whole ranges and
// keeps no hints while those searches read few pages of files_claim_idx; one
// that reads as many as the bound (pgworker.claim_hint_pages, 50 by default
// and one more per 100 rows asked for) starts hints, and a whole-range
// search under the bound after that drops them. The pages are real ones: a
// transaction holds the xmin horizon while 20,000 rows leave the queue, so
// that their entries stay in the index, about 100 pages of them. Once it is
// let go the searches skip those entries but still read their pages, and the
// hints stay until vacuum clears them. The bound counts pages, not time, so
// the test holds on a machine of any speed and load.
func TestClaimHintsStartWhenSearchIsSlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, holder := plainConn(t, url), plainConn(t, url)
	mustExec(t, conn, "ALTER TABLE files.files SET (autovacuum_enabled = false)")
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	// wholeSearch makes the session's next claim search whole ranges, as
	// it does once it is due.
	wholeSearch := func() {
		t.Helper()
		if hints(t, conn) != "" {
			mustExec(t, conn, `SELECT set_config('pgworker.claim_hints', '{"at": 0, "next": 0, "q": {}}', false)`)
		}
	}

	// Fast searches under the default bound: no hints.
	for i := 0; i < 3; i++ {
		if got := claimOn(t, conn, "w1", 1); len(got) != 1 {
			t.Fatalf("claim %d: %d rows, want 1", i, len(got))
		}
		if h := hints(t, conn); h != "" {
			t.Fatalf("claim %d: hints %s after fast searches, want none", i, h)
		}
	}

	// Held dead entries make the whole-range search slow: the claim after
	// it starts past them.
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM files.queues").Scan(&n); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'dead' || g FROM generate_series(1, 20000) g")
	mustExec(t, conn, "SELECT files.cancel(VARIADIC (SELECT array_agg(id) FROM files.files WHERE state = 'pending'))")
	mustExec(t, conn, "INSERT INTO files.files (source) SELECT 'y' || g FROM generate_series(1, 6) g")
	// About 100 pages: under a bound of 200, no hints; over the default,
	// 50, slow (one row asked for adds a hundredth of a page).
	mustExec(t, conn, "SET pgworker.claim_hint_pages = 200")
	if got := claimOn(t, conn, "w1", 1); len(got) != 1 || hints(t, conn) != "" {
		t.Fatalf("claim under the bound: %d rows, hints %q, want 1 and none", len(got), hints(t, conn))
	}
	mustExec(t, conn, "RESET pgworker.claim_hint_pages")
	got := claimOn(t, conn, "w1", 1)
	if len(got) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(got))
	}
	if h := hints(t, conn); !strings.Contains(h, fmt.Sprintf(`"default": [0, %d]`, got[0].ID+1)) {
		t.Fatalf("hints %q after a slow search, want the default queue's past row %d", h, got[0].ID)
	}
	if got := claimOn(t, conn, "w1", 1); len(got) != 1 || hints(t, conn) == "" {
		t.Fatalf("hinted claim: %d rows, hints %q", len(got), hints(t, conn))
	}

	// The snapshot let go, whole searches mark the entries dead and then
	// skip them, but still read their pages: the hints stay.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		wholeSearch()
		if got := claimOn(t, conn, "w1", 1); len(got) != 1 || hints(t, conn) == "" {
			t.Fatalf("whole search %d after the snapshot: %d rows, hints %q, want 1 and hints", i, len(got), hints(t, conn))
		}
	}

	// Vacuum clears the pages: the next whole-range search reads few, and
	// the hints go.
	mustExec(t, conn, "VACUUM files.files")
	wholeSearch()
	if got := claimOn(t, conn, "w1", 1); len(got) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(got))
	}
	if h := hints(t, conn); h != "" {
		t.Fatalf("hints %s after a whole-range search of a vacuumed index, want none", h)
	}
}
