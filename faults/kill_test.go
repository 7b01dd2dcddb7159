//go:build linux

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestKill9 kills random pgworker processes with SIGKILL mid-run and starts
// replacements: the rows they held come back once their leases run out and
// are finished by the others.
func TestKill9(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows, kills, procs := 300, 4, 3
	if full() {
		rows, kills, procs = 2000, 20, 4
	}
	r := newRig(t, nil)
	r.putInputs(32)
	for i := range procs {
		r.startWorker(fleet(i))
	}
	r.enqueue(rows)

	var orphans int
	var reclaims []*fault
	var victims []*proc
	for k := range kills {
		r.waitDone((k+1)*rows/(kills+2), 5*time.Minute)
		// The victim: a live process that holds rows, so that the kill
		// lands mid-work.
		live := r.Live()
		rand.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		victim := live[0]
		for _, p := range live {
			if ids, err := r.held(context.Background(), p.Prefix); err == nil && len(ids) > 0 {
				victim = p
				break
			}
		}
		at := time.Now()
		victim.Kill()
		victims = append(victims, victim)
		var ids []int64
		if err := r.retry(func(ctx context.Context) (err error) {
			ids, err = r.held(ctx, victim.Prefix)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		orphans += len(ids)
		r.startWorker(workerConfig{})
		if len(ids) == 0 {
			continue
		}
		name := fmt.Sprintf("kill %d (%s, %d rows held)", k+1, victim.Name, len(ids))
		r.track(name, at, 3*time.Minute, r.allDone(ids))
		// Reclaimed: no longer held by the dead process.
		prefix := victim.Prefix
		reclaims = append(reclaims, r.track(name+": reclaimed", at, 3*time.Minute, func(ctx context.Context) (bool, error) {
			held, err := r.held(ctx, prefix)
			return len(held) == 0, err
		}))
	}
	r.WaitSettled(10 * time.Minute)
	r.stopAll()
	r.trackers.Wait()
	r.deadBesides(victims...)
	var slowestReclaim time.Duration
	for _, f := range reclaims {
		slowestReclaim = max(slowestReclaim, f.recovered)
	}
	if slowestReclaim > reapBound+5*time.Second {
		t.Errorf("orphans came back %s after the kill; the lease timeout (%s) plus a reap interval (up to %s) bounds it",
			slowestReclaim.Round(time.Millisecond), leaseTimeout, reapBound-leaseTimeout)
	}
	lost := r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'lost'`)
	note := fmt.Sprintf("%d rows held by killed processes: %d came back through files.reap within %s of the kill "+
		"(lease %s, reaped every ~%s by each live worker) and were finished elsewhere",
		orphans, lost, slowestReclaim.Round(100*time.Millisecond), leaseTimeout, leaseTimeout)
	if orphans > lost {
		note += fmt.Sprintf(", %d were completed by the victim's statement in flight at the kill", orphans-lost)
	}
	r.record(1, "kill -9 of random `pgworker run` processes, replacements started",
		fmt.Sprintf("%d × kill -9", kills), note, fleetNote)
}

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("the fault suite is skipped with -short")
	}
}
