package migrations_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/listener"
	"github.com/pgworker/pgworker/migrations"
	"github.com/pgworker/pgworker/queue"
	"github.com/pgworker/pgworker/worker"
)

// TestSharedNames checks that the names and rules Go code shares with the SQL
// agree with what the migrations build, read from the catalog and from the
// SQL API's behaviour.
func TestSharedNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)

	t.Run("channels", func(t *testing.T) {
		// Every channel the SQL API notifies on, from the function bodies.
		var bodies []string
		rows, err := pool.Query(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'files'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var b string
			if err := rows.Scan(&b); err != nil {
				t.Fatal(err)
			}
			bodies = append(bodies, b)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		var sql []string
		for _, m := range regexp.MustCompile(`pg_notify\('([^']*)'`).FindAllStringSubmatch(strings.Join(bodies, "\n"), -1) {
			sql = append(sql, m[1])
		}
		slices.Sort(sql)
		sql = slices.Compact(sql)
		goNames := []string{listener.ChannelControl, listener.ChannelPending, queue.ChannelBatch}
		slices.Sort(goNames)
		if !slices.Equal(sql, goNames) {
			t.Errorf("the SQL API notifies on %q, Go listens on %q", sql, goNames)
		}
	})

	t.Run("default lease", func(t *testing.T) {
		// A slot registered without a lease, and one registered by its first claim.
		mustExec(t, pool, "SELECT files.register_worker('names-registered')")
		mustExec(t, pool, "SELECT count(*) FROM files.claim('names-claimed')")
		rows, err := pool.Query(ctx, `SELECT worker_id, lease_timeout FROM files.workers WHERE worker_id LIKE 'names-%' ORDER BY worker_id`)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var id string
			var lease time.Duration
			if err := rows.Scan(&id, &lease); err != nil {
				t.Fatal(err)
			}
			n++
			if lease != worker.DefaultLeaseTimeout {
				t.Errorf("slot %s got a lease of %s from the SQL API, worker.DefaultLeaseTimeout is %s", id, lease, worker.DefaultLeaseTimeout)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("%d slots registered, want 2", n)
		}
		if worker.DefaultLeaseTimeout <= worker.DefaultHeartbeatInterval {
			t.Errorf("worker.DefaultLeaseTimeout %s does not exceed worker.DefaultHeartbeatInterval %s",
				worker.DefaultLeaseTimeout, worker.DefaultHeartbeatInterval)
		}
	})

	t.Run("queue names", func(t *testing.T) {
		longest := strings.Repeat("é", migrations.MaxQueueNameLength)
		for _, name := range []string{"", "q", longest, longest + "x", strings.Repeat("x", migrations.MaxQueueNameLength+1)} {
			for _, insert := range []string{
				"INSERT INTO files.files (queue, source) VALUES ($1, 'names')",
				"INSERT INTO files.queues (queue) VALUES ($1)",
			} {
				_, err := pool.Exec(ctx, insert, name)
				var pgErr *pgconn.PgError
				if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "23514") {
					t.Fatalf("%s with a queue of %d characters: %v", insert, utf8.RuneCountInString(name), err)
				}
				if accepted := err == nil; accepted != migrations.ValidQueueName(name) {
					t.Errorf("%s accepts a queue of %d characters: %v; migrations.ValidQueueName: %v",
						insert, utf8.RuneCountInString(name), accepted, migrations.ValidQueueName(name))
				}
				mustExec(t, pool, "DELETE FROM files.files WHERE source = 'names'")
				mustExec(t, pool, "DELETE FROM files.queues")
			}
		}
	})

	t.Run("batch names", func(t *testing.T) {
		longest := strings.Repeat("é", migrations.MaxBatchNameLength)
		for _, name := range []string{"", "b", "run 2026-12-01", longest, longest + "x", "a\x1b[31mred", "tab\there", "del\x7f", "nbsp\u00a0ok"} {
			for _, insert := range []string{
				"INSERT INTO files.files (batch, source) VALUES ($1, 'names')",
				"INSERT INTO files.batches (batch) VALUES ($1)",
			} {
				_, err := pool.Exec(ctx, insert, name)
				var pgErr *pgconn.PgError
				if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "23514") {
					t.Fatalf("%s with batch %q: %v", insert, name, err)
				}
				if accepted := err == nil; accepted != migrations.ValidBatchName(name) {
					t.Errorf("%s accepts batch %q: %v; migrations.ValidBatchName: %v", insert, name, accepted, migrations.ValidBatchName(name))
				}
				mustExec(t, pool, "DELETE FROM files.files WHERE source = 'names'")
				mustExec(t, pool, "DELETE FROM files.batches")
			}
		}
	})

	t.Run("row states", func(t *testing.T) {
		var def string
		if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'files_state_valid'`).Scan(&def); err != nil {
			t.Fatal(err)
		}
		var sql []string
		for _, m := range regexp.MustCompile(`'([a-z_]+)'::text`).FindAllStringSubmatch(def, -1) {
			sql = append(sql, m[1])
		}
		goNames := []string{migrations.StatePending, migrations.StateRunning, migrations.StateDone,
			migrations.StateFailed, migrations.StateCancelled}
		if !slices.Equal(sql, goNames) {
			t.Errorf("files_state_valid allows %q (%s), Go names %q", sql, def, goNames)
		}
	})
}
