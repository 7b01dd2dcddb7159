package claim_test

import (
	"testing"
	"time"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// A process that prefers gpu works on cpu's rows while gpu has none
// ("stealing"); a notification while every slot is busy sends no claim, and
// the slot that frees up next takes gpu's row although cpu's are older.
func TestRunPrefersQueuesInOrder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	insert(t, pool, 5, "cpu")
	bell := make(chan struct{}) // unbuffered: a send returns once the claimer has taken it
	c := claim.New(pool, &claim.Config{
		Queues: []string{"gpu", "cpu"}, Prefer: true,
		Idle: []string{"n:1:0", "n:1:1"}, Doorbell: bell, SafetyNet: time.Hour,
	})
	col := newCollector()
	run(t, c, col.deliver)
	first, second := col.next(t, "first cpu row"), col.next(t, "second cpu row")
	if first.Queue != "cpu" || second.Queue != "cpu" {
		t.Fatalf("with gpu empty: rows of %s and %s, want cpu's", first.Queue, second.Queue)
	}
	claims := c.Stats().Claims

	insert(t, pool, 2, "gpu")
	// Two rings taken: the first was handled, with no slot idle, before the
	// claimer waited again for the second.
	bell <- struct{}{}
	bell <- struct{}{}
	if s := c.Stats(); s.Claims != claims {
		t.Fatalf("%d claims while every slot was busy, want none", s.Claims-claims)
	}
	c.Free(first.WorkerID)
	third := col.next(t, "after a slot freed up")
	if third.Queue != "gpu" || third.WorkerID != first.WorkerID {
		t.Fatalf("freed slot got a row of %s (slot %s), want gpu's for %s", third.Queue, third.WorkerID, first.WorkerID)
	}
	if s := c.Stats(); s.Claims != claims+1 {
		t.Fatalf("%d claims for one freed slot, want 1", s.Claims-claims)
	}
}
