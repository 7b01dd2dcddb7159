package migrations_test

import (
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

// When every live slot has been silent past its lease, the database (or the
// network) was away, as after a failover to a standby that started long
// ago: the first reap takes nothing, and silence counts from the moment the
// fleet is heard from again.
func TestReapAfterFleetSilence(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, "SELECT files.register_worker('a', lease_timeout => '10 seconds', key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT files.register_worker('b', lease_timeout => '10 seconds', key => 'test-key-0123456789')")
	testhelp.WaitServerUp(t, pool, 10*time.Second)
	mustExec(t, pool, "INSERT INTO files.files (source) VALUES ('x')")
	if got := claim(t, pool, "a", 1); len(got) != 1 {
		t.Fatalf("claimed %d rows", len(got))
	}
	silence := func() {
		t.Helper()
		mustExec(t, pool, "UPDATE files.workers SET last_heartbeat_at = now() - interval '5 minutes'")
		mustExec(t, pool, "UPDATE files.files SET lease_expires_at = now() - interval '4 minutes' WHERE state = 'running'")
	}

	// A reap is the first sign of life after the outage.
	silence()
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 0 {
		t.Fatalf("the first reap after a silence of the whole fleet took %d rows", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE state = 'active'"); n != 2 {
		t.Fatalf("%d slots active after the reap, want 2", n)
	}
	// b comes back; a does not: it is silent only since the fleet was heard.
	mustExec(t, pool, "SELECT * FROM files.heartbeat('test-key-0123456789', 'b')")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 0 {
		t.Fatalf("a reap within a lease of the outage's end took %d rows", n)
	}
	// A lease later, a is dead and its row goes back.
	mustExec(t, pool, "UPDATE files.reap_state SET fleet_resumed_at = now() - interval '2 minutes'")
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 1 {
		t.Fatalf("reap a lease after the outage took %d rows, want 1", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM files.workers WHERE worker_id = 'a' AND state = 'dead'"); n != 1 {
		t.Fatal("the slot that stayed silent was not declared dead")
	}

	// A heartbeat can be the first sign of life too.
	if got := claim(t, pool, "b", 1); len(got) != 1 {
		t.Fatalf("claimed %d rows", len(got))
	}
	silence()
	mustExec(t, pool, "SELECT * FROM files.heartbeat('test-key-0123456789', 'c')")
	if n := queryInt(t, pool, "SELECT count(*) FROM files.reap_state WHERE fleet_resumed_at > now() - interval '1 minute'"); n != 1 {
		t.Fatal("a heartbeat after the fleet's silence was not noted")
	}
	if n := queryInt(t, pool, "SELECT files.reap()"); n != 0 {
		t.Fatalf("reap after the fleet was heard again took %d rows", n)
	}
}
