// Package testhelp holds the small helpers that the tests of several packages
// and the test servers share: waiting for a condition, a log buffer safe for
// concurrent writers, a free port, a random name, the module's root.
//
//	testhelp.WaitFor(t, time.Minute, "the row to be done", func() bool {
//		return state(t, id) == "done"
//	})
package testhelp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitFor polls cond every few milliseconds until it holds, failing the test
// with what it waited for when timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitEvery(t, timeout, 5*time.Millisecond, what, cond)
}

// WaitEvery is WaitFor polling every interval, for conditions that cost a
// query or more.
func WaitEvery(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
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

// FreePort returns a TCP port of 127.0.0.1 that nobody listened on a moment
// ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RandomHex returns n random bytes in hex, for names that must not collide.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// ErrNoModule is returned by ModuleRoot outside the module.
var ErrNoModule = errors.New("no go.mod above the working directory")

// ModuleRoot walks up from the working directory to the directory of go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoModule
		}
		dir = parent
	}
}
