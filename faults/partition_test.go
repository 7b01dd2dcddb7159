//go:build linux

package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// TestPartition cuts one worker off from PostgreSQL (it reaches the server
// through a proxy) for longer than the lease timeout: its rows are reaped
// and finished by the others; when the link heals, whatever it still tries
// to record for them is refused by fencing, its outputs never become
// results, and it goes back to work.
func TestPartition(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows := 300
	cuts := []string{"freeze"}
	if full() {
		rows = 1000
		cuts = []string{"freeze", "refuse", "freeze"}
	}
	r := newRig(t, nil)
	r.putInputs(32)
	proxy := pgtest.StartProxy(t, r.DatabaseURL)
	proxied := proxy.URL(t, r.DatabaseURL)
	cut := r.startWorker(workerConfig{DatabaseURL: proxied})
	r.startWorker(workerConfig{})
	r.startWorker(workerConfig{})
	r.enqueue(rows)

	var reaped, refused int
	for i, how := range cuts {
		r.waitDone((i+1)*rows/(len(cuts)+2), 5*time.Minute)
		// Cut while it holds rows.
		r.WaitFor(time.Minute, "the cut-off worker holds rows", func(ctx context.Context) (bool, error) {
			ids, err := r.held(ctx, cut.Prefix)
			return len(ids) > 0, err
		})
		at := time.Now()
		switch how {
		case "freeze": // half-open: every byte stalls, nothing closes
			proxy.Freeze()
		case "refuse": // a clean cut: connections close, new ones are refused
			proxy.Refuse()
			proxy.Drop()
		}
		var ids []int64
		if err := r.retry(func(ctx context.Context) (err error) {
			ids, err = r.held(ctx, cut.Prefix)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		reaped += len(ids)
		name := fmt.Sprintf("cut %d (%s, %d rows held)", i+1, how, len(ids))
		// The partition lasts until the others have finished its rows.
		r.WaitFor(3*time.Minute, name+": rows finished elsewhere", r.allDone(ids))
		r.track(name+": rows finished elsewhere", at, time.Minute, r.allDone(ids))
		r.WaitFor(time.Minute, name+": slots declared dead", func(ctx context.Context) (bool, error) {
			n, err := r.Count(ctx, `SELECT count(*) FROM files.workers WHERE starts_with(worker_id, $1) AND state <> 'dead'`, cut.Prefix)
			return n == 0, err
		})
		healed := time.Now()
		proxy.Restore()
		// Healed: it heartbeats again and completes rows of its own.
		r.track(name+": back to work after the heal", healed, 2*time.Minute, func(ctx context.Context) (bool, error) {
			n, err := r.Count(ctx, `SELECT count(*) FROM files.workers
				WHERE starts_with(worker_id, $1) AND (state <> 'active' OR last_heartbeat_at <= $2)`, cut.Prefix, healed)
			if err != nil || n > 0 {
				return false, err
			}
			pending, err := r.Count(ctx, `SELECT count(*) FROM files.files WHERE state = 'pending'`)
			if err != nil || pending == 0 {
				return pending == 0, err
			}
			n, err = r.Count(ctx, `SELECT count(*) FROM files.attempts
				WHERE starts_with(worker_id, $1) AND outcome = 'done' AND finished_at > $2`, cut.Prefix, healed)
			return n > 0, err
		})
		r.trackers.Wait()
	}
	r.WaitSettled(5 * time.Minute)

	// A late complete of a reaped attempt, sent through the healed link as
	// any client of the SQL API could send it, is refused, and the row keeps
	// its result.
	late, err := pgx.Connect(context.Background(), proxied)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close(context.Background())
	rowsLost, err := late.Query(context.Background(), `SELECT file_id, worker_id, attempt FROM files.attempts
		WHERE starts_with(worker_id, $1) AND outcome = 'lost'`, cut.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		ID      int64
		Worker  string
		Attempt int32
	}
	lost, err := pgx.CollectRows(rowsLost, pgx.RowToStructByPos[attempt])
	if err != nil {
		t.Fatal(err)
	}
	// Each attempt recorded lost was one the cut-off worker held, and its row
	// was then finished by exactly one later attempt. How many were lost may
	// differ from the rows seen held just after the cut, either way: a
	// statement that reached the server before the cut may still complete a
	// row, or claim one.
	if len(lost) == 0 {
		t.Errorf("no attempt of the cut-off worker was recorded lost; it held %d rows when cut", reaped)
	}
	for _, a := range lost {
		if n := r.mustCount(`SELECT count(*) FROM files.attempts WHERE file_id = $1 AND attempt > $2 AND outcome = 'done'`,
			a.ID, a.Attempt); n != 1 {
			t.Errorf("row %d: %d later attempts done after attempt %d of %s was lost, want 1", a.ID, n, a.Attempt, a.Worker)
		}
	}
	for _, a := range lost {
		var ok bool
		if err := late.QueryRow(context.Background(), `SELECT files.complete($1, $2, $3, 'token of the lost claim', '{"late": true}')`,
			a.ID, a.Worker, a.Attempt).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Errorf("row %d: a late complete of reaped attempt %d of %s was accepted", a.ID, a.Attempt, a.Worker)
		} else {
			refused++
		}
	}
	r.stopAll()
	r.deadBesides(cut)
	// What the cut-off worker itself did with the rows it lost: it sent
	// their outcomes once the link healed and the fenced call refused them
	// (or, had they still been running, its next heartbeat stopped them).
	gaveUp := logCount([]*proc{cut}, `"msg":"worker: outcome lost`)
	leaseLost := logCount([]*proc{cut}, `"msg":"worker: lease lost`)
	refusedIDs := logFileIDs(cut.Log, `"msg":"worker: outcome refused`)
	refusedByDB, otherRefusals, ownRetries := 0, 0, 0
	for _, id := range refusedIDs {
		if slices.ContainsFunc(lost, func(a attempt) bool { return a.ID == id }) {
			refusedByDB++
			continue
		}
		otherRefusals++
		// A statement that committed but whose answer the cut lost is sent
		// again, and refused: the row is already done by this very attempt.
		own := r.mustCount(`SELECT count(*) FROM files.attempts WHERE file_id = $1 AND outcome = 'done' AND starts_with(worker_id, $2)`,
			id, cut.Prefix)
		ownRetries += own
		t.Logf("row %d: an outcome of the cut-off worker refused; done by the cut-off worker itself: %v", id, own > 0)
	}
	t.Logf("cut-off worker: %d outcomes of lost rows refused by fencing, %d other refusals, %d not sent, %d handlers stopped by a heartbeat",
		refusedByDB, otherRefusals, gaveUp, leaseLost)
	if refusedByDB == 0 {
		t.Errorf("the cut-off worker sent no late outcome after the heal; the fence was not tested")
	}
	notes := []string{
		fmt.Sprintf("%d rows held when cut, %d reaped (attempt lost) and finished elsewhere", reaped, len(lost)),
		fmt.Sprintf("the cut-off worker's late outcomes for them, sent after the heal: %d refused by fencing (%d not sent, %d handlers stopped by a heartbeat)",
			refusedByDB, gaveUp, leaseLost),
	}
	if otherRefusals > 0 {
		notes = append(notes, fmt.Sprintf("%d other outcomes refused, %d of them retries of a complete that had committed before the cut",
			otherRefusals, ownRetries))
	}
	notes = append(notes, fmt.Sprintf("%d late completes replayed through the healed link: all refused", refused))
	r.record(3, "network partition of one worker (proxy), longer than the lease timeout",
		fmt.Sprintf("%d × partition (%s)", len(cuts), strings.Join(cuts, ", ")), notes...)
}
