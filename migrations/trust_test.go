package migrations_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// loginAs creates a LOGIN role that is a member of member (none when empty)
// and returns a pool that connects as it to the database at dbURL.
func loginAs(t *testing.T, dbURL, member string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := "pgworker_login_" + strings.ToLower(rand.Text()[:10])
	password := rand.Text()
	super := pgtest.PoolFor(t, dbURL)
	stmt := fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password)
	if member != "" {
		stmt += " IN ROLE " + member
	}
	mustExec(t, super, stmt)
	t.Cleanup(func() {
		// The role's pool closes first (cleanups run last in, first out).
		if _, err := super.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	pool := pgtest.PoolFor(t, u.String())
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	return pool
}

// wantRefused runs sql and fails unless it is refused with SQLSTATE state
// and a message that holds msg.
func wantRefused(t *testing.T, pool *pgxpool.Pool, state, msg, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != state || !strings.Contains(pgErr.Message, msg) {
		t.Errorf("%s: got %v, want SQLSTATE %s with %q", sql, err, state, msg)
	}
}

// A pgworker_worker login on another node sees the victim's worker id and
// attempt in files.active_workers, and a reader sees the token's hash: with
// them it can neither record an outcome for the victim's row, nor keep the
// victim's slot alive, drain it or deregister it, nor take its id over, nor
// hold rows hostage past any reap. The victim's own calls go through.
func TestForeignWorkerIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	admin := pgtest.PoolFor(t, dbURL)
	victim := loginAs(t, dbURL, "pgworker_worker")
	thief := loginAs(t, dbURL, "pgworker_worker")
	reader := loginAs(t, dbURL, "pgworker_reader")
	mustExec(t, admin, "INSERT INTO files.files (source) VALUES ('a'), ('b'), ('c')")

	const victimKey = "victim-key-0123456789"
	var key string
	if err := victim.QueryRow(ctx, "SELECT files.register_worker('v:1:0', 'v', 1, 0, key => $1)", victimKey).Scan(&key); err != nil || key != victimKey {
		t.Fatalf("register: %q, %v", key, err)
	}
	var id int64
	var attempt int
	var token string
	if err := victim.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim('v:1:0', key => $1)", victimKey).
		Scan(&id, &attempt, &token); err != nil {
		t.Fatal(err)
	}
	if len(token) < 32 {
		t.Fatalf("claim token %q: want a secret of at least 32 characters", token)
	}

	// What the thief can learn.
	var seenWorker string
	var seenAttempt int
	if err := thief.QueryRow(ctx, "SELECT worker_id, attempt FROM files.active_workers WHERE file_id = $1", id).
		Scan(&seenWorker, &seenAttempt); err != nil || seenWorker != "v:1:0" || seenAttempt != attempt {
		t.Fatalf("active_workers: %q %d %v", seenWorker, seenAttempt, err)
	}
	var hashHex string
	if err := reader.QueryRow(ctx, "SELECT encode(claim_token_hash, 'hex') FROM files.files WHERE id = $1", id).Scan(&hashHex); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, reader, "SELECT count(*) FROM files.files WHERE claim_token IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows show a claim token to a reader", n)
	}
	wantRefused(t, thief, "42501", "permission denied", "SELECT claim_token_hash FROM files.files")
	var thiefKey string
	if err := thief.QueryRow(ctx, "SELECT files.register_worker('t:2:0')").Scan(&thiefKey); err != nil || len(thiefKey) < 16 {
		t.Fatalf("thief's own registration: %q, %v", thiefKey, err)
	}

	// The thief's own claim, and its token: good for its own row only.
	var thiefToken string
	if err := thief.QueryRow(ctx, "SELECT claim_token FROM files.claim_batch(ARRAY['t:2:0'], key => $1)", thiefKey).Scan(&thiefToken); err != nil {
		t.Fatal(err)
	}

	forged := "wrong claim token"
	for _, guess := range []string{"", "forged", hashHex, thiefKey, victimKey[:10], thiefToken} {
		wantRefused(t, thief, "42501", forged, `SELECT files.complete($1, 'v:1:0', $2, $3, '{"forged": true}')`, id, attempt, guess)
		wantRefused(t, thief, "42501", forged, `SELECT * FROM files.complete_many(ARRAY[$1::bigint], ARRAY['v:1:0'], ARRAY[$2::int], ARRAY[$3])`, id, attempt, guess)
		wantRefused(t, thief, "42501", forged, `SELECT files.fail($1, 'v:1:0', $2, $3, 'forged', false)`, id, attempt, guess)
		wantRefused(t, thief, "42501", forged, `SELECT * FROM files.fail_many(ARRAY[$1::bigint], ARRAY['v:1:0'], ARRAY[$2::int], ARRAY[$3], ARRAY['forged'])`, id, attempt, guess)
		wantRefused(t, thief, "42501", forged, `SELECT files.release($1, 'v:1:0', $2, $3)`, id, attempt, guess)
	}
	notYours := "is not the caller's"
	for _, k := range []any{thiefKey, hashHex, nil} {
		wantRefused(t, thief, "42501", notYours, "SELECT * FROM files.heartbeat($1, 'v:1:0')", k)
		wantRefused(t, thief, "42501", notYours, "SELECT * FROM files.heartbeat($1, 't:2:0', 'v:1:0')", k)
		wantRefused(t, thief, "42501", notYours, "SELECT files.drain_worker($1, 'v:1:0')", k)
		wantRefused(t, thief, "42501", notYours, "SELECT files.deregister_worker('v:1:0', $1)", k)
		wantRefused(t, thief, "42501", "has a key and this is not it", "SELECT * FROM files.claim('v:1:0', key => $1)", k)
		wantRefused(t, thief, "42501", "has a key and this is not it", "SELECT * FROM files.claim_batch(ARRAY['t:2:0', 'v:1:0'], key => $1)", k)
	}
	wantRefused(t, thief, "42501", "has a key and this is not it",
		"SELECT files.register_worker('v:1:0', lease_timeout => '1 hour', key => $1)", thiefKey)
	wantRefused(t, thief, "42501", "has a key and this is not it", "SELECT files.register_worker('v:1:0')")

	// Hostages: a lease past any reap, or the whole backlog in one claim.
	wantRefused(t, thief, "22023", "lease_timeout must be above 0 and at most 24 hours",
		"SELECT files.register_worker('t:2:1', lease_timeout => '1000 years')")
	wantRefused(t, thief, "22023", "lease_timeout must be above 0 and at most 24 hours",
		"SELECT files.register_worker('t:2:1', lease_timeout => '0 seconds')")
	wantRefused(t, thief, "22023", "max must be between 1 and 10000",
		"SELECT * FROM files.claim('t:2:0', NULL, 100000, key => $1)", thiefKey)
	wantRefused(t, thief, "22023", "at most 10000 worker_ids",
		"SELECT * FROM files.claim_batch((SELECT array_agg('t:3:' || g) FROM generate_series(1, 10001) g), key => $1)", thiefKey)
	wantRefused(t, admin, "23514", "workers_lease_timeout_at_most_a_day",
		"UPDATE files.workers SET lease_timeout = '25 hours' WHERE worker_id = 't:2:0'")

	// Nothing changed: the row runs in the victim's attempt, its lease as
	// the victim left it, no attempt was recorded, the slot is active.
	if n := queryInt(t, admin, `SELECT count(*) FROM files.files WHERE id = $1 AND state = 'running'
		AND worker_id = 'v:1:0' AND attempt = $2 AND result IS NULL`, id, attempt); n != 1 {
		t.Fatal("the victim's row changed")
	}
	if n := queryInt(t, admin, "SELECT count(*) FROM files.attempts"); n != 0 {
		t.Fatalf("%d attempts recorded", n)
	}
	if n := queryInt(t, admin, "SELECT count(*) FROM files.workers WHERE worker_id = 'v:1:0' AND state = 'active' AND lease_timeout = '15 seconds'"); n != 1 {
		t.Fatal("the victim's slot changed")
	}

	// The honest path.
	if n := queryInt(t, victim, "SELECT count(*) FROM files.heartbeat($1, 'v:1:0')", victimKey); n != 1 {
		t.Fatalf("victim's heartbeat saw %d rows, want 1", n)
	}
	// A token is one claim's: the slot's next claim has another, and
	// neither works on the other's row.
	var nextID int64
	var nextToken string
	if err := victim.QueryRow(ctx, "SELECT id, claim_token FROM files.claim('v:1:0', key => $1)", victimKey).Scan(&nextID, &nextToken); err != nil {
		t.Fatal(err)
	}
	if nextToken == token {
		t.Fatal("two claims returned the same token")
	}
	wantRefused(t, victim, "42501", forged, `SELECT files.complete($1, 'v:1:0', 1, $2, '{}')`, nextID, token)
	wantRefused(t, victim, "42501", forged, `SELECT files.complete($1, 'v:1:0', $2, $3, '{}')`, id, attempt, nextToken)
	if !queryBool(t, victim, `SELECT files.complete($1, 'v:1:0', 1, $2, '{}')`, nextID, nextToken) {
		t.Fatal("the next claim's complete was refused")
	}
	if !queryBool(t, victim, `SELECT files.complete($1, 'v:1:0', $2, $3, '{"by": "victim"}')`, id, attempt, token) {
		t.Fatal("the claimer's complete was refused")
	}
	if by := queryInt(t, admin, `SELECT count(*) FROM files.files WHERE id = $1 AND state = 'done' AND result->>'by' = 'victim'`, id); by != 1 {
		t.Fatal("the row is not done with the claimer's result")
	}
	// A finished row's token no longer works, and says nothing: false.
	if queryBool(t, victim, `SELECT files.complete($1, 'v:1:0', $2, $3, '{}')`, id, attempt, token) {
		t.Fatal("second complete accepted")
	}
	if n := queryInt(t, victim, "SELECT files.drain_worker($1, 'v:1:0')", victimKey); n != 1 {
		t.Fatalf("drain marked %d slots", n)
	}
	if n := queryInt(t, victim, "SELECT files.deregister_worker('v:1:0', $1)", victimKey); n != 0 {
		t.Fatalf("deregister released %d rows", n)
	}
}

// A claim token is the claim's: every row one call returns carries it, for
// whichever of the call's slots, and records each of their outcomes; it is
// good for no row of another call. Rows one call claims go to one caller
// (one slot, or one process's slots under one key): the boundary SECURITY.md
// states.
func TestClaimTokenIsTheCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	admin := pgtest.PoolFor(t, dbURL)
	w := loginAs(t, dbURL, "pgworker_worker")
	mustExec(t, admin, "INSERT INTO files.files (source) SELECT 's' || g FROM generate_series(1, 4) g")
	const key = "process-key-0123456789"

	type claimed struct {
		id      int64
		worker  string
		attempt int
		token   string
	}
	claim := func(sql string) []claimed {
		t.Helper()
		rows, err := w.Query(ctx, sql, key)
		if err != nil {
			t.Fatal(err)
		}
		var out []claimed
		for rows.Next() {
			var c claimed
			if err := rows.Scan(&c.id, &c.worker, &c.attempt, &c.token); err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := claim("SELECT id, worker_id, attempt, claim_token FROM files.claim_batch(ARRAY['p:1:0', 'p:1:1'], key => $1)")
	second := claim("SELECT id, worker_id, attempt, claim_token FROM files.claim('p:1:2', NULL, 2, key => $1)")
	if len(first) != 2 || len(second) != 2 {
		t.Fatalf("claimed %d and %d rows, want 2 and 2", len(first), len(second))
	}
	if first[0].token != first[1].token || second[0].token != second[1].token {
		t.Fatalf("a call's rows carry different tokens: %q %q, %q %q", first[0].token, first[1].token, second[0].token, second[1].token)
	}
	if first[0].token == second[0].token {
		t.Fatal("two calls returned the same token")
	}
	for _, c := range first {
		wantRefused(t, w, "42501", "wrong claim token", "SELECT files.complete($1, $2, $3, $4, '{}')", c.id, c.worker, c.attempt, second[0].token)
	}
	for _, c := range second {
		wantRefused(t, w, "42501", "wrong claim token", "SELECT files.fail($1, $2, $3, $4, 'x')", c.id, c.worker, c.attempt, first[0].token)
	}
	for _, c := range append(first, second...) {
		if !queryBool(t, w, "SELECT files.complete($1, $2, $3, $4, '{}')", c.id, c.worker, c.attempt, c.token) {
			t.Fatalf("row %d: the claim's own token refused", c.id)
		}
	}
	if n := queryInt(t, admin, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 4 {
		t.Fatalf("%d rows done, want 4", n)
	}
}

// A script that calls get_unprocessed_entry_by_priority with a key of its
// own registers its slot with that key, heartbeats with it, and records the
// outcome with the row's claim token; the slot's key releases a row whose
// token was lost. A slot first claimed without a key can claim, and nobody
// can heartbeat it.
func TestScriptWorkerWithKey(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	admin := pgtest.PoolFor(t, dbURL)
	script := loginAs(t, dbURL, "pgworker_worker")
	mustExec(t, admin, "INSERT INTO files.files (source) VALUES ('a'), ('b'), ('c')")

	const key = "script-key-0123456789"
	got := func(sql string, args ...any) (int64, int, string) {
		t.Helper()
		var id int64
		var attempt int
		var token string
		if err := script.QueryRow(context.Background(), sql, args...).Scan(&id, &attempt, &token); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return id, attempt, token
	}
	id, attempt, token := got("SELECT id, attempt, claim_token FROM files.get_unprocessed_entry_by_priority('host:7', $1)", key)
	if n := queryInt(t, script, "SELECT count(*) FROM files.heartbeat($1, 'host:7')", key); n != 1 {
		t.Fatalf("heartbeat: %d rows", n)
	}
	if !queryBool(t, script, "SELECT files.complete($1, 'host:7', $2, $3, '{}')", id, attempt, token) {
		t.Fatal("complete refused")
	}
	id, attempt, _ = got("SELECT id, attempt, claim_token FROM files.get_unprocessed_entry_by_priority('host:7', $1)", key)
	if !queryBool(t, script, "SELECT files.release($1, 'host:7', $2, $3, 'token lost')", id, attempt, key) {
		t.Fatal("release with the slot's key refused")
	}
	wantRefused(t, script, "42501", "has a key and this is not it",
		"SELECT * FROM files.get_unprocessed_entry_by_priority('host:7')")
	wantRefused(t, script, "22023", "key must be at least 16 characters",
		"SELECT * FROM files.get_unprocessed_entry_by_priority('host:8', 'short')")

	// Without a key: claims work, heartbeats are refused.
	id, attempt, token = got("SELECT id, attempt, claim_token FROM files.get_unprocessed_entry_by_priority('host:9')")
	wantRefused(t, script, "42501", "is not the caller's", "SELECT * FROM files.heartbeat($1, 'host:9')", key)
	if !queryBool(t, script, "SELECT files.fail($1, 'host:9', $2, $3, 'broken', false)", id, attempt, token) {
		t.Fatal("fail refused")
	}
}

// A payload is checked when it is written, by INSERT, COPY or an UPDATE that
// sets it, and not by the claims, heartbeats and outcomes that update its
// row: a row whose payload the check would refuse (written while the
// trigger was disabled) is claimed, kept alive and completed, though not
// copied into a next stage.
func TestPayloadCheckedWhenWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	refusedBy := func(what, constraint string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != constraint {
			t.Errorf("%s: got %v, want SQLSTATE 23514 from %s", what, err, constraint)
		}
	}
	const big = `jsonb_build_object('x', repeat('a', 1048576))`

	_, err := pool.CopyFrom(ctx, pgx.Identifier{"files", "files"}, []string{"source", "payload"},
		pgx.CopyFromRows([][]any{{"fits", map[string]any{"a": 1}}, {"a list", []any{1}}}))
	refusedBy("COPY of a list", "files_payload_is_object", err)
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files"); n != 0 {
		t.Fatalf("a refused COPY left %d rows", n)
	}
	// One bad row among good ones: the statement stores none, and the
	// error names the row.
	_, err = pool.Exec(ctx, `INSERT INTO files.files (source, payload)
		SELECT 'row ' || i, CASE WHEN i = 7 THEN `+big+` ELSE '{}' END FROM generate_series(1, 10) i`)
	refusedBy("INSERT of ten rows, one too large", "files_payload_at_most_1mib", err)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Detail, "source row 7") {
		t.Errorf("the refusal does not name the row: %v", err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files"); n != 0 {
		t.Fatalf("a refused INSERT left %d rows", n)
	}
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('fine')")
	_, err = pool.Exec(ctx, "UPDATE files.files SET payload = '[1]' WHERE source = 'fine'")
	refusedBy("UPDATE to a list", "files_payload_is_object", err)
	_, err = pool.Exec(ctx, "UPDATE files.files SET payload = "+big+" WHERE source = 'fine'")
	refusedBy("UPDATE to over 1 MiB", "files_payload_at_most_1mib", err)

	mustExec(t, pool, "ALTER TABLE files.files DISABLE TRIGGER files_payload_checked")
	mustExec(t, pool, "INSERT INTO files.files (source, queue, payload) VALUES ('written around the check', 'old', "+big+")")
	mustExec(t, pool, "ALTER TABLE files.files ENABLE TRIGGER files_payload_checked")
	h := claimOne(t, pool, "w", "old")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.heartbeat($1, 'w')", testKey); n != 1 {
		t.Fatalf("heartbeat kept %d rows, want 1", n)
	}
	// A next stage's rows copy the payload: they are checked as they are
	// inserted, and the refusal undoes the completion with them.
	_, err = pool.Exec(ctx, "SELECT files.complete($1, 'w', $2, $3, $4, NULL, 'next')", h.id, h.attempt, h.token,
		`{"outputs": [{"key": "out/1"}]}`)
	refusedBy("complete with then_queue copying the payload", "files_payload_at_most_1mib", err)
	if !queryBool(t, pool, "SELECT files.complete($1, 'w', $2, $3, '{}')", h.id, h.attempt, h.token) {
		t.Fatal("complete refused")
	}
	// Setting it still checks it, on that row too.
	_, err = pool.Exec(ctx, "UPDATE files.files SET payload = payload WHERE source = 'written around the check'")
	refusedBy("UPDATE that sets the payload again", "files_payload_at_most_1mib", err)
}

// Payloads are bounded (1 MiB of text), and an empty queue name is an error
// wherever the API takes one: before, a retry with an empty queue name retried the
// failed rows of every queue.
func TestBoundsAndEmptyQueueNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, `INSERT INTO files.files (source, payload) VALUES ('fits', jsonb_build_object('x', repeat('a', 1048576 - 10)))`)
	wantRefused(t, pool, "23514", "files_payload_at_most_1mib",
		`INSERT INTO files.files (source, payload) VALUES ('big', jsonb_build_object('x', repeat('a', 1048576)))`)

	mustExec(t, pool, "INSERT INTO files.files (source, queue, state, finished_at) VALUES ('f', 'q', 'failed', now())")
	for _, sql := range []string{
		"SELECT files.retry(NULL, '')",
		"SELECT files.pause_queue('')",
		"SELECT files.resume_queue('')",
		"SELECT * FROM files.claim('w', ARRAY[''], key => 'test-key-0123456789')",
		"SELECT * FROM files.claim('w', ARRAY['q', NULL], key => 'test-key-0123456789')",
		"SELECT * FROM files.claim_batch(ARRAY['w'], ARRAY[''], key => 'test-key-0123456789')",
		"SELECT files.register_worker('w', queues => ARRAY[''])",
	} {
		wantRefused(t, pool, "22023", "", sql)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state = 'failed'"); n != 1 {
		t.Fatalf("%d failed rows left, want 1", n)
	}
}
