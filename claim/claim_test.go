package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func insert(t *testing.T, pool *pgxpool.Pool, n int, queue string) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		"INSERT INTO files.files (queue, source) SELECT $1, 'src-' || g FROM generate_series(1, $2::int) g", queue, n)
	if err != nil {
		t.Fatal(err)
	}
}

func TestClaimOneRowPerSlot(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	insert(t, pool, 5, "default")
	if _, err := pool.Exec(ctx, "UPDATE files.files SET priority = 9 WHERE id = 4"); err != nil {
		t.Fatal(err)
	}
	c := claim.New(pool, nil)
	rows, err := c.Claim(ctx, []string{"n:1:0", "n:1:1", "n:1:2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("claimed %d rows, want 3", len(rows))
	}
	if rows[0].ID != 4 || rows[1].ID != 1 || rows[2].ID != 2 {
		t.Fatalf("claim order: %d %d %d, want 4 1 2 (priority, then id)", rows[0].ID, rows[1].ID, rows[2].ID)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.WorkerID] || r.Attempt != 1 || r.Source == "" || string(r.Payload) != "{}" || r.LeaseExpiresAt.IsZero() {
			t.Fatalf("bad row %+v", r)
		}
		seen[r.WorkerID] = true
	}
	var held int
	if err := pool.QueryRow(ctx, "SELECT count(DISTINCT worker_id) FROM files.files WHERE state = 'running'").Scan(&held); err != nil || held != 3 {
		t.Fatalf("running rows held by %d slots (%v), want 3", held, err)
	}

	// Nothing left for these queues: an empty claim is a lost race, not an error.
	rows, err = claim.New(pool, &claim.Config{Queues: []string{"other"}}).Claim(ctx, []string{"n:1:3"})
	if err != nil || len(rows) != 0 {
		t.Fatalf("claim of an empty queue: %d rows, %v", len(rows), err)
	}
}

func TestRaceLost(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40001"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"}), true},
		{&pgconn.PgError{Code: "23505"}, false},
		{errors.New("connection refused"), false},
		{nil, false},
	} {
		if got := claim.RaceLost(tc.err); got != tc.want {
			t.Errorf("RaceLost(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// idleSlots returns the worker ids of n slots of one process.
func idleSlots(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("n:1:%d", i)
	}
	return ids
}

// collector gathers delivered rows.
type collector struct {
	mu   sync.Mutex
	rows []claim.Row
	got  chan claim.Row
}

func newCollector() *collector { return &collector{got: make(chan claim.Row, 1000)} }

func (c *collector) deliver(r claim.Row) {
	c.mu.Lock()
	c.rows = append(c.rows, r)
	c.mu.Unlock()
	c.got <- r
}

func (c *collector) next(t *testing.T, what string) claim.Row {
	t.Helper()
	select {
	case r := <-c.got:
		return r
	case <-time.After(patience):
		t.Fatalf("no row delivered: %s", what)
		return claim.Row{}
	}
}

func run(t *testing.T, c *claim.Claimer, deliver func(claim.Row)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx, deliver)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func TestRunClaimsOnDoorbellOnly(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	bell := make(chan struct{}, 1)
	c := claim.New(pool, &claim.Config{Idle: []string{"n:1:0"}, Doorbell: bell, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })

	insert(t, pool, 1, "default") // nobody rings
	bell <- struct{}{}
	col.next(t, "after the doorbell")
	if s := c.Stats(); s.Claims != 2 || s.Rows != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// A claim that filled every idle slot looks again as soon as a slot frees up,
// without a notification.
func TestRunClaimsAgainWhenSlotsFree(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	insert(t, pool, 5, "default")
	c := claim.New(pool, &claim.Config{Idle: []string{"n:1:0", "n:1:1"}, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	first := col.next(t, "first")
	col.next(t, "second")

	c.Free(first.WorkerID)
	third := col.next(t, "after a slot freed up")
	if third.WorkerID != first.WorkerID {
		t.Fatalf("row went to %s, want the freed slot %s", third.WorkerID, first.WorkerID)
	}
	if s := c.Stats(); s.Claims != 2 {
		t.Fatalf("claims = %d, want 2 (one per wake-up)", s.Claims)
	}
}

// A backlog fills every idle slot within a few claims, each naming twice as
// many slots as the one before and each finding rows.
func TestRunBacklogFillsEveryIdleSlot(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	insert(t, pool, 50, "default")
	idle := idleSlots(10)
	c := claim.New(pool, &claim.Config{Idle: idle, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	held := map[string]bool{}
	for range idle {
		held[col.next(t, "a row for each idle slot").WorkerID] = true
	}
	if len(held) != len(idle) {
		t.Fatalf("%d slots got rows, want %d", len(held), len(idle))
	}
	// Asking for 2, 4, then the 4 left: three claims, none of them empty.
	if s := c.Stats(); s.Claims != 3 || s.RacesLost != 0 || s.IdleSlots != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// Rows announced one at a time cost one claim each, however many slots are
// idle: a claim that names two slots and finds one row looks no further.
func TestRunOneClaimPerLoneRow(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	bell := make(chan struct{}, 1)
	idle := idleSlots(10)
	c := claim.New(pool, &claim.Config{Idle: idle, Doorbell: bell, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })
	for i := range 5 {
		insert(t, pool, 1, "default")
		bell <- struct{}{}
		col.next(t, "the announced row")
		// The claim is counted once answered, before its row is delivered.
		if s := c.Stats(); s.Claims != uint64(2+i) || s.Rows != uint64(1+i) {
			t.Fatalf("after row %d: %+v", i+1, s)
		}
	}
}

func TestRunSafetyNetAndWakeAt(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()

	// A row scheduled in the future; the claimer is told when.
	var runAfter time.Time
	err := pool.QueryRow(ctx, `INSERT INTO files.files (source, run_after) VALUES ('later', now() + interval '300 milliseconds')
		RETURNING run_after`).Scan(&runAfter)
	if err != nil {
		t.Fatal(err)
	}
	c := claim.New(pool, &claim.Config{Idle: []string{"n:1:0"}, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	c.WakeAt(runAfter)
	r := col.next(t, "at run_after")
	if r.Source != "later" || time.Now().Before(runAfter) {
		t.Fatalf("got %q at %v, run_after %v", r.Source, time.Now(), runAfter)
	}

	// The safety net alone finds a row nobody announced.
	pool2 := pgtest.Pool(t)
	c2 := claim.New(pool2, &claim.Config{Idle: []string{"n:2:0"}, SafetyNet: 200 * time.Millisecond})
	col2 := newCollector()
	run(t, c2, col2.deliver)
	waitFor(t, "the first look", func() bool { return c2.Stats().Claims >= 1 })
	insert(t, pool2, 1, "default")
	col2.next(t, "by the safety net")
	if c2.Stats().SafetyWakes == 0 {
		t.Fatal("no safety-net wake counted")
	}
}

// A claim that finds rows past its session's claim hints, fewer than it
// asked for, or none, does not read the rows behind them (files.pick) until
// its session's next whole-range search is due: with no doorbell and the
// safety net an hour away, the claimer looks once more a second later, and
// again two seconds after a look that found nothing, and the look made once
// the whole-range search is due takes a row behind the hints.
func TestRunLooksAgainAfterAShortHintedClaim(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolFor(t, pgtest.URL(t), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one session: the hints set below are the claimer's
		cfg.ConnConfig.RuntimeParams["pgworker.claim_hint_pages"] = "0"
	})
	ctx := context.Background()
	insert(t, pool, 3, "default")
	var last int64
	if err := pool.QueryRow(ctx, "SELECT max(id) FROM files.files").Scan(&last); err != nil {
		t.Fatal(err)
	}
	// The session's hint of queue default is at the last row, as if it had
	// claimed the two before it; they are behind it, pending, and its next
	// whole-range search is an hour away.
	_, err := pool.Exec(ctx, `SELECT set_config('pgworker.claim_hints', jsonb_build_object(
		'at', extract(epoch FROM clock_timestamp()), 'next', extract(epoch FROM clock_timestamp()) + 3600,
		'q', jsonb_build_object('default', jsonb_build_array(0, $1::bigint)))::text, false)`, last)
	if err != nil {
		t.Fatal(err)
	}
	c := claim.New(pool, &claim.Config{Idle: []string{"n:1:0", "n:1:1"}, SafetyNet: time.Hour})
	col := newCollector()
	run(t, c, col.deliver)
	if first := col.next(t, "the first claim"); first.ID != last {
		t.Fatalf("the first claim took row %d, want row %d at the hint", first.ID, last)
	}
	waitFor(t, "a look that finds nothing", func() bool { return c.Stats().Claims >= 2 })
	if s := c.Stats(); s.SafetyWakes < 1 || s.Rows != 1 {
		t.Fatalf("stats: %+v, want a look that found nothing", s)
	}
	// The whole-range search is due: the next look, two seconds after the
	// last, takes a row behind the hint.
	if _, err := pool.Exec(ctx, `SELECT set_config('pgworker.claim_hints', jsonb_set(current_setting('pgworker.claim_hints')::jsonb,
		'{next}', '0')::text, false)`); err != nil {
		t.Fatal(err)
	}
	if second := col.next(t, "a row behind the hint, with no doorbell"); second.ID == last {
		t.Fatalf("row %d delivered twice", last)
	}
	if s := c.Stats(); s.SafetyWakes < 2 {
		t.Fatalf("stats: %+v, want the row taken by a second look", s)
	}
}

// Connection errors back off, log once, and claiming resumes by itself.
func TestRunSurvivesConnectionErrors(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	proxy := pgtest.StartProxy(t, url)
	pool := pgtest.PoolFor(t, proxy.URL(t, url))
	direct := pgtest.PoolFor(t, url)
	var logs syncBuffer
	bell := make(chan struct{}, 1)
	c := claim.New(pool, &claim.Config{
		Idle: []string{"n:1:0"}, Doorbell: bell, SafetyNet: time.Hour,
		BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	col := newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })

	proxy.Refuse()
	proxy.Drop()
	insert(t, direct, 1, "default")
	bell <- struct{}{}
	waitFor(t, "five failed claims", func() bool { return c.Stats().Errors >= 5 })
	proxy.Restore()
	col.next(t, "after the outage")
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d warnings for one outage, want 1:\n%s", n, logs.String())
	}
}

// A claim on a connection the server ended while it sat in the pool (no
// ping checks it first, as with worker.ShouldPing) is tried again at once,
// on a new connection: with an hour's backoff, only that claim can deliver
// the row.
func TestRunClaimsAgainAtOnceOnALostConnection(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.RuntimeParams["application_name"] = "claimer-lost-connection"
	})
	bell := make(chan struct{}, 1)
	c := claim.New(pool, &claim.Config{
		Idle: []string{"n:1:0"}, Doorbell: bell, SafetyNet: time.Hour,
		BackoffMin: time.Hour, BackoffMax: time.Hour,
	})
	col := newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })

	pgtest.EndSession(t, url, "claimer-lost-connection")
	insert(t, pgtest.PoolFor(t, url), 1, "default")
	bell <- struct{}{}
	col.next(t, "after the lost connection")
	// The claim that delivered it clears the last error after handing out
	// its rows.
	waitFor(t, "the last error cleared", func() bool { return c.Stats().LastClaimErr == "" })
	if n := c.Stats().Errors; n != 1 {
		t.Fatalf("%d claim errors, want the one claim on the lost connection", n)
	}
}

// The claimer sends plain calls with parameters: it works whatever statement
// mode the pool uses (PgBouncer in transaction mode needs Exec or simple protocol).
func TestClaimStatementModes(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeDescribeExec} {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		insert(t, pool, 2, "q")
		rows, err := claim.New(pool, &claim.Config{Queues: []string{"q"}}).Claim(context.Background(), []string{"m:" + mode.String()})
		pool.Close()
		if err != nil || len(rows) != 1 {
			t.Fatalf("mode %v: %d rows, %v", mode, len(rows), err)
		}
	}
}

// patience bounds every wait for something that must happen: long enough
// for a machine loaded by other suites, so that only a defect times out.
const patience = 2 * time.Minute

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testhelp.WaitFor(t, patience, what, cond)
}

type syncBuffer = testhelp.SyncBuffer

// A claim's transaction commits without waiting for its WAL flush, and the
// session's setting is the same after it: seen at the claim's commit by a
// deferred trigger, and on the one connection of the pool afterwards.
func TestClaimCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolFor(t, pgtest.URL(t), func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE public.seen_at_commit (setting text);
		CREATE FUNCTION public.note_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.seen_at_commit VALUES (current_setting('synchronous_commit'));
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER note_commit AFTER UPDATE ON files.files
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.note_commit()`); err != nil {
		t.Fatal(err)
	}
	insert(t, pool, 3, "q")
	c := claim.New(pool, &claim.Config{Queues: []string{"q"}})
	for _, ids := range [][]string{{"a:1:0"}, {"a:1:1", "a:1:2"}} { // files.claim, files.claim_batch
		rows, err := c.Claim(ctx, ids)
		if err != nil || len(rows) != len(ids) {
			t.Fatalf("claim for %v: %d rows, %v", ids, len(rows), err)
		}
	}
	var settings []string
	rs, _ := pool.Query(ctx, "SELECT setting FROM public.seen_at_commit")
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		settings = append(settings, s)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	if len(settings) != 3 || strings.Count(strings.Join(settings, ","), "off") != 3 {
		t.Fatalf("synchronous_commit at the claims' commits: %v, want off three times", settings)
	}
	var after string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after); err != nil || after != "on" {
		t.Fatalf("synchronous_commit after the claims: %q, %v; want on (the claim's setting is its transaction's)", after, err)
	}
	// Nothing to claim: no rows, no error.
	if rows, err := c.Claim(ctx, []string{"a:1:3", "a:1:4"}); err != nil || len(rows) != 0 {
		t.Fatalf("claim of an empty queue: %d rows, %v", len(rows), err)
	}
}
