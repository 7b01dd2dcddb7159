package worker_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgbouncertest"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/listener"
	"github.com/pgworker/pgworker/worker"
)

// With the safety net an hour away, only the notification of the insert can
// bring the row to an idle worker.
func TestDoorbellAloneCarriesWork(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	close(g.open)
	w := start(t, pool, &worker.Config{Handler: g, Slots: 4, SafetyNet: time.Hour})
	settled(t, w)

	id := insert(t, pool, 1)[0]
	if j := g.next(t, "the doorbell"); j.ID != id || j.Attempt != 1 || j.Source != "src-1" {
		t.Fatalf("job %+v", j)
	}
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE state = 'done' AND result = jsonb_build_object('id', id)")
	waitFor(t, "the done counter", func() bool { return w.Stats().Done == 1 })
}

// The listen connection is terminated and stays away while rows arrive: their
// notifications are lost, and the ring after the reconnect brings them.
func TestRowsInsertedWhileListenerIsDown(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	proxy := pgtest.StartProxy(t, url)
	w := start(t, pool, &worker.Config{
		Handler: noop, Slots: 4, SafetyNet: time.Hour, ListenURL: proxy.URL(t, url),
	})
	settled(t, w)

	proxy.Refuse() // the listener cannot come back until Restore
	if n := count(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgworker listener'`); n != 1 {
		t.Fatalf("terminated %d listen connections, want 1", n)
	}
	waitFor(t, "the listener to notice", func() bool { return !w.Stats().Listening })
	insert(t, pool, 20)
	insert(t, pool, 5)
	proxy.Restore()

	waitCount(t, pool, 25, "SELECT count(*) FROM files.files WHERE state = 'done'")
	waitFor(t, "the done counter", func() bool { return w.Stats().Done == 25 })
	if s := w.Stats(); s.ListenerReconnects < 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// An immediate restart of the whole server: a handler running across it
// records its outcome afterwards (the complete is retried), heartbeats
// resume, and rows inserted before the listener is back are processed.
func TestServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL cluster")
	}
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Destroy()
	url := cluster.URL("postgres")
	if err := pgtest.MigrateUp(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolFor(t, url)
	test := pgtest.PoolFor(t, url)
	proxy := pgtest.StartProxy(t, url)
	var logs logCapture
	g := newGate()
	w := start(t, pool, &worker.Config{
		Handler: g, Slots: 4, SafetyNet: time.Hour, ListenURL: proxy.URL(t, url),
		HeartbeatInterval: 200 * time.Millisecond, LeaseTimeout: 5 * time.Second, Logger: logs.logger(),
	})
	settled(t, w)
	first := insert(t, test, 1)[0]
	g.next(t, "the first row")
	// A claim commits without waiting for its WAL flush (package claim): a
	// checkpoint flushes it, so that the row is certainly held across the
	// crash. (A claim the crash takes with it: TestClaimLostWithTheServer.)
	if _, err := test.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}

	proxy.Refuse()
	if err := cluster.Restart(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the listener to notice", func() bool { return !w.Stats().Listening })
	// The test's own pool finds its connections dead once: retry.
	waitFor(t, "an insert after the restart", func() bool {
		_, err := test.Exec(ctx, "INSERT INTO files.files (source) SELECT 'after-' || g FROM generate_series(1, 10) g")
		return err == nil
	})
	beats := w.Stats().Heartbeats
	close(g.open) // the first handler completes now, on a pool whose connections died
	waitCount(t, test, 1, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'done' AND attempt = 1", first)
	waitFor(t, "heartbeats to resume", func() bool { return w.Stats().Heartbeats > beats+2 })
	proxy.Restore()

	waitCount(t, test, 11, "SELECT count(*) FROM files.files WHERE state = 'done'")
	waitFor(t, "the done counter", func() bool { return w.Stats().Done == 11 })
	if s := w.Stats(); s.Lost != 0 || s.ListenerReconnects < 1 {
		t.Fatalf("stats: %+v\n%s", s, logs.String())
	}
}

// Under repeatable read, racing claims fail with 40001: that is a lost race,
// never an error, and every row is still processed exactly once.
func TestSerializationFailuresAreLostRaces(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.PoolFor(t, url)
	if _, err := admin.Exec(context.Background(),
		"DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$"); err != nil {
		t.Fatal(err)
	}
	var logs logCapture
	var handled atomic.Int64
	h := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
		handled.Add(1)
		return &worker.Result{Output: "ok"}, nil
	})
	var ws []*worker.Worker
	for range 4 {
		pool := pgtest.PoolFor(t, url) // new connections: repeatable read
		ws = append(ws, start(t, pool, &worker.Config{
			Handler: h, Slots: 8, SafetyNet: time.Hour, Logger: logs.logger(),
			// Frequent heartbeats race the completes; a long lease gives each
			// heartbeat 30 s, so that a machine stalled by other suites'
			// load (a heartbeat once timed out at 5 s) is not taken for a
			// lost race logged as an error.
			HeartbeatInterval: 100 * time.Millisecond, LeaseTimeout: time.Minute,
		}))
	}
	var iso string
	if err := pgtest.PoolFor(t, url).QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("isolation %q, %v", iso, err)
	}
	for _, w := range ws {
		settled(t, w)
	}
	const rows = 400
	for range rows / 20 {
		insert(t, admin, 20)
	}
	waitCount(t, admin, rows, "SELECT count(*) FROM files.files WHERE state = 'done'")

	var races uint64
	for _, w := range ws {
		races += w.Stats().RacesLost
	}
	if got := handled.Load(); got != rows {
		t.Fatalf("handled %d times, want %d", got, rows)
	}
	if n := count(t, admin, "SELECT count(*) FROM files.attempts"); n != rows {
		t.Fatalf("%d attempts for %d rows", n, rows)
	}
	if n := count(t, admin, "SELECT count(*) FROM files.files WHERE attempt <> 1"); n != 0 {
		t.Fatalf("%d rows took more than one attempt", n)
	}
	if problems := logs.problems(); len(problems) > 0 {
		t.Fatalf("warnings or errors logged:\n%s", strings.Join(problems, "\n"))
	}
	// How many claims fail with 40001 here depends on timing;
	// TestSerializationFailureIsALostRace makes one happen.
	var serialization uint64
	for _, w := range ws {
		serialization += w.Stats().SerializationFailures
	}
	t.Logf("races lost: %d, of which serialization failures: %d", races, serialization)
}

// A claim that fails with 40001 under repeatable read is a lost race: the
// claimer looks again by itself, logs nothing above debug, and the row runs
// once. The failure is made to happen: the slot is stopped, so that the claim
// revives it, and the test holds a lock on the slot's row until the claim
// waits for it, then commits an update of that row that the claim's snapshot
// does not see.
func TestSerializationFailureIsALostRace(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.PoolFor(t, url)
	ctx := context.Background()
	if _, err := admin.Exec(ctx,
		"DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$"); err != nil {
		t.Fatal(err)
	}
	var logs logCapture
	g := newGate()
	close(g.open)
	w := start(t, pgtest.PoolFor(t, url), &worker.Config{
		Handler: g, SafetyNet: time.Hour, HeartbeatInterval: time.Hour, LeaseTimeout: 2 * time.Hour, Logger: logs.logger(),
	})
	settled(t, w)
	slot := w.WorkerIDs()[0]
	if _, err := admin.Exec(ctx, "UPDATE files.workers SET state = 'stopped' WHERE worker_id = $1", slot); err != nil {
		t.Fatal(err)
	}

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var holder int32
	if err := tx.QueryRow(ctx, "UPDATE files.workers SET version = version WHERE worker_id = $1 RETURNING pg_backend_pid()", slot).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	id := insert(t, admin, 1)[0]
	waitFor(t, "the claim to wait for the slot's row", func() bool {
		return count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))", holder) == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if j := g.next(t, "the row, claimed again after the 40001"); j.ID != id || j.Attempt != 1 {
		t.Fatalf("job %+v", j)
	}
	waitCount(t, admin, 1, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'done' AND attempt = 1", id)
	if s := w.Stats(); s.SerializationFailures != 1 || s.ClaimErrors != 0 {
		t.Fatalf("stats: %+v", s)
	}
	if problems := logs.problems(); len(problems) > 0 {
		t.Fatalf("warnings or errors logged:\n%s", strings.Join(problems, "\n"))
	}
}

// lateSuccess starts a worker whose handler runs until its context is
// cancelled and then returns a success, too late. lost waits for that
// cancellation and checks that its cause is a lost lease.
func lateSuccess(t *testing.T, pool *pgxpool.Pool) (w *worker.Worker, lost func(when string)) {
	t.Helper()
	causes := make(chan error, 1)
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return &worker.Result{Output: "late"}, nil // a success after the loss
	})
	w = start(t, pool, &worker.Config{Handler: h, HeartbeatInterval: 100 * time.Millisecond, SafetyNet: time.Hour})
	settled(t, w)
	return w, func(when string) {
		t.Helper()
		if cause := receive(t, causes, "handler not cancelled "+when); !errors.Is(cause, worker.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
	}
}

// claimLost leaves row id as a server that lost its claim would (pending,
// as before the claim), then runs then, in one transaction.
func claimLost(t *testing.T, pool *pgxpool.Pool, id int64, then func(pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // after a failure, so that the pool can close
	if _, err := tx.Exec(ctx, `UPDATE files.files SET state = 'pending', worker_id = NULL, attempt = attempt - 1,
		claimed_at = NULL, lease_expires_at = NULL, claim_token_hash = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	then(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A claim lost with the server: it committed without waiting for its WAL
// flush, and the server crashed before the flush, so the row is pending
// again as it was before the claim, with its attempt count, while this
// worker runs it. Another worker claims it (attempt 1 again, its own token);
// the heartbeat notices, the handler is cancelled, its late success changes
// nothing, and the row has one outcome, the other worker's.
func TestClaimLostWithTheServer(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	w, lost := lateSuccess(t, pool)
	id := insert(t, pool, 1)[0]
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'running'", id)

	// What the crash leaves, and the other worker's claim, in one
	// transaction: the row as it was before the claim, then claimed again.
	var token string
	claimLost(t, pool, id, func(tx pgx.Tx) {
		if err := tx.QueryRow(ctx, "SELECT claim_token FROM files.claim('other', NULL, 1) WHERE attempt = 1").Scan(&token); err != nil {
			t.Fatalf("the other worker's claim: %v", err)
		}
	})

	lost("after its claim was lost")
	waitFor(t, "the slot to free up", func() bool { return w.Stats().BusySlots == 0 })
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT files.complete($1, 'other', 1, $2)", id, token).Scan(&ok); err != nil || !ok {
		t.Fatalf("the other worker's outcome: %v, %v", ok, err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1", id); n != 1 {
		t.Fatalf("%d attempts recorded, want the other worker's alone", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1 AND attempt = 1 AND outcome = 'done' AND worker_id = 'other'", id); n != 1 {
		t.Fatal("the row's outcome is not the other worker's")
	}
	if s := w.Stats(); s.LeaseLosses != 1 || s.Done != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// A row reaped and claimed by someone else: the heartbeat notices, the
// handler's context is cancelled with ErrLeaseLost, and its late success
// changes nothing.
func TestLeaseLossCancelsHandler(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	w, lost := lateSuccess(t, pool)
	// reap counts no silence from before the server's start: wait for more
	// uptime than the default lease.
	testhelp.WaitServerUp(t, pool, 15*time.Second)
	id := insert(t, pool, 1)[0]
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'running'", id)

	// Expire the lease, reap, and let another worker take the row, in one
	// transaction: the reap's notification arrives when the thief holds it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // after a failure, so that the pool can close
	if _, err := tx.Exec(ctx, "UPDATE files.files SET lease_expires_at = now() - interval '1 second' WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
	var reaped int
	if err := tx.QueryRow(ctx, "SELECT files.reap()").Scan(&reaped); err != nil || reaped != 1 {
		t.Fatalf("reap: %d, %v", reaped, err)
	}
	var claimed int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM files.claim('thief', NULL, 1)").Scan(&claimed); err != nil || claimed != 1 {
		t.Fatalf("the other worker claimed %d rows (%v)", claimed, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	lost("after losing its lease")
	waitFor(t, "the slot to free up", func() bool { return w.Stats().BusySlots == 0 })
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'running' AND worker_id = 'thief' AND attempt = 2", id); n != 1 {
		t.Fatal("the late success changed the row")
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1 AND attempt = 1 AND outcome = 'lost'", id); n != 1 {
		t.Fatal("attempt 1 is not recorded lost")
	}
	if s := w.Stats(); s.LeaseLosses != 1 || s.Done != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestStopLetsHandlersFinish(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	w, err := worker.New(pool, &worker.Config{Handler: g, Slots: 3, SafetyNet: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	insert(t, pool, 5)
	for range 3 {
		g.next(t, "three running")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(context.Background()) }()
	waitCount(t, pool, 3, "SELECT count(*) FROM files.workers WHERE state = 'draining'")
	close(g.open)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 3 {
		t.Fatalf("%d rows done, want the 3 that were running", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'pending' AND attempt = 0"); n != 2 {
		t.Fatalf("%d rows untouched, want 2", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.workers WHERE state = 'stopped'"); n != 3 {
		t.Fatalf("%d slots stopped, want 3", n)
	}
}

func TestStopAndCancelReleases(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	w, err := worker.New(pool, &worker.Config{Handler: g, Slots: 3, SafetyNet: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	insert(t, pool, 3)
	for range 3 {
		g.next(t, "three running")
	}
	if err := w.StopAndCancel(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if cause := g.cause(t); !errors.Is(cause, worker.ErrStopping) {
			t.Fatalf("cause %v, want ErrStopping", cause)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'pending' AND attempt = 0"); n != 3 {
		t.Fatalf("%d rows back to pending with no attempt spent, want 3", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'released'"); n != 3 {
		t.Fatalf("%d attempts released, want 3", n)
	}
	if s := w.Stats(); s.Released != 3 {
		t.Fatalf("stats: %+v", s)
	}
}

// A row handed back while its handler still runs here (the server lost the
// claim), and claimed again by another slot of this worker: StopAndCancel
// reaches both handlers, not only the one whose attempt the row is held for,
// and only that attempt is recorded.
func TestStopAndCancelReachesAnEarlierAttempt(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	started := make(chan string, 2)
	causes := make(chan error, 2)
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		started <- job.WorkerID
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	// No heartbeat during the test: nothing tells the worker that the first
	// attempt is gone.
	w, err := worker.New(pool, &worker.Config{Handler: h, Slots: 2, HeartbeatInterval: time.Hour,
		LeaseTimeout: 2 * time.Hour, SafetyNet: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	settled(t, w)
	id := insert(t, pool, 1)[0]
	first := <-started

	claimLost(t, pool, id, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, "SELECT pg_notify('files_pending', 'default')"); err != nil {
			t.Fatal(err)
		}
	})
	if second := <-started; second == first {
		t.Fatalf("the row ran again in the same slot %s", first)
	}

	stopCtx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	if err := w.StopAndCancel(stopCtx); err != nil {
		t.Fatalf("StopAndCancel: %v", err)
	}
	for range 2 {
		if cause := <-causes; !errors.Is(cause, worker.ErrStopping) {
			t.Fatalf("cause %v, want ErrStopping", cause)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'pending' AND attempt = 0", id); n != 1 {
		t.Fatal("the row is not back to pending with no attempt spent")
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = $1", id); n != 1 {
		t.Fatalf("%d attempts recorded, want the second one's release alone", n)
	}
}

// Stop whose context ends before the handlers do: they are cancelled and
// their rows released.
func TestStopDeadline(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	w, err := worker.New(pool, &worker.Config{Handler: g, Slots: 2, SafetyNet: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	insert(t, pool, 2)
	g.next(t, "first")
	g.next(t, "second")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := w.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want DeadlineExceeded", err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'pending' AND attempt = 0"); n != 2 {
		t.Fatalf("%d rows released, want 2", n)
	}
}

// One insert with 1,000 idle slots in 10 processes costs at most one claim
// query per process, counted by the server.
func TestOneInsertCostsOneClaimPerProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 slots")
	}
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.PoolFor(t, url)
	ctx := context.Background()
	if _, err := admin.Exec(ctx,
		"DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''all''', current_database()); END $$"); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	h := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
		handled.Add(1)
		return nil, nil
	})
	var ws []*worker.Worker
	for range 10 {
		ws = append(ws, start(t, pgtest.PoolFor(t, url), &worker.Config{Handler: h, Slots: 100, SafetyNet: time.Hour}))
	}
	clientClaims := func() uint64 {
		var n uint64
		for _, w := range ws {
			n += w.Stats().Claims
		}
		return n
	}
	// A listener that reconnects rings its doorbells, which costs a claim:
	// a loaded machine can make one miss its ping.
	reconnects := func() uint64 {
		var n uint64
		for _, w := range ws {
			n += w.Stats().ListenerReconnects
		}
		return n
	}
	serverClaims := func() uint64 {
		var n int64
		err := admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
			WHERE schemaname = 'files' AND funcname = 'claim_batch'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(n)
	}
	for _, w := range ws {
		settled(t, w)
	}
	// Statistics reach the view up to a few seconds late: wait until the
	// server has counted every claim the workers made.
	before := clientClaims()
	waitFor(t, "the server's count to catch up", func() bool { return serverClaims() >= before })
	base, reconnected := serverClaims(), reconnects()

	insert(t, admin, 1)
	waitFor(t, "the row to be handled", func() bool { return handled.Load() == 1 })
	waitCount(t, admin, 1, "SELECT count(*) FROM files.files WHERE state = 'done'")
	after := clientClaims()
	waitFor(t, "the server's count to catch up", func() bool { return serverClaims() >= after })
	got, extra := serverClaims()-base, reconnects()-reconnected
	t.Logf("one insert, 1,000 idle slots in 10 processes: %d claim queries (server count), %d (client count), %d listener reconnects",
		got, after-before, extra)
	if got > 10+extra || got == 0 {
		t.Fatalf("one insert cost %d claim queries with %d listener reconnects, want 1 to %d", got, extra, 10+extra)
	}
}

// files.cancel of a running row reaches its handler through files_control.
func TestCancelReachesHandler(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	w := start(t, pool, &worker.Config{Handler: g, SafetyNet: time.Hour, HeartbeatInterval: time.Hour, LeaseTimeout: 2 * time.Hour})
	settled(t, w)
	id := insert(t, pool, 1)[0]
	g.next(t, "the row")
	if n := count(t, pool, "SELECT files.cancel($1)", id); n != 1 {
		t.Fatalf("cancelled %d rows", n)
	}
	// Heartbeats are an hour apart: only the control message can do it.
	if cause := g.cause(t); !errors.Is(cause, worker.ErrCancelled) {
		t.Fatalf("cause %v, want ErrCancelled", cause)
	}
	waitFor(t, "the slot to free up", func() bool { return w.Stats().BusySlots == 0 })
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'cancelled'", id); n != 1 {
		t.Fatal("row not cancelled")
	}
	if s := w.Stats(); s.Cancelled != 1 || s.Failed != 0 || s.Released != 0 || s.Lost != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// A failure records its report, and the retry is picked up when its backoff
// ends although nothing announces it.
func TestFailureReportAndRetry(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "INSERT INTO files.queues (queue, backoff_base, backoff_max) VALUES ('default', '300ms', '300ms')"); err != nil {
		t.Fatal(err)
	}
	exit := 3
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		if job.Attempt == 1 {
			return &worker.Result{ExitCode: &exit, StderrTail: "disk on fire", Output: []string{"partial"}}, errors.New("backend exited with 3")
		}
		if job.LastError != "backend exited with 3" {
			return nil, worker.Permanent(fmt.Errorf("second attempt saw last error %q", job.LastError))
		}
		return &worker.Result{Output: map[string]int{"attempt": job.Attempt}}, nil
	})
	w := start(t, pool, &worker.Config{Handler: h, SafetyNet: time.Hour})
	settled(t, w)
	id := insert(t, pool, 1)[0]
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'done' AND attempt = 2", id)
	waitFor(t, "the done counter", func() bool { return w.Stats().Done == 1 })
	if n := count(t, pool, `SELECT count(*) FROM files.attempts WHERE file_id = $1 AND attempt = 1 AND outcome = 'failed'
		AND exit_code = 3 AND stderr_tail = 'disk on fire' AND error = 'backend exited with 3' AND output = '["partial"]'`, id); n != 1 {
		t.Fatal("the failed attempt's report is not recorded")
	}
	// The retry needs no notification. What claims it is not fixed: the
	// wake-up set for its backoff (a safety wake), a listener reconnect, or,
	// on a loaded machine, one of the looks the freed slot makes after the
	// failure, when they come later than the backoff. Package claim tests
	// the wake-up alone (TestRunSafetyNetAndWakeAt).
	if s := w.Stats(); s.Failed != 1 || s.Done != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestPermanentReleaseAndTimeout(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO files.files (source) VALUES ('permanent'), ('release'), ('slow')`); err != nil {
		t.Fatal(err)
	}
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		switch job.Source {
		case "permanent":
			return nil, worker.Permanent(errors.New("malformed input"))
		case "release":
			return nil, worker.Release(errors.New("local disk full"))
		default:
			<-ctx.Done()
			return nil, ctx.Err()
		}
	})
	w := start(t, pool, &worker.Config{Handler: h, Slots: 3, MaxReleases: 2, Timeout: 100 * time.Millisecond})
	// permanent: failed after one attempt.
	waitCount(t, pool, 1, "SELECT count(*) FROM files.files WHERE source = 'permanent' AND state = 'failed' AND attempt = 1")
	// release: handed back twice without spending an attempt, then failed
	// (retryably) instead of bouncing forever.
	// (The row comes back after its backoff and bounces again, so count only
	// what happened before its first failure.)
	waitFor(t, "the released row to fail", func() bool {
		return count(t, pool, `SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
			WHERE f.source = 'release' AND a.outcome = 'failed' AND a.error LIKE 'released 2 times%'`) >= 1
	})
	if n := count(t, pool, `SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
		WHERE f.source = 'release' AND a.outcome = 'released' AND a.id < (
			SELECT min(b.id) FROM files.attempts b WHERE b.file_id = a.file_id AND b.outcome = 'failed')`); n != 2 {
		t.Fatalf("%d releases before the first failure, want 2", n)
	}
	// slow: timed out, failed and retried (it times out at every attempt, so
	// by now there may be more than one).
	waitFor(t, "the slow row's timed-out attempt", func() bool {
		return count(t, pool, `SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
			WHERE f.source = 'slow' AND a.outcome = 'failed' AND a.error LIKE 'handler timed out after 100ms%'`) >= 1
	})
	waitFor(t, "the counters", func() bool { s := w.Stats(); return s.Released >= 2 && s.Failed >= 3 })
}

// Through a transaction-pooling PgBouncer, with the pool in a statement mode
// that suits it and the listener on a direct URL, the runtime works: no
// session state, no named prepared statements.
func TestThroughTransactionPooler(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			direct := pgtest.URL(t)
			u, err := neturl.Parse(direct)
			if err != nil {
				t.Fatal(err)
			}
			bouncer := pgbouncertest.Start(t, pgtest.ServerURL(t), nil) // transaction pooling
			cfg, err := pgxpool.ParseConfig(bouncer.URL(strings.TrimPrefix(u.Path, "/")))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			fails := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
				if job.Source == "src-1" && job.Attempt == 1 {
					return &worker.Result{StderrTail: "x"}, errors.New("first attempt fails")
				}
				return &worker.Result{Output: map[string]string{"mode": mode.String()}}, nil
			})
			if _, err := pool.Exec(context.Background(), "INSERT INTO files.queues (queue, backoff_base, backoff_max) VALUES ('default', '10ms', '10ms')"); err != nil {
				t.Fatal(err)
			}
			// Frequent heartbeats go through the pooler; a long lease gives
			// each of them 15s, so that a loaded machine's slow one is not
			// counted as an error.
			w := start(t, pool, &worker.Config{
				Handler: fails, Slots: 4, ListenURL: direct, SafetyNet: time.Hour,
				HeartbeatInterval: 50 * time.Millisecond, LeaseTimeout: 30 * time.Second,
			})
			settled(t, w)
			insert(t, pool, 10)
			waitCount(t, pool, 10, "SELECT count(*) FROM files.files WHERE state = 'done' AND result ->> 'mode' IS NOT NULL")
			waitFor(t, "the done counter", func() bool { return w.Stats().Done == 10 })
			waitFor(t, "a heartbeat", func() bool { return w.Stats().Heartbeats > 0 })
			if s := w.Stats(); s.Failed != 1 || s.Done != 10 || s.HeartbeatErrors != 0 {
				t.Fatalf("stats: %+v", s)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	pool := &pgxpool.Pool{}
	for _, tc := range []struct {
		cfg  *worker.Config
		want string
	}{
		{nil, "missing handler"},
		{&worker.Config{Handler: noop, HeartbeatInterval: time.Minute}, "shorter than the lease timeout"},
	} {
		if _, err := worker.New(pool, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := worker.New(nil, &worker.Config{Handler: noop}); err == nil {
		t.Error("New(nil pool) succeeded")
	}
}

// With Slots 1-4, a backlog makes the worker grow to 4 slots; once the queue
// is empty and the worker idle, it shrinks back to 1.
func TestSlotsScaleWithBacklog(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	w := start(t, pool, &worker.Config{
		Handler: g, Slots: 1, MaxSlots: 4, SafetyNet: time.Hour,
		HeartbeatInterval: 50 * time.Millisecond, LeaseTimeout: 5 * time.Second,
	})
	settled(t, w)
	insert(t, pool, 20)
	for range 4 {
		g.next(t, "a handler on each of 4 slots")
	}
	if s := w.Stats(); s.Slots != 4 || s.BusySlots != 4 {
		t.Fatalf("stats: %+v", s)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.workers WHERE state = 'active'"); n != 4 {
		t.Fatalf("%d active slots registered, want 4", n)
	}
	close(g.open)
	waitCount(t, pool, 20, "SELECT count(*) FROM files.files WHERE state = 'done'")
	waitFor(t, "the slots to shrink back to 1", func() bool { return w.Stats().Slots == 1 })
	// The slots leave the process first, then the database.
	waitCount(t, pool, 3, "SELECT count(*) FROM files.workers WHERE state = 'stopped'")
	// Which slot stays depends on which were idle at each shrink: the one
	// left is the one still active in the database.
	got := w.WorkerIDs()
	if len(got) != 1 {
		t.Fatalf("slots left: %v", got)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.workers WHERE state = 'active' AND worker_id = $1", got[0]); n != 1 {
		t.Fatalf("slot %s left, not active in the database", got[0])
	}
}

// Text PostgreSQL cannot store (NUL characters, invalid UTF-8) costs neither
// the row that produced it nor its neighbours in the same batch their outcome.
func TestUnstorableOutcomes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		switch job.Source {
		case "src-1":
			return &worker.Result{Output: map[string]string{"text": "nul\x00inside"}}, nil
		case "src-2":
			return &worker.Result{StderrTail: "bad\x00bytes\xff"}, errors.New("exit\x00 1")
		default:
			return &worker.Result{Output: "fine"}, nil
		}
	})
	var logs logCapture
	w := start(t, pool, &worker.Config{Handler: h, Slots: 8, Logger: logs.logger()})
	insert(t, pool, 8)
	waitCount(t, pool, 6, "SELECT count(*) FROM files.files WHERE state = 'done' AND result = '\"fine\"'")
	waitCount(t, pool, 1, `SELECT count(*) FROM files.files WHERE source = 'src-1' AND state = 'failed'
		AND last_error LIKE 'the result could not be recorded:%'`)
	waitCount(t, pool, 1, `SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
		WHERE f.source = 'src-2' AND a.outcome = 'failed' AND a.error = 'exit 1' AND a.stderr_tail = 'badbytes' || U&'\FFFD'`)
	waitFor(t, "the counters", func() bool { s := w.Stats(); return s.Done == 6 && s.Failed == 2 && s.Lost == 0 })
}

// holdFirstOutcome inserts n rows and starts a worker of cfg, its handler
// set here to send each row it starts on started; once the first row has
// started, it holds that row's outcome up with a lock on the row (tx, which
// the caller may roll back) and lets the handler return. The handlers of
// the other rows return only once the outcome's statement waits for the
// lock, so that theirs come after it. The lock holds up the heartbeat too:
// the leases are an hour long, so that no row is taken back meanwhile
// however slow the machine.
func holdFirstOutcome(t *testing.T, pool *pgxpool.Pool, n int, cfg worker.Config) (ids []int64, w *worker.Worker, tx pgx.Tx, started <-chan int64) {
	t.Helper()
	ctx := context.Background()
	cfg.HeartbeatInterval, cfg.LeaseTimeout = time.Hour, 2*time.Hour
	ids = insert(t, pool, n)
	starts := make(chan int64, n)
	release, blocked := make(chan struct{}), make(chan struct{})
	cfg.Handler = worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
		starts <- job.ID
		if job.ID == ids[0] {
			<-release
		} else {
			<-blocked
		}
		return nil, nil
	})
	w = start(t, pool, &cfg)
	if id := nextStart(t, starts, "the first row"); id != ids[0] {
		t.Fatalf("first row %d, want %d", id, ids[0])
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // a no-op when the caller rolled it back
	if _, err := tx.Exec(ctx, "SELECT 1 FROM files.files WHERE id = $1 FOR UPDATE", ids[0]); err != nil {
		t.Fatal(err)
	}
	close(release) // its outcome now waits for the lock, and the ones after it for that
	// Behind the lock's holder, or behind a heartbeat that waits for it
	// too: this test's database has no other lock waits.
	waitFor(t, "the first outcome's statement to wait for the lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%files.complete%'`) == 1
	})
	close(blocked)
	return ids, w, tx, starts
}

// nextStart waits for the next row started.
func nextStart(t *testing.T, started <-chan int64, what string) int64 {
	t.Helper()
	return receive(t, started, "no handler started: "+what)
}

// A slot takes its next row while the outcome of its last one waits for the
// database, and a process holds at most MaxUnrecorded waiting outcomes:
// with the first row's outcome held up by a lock on the row and one allowed
// to wait, the one slot runs the second row, and does not start the third
// until the first outcome is recorded.
func TestSlotRunsOnWhileOutcomeWaits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ids, w, tx, started := holdFirstOutcome(t, pool, 3, worker.Config{Slots: 1, MaxUnrecorded: 1})
	if id := nextStart(t, started, "the second row, while the first outcome waits"); id != ids[1] {
		t.Fatalf("second row %d, want %d", id, ids[1])
	}
	waitFor(t, "the slot to wait for its own outcome", func() bool { return w.Stats().OutcomeWaits == 1 })
	select {
	case id := <-started:
		t.Fatalf("row %d started while the slot waits for its outcome", id)
	default:
	}
	if s := w.Stats(); s.Claimed != 2 || s.Unrecorded != 2 || s.BusySlots != 0 || s.IdleSlots != 0 || s.Done != 0 {
		t.Fatalf("stats while the first outcome is held up: %+v", s)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 0 {
		t.Fatalf("%d rows done while the first outcome is held up, want 0", n)
	}

	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if id := nextStart(t, started, "the third row, once the first outcome is recorded"); id != ids[2] {
		t.Fatalf("third row %d, want %d", id, ids[2])
	}
	waitFor(t, "every row done", func() bool { return w.Stats().Done == 3 })
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE outcome = 'done'"); n != 3 {
		t.Fatalf("%d done attempts, want 3", n)
	}
	if s := w.Stats(); s.OutcomeWaits != 1 {
		t.Errorf("slot waited for its own outcome %d times, want 1", s.OutcomeWaits)
	}
}

// By default a process lets more outcomes wait than it has slots: with the
// first row's outcome held up by a lock on the row, the one slot runs all
// the other rows meanwhile, and each ends done once, after the lock goes.
func TestOutcomesWaitBeyondTheSlots(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	const rows = 10
	ids, w, tx, started := holdFirstOutcome(t, pool, rows, worker.Config{Slots: 1})
	seen := map[int64]bool{ids[0]: true}
	for len(seen) < rows {
		id := nextStart(t, started, fmt.Sprintf("row %d of %d, while the first outcome waits", len(seen)+1, rows))
		if seen[id] {
			t.Fatalf("row %d started twice", id)
		}
		seen[id] = true
	}
	waitFor(t, "every outcome waiting", func() bool { return w.Stats().Unrecorded == rows })
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 0 {
		t.Fatalf("%d rows done while the first outcome is held up, want 0", n)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every outcome recorded", func() bool { return w.Stats().Done == rows })
	waitFor(t, "no outcome waiting", func() bool { return w.Stats().Unrecorded == 0 })
	if s := w.Stats(); s.OutcomeWaits != 0 {
		t.Errorf("a slot waited for its own outcome %d times, want 0", s.OutcomeWaits)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = ANY ($1) AND state = 'done' AND attempt = 1", ids); n != rows {
		t.Fatalf("%d of %d rows done at their first attempt", n, rows)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.attempts WHERE file_id = ANY ($1)", ids); n != rows {
		t.Fatalf("%d attempts recorded for %d rows", n, rows)
	}
}

// A cancellation sent while the listener is away is lost with its message:
// after LISTEN again, the worker asks the database at once, without waiting
// for a heartbeat an hour away, and the attempt's outcome says it was
// cancelled, not lost (as when a heartbeat comes before the hint).
func TestCancelDuringListenerOutage(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l, err := listener.New(&listener.Config{URL: url, PingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	listen := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = l.Listen(ctx) }()
		return func() { cancel(); <-done }
	}
	g := newGate()
	w := start(t, pool, &worker.Config{Handler: g, Listener: l, SafetyNet: time.Hour, HeartbeatInterval: time.Hour, LeaseTimeout: 2 * time.Hour})
	stop := listen()
	settled(t, w)
	id := insert(t, pool, 1)[0]
	g.next(t, "the row")

	stop() // no session listens: the cancellation's message reaches nobody
	if n := count(t, pool, "SELECT files.cancel($1)", id); n != 1 {
		t.Fatalf("cancelled %d rows", n)
	}
	beats := w.Stats().Heartbeats
	stop = listen()
	defer stop()
	if cause := g.cause(t); !errors.Is(cause, worker.ErrCancelled) {
		t.Fatalf("cause %v, want ErrCancelled", cause)
	}
	if s := w.Stats(); s.Heartbeats <= beats || s.Done != 0 || s.Cancelled != 1 || s.LeaseLosses != 0 {
		t.Errorf("stats: %+v", s)
	}
	waitFor(t, "the slot to free up", func() bool { return w.Stats().BusySlots == 0 })
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'cancelled'", id); n != 1 {
		t.Fatal("row not cancelled")
	}
}

// Stats may be read while Start sets the worker up (a metrics endpoint that
// serves before the worker has started): -race checks it.
func TestStatsDuringStart(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	w, err := worker.New(pool, &worker.Config{Handler: noop})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			_ = w.Stats()
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(done)
	<-read
	settled(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// With a claim cooldown, the ring of the listener's connect, which comes
// within the cooldown of the claim at start, makes the listener stop
// listening for the rest of the cooldown.
func TestClaimCooldownQuietsTheListener(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g := newGate()
	close(g.open)
	w := start(t, pool, &worker.Config{Handler: g, Slots: 2, SafetyNet: time.Hour, ClaimCooldown: time.Hour})
	waitFor(t, "the quiet spell", func() bool {
		s := w.Stats()
		return s.ListenerQuiets == 1 && s.ClaimsDeferred == 1
	})
	if s := w.Stats(); s.Claims != 1 || !s.Listening {
		t.Fatalf("stats: %+v", s)
	}
}

// With a claim cooldown, an outcome that ends within the cooldown of the
// last outcome statement waits for it, the row still running in the
// database, until a slot has to wait for its own outcome: then both go in
// one statement. The first outcome, after a quiet spell, goes at once.
func TestClaimCooldownGathersOutcomes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ids := insert(t, pool, 3)
	g := newGate()
	// One slot: one outcome can be held while the slot runs the next row;
	// the outcome after it makes the slot wait for its own, which ends the
	// recorder's wait.
	w := start(t, pool, &worker.Config{Handler: g, Slots: 1, MaxUnrecorded: 1, SafetyNet: time.Hour, ClaimCooldown: time.Hour})

	first := g.next(t, "the first row")
	g.open <- struct{}{}
	waitFor(t, "the first outcome, recorded at once", func() bool { return w.Stats().Done == 1 })

	second := g.next(t, "the second row")
	g.open <- struct{}{}
	waitFor(t, "the second outcome held back", func() bool { return w.Stats().RecordsDeferred == 1 })
	if s := w.Stats(); s.Done != 1 {
		t.Fatalf("the second outcome was recorded during the cooldown: %+v", s)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = $1 AND state = 'running'", second.ID); n != 1 {
		t.Fatalf("row %d is not running while its outcome waits", second.ID)
	}

	third := g.next(t, "the third row")
	g.open <- struct{}{}
	waitFor(t, "both held outcomes recorded", func() bool { return w.Stats().Done == 3 })
	// In one statement: one transaction, one finished_at.
	if n := count(t, pool, "SELECT count(DISTINCT finished_at) FROM files.files WHERE id = ANY ($1)",
		[]int64{second.ID, third.ID}); n != 1 {
		t.Fatalf("the held outcomes were recorded in %d statements, not one", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE id = ANY ($1) AND state = 'done'", ids); n != 3 {
		t.Fatalf("%d of 3 rows done", n)
	}
	if first.ID == second.ID || second.ID == third.ID {
		t.Fatalf("rows handed out twice: %d, %d, %d", first.ID, second.ID, third.ID)
	}
}

// A worker that stops records the outcomes a cooldown holds back at once.
func TestClaimCooldownStopRecordsHeldOutcomes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	insert(t, pool, 2)
	g := newGate()
	w, err := worker.New(pool, &worker.Config{Handler: g, Slots: 1, SafetyNet: time.Hour, ClaimCooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.next(t, "the first row")
	g.open <- struct{}{}
	waitFor(t, "the first outcome", func() bool { return w.Stats().Done == 1 })
	g.next(t, "the second row")
	g.open <- struct{}{}
	waitFor(t, "the second outcome held back", func() bool { return w.Stats().RecordsDeferred == 1 })

	// Far sooner than the hour of the cooldown.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); s.Done != 2 || s.Lost != 0 {
		t.Fatalf("stats after stop: %+v", s)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'done'"); n != 2 {
		t.Fatalf("%d of 2 rows done after stop", n)
	}
}

// pgworker run's pool checks a connection before handing it out only after
// a minute idle: pgx's second would put a round trip in front of the claim
// that follows every quiet second.
func TestShouldPing(t *testing.T) {
	for _, c := range []struct {
		idle time.Duration
		want bool
	}{{0, false}, {2 * time.Second, false}, {59 * time.Second, false}, {61 * time.Second, true}, {time.Hour, true}} {
		if got := worker.ShouldPing(context.Background(), pgxpool.ShouldPingParams{IdleDuration: c.idle}); got != c.want {
			t.Errorf("idle %v: ShouldPing %v, want %v", c.idle, got, c.want)
		}
	}
}

// A heartbeat that takes a connection the server ended while it sat in the
// pool, handed out unchecked (ShouldPing), is sent again at once on a new
// one: no heartbeat fails.
func TestHeartbeatOnALostConnection(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const app = "worker-lost-connection"
	pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ShouldPing = worker.ShouldPing
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	})
	l, err := listener.New(&listener.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	lctx, stopListening := context.WithCancel(context.Background())
	listening := make(chan struct{})
	go func() { defer close(listening); _ = l.Listen(lctx) }()
	t.Cleanup(func() { stopListening(); <-listening })
	w := start(t, pool, &worker.Config{Handler: newGate(), Listener: l, SafetyNet: time.Hour, ReapInterval: time.Hour,
		HeartbeatInterval: 100 * time.Millisecond})
	waitFor(t, "a look for work and a heartbeat", func() bool { s := w.Stats(); return s.Claims > 0 && s.Heartbeats > 0 })

	pgtest.EndSession(t, url, app)
	beats := w.Stats().Heartbeats
	waitFor(t, "two more heartbeats", func() bool { return w.Stats().Heartbeats >= beats+2 })
	if s := w.Stats(); s.HeartbeatErrors != 0 || s.ClaimErrors != 0 {
		t.Fatalf("heartbeat errors %d, claim errors %d; want none", s.HeartbeatErrors, s.ClaimErrors)
	}
}
