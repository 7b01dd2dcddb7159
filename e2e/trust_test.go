package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// loginURL creates a LOGIN role that is a member of member (none when
// empty) and returns a URL of the stack's database that connects as it.
func (s *stack) loginURL(member string) string {
	s.T.Helper()
	role := "pgworker_login_" + strings.ToLower(rand.Text()[:10])
	password := rand.Text()
	stmt := fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password)
	if member != "" {
		stmt += " IN ROLE " + member
	}
	s.Exec(stmt)
	s.T.Cleanup(func() {
		if _, err := s.DB.Exec(context.Background(), "DROP ROLE "+role); err != nil {
			s.T.Errorf("drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(s.DatabaseURL)
	if err != nil {
		s.T.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return u.String()
}

// TestForgedControlMessages: any role that can connect can send on channel
// files_control. Cancellations forged by a role without grants, by
// pgworker_reader and by pgworker_worker, naming a running row and its
// worker, change nothing: the program runs to completion and the row ends
// done in its one attempt. A real `pgworker cancel` of another row, sent
// after them, still stops that row's program promptly.
func TestForgedControlMessages(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	s.Put(in, "a", []byte("a"))
	s.Put(in, "b", []byte("b"))
	s.makeGates(1, 2)
	s.start("--exec", s.gatedBackend(), "--slots", "2", "--input-store", in, "--output-store", out)
	s.Enqueue(nil, "a", "b")
	s.waitFor(time.Minute, "the backends of rows 1 and 2 to start", func() bool {
		return len(s.backendPIDs(1)) == 1 && len(s.backendPIDs(2)) == 1
	})
	victim, other := s.backendPIDs(1)[0], s.backendPIDs(2)[0]
	workerID := s.row(1).WorkerID
	if workerID == nil {
		t.Fatal("row 1 has no worker")
	}
	forged, err := json.Marshal(map[string]any{"op": "cancel", "file_id": 1, "worker_id": *workerID})
	if err != nil {
		t.Fatal(err)
	}

	for _, member := range []string{"", "pgworker_reader", "pgworker_worker"} {
		pool := pgtest.PoolFor(t, s.loginURL(member))
		ctx, cancel := s.ctx()
		for range 3 {
			if _, err := pool.Exec(ctx, "SELECT pg_notify('files_control', $1)", string(forged)); err != nil {
				t.Fatalf("notify as a member of %q: %v", member, err)
			}
		}
		cancel()
		pool.Close()
	}

	// The real cancellation reaches the worker after the forged ones.
	res := s.Pgworker(nil, "cancel", "2")
	if res.Code != 0 || !strings.Contains(res.Stdout, "cancelled 1 row") {
		t.Fatalf("cancel: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	cancelled := time.Now()
	s.waitFor(30*time.Second, "the backend of the cancelled row to be killed", func() bool { return !alive(other) })
	if took := time.Since(cancelled); took > 5*time.Second {
		t.Errorf("the backend was killed %s after the cancel, want about a second", took)
	}

	if !alive(victim) {
		t.Fatal("a forged cancellation killed the backend of row 1")
	}
	s.openGate(1)
	s.waitState(time.Minute, 1, "done")
	if as := s.attempts(1); len(as) != 1 || as[0].Outcome != "done" || len(s.backendPIDs(1)) != 1 {
		t.Errorf("row 1: attempts %v, backends %v; want one attempt, done", outcomes(as), s.backendPIDs(1))
	}
	if r := s.row(2); r.State != "cancelled" {
		t.Errorf("row 2: state %s, want cancelled", r.State)
	}
}
