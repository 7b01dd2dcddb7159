package bench

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// The server's CPU time counts the work of its backends: a backend that
// burns CPU adds at least its own CPU time (read from its own /proc entry)
// to the total, and the total never goes back.
func TestServerCPUCountsBackends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	b, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, err := b.findServerCPU(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	own := func() int64 {
		st, err := readStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		return st.utime + st.stime
	}
	before, err := server.total()
	if err != nil {
		t.Fatal(err)
	}
	ownBefore := own()
	if _, err := conn.Exec(ctx, "SELECT count(*) FROM generate_series(1, 3000000)"); err != nil {
		t.Fatal(err)
	}
	ownAfter := own()
	after, err := server.total()
	if err != nil {
		t.Fatal(err)
	}
	if ownAfter == ownBefore {
		t.Skip("the backend's query took less than a clock tick")
	}
	grew := int64((after - before) * clockTicks / 1e9)
	if grew < ownAfter-ownBefore {
		t.Errorf("the server's CPU grew by %d ticks, its backend alone by %d", grew, ownAfter-ownBefore)
	}
}

// Backends that burn CPU and end while the total is read, again and again,
// never make it go back: a backend the postmaster waits for during a reading
// is counted once, among the live ones or among the ended ones.
func TestServerCPUKeepsEndedBackends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	b, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, err := b.findServerCPU(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pool.Config().ConnConfig
	done := make(chan error, 1)
	go func() {
		for range 60 {
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				done <- err
				return
			}
			_, err = conn.Exec(ctx, "SELECT count(*) FROM generate_series(1, 200000)")
			conn.Close(ctx)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	last, err := server.total()
	if err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		default:
		}
		now, err := server.total()
		if err != nil {
			t.Fatal(err)
		}
		if now < last {
			t.Fatalf("the server's CPU went back from %v to %v", last, now)
		}
		last = now
	}
}
