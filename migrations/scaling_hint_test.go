package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// hintLine is one line of files.scaling_hint, in a form easy to compare.
type hintLine struct {
	Pending, Scheduled, Running int64
	Attempts                    int64
	MeanMS                      *int64
	Nodes, Slots                int
	SlotsPerNode                string
	Needed, Desired             int
	PerInstance, Target         *string
}

func (h hintLine) String() string {
	mean, target := "NULL", "NULL"
	if h.MeanMS != nil {
		mean = fmt.Sprint(*h.MeanMS)
	}
	if h.Target != nil {
		target = *h.Target
	}
	return fmt.Sprintf("pending=%d scheduled=%d running=%d attempts=%d mean_ms=%s nodes=%d slots=%d spn=%s needed=%d desired=%d per_instance=%s target=%s",
		h.Pending, h.Scheduled, h.Running, h.Attempts, mean, h.Nodes, h.Slots, h.SlotsPerNode, h.Needed, h.Desired, *h.PerInstance, target)
}

// hint reads a scaling hint query; the fleet's line is under "".
func hint(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT coalesce(queue, ''), pending, scheduled, running, recent_attempts,
       round(extract(epoch FROM mean_attempt_time) * 1000)::bigint, nodes, slots, slots_per_node::text,
       needed_nodes, desired_nodes, backlog_per_instance::text, target_backlog_per_instance::text
FROM (`+sql+`) h`, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out := map[string]string{}
	var order []string
	for rows.Next() {
		var q string
		var h hintLine
		if err := rows.Scan(&q, &h.Pending, &h.Scheduled, &h.Running, &h.Attempts, &h.MeanMS, &h.Nodes, &h.Slots,
			&h.SlotsPerNode, &h.Needed, &h.Desired, &h.PerInstance, &h.Target); err != nil {
			t.Fatal(err)
		}
		out[q] = h.String()
		order = append(order, q)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if len(order) == 0 || order[len(order)-1] != "" {
		t.Fatalf("%s: the fleet's line (queue NULL) is not last: %q", sql, order)
	}
	return out
}

func wantHint(t *testing.T, got map[string]string, queue, want string) {
	t.Helper()
	if got[queue] != want {
		t.Errorf("queue %q:\n got  %s\n want %s", queue, got[queue], want)
	}
}

// registerProcess registers the slots of one worker process.
func registerProcess(t *testing.T, pool *pgxpool.Pool, node string, pid, slots int) {
	t.Helper()
	mustExec(t, pool, "SELECT files.register_worker($1 || ':' || $2::int || ':' || g, $1, $2::int, g, key => 'test-key-0123456789') FROM generate_series(0, $3::int - 1) g",
		node, pid, slots)
}

// attemptsOf makes n attempts of queue's pending rows end done, each taking
// exactly d (claim to outcome), by slot worker.
func attemptsOf(t *testing.T, pool *pgxpool.Pool, worker, queue string, n int, d string) {
	t.Helper()
	mustExec(t, pool, `SELECT files.complete(c.id, c.worker_id, c.attempt, c.claim_token, '{}') FROM files.claim($1, ARRAY[$2], $3, key => 'test-key-0123456789') c`, worker, queue, n)
	mustExec(t, pool, `UPDATE files.attempts a SET started_at = a.finished_at - $2::interval
		FROM files.files f WHERE f.id = a.file_id AND f.queue = $1 AND a.outcome = 'done'`, queue, d)
}

// The hint's arithmetic on known data: two processes of four slots, 100
// rows of queue a outstanding, attempts of exactly two seconds.
func TestScalingHintMath(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	registerProcess(t, pool, "n1", 101, 4)
	registerProcess(t, pool, "n2", 102, 4)
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'a', 'a' || g FROM generate_series(1, 120) g")
	attemptsOf(t, pool, "n1:101:0", "a", 20, "2 seconds")

	// 100 rows x 2 s = 200 s of slot time; in 1 minute that is 3.33 slots,
	// 0.83 nodes of 4 slots: 1 node. Each node may hold 60 s / 2 s x 4 = 120 rows.
	got := hint(t, pool, "SELECT * FROM files.scaling_hint(target_drain => '1 minute')")
	wantHint(t, got, "a", "pending=100 scheduled=0 running=0 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=1 desired=1 per_instance=50.00 target=120.00")
	wantHint(t, got, "", "pending=100 scheduled=0 running=0 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=1 desired=1 per_instance=50.00 target=120.00")

	// In 10 s: 20 slots, exactly 5 nodes; clamped by max_nodes and min_nodes.
	got = hint(t, pool, "SELECT * FROM files.scaling_hint(target_drain => '10 seconds')")
	wantHint(t, got, "", "pending=100 scheduled=0 running=0 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=5 desired=5 per_instance=50.00 target=20.00")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint('10 seconds', 0, 3)")
	wantHint(t, got, "", "pending=100 scheduled=0 running=0 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=5 desired=3 per_instance=50.00 target=20.00")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint('10 seconds', 7, 3)") // max below min: min wins
	wantHint(t, got, "", "pending=100 scheduled=0 running=0 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=5 desired=7 per_instance=50.00 target=20.00")

	// One more row needs a sixth node; a running row counts as outstanding.
	mustExec(t, pool, "SELECT count(*) FROM files.claim('n2:102:0', ARRAY['a'], 1, key => 'test-key-0123456789')")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('a', 'extra')")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint(target_drain => '10 seconds')")
	wantHint(t, got, "", "pending=100 scheduled=0 running=1 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=6 desired=6 per_instance=50.50 target=20.00")

	// The view reads files.scaling_settings; the arguments override them.
	mustExec(t, pool, "UPDATE files.scaling_settings SET target_drain = '10 seconds', min_nodes = 1, max_nodes = 4")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=100 scheduled=0 running=1 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=6 desired=4 per_instance=50.50 target=20.00")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint(max_nodes => 10)")
	wantHint(t, got, "", "pending=100 scheduled=0 running=1 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=4.00 needed=6 desired=6 per_instance=50.50 target=20.00")

	// A set slots_per_node wins over the measured one: 202 s / 10 s / 8 = 2.5.
	mustExec(t, pool, "UPDATE files.scaling_settings SET slots_per_node = 8")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=100 scheduled=0 running=1 attempts=20 mean_ms=2000 nodes=2 slots=8 spn=8.00 needed=3 desired=3 per_instance=50.50 target=40.00")
}

// Several queues: a queue without attempts of its own takes the fleet's mean;
// a retry waiting for its backoff is pending; a paused queue's pending rows need no node, its running ones do; slots that
// serve only some queues count for those.
func TestScalingHintQueues(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	registerProcess(t, pool, "n1", 101, 4)
	mustExec(t, pool, "SELECT files.register_worker('n2:102:' || g, 'n2', 102, g, queues => ARRAY['b'], key => 'test-key-0123456789') FROM generate_series(0, 1) g")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'a', 'a' || g FROM generate_series(1, 50) g")
	attemptsOf(t, pool, "n1:101:0", "a", 10, "3 seconds")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'b', 'b' || g FROM generate_series(1, 20) g")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'c', 'c' || g FROM generate_series(1, 30) g")
	mustExec(t, pool, "SELECT count(*) FROM files.claim('n1:101:1', ARRAY['c'], 1, key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT files.pause_queue('c')")
	mustExec(t, pool, "SELECT files.fail(c.id, c.worker_id, c.attempt, c.claim_token, 'flaky') FROM files.claim('n2:102:0', ARRAY['b'], 1, key => 'test-key-0123456789') c")
	mustExec(t, pool, "UPDATE files.attempts SET started_at = finished_at - interval '3 seconds' WHERE outcome = 'failed'")

	got := hint(t, pool, "SELECT * FROM files.scaling_hint(target_drain => '30 seconds')")
	// a: 40 x 3 s / 30 s = 4 slots, of 4 per node: 1 node; 40 rows on 1 node.
	wantHint(t, got, "a", "pending=40 scheduled=0 running=0 attempts=10 mean_ms=3000 nodes=1 slots=4 spn=4.00 needed=1 desired=1 per_instance=40.00 target=40.00")
	// b: 20 x 3 s / 30 s = 2 slots on 2 nodes of 3 slots: 1 node.
	wantHint(t, got, "b", "pending=20 scheduled=1 running=0 attempts=1 mean_ms=3000 nodes=2 slots=6 spn=3.00 needed=1 desired=1 per_instance=10.00 target=30.00")
	// c, paused and without attempts of its own (the fleet's mean applies):
	// only its running row needs a slot.
	wantHint(t, got, "c", "pending=29 scheduled=0 running=1 attempts=0 mean_ms=3000 nodes=1 slots=4 spn=4.00 needed=1 desired=1 per_instance=1.00 target=40.00")
	// The fleet: (40 + 20 + 1) x 3 s / 30 s = 6.1 slots, of 3 per node: 3 nodes.
	wantHint(t, got, "", "pending=60 scheduled=1 running=1 attempts=11 mean_ms=3000 nodes=2 slots=6 spn=3.00 needed=3 desired=3 per_instance=30.50 target=30.00")
}

// Without data the hint neither guesses nor scales in: with rows outstanding
// and no attempt ended in the sample window it keeps the nodes there are, at
// least one; with nothing outstanding it asks for min_nodes.
func TestScalingHintWithoutData(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	got := hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=0 scheduled=0 running=0 attempts=0 mean_ms=NULL nodes=0 slots=0 spn=1.00 needed=0 desired=0 per_instance=0.00 target=NULL")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint(min_nodes => 2)")
	wantHint(t, got, "", "pending=0 scheduled=0 running=0 attempts=0 mean_ms=NULL nodes=0 slots=0 spn=1.00 needed=0 desired=2 per_instance=0.00 target=NULL")

	// Rows but no worker yet: one node, to start measuring.
	mustExec(t, pool, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 500) g")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=500 scheduled=0 running=0 attempts=0 mean_ms=NULL nodes=0 slots=0 spn=1.00 needed=1 desired=1 per_instance=500.00 target=NULL")

	// Three nodes at work on long rows, none ended yet: keep the three.
	for i := range 3 {
		registerProcess(t, pool, fmt.Sprintf("n%d", i), 100+i, 2)
	}
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=500 scheduled=0 running=0 attempts=0 mean_ms=NULL nodes=3 slots=6 spn=2.00 needed=3 desired=3 per_instance=166.67 target=NULL")

	// Attempts that ended before the sample window do not count.
	attemptsOf(t, pool, "n0:100:0", "default", 10, "1 second")
	mustExec(t, pool, "UPDATE files.attempts SET started_at = started_at - interval '1 hour', finished_at = finished_at - interval '1 hour'")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=490 scheduled=0 running=0 attempts=0 mean_ms=NULL nodes=3 slots=6 spn=2.00 needed=3 desired=3 per_instance=163.33 target=NULL")
}

// The sample is the newest attempts of the fleet, 50 for each slot that can
// have recorded them: with two slots, the newest 100. Slot 0 ran 120 attempts
// of 1 s, then slot 1 30 of 4 s; the sample holds those 30 and the last 70 of
// slot 0, whoever ran them.
func TestScalingHintSampleIsTheNewestAttempts(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	registerProcess(t, pool, "n1", 101, 2)
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'a', 'a' || g FROM generate_series(1, 200) g")
	mustExec(t, pool, "INSERT INTO files.files (queue, source) SELECT 'b', 'b' || g FROM generate_series(1, 100) g")
	attemptsOf(t, pool, "n1:101:0", "a", 120, "1 second")
	attemptsOf(t, pool, "n1:101:1", "b", 30, "4 seconds")

	got := hint(t, pool, "SELECT * FROM files.scaling_hint(target_drain => '1 hour')")
	// (70 x 1 s + 30 x 4 s) / 100 = 1.9 s.
	wantHint(t, got, "a", "pending=80 scheduled=0 running=0 attempts=70 mean_ms=1000 nodes=1 slots=2 spn=2.00 needed=1 desired=1 per_instance=80.00 target=7200.00")
	wantHint(t, got, "b", "pending=70 scheduled=0 running=0 attempts=30 mean_ms=4000 nodes=1 slots=2 spn=2.00 needed=1 desired=1 per_instance=70.00 target=1800.00")
	wantHint(t, got, "", "pending=150 scheduled=0 running=0 attempts=100 mean_ms=1900 nodes=1 slots=2 spn=2.00 needed=1 desired=1 per_instance=150.00 target=3789.47")
}

// Scale-in, seen from the hint: slots that drain (a node going away) are not
// capacity, the rows they still run are outstanding, and once the backlog is
// gone and the last rows finish the hint comes down to min_nodes. The drain
// itself (SIGTERM: finish or release, never lose) is pgworker run's.
func TestScalingHintScaleIn(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	registerProcess(t, pool, "n1", 101, 2)
	registerProcess(t, pool, "n2", 102, 2)
	mustExec(t, pool, "UPDATE files.scaling_settings SET target_drain = '4 seconds', min_nodes = 1")
	mustExec(t, pool, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, 10) g")
	attemptsOf(t, pool, "n1:101:0", "default", 4, "1 second")

	// 6 rows x 1 s / 4 s = 1.5 slots: 1 node of 2.
	got := hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=6 scheduled=0 running=0 attempts=4 mean_ms=1000 nodes=2 slots=4 spn=2.00 needed=1 desired=1 per_instance=3.00 target=8.00")

	// The autoscaler stops n2 while it runs a row: n2 drains.
	var id int64
	var attempt int
	var token string
	if err := pool.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim('n2:102:0', key => 'test-key-0123456789')").Scan(&id, &attempt, &token); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, "SELECT files.drain_worker('test-key-0123456789', 'n2:102:0', 'n2:102:1')")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	wantHint(t, got, "", "pending=5 scheduled=0 running=1 attempts=4 mean_ms=1000 nodes=1 slots=2 spn=2.00 needed=1 desired=1 per_instance=6.00 target=8.00")

	// The draining slot finishes its row, the rest is done elsewhere.
	mustExec(t, pool, "SELECT files.complete($1, 'n2:102:0', $2, $3, '{}')", id, attempt, token)
	mustExec(t, pool, "SELECT files.deregister_worker('n2:102:' || g, 'test-key-0123456789') FROM generate_series(0, 1) g")
	attemptsOf(t, pool, "n1:101:1", "default", 5, "1 second")
	got = hint(t, pool, "SELECT * FROM files.scaling_hint")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.files WHERE state <> 'done'"); n != 0 {
		t.Fatalf("%d rows not done", n)
	}
	wantHint(t, got, "", "pending=0 scheduled=0 running=0 attempts=10 mean_ms=1000 nodes=1 slots=2 spn=2.00 needed=0 desired=1 per_instance=0.00 target=8.00")
}

// Workers and readers may read the hint; admins may change its settings.
func TestScalingHintRoles(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		role, sql string
		ok        bool
	}{
		{"pgworker_worker", "SELECT * FROM files.scaling_hint", true},
		{"pgworker_worker", "SELECT * FROM files.scaling_hint('1 minute', 1, 2)", true},
		{"pgworker_reader", "SELECT * FROM files.scaling_hint", true},
		{"pgworker_reader", "SELECT * FROM files.scaling_settings", true},
		{"pgworker_admin", "UPDATE files.scaling_settings SET max_nodes = 40", true},
		{"pgworker_worker", "UPDATE files.scaling_settings SET max_nodes = 40", false},
		{"pgworker_reader", "UPDATE files.scaling_settings SET max_nodes = 40", false},
		{"pgworker_admin", "DELETE FROM files.scaling_settings", false},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+tc.role); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, tc.sql)
			return err
		})
		if tc.ok && err != nil || !tc.ok && sqlState(err) != "42501" {
			t.Errorf("%s: %s: %v", tc.role, tc.sql, err)
		}
	}
	mustExec(t, pool, "UPDATE files.scaling_settings SET max_nodes = 1") // settings stay one row, checked
	if _, err := pool.Exec(ctx, "INSERT INTO files.scaling_settings (singleton) VALUES (false)"); sqlState(err) != "23514" {
		t.Errorf("a second settings row: %v", err)
	}
	if _, err := pool.Exec(ctx, "UPDATE files.scaling_settings SET min_nodes = 5, max_nodes = 2"); sqlState(err) != "23514" {
		t.Errorf("min above max: %v", err)
	}
}
