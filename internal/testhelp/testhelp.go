// Package testhelp holds the small helpers that the tests of several packages
// share: waiting for a condition, and a log buffer safe for concurrent writers.
package testhelp

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitFor polls cond every few milliseconds until it holds, failing the test
// with what it waited for when timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that many goroutines may write to, such as
// the output of a logger under test.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitServerUp waits until the server of pool has been up longer than d.
// files.reap counts no silence from before the server's start, so a test
// that reaps leases of d needs that much uptime, and a fresh cluster has
// seconds.
func WaitServerUp(t testing.TB, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	WaitFor(t, d+30*time.Second, "the server to be up longer than "+d.String(), func() bool {
		var up bool
		err := pool.QueryRow(context.Background(), "SELECT pg_postmaster_start_time() < now() - $1::interval", d.String()).Scan(&up)
		if err != nil {
			t.Fatalf("server uptime: %v", err)
		}
		return up
	})
}
