//go:build linux

package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/harness"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// TestFailover kills the primary mid-run and promotes its synchronous
// standby: the workers, given both servers in a multi-host URL with
// target_session_attrs=read-write, follow the new primary and finish the run
// with nothing lost.
func TestFailover(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows, procs := 300, 3
	if full() {
		rows = 1000
	}
	// How long the cluster has no primary: the time a failover manager
	// takes to decide, here past the lease timeout.
	const gap = 2 * leaseTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	primary := privateCluster(t, "full_page_writes = on")
	migratedDB(t, primary)
	next := standby(t, ctx, primary)
	cancel()
	multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/faults?sslmode=disable&target_session_attrs=read-write",
		primary.Port, next.Port)

	r := newRig(t, &rigConfig{DatabaseURL: multi})
	r.putInputs(32)
	for i := range procs {
		r.startWorker(fleet(i))
	}
	r.enqueue(rows)

	r.waitDone(rows/3, 5*time.Minute)
	// Every completion acknowledged before the crash must survive it.
	doneBefore := r.mustCount(`SELECT count(*) FROM files.files WHERE state = 'done'`)
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	at := time.Now()
	if err := primary.Stop(ctx); err != nil { // immediate: a crash
		t.Fatalf("kill the primary: %v", err)
	}
	time.Sleep(gap) // the failover manager's delay, not a synchronisation
	if err := next.Promote(ctx); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	promoted := time.Now()
	t.Logf("no primary for %s", promoted.Sub(at).Round(time.Millisecond))
	doneAfter := r.mustCount(`SELECT count(*) FROM files.files WHERE state = 'done'`)
	if doneAfter < doneBefore {
		t.Errorf("the promoted standby has %d rows done, the primary had %d before the crash", doneAfter, doneBefore)
	}
	// Some node of a fleet reaches the new primary first, and reaps.
	reaped := r.reapNow()
	if reaped > 0 {
		t.Errorf("a reap right after the promotion took %d rows from live workers", reaped)
	}
	progress := r.progressAfter(promoted)
	r.track("failover", at, 2*time.Minute, func(ctx context.Context) (bool, error) {
		ok, err := progress(ctx)
		if !ok || err != nil {
			return false, err
		}
		n, err := r.listening(ctx)
		return n == procs, err
	})
	r.WaitSettled(5 * time.Minute)
	r.stopAll()
	r.deadBesides()
	notes := append([]string{
		fmt.Sprintf("rows done before the crash %d, on the promoted standby %d", doneBefore, doneAfter),
		fmt.Sprintf("%d live workers with a slot declared dead, %d attempts lost; a reap right after the promotion took back %d rows",
			len(r.seenDead(r.Procs()...)), r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'lost'`), reaped),
		fleetNote,
	}, r.orphanNote()...)
	tally := r.record(5, "failover: primary killed (`stop -m immediate`), synchronous standby promoted; multi-host `--database-url`",
		fmt.Sprintf("1 × failover, no primary for %s", promoted.Sub(at).Round(100*time.Millisecond)), notes...)
	if n := tally.attempts["lost"]; n > 0 {
		t.Errorf("%d attempts were lost although no worker died", n)
	}
}

// standby starts a standby of primary and makes it synchronous.
func standby(t *testing.T, ctx context.Context, primary *pgtest.Cluster) *pgtest.Cluster {
	t.Helper()
	s, err := pgtest.StartStandby(ctx, primary)
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("standby log (last lines):\n%s", tail(s.LogFile(), 30))
		}
		if err := s.Destroy(); err != nil {
			t.Errorf("destroy standby: %v", err)
		}
	})
	syncStandby(t, ctx, primary)
	return s
}

// syncStandby makes the primary's standbys synchronous and waits until one is.
func syncStandby(t *testing.T, ctx context.Context, primary *pgtest.Cluster) {
	t.Helper()
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the standby did not become synchronous")
		case <-time.After(harness.Poll):
		}
	}
}
