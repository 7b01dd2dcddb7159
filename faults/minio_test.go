//go:build linux

package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/miniotest"
)

// minioOutage is how long MinIO stays stopped.
const minioOutage = 10 * time.Second

// TestMinIOOutage stops MinIO for 10s mid-run: downloads and uploads retry,
// and no row fails because of it.
func TestMinIOOutage(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows, outages, procs := 300, 1, 3
	if full() {
		rows, outages = 1000, 3
	}
	if _, err := miniotest.Binary(); err != nil {
		t.Skip(err)
	}
	srv := miniotest.New(t)
	r := newRig(t, &rigConfig{MinIO: srv})
	r.putInputs(32)
	for range procs {
		r.startWorker(workerConfig{})
	}
	r.enqueue(rows)

	for i := range outages {
		r.waitDone((i+1)*rows/(outages+1), 5*time.Minute)
		at := time.Now()
		if err := srv.Stop(); err != nil {
			t.Fatalf("stop MinIO: %v", err)
		}
		time.Sleep(minioOutage) // the length of the outage, not a synchronisation
		if err := srv.Start(); err != nil {
			t.Fatalf("start MinIO: %v", err)
		}
		back := time.Now()
		r.track(fmt.Sprintf("MinIO outage %d", i+1), at, 2*time.Minute, func(ctx context.Context) (bool, error) {
			n, err := r.Count(ctx, `SELECT count(*) FROM files.files WHERE state = 'done' AND finished_at > $1`, back)
			return n > 0, err
		})
		r.trackers.Wait()
	}
	r.WaitSettled(5 * time.Minute)
	r.stopAll()
	r.deadBesides()
	var storeErrors []string
	_ = r.strings(context.Background(), &storeErrors, `SELECT DISTINCT left(error, 160) FROM files.attempts WHERE outcome IN ('failed', 'released') LIMIT 3`)
	failed := r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'failed'`)
	released := r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'released'`)
	if failed > 0 {
		t.Errorf("%d attempts failed because MinIO was away, e.g. %v", failed, storeErrors)
	}
	r.record(6, fmt.Sprintf("MinIO stopped for %s mid-run", minioOutage),
		fmt.Sprintf("%d × MinIO outage of %s", outages, minioOutage),
		fmt.Sprintf("%d attempts failed, %d released: transfers retried in place through the outage", failed, released))
}
