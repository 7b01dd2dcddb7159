package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// claimSources claims through sql (its arguments args) and returns the
// sources of the rows, in the order the claim returned them.
func claimSources(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return got
}

// With prefer, the queues' order is the claim order: the first queue's rows
// while it has claimable ones, whatever the priorities, then the next
// queue's for the slots left over. Both claim functions, one statement each.
func TestClaimPreference(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"claim", "claim_batch"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			mustExec(t, pool, `INSERT INTO files.files (source, queue, priority) VALUES
				('gpu-1', 'gpu', 0), ('cpu-1', 'cpu', 9), ('gpu-2', 'gpu', 5), ('cpu-2', 'cpu', 0),
				('gpu-later', 'gpu', 9), ('other', 'other', 99)`)
			mustExec(t, pool, "UPDATE files.files SET run_after = now() + interval '1 hour' WHERE source = 'gpu-later'")
			claimN := func(n int, prefer bool) []string {
				if fn == "claim" {
					return claimSources(t, pool, "SELECT source FROM files.claim('w', ARRAY['gpu', 'cpu'], $1, 'test-key-0123456789', $2)", n, prefer)
				}
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("w:%d", i)
				}
				return claimSources(t, pool, "SELECT source FROM files.claim_batch($1, ARRAY['gpu', 'cpu'], 'test-key-0123456789', $2)", ids, prefer)
			}
			// gpu's two claimable rows fill two of three slots; the third
			// steals cpu's best.
			if got := claimN(3, true); fmt.Sprint(got) != "[gpu-2 gpu-1 cpu-1]" {
				t.Fatalf("preferring gpu: %v, want [gpu-2 gpu-1 cpu-1]", got)
			}
			mustExec(t, pool, "INSERT INTO files.files (source, queue, priority) VALUES ('gpu-3', 'gpu', 0), ('cpu-3', 'cpu', 9)")
			// Without prefer: priority across the queues.
			if got := claimN(1, false); fmt.Sprint(got) != "[cpu-3]" {
				t.Fatalf("without prefer: %v, want [cpu-3]", got)
			}
			if got := claimN(1, true); fmt.Sprint(got) != "[gpu-3]" {
				t.Fatalf("preferring gpu again: %v, want [gpu-3]", got)
			}
			// A paused preferred queue is skipped like an empty one.
			mustExec(t, pool, "INSERT INTO files.files (source, queue) VALUES ('gpu-4', 'gpu')")
			mustExec(t, pool, "SELECT files.pause_queue('gpu')")
			if got := claimN(2, true); fmt.Sprint(got) != "[cpu-2]" {
				t.Fatalf("gpu paused: %v, want [cpu-2]", got)
			}
		})
	}
}

// TestMaxRunningRace: 20 connections claim at once, round after round,
// through files.claim_batch and files.claim, under each isolation level, from
// a queue capped at 5. A trigger records the queue's running rows at every
// claim and completion, inside the transaction that makes it: no record may
// exceed the cap, and under READ COMMITTED every round fills it exactly.
func TestMaxRunningRace(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(isolation, func(t *testing.T) {
			t.Parallel()
			const conns, capped, rounds = 20, 5, 8
			ctx := context.Background()
			url := pgtest.URL(t)
			admin := pgtest.PoolFor(t, url)
			mustExec(t, admin, `CREATE TABLE public.samples (running bigint NOT NULL)`)
			mustExec(t, admin, `CREATE FUNCTION public.sample() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					INSERT INTO public.samples
					SELECT count(*) FROM files.files WHERE state = 'running' AND queue = 'licensed';
					RETURN NULL;
				END $$`)
			mustExec(t, admin, `CREATE TRIGGER sample AFTER UPDATE OF state ON files.files
				FOR EACH ROW WHEN (NEW.queue = 'licensed') EXECUTE FUNCTION public.sample()`)
			mustExec(t, admin, `INSERT INTO files.files (source, queue) SELECT 'obj-' || g, 'licensed' FROM generate_series(1, 200) g`)
			mustExec(t, admin, `INSERT INTO files.files (source, queue) SELECT 'free-' || g, 'free' FROM generate_series(1, 200) g`)
			mustExec(t, admin, `SELECT files.set_max_running('licensed', $1)`, capped)

			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = conns
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			type held struct {
				id      int64
				worker  string
				attempt int
				token   string
				queue   string
			}
			for round := range rounds {
				var (
					mu    sync.Mutex
					got   []held
					lost  int
					first error
					wg    sync.WaitGroup
				)
				start := make(chan struct{})
				for c := range conns {
					wg.Go(func() {
						<-start
						sql := `SELECT id, worker_id, attempt, claim_token, queue FROM files.claim_batch($1, ARRAY['licensed', 'free'], 'test-key-0123456789')`
						var args []any = []any{[]string{fmt.Sprintf("c%d:%d:0", c, round), fmt.Sprintf("c%d:%d:1", c, round)}}
						if c%2 == 1 {
							sql = `SELECT id, worker_id, attempt, claim_token, queue FROM files.claim($1, ARRAY['licensed', 'free'], 3, 'test-key-0123456789')`
							args = []any{fmt.Sprintf("c%d:%d", c, round)}
						}
						rows, err := pool.Query(ctx, sql, args...)
						var hs []held
						if err == nil {
							hs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (held, error) {
								var h held
								return h, r.Scan(&h.id, &h.worker, &h.attempt, &h.token, &h.queue)
							})
						}
						mu.Lock()
						defer mu.Unlock()
						switch s := sqlState(err); {
						case s == "40001" || s == "40P01":
							lost++
						case err != nil && first == nil:
							first = err
						}
						got = append(got, hs...)
					})
				}
				close(start)
				wg.Wait()
				if first != nil {
					t.Fatal(first)
				}
				n := 0
				for _, h := range got {
					if h.queue == "licensed" {
						n++
					}
				}
				if n > capped || (isolation == "read committed" && n != capped) {
					t.Fatalf("round %d: %d rows of the capped queue claimed at once (%d claims lost a race), want %d", round, n, lost, capped)
				}
				if running := queryInt(t, admin, "SELECT count(*) FROM files.files WHERE state = 'running' AND queue = 'licensed'"); running != n {
					t.Fatalf("round %d: %d rows running, %d claimed", round, running, n)
				}
				// Every claimed row completes; the next round starts from none running.
				for _, h := range got {
					if !queryBool(t, admin, "SELECT files.complete($1, $2, $3, $4)", h.id, h.worker, h.attempt, h.token) {
						t.Fatalf("round %d: complete of row %d refused", round, h.id)
					}
				}
			}
			maxSeen := queryInt(t, admin, "SELECT max(running) FROM public.samples")
			if maxSeen > capped {
				t.Fatalf("the capped queue had %d rows running at once, cap %d", maxSeen, capped)
			}
			if maxSeen == 0 {
				t.Fatal("no row of the capped queue was claimed")
			}
			// The other queue had no cap: its rows went to the slots left over.
			// Under READ COMMITTED the cap fills every round, leaving slots
			// over; under the stricter levels every claim of a round may lose
			// its race on the capped queue (40001), which takes the whole claim.
			if isolation == "read committed" &&
				queryInt(t, admin, "SELECT count(*) FROM files.files WHERE queue = 'free' AND state = 'done'") == 0 {
				t.Fatal("no row of the uncapped queue was done")
			}
		})
	}
}

// A capped queue's slot that frees wakes the idle workers (files_pending),
// which nothing else would: a completion, a failure, a cancel. A queue
// without a cap stays silent, and so does a capped one with nothing to claim.
func TestMaxRunningWakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	listen, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(ctx)
	mustExec(t, listen, "LISTEN files_pending")
	mustExec(t, pool, "INSERT INTO files.files (source, queue) SELECT 'c' || g, 'capped' FROM generate_series(1, 4) g")
	mustExec(t, pool, "INSERT INTO files.files (source, queue) SELECT 'f' || g, 'free' FROM generate_series(1, 4) g")
	mustExec(t, pool, "SELECT files.set_max_running('capped', 1)")
	mustExec(t, pool, "SELECT files.set_max_running('capped', 1)")
	// What was sent so far: the inserts and the settings.
	drain := func() []string {
		var got []string
		for {
			ctx, cancel := context.WithTimeout(ctx, 0)
			n, err := listen.WaitForNotification(ctx)
			cancel()
			if err != nil {
				if listen.IsClosed() {
					t.Fatal(err)
				}
				return got
			}
			got = append(got, n.Payload)
		}
	}
	// A marker notification ends each look: every notification committed
	// before it has arrived when it does.
	look := func() []string {
		t.Helper()
		mustExec(t, pool, "SELECT pg_notify('files_pending', 'marker')")
		var got []string
		for {
			n, err := listen.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == "marker" {
				return got
			}
			got = append(got, n.Payload)
		}
	}
	_ = drain
	look()
	c := claim(t, pool, "w1", 10) // one capped row (the cap), four free
	if len(c) != 5 {
		t.Fatalf("claimed %d rows, want 5 (1 capped + 4 free)", len(c))
	}
	byQueue := map[string][]claimed{}
	for _, r := range c {
		var q string
		if err := pool.QueryRow(ctx, "SELECT queue FROM files.files WHERE id = $1", r.ID).Scan(&q); err != nil {
			t.Fatal(err)
		}
		byQueue[q] = append(byQueue[q], r)
	}
	if len(byQueue["capped"]) != 1 {
		t.Fatalf("%d rows of the capped queue claimed, cap 1", len(byQueue["capped"]))
	}
	free := byQueue["free"][0]
	if !queryBool(t, pool, "SELECT files.complete($1, 'w1', $2, $3)", free.ID, free.Attempt, free.Token) {
		t.Fatal("complete refused")
	}
	if got := look(); len(got) != 0 {
		t.Fatalf("completing a row of a queue without cap sent %v", got)
	}
	r := byQueue["capped"][0]
	if !queryBool(t, pool, "SELECT files.complete($1, 'w1', $2, $3)", r.ID, r.Attempt, r.Token) {
		t.Fatal("complete refused")
	}
	if got := look(); !slices.Equal(got, []string{"capped"}) {
		t.Fatalf("completing a row of the capped queue sent %v, want [capped]", got)
	}
	c = claim(t, pool, "w1", 10)
	if len(c) != 1 {
		t.Fatalf("claimed %d rows after a completion, want 1", len(c))
	}
	look()
	if !queryBool(t, pool, "SELECT files.fail($1, 'w1', $2, $3, 'boom', false)", c[0].ID, c[0].Attempt, c[0].Token) {
		t.Fatal("fail refused")
	}
	if got := look(); !slices.Equal(got, []string{"capped"}) {
		t.Fatalf("failing a row of the capped queue sent %v, want [capped]", got)
	}
	c = claim(t, pool, "w1", 10)
	look()
	mustExec(t, pool, "SELECT files.cancel($1)", c[0].ID)
	if got := look(); !slices.Equal(got, []string{"capped"}) {
		t.Fatalf("cancelling a running row of the capped queue sent %v, want [capped]", got)
	}
	// The last capped row: its end leaves nothing to claim, and wakes nobody.
	c = claim(t, pool, "w1", 10)
	look()
	if !queryBool(t, pool, "SELECT files.complete($1, 'w1', $2, $3)", c[0].ID, c[0].Attempt, c[0].Token) {
		t.Fatal("complete refused")
	}
	if got := look(); len(got) != 0 {
		t.Fatalf("completing the last row of the capped queue sent %v", got)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE queue = 'capped' AND state IN ('pending', 'running')"); n != 0 {
		t.Fatalf("%d rows of the capped queue left open", n)
	}
}

// A cap of 0 lets nothing start; lifting the cap wakes the workers; a cap
// lowered below the running rows lets none start until they are under it.
func TestMaxRunningSettings(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	mustExec(t, pool, "SELECT files.set_max_running('default', 0)")
	if got := claim(t, pool, "w", 5); len(got) != 0 {
		t.Fatalf("cap 0: claimed %d rows", len(got))
	}
	mustExec(t, pool, "SELECT files.set_max_running('default', NULL)")
	if got := claim(t, pool, "w", 4); len(got) != 4 {
		t.Fatalf("no cap: claimed %d rows, want 4", len(got))
	}
	mustExec(t, pool, "SELECT files.set_max_running('default', 2)")
	if got := claim(t, pool, "w", 4); len(got) != 0 {
		t.Fatalf("4 running, cap 2: claimed %d rows", len(got))
	}
	mustExec(t, pool, "SELECT files.set_max_running('default', 6)")
	if got := claim(t, pool, "w", 4); len(got) != 2 {
		t.Fatalf("4 running, cap 6: claimed %d rows, want 2", len(got))
	}
	// A new queue gets its cap before its first row.
	mustExec(t, pool, "SELECT files.set_max_running('later', 3)")
	if n := queryInt(t, pool, "SELECT max_running FROM files.queues WHERE queue = 'later'"); n != 3 {
		t.Fatalf("max_running of a new queue: %d", n)
	}
	for _, bad := range []string{
		"SELECT files.set_max_running('default', -1)",
		"SELECT files.set_max_running('', 1)",
		"SELECT files.set_fair_share('default', NULL)",
	} {
		if _, err := pool.Exec(context.Background(), bad); sqlState(err) != "22023" {
			t.Errorf("%s: %v, want SQLSTATE 22023", bad, err)
		}
	}
}

// With fair share, a small batch enqueued behind a large one is not stuck
// behind it: within a priority the batches take turns, the one with the
// fewest running rows first, rows without a batch as one more batch; priority
// still comes first.
func TestFairShare(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"claim", "claim_batch"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			mustExec(t, pool, "INSERT INTO files.files (source, batch) SELECT 'big-' || g, 'big' FROM generate_series(1, 1000) g")
			mustExec(t, pool, "INSERT INTO files.files (source, batch) SELECT 'small-' || g, 'small' FROM generate_series(1, 3) g")
			mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('loose-1'), ('loose-2')")
			// The rows a claim takes, sorted: which rows, not the order of the
			// answer, say who had the turn.
			claimN := func(n int) string {
				var got []string
				if fn == "claim" {
					got = claimSources(t, pool, "SELECT source FROM files.claim('w', NULL, $1, 'test-key-0123456789')", n)
				} else {
					ids := make([]string, n)
					for i := range ids {
						ids[i] = fmt.Sprintf("w:%d", i)
					}
					got = claimSources(t, pool, "SELECT source FROM files.claim_batch($1, NULL, 'test-key-0123456789')", ids)
				}
				slices.Sort(got)
				return strings.Join(got, " ")
			}
			if got := claimN(2); got != "big-1 big-2" {
				t.Fatalf("without fair share: %s, want id order", got)
			}
			mustExec(t, pool, "SELECT files.set_fair_share('default', true)")
			// big has two rows running: its turns come after two of each other batch.
			if got := claimN(7); got != "big-3 big-4 loose-1 loose-2 small-1 small-2 small-3" {
				t.Fatalf("fair share: %s", got)
			}
			mustExec(t, pool, "INSERT INTO files.files (source, batch, priority) VALUES ('urgent', 'big', 5)")
			if got := claimN(3); got != "big-5 big-6 urgent" {
				t.Fatalf("fair share with a higher priority row: %s", got)
			}
			if got := claimN(2); got != "big-7 big-8" {
				t.Fatalf("fair share, one batch left: %s", got)
			}
			// With a cap as well: 14 rows run, 2 more may.
			mustExec(t, pool, "SELECT files.set_max_running('default', 16)")
			mustExec(t, pool, "INSERT INTO files.files (source, batch) SELECT 'new-' || g, 'new' FROM generate_series(1, 5) g")
			if got := claimN(5); got != "new-1 new-2" {
				t.Fatalf("fair share under a cap of 16 with 14 running: %s", got)
			}
		})
	}
}
