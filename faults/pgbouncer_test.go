//go:build linux

package faults

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgbouncertest"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// TestPgBouncer runs the workers through a real PgBouncer in transaction
// pooling mode (statements sent without prepared statements, LISTEN on a
// direct URL) and restarts PgBouncer mid-run: nothing is lost.
func TestPgBouncer(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows, restarts, procs := 300, 1, 2
	if full() {
		rows, restarts, procs = 1000, 3, 3
	}
	if err := havePgBouncer(); err != nil {
		t.Skip(err)
	}
	r := newRig(t, nil)
	r.putInputs(32)
	b := pgbouncertest.Start(t, pgtest.ServerURL(t), &pgbouncertest.Config{PoolMode: "transaction"})
	u, err := url.Parse(r.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	pooled := b.URL(strings.TrimPrefix(u.Path, "/"))
	for range procs {
		r.startWorker(workerConfig{DatabaseURL: pooled, ListenURL: r.DatabaseURL, Args: []string{"--statement-mode", "exec"}})
	}
	r.enqueue(rows)

	// Transactions PgBouncer served for the test database: its counters
	// start again at each restart.
	db := strings.TrimPrefix(u.Path, "/")
	var xacts int
	served := func() {
		t.Helper()
		stats, err := b.Admin(context.Background(), "SHOW STATS")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			if s["database"] == db {
				n, _ := strconv.Atoi(s["total_xact_count"])
				xacts += n
			}
		}
	}
	for i := range restarts {
		r.waitDone((i+1)*rows/(restarts+1), 5*time.Minute)
		served()
		at := time.Now()
		// Alternate a clean shutdown with a crash.
		how := "restart (immediate shutdown)"
		if i%2 == 1 {
			how = "kill -9 and start"
			if err = b.Kill(); err == nil {
				err = b.Start()
			}
		} else {
			err = b.Restart()
		}
		if err != nil {
			t.Fatalf("PgBouncer %s: %v", how, err)
		}
		r.track(fmt.Sprintf("PgBouncer %s %d", how, i+1), at, 2*time.Minute, r.progressAfter(time.Now()))
		r.trackers.Wait()
	}
	r.WaitSettled(5 * time.Minute)

	// The run went through PgBouncer: its pools served the workers'
	// transactions.
	served()
	if xacts < rows {
		t.Errorf("PgBouncer served %d transactions of the test database for %d rows", xacts, rows)
	}
	r.stopAll()
	r.deadBesides()
	notes := append([]string{fmt.Sprintf("%d transactions through PgBouncer (its SHOW STATS)", xacts)}, r.orphanNote()...)
	tally := r.record(4, "PgBouncer (transaction pooling, `--statement-mode exec`, LISTEN direct), restarted mid-run",
		fmt.Sprintf("%d × PgBouncer restart", restarts), notes...)
	if n := tally.attempts["lost"]; n > 0 {
		t.Errorf("%d attempts were lost to a PgBouncer restart", n)
	}
}

// havePgBouncer says why the PgBouncer scenario cannot run, if it cannot.
func havePgBouncer() error {
	if _, err := exec.LookPath("pgbouncer"); err == nil {
		return nil
	}
	if _, err := os.Stat(pgbouncertest.DefaultBinary); err == nil {
		return nil
	}
	return errors.New("PgBouncer is not installed (apt-get install pgbouncer)")
}
