//go:build linux

package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// privateCluster starts a PostgreSQL cluster of the test's own (to restart,
// stop or fail over), destroyed at the end of the test.
func privateCluster(t *testing.T, settings ...string) *pgtest.Cluster {
	t.Helper()
	if _, err := pgtest.BinDir(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgtest.StartCluster(ctx, &pgtest.ClusterConfig{Settings: settings})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("PostgreSQL log (last lines):\n%s", tail(c.LogFile(), 30))
		}
		if err := c.Destroy(); err != nil {
			t.Errorf("destroy cluster: %v", err)
		}
	})
	return c
}

// migratedDB creates database "faults" on the cluster and migrates it.
func migratedDB(t *testing.T, c *pgtest.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE faults"); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.MigrateUp(ctx, c.URL("faults")); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return c.URL("faults")
}

// TestPostgresRestart restarts PostgreSQL in immediate mode (a crash and
// recovery) twice mid-run, then stops it for twice the lease timeout: the
// workers reconnect, listen again and finish, and no live worker is
// declared dead because the database was away.
func TestPostgresRestart(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows, restarts, procs := 300, 2, 3
	if full() {
		rows, restarts, procs = 1000, 4, 3
	}
	c := privateCluster(t)
	r := newRig(t, &rigConfig{DatabaseURL: migratedDB(t, c)})
	r.putInputs(32)
	for i := range procs {
		r.startWorker(fleet(i))
	}
	r.enqueue(rows)

	for i := range restarts + 1 {
		r.waitDone((i+1)*rows/(restarts+2), 5*time.Minute)
		at := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		name := fmt.Sprintf("restart %d", i+1)
		var err error
		if i < restarts {
			err = c.Restart(ctx, "immediate")
		} else {
			// The last one keeps the server down past the lease timeout:
			// the workers' silence is the database's fault, not theirs.
			name = fmt.Sprintf("outage of %s", 2*leaseTimeout)
			if err = c.Stop(ctx); err == nil {
				time.Sleep(2 * leaseTimeout) // the length of the outage, not a synchronisation
				err = c.Start(ctx)
			}
		}
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		up := time.Now()
		t.Logf("%s: the server was away for %s", name, up.Sub(at).Round(time.Millisecond))
		// Some node of a fleet reaches the server first, and reaps.
		if n := r.reapNow(); n > 0 {
			t.Errorf("%s: a reap right after the server came back took %d rows from live workers", name, n)
		}
		progress := r.progressAfter(up)
		r.track(name, at, 2*time.Minute, func(ctx context.Context) (bool, error) {
			ok, err := progress(ctx)
			if !ok || err != nil {
				return false, err
			}
			n, err := r.listening(ctx)
			return n == procs, err
		})
		r.trackers.Wait() // one restart at a time
	}
	r.WaitSettled(5 * time.Minute)

	// Idle workers must hear of new rows through LISTEN, not the 30s
	// safety net: enqueue a few more and time the first claim.
	before := r.mustCount(`SELECT count(*) FROM files.attempts`)
	r.enqueue(20)
	wake := r.WaitFor(time.Minute, "a claim of the rows enqueued after the restarts", func(ctx context.Context) (bool, error) {
		n, err := r.Count(ctx, `SELECT count(*) FROM files.attempts`)
		return n > before, err
	})
	if wake > 10*time.Second {
		t.Errorf("rows enqueued after the restarts were claimed after %s: the workers do not listen again", wake)
	}
	r.WaitSettled(5 * time.Minute)
	r.stopAll()
	r.deadBesides()
	notes := append([]string{
		fmt.Sprintf("%d live workers with a slot declared dead, %d attempts lost; a reap right after each restart took back 0 rows",
			len(r.seenDead(r.Procs()...)), r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'lost'`)),
		fmt.Sprintf("rows enqueued after the restarts claimed %s after the insert (LISTEN again)", wake.Round(time.Millisecond)),
		fleetNote,
	}, r.orphanNote()...)
	tally := r.record(2, "`pg_ctl restart -m immediate` mid-run (private cluster)",
		fmt.Sprintf("%d × immediate restart, then a %s outage (stop -m immediate, start)", restarts, 2*leaseTimeout), notes...)
	if n := tally.attempts["lost"]; n > 0 {
		t.Errorf("%d attempts were lost although no worker died", n)
	}
}
