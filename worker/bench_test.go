package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/worker"
)

// benchPool opens a pool of up to conns connections on a fresh database.
func benchPool(b *testing.B, conns int32) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkPickupLatency measures the time from sending an INSERT (so
// including its commit) to the start of the handler, one row at a time, with
// idle slots waiting.
func BenchmarkPickupLatency(b *testing.B) {
	pool := benchPool(b, 4)
	started := make(chan time.Time, 1)
	h := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
		started <- time.Now()
		return nil, nil
	})
	w := start(b, pool, &worker.Config{Handler: h, Slots: 4})
	settled(b, w)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)      // from sending the INSERT
	afterAck := make([]time.Duration, 0, b.N) // from its commit being acknowledged
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := pool.Exec(ctx, "INSERT INTO files.files (source) VALUES ('x')"); err != nil {
			b.Fatal(err)
		}
		ack := time.Now()
		select {
		case t1 := <-started:
			lat = append(lat, t1.Sub(t0))
			afterAck = append(afterAck, max(t1.Sub(ack), 0))
		case <-time.After(10 * time.Second):
			b.Fatal("row not picked up")
		}
	}
	b.StopTimer()
	b.ReportMetric(percentile(lat, 50), "p50_ms")
	b.ReportMetric(percentile(lat, 99), "p99_ms")
	b.ReportMetric(percentile(afterAck, 50), "p50_after_commit_ms")
}

func percentile(ds []time.Duration, p int) float64 {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return float64(ds[min(len(ds)-1, len(ds)*p/100)].Microseconds()) / 1000
}

// BenchmarkThroughput measures no-op rows per second: b.N rows wait in a
// paused queue; resuming it starts the clock. batch=1 records one outcome per
// statement, as without the batched complete.
func BenchmarkThroughput(b *testing.B) {
	for _, slots := range []int{100, 2000} {
		for _, batch := range []int{0, 1} {
			name := fmt.Sprintf("slots=%d", slots)
			if batch == 1 {
				name += "/batch=1"
			}
			b.Run(name, func(b *testing.B) { throughput(b, slots, batch) })
		}
	}
}

func throughput(b *testing.B, slots, batch int) {
	pool := benchPool(b, 8)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT files.pause_queue('default')"); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO files.files (source) SELECT 'x' FROM generate_series(1, $1::int)", b.N); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE files.files"); err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	finished := make(chan struct{})
	h := worker.HandlerFunc(func(context.Context, *worker.Job) (*worker.Result, error) {
		if done.Add(1) == int64(b.N) {
			close(finished)
		}
		return nil, nil
	})
	w := start(b, pool, &worker.Config{Handler: h, Slots: slots, MaxBatch: batch, SafetyNet: time.Hour})
	settled(b, w)

	b.ResetTimer()
	t0 := time.Now()
	if _, err := pool.Exec(ctx, "SELECT files.resume_queue('default')"); err != nil {
		b.Fatal(err)
	}
	<-finished
	waitFor(b, "every outcome recorded", func() bool { return w.Stats().Done == uint64(b.N) })
	elapsed := time.Since(t0)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
	s := w.Stats()
	b.ReportMetric(float64(s.Claims), "claims")
}
