package riverbench_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/bench/peers/internal/benchdb"
	"github.com/pgworker/pgworker/bench/peers/riverbench"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// migrated opens a pool on a fresh database holding River's schema.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, benchdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := riverbench.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if err := riverbench.Migrate(ctx, pool, nil); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if err := riverbench.CheckEmpty(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func completed(t *testing.T, pool *pgxpool.Pool) (done, total int) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		"SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM river_job").Scan(&done, &total)
	if err != nil {
		t.Fatal(err)
	}
	return done, total
}

func TestThroughput(t *testing.T) {
	t.Parallel()
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := riverbench.Throughput(ctx, pool, &riverbench.Config{Rows: 200, Slots: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != "throughput" || res.System != "river" || res.Rows != 200 || res.Slots != 10 {
		t.Errorf("setup = %+v", res.Setup)
	}
	if res.RowsPerSec <= 0 || res.ElapsedMS <= 0 {
		t.Errorf("rows_per_sec = %v, elapsed_ms = %v; want both positive", res.RowsPerSec, res.ElapsedMS)
	}
	if res.RiverVersion == "" || res.GoVersion == "" {
		t.Errorf("versions missing: %+v", res.Setup)
	}
	// Every job was completed once River said so, not merely worked.
	if done, total := completed(t, pool); done != 200 || total != 200 {
		t.Errorf("river_job: %d completed of %d; want 200 of 200", done, total)
	}
	if err := riverbench.CheckEmpty(ctx, pool); !errors.Is(err, riverbench.ErrNotEmpty) {
		t.Errorf("CheckEmpty after a run = %v, want ErrNotEmpty", err)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := riverbench.Latency(ctx, pool, &riverbench.Config{Rows: 200, Slots: 10, Rate: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != "latency" || res.Rows != 200 || res.Slots != 10 || res.Rate != 100 {
		t.Errorf("setup = %+v, rate %v", res.Setup, res.Rate)
	}
	for name, p := range map[string]riverbench.Percentiles{"from commit": res.Percentiles, "from send": res.FromSend} {
		if !(p.P50MS <= p.P90MS && p.P90MS <= p.P99MS && p.P99MS <= p.MaxMS) || p.MaxMS <= 0 {
			t.Errorf("%s: percentiles out of order: %+v", name, p)
		}
	}
	if res.FromSend.MaxMS < res.MaxMS {
		t.Errorf("from send max %v < from commit max %v", res.FromSend.MaxMS, res.MaxMS)
	}
	// The warm-up jobs are run but not counted.
	if done, total := completed(t, pool); total < 200 || done != total {
		t.Errorf("river_job: %d completed of %d; want all of at least 200", done, total)
	}
}

func TestCPU(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		rate float64
		rows int
	}{{"rate", 100, 30}, {"peak", 0, 200}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := migrated(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := riverbench.CPU(ctx, pool, &riverbench.Config{Rows: 200, Slots: 10}, c.rate, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if res.Mode != "cpu" || res.Rows != c.rows || res.Rate != c.rate {
				t.Errorf("setup = %+v, rate %v", res.Setup, res.Rate)
			}
			// A job costs the server CPU, WAL and transactions.
			if res.ServerCPUMSPerRow <= 0 || res.WALBytesPerRow <= 0 || res.XactsPerRow <= 0 || res.RowsPerSec <= 0 {
				t.Errorf("result %+v", res)
			}
			if done, total := completed(t, pool); done != c.rows || total != c.rows {
				t.Errorf("river_job: %d completed of %d; want %d", done, total, c.rows)
			}
		})
	}
}
