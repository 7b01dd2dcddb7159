package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// A doorbell that rings within the cooldown of the last claim is answered
// when the cooldown ends, not at once; stopping the claimer meanwhile ends
// the wait.
func TestRunCooldownDefersTheClaim(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	bell := make(chan struct{}, 1)
	c := claim.New(pool, &claim.Config{
		Idle: []string{"n:1:0", "n:1:1"}, Doorbell: bell, SafetyNet: time.Hour, Cooldown: time.Hour,
	})
	col := newCollector()
	run(t, c, col.deliver) // its cleanup asserts that Run returns within the cooldown
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })

	insert(t, pool, 1, "default")
	bell <- struct{}{}
	waitFor(t, "the claim held back", func() bool { return c.Stats().Deferred == 1 })
	var pending int
	if err := pool.QueryRow(context.Background(),
		"SELECT count(*) FROM files.files WHERE state = 'pending'").Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); pending != 1 || s.Claims != 1 || s.Rows != 0 {
		t.Fatalf("during the cooldown: %d rows pending (want 1), stats %+v", pending, s)
	}
}

// A claim that filled every slot it named is followed at once, cooldown or
// not: a backlog is not slowed down by it.
func TestRunCooldownSparesTheFollowUp(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	bell := make(chan struct{}, 1)
	idle := idleSlots(10)
	c := claim.New(pool, &claim.Config{
		Idle: idle, Doorbell: bell, SafetyNet: time.Hour, Cooldown: 50 * time.Millisecond,
	})
	col := newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })

	insert(t, pool, 3, "default")
	bell <- struct{}{}
	for range 3 {
		col.next(t, "the announced rows")
	}
	// Asking for 2 (full), then at once for 4 (one found). Only the first
	// may have waited for the cooldown, depending on how long the insert took.
	if s := c.Stats(); s.Claims != 3 || s.Rows != 3 || s.Deferred > 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// With Quiet, a doorbell within the cooldown asks the listener to stop
// listening until the cooldown ends, and the claimer waits for the ring
// that ends the spell instead of sleeping: a ring meanwhile asks again, and
// the held-back claim is counted once.
func TestRunCooldownAsksForQuiet(t *testing.T) {
	t.Parallel()
	c, bell, asked, _ := quietClaimer(t, time.Hour)
	bell <- struct{}{}
	until := quietAsked(t, asked)
	if d := time.Until(until); d > time.Hour || d < 50*time.Minute {
		t.Fatalf("quiet asked until %s from now, want the end of the cooldown of an hour", d)
	}
	bell <- struct{}{} // a ring during the spell, as a reconnect would give
	if again := quietAsked(t, asked); !again.Equal(until) {
		t.Fatalf("asked again until %v, want %v", again, until)
	}
	if s := c.Stats(); s.Claims != 1 || s.Deferred != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// The ring that ends a quiet spell brings the claim held back.
func TestRunCooldownClaimsAfterQuiet(t *testing.T) {
	t.Parallel()
	c, bell, asked, col := quietClaimer(t, 100*time.Millisecond)
	bell <- struct{}{}
	// On a slow machine the cooldown may be over before the ring is seen:
	// then the row is claimed at once, without a spell.
	select {
	case until := <-asked:
		time.Sleep(time.Until(until))
		bell <- struct{}{} // as the listener rings when the spell ends
	case r := <-col.got:
		col.got <- r
	case <-time.After(patience):
		t.Fatal("neither a spell nor a claim")
	}
	col.next(t, "the row announced during the cooldown")
	if s := c.Stats(); s.Claims != 2 || s.Rows != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// quietClaimer runs a claimer of two slots with cooldown whose Quiet sends
// each end asked for to asked and agrees, once it has looked for work at
// start, with one row inserted since.
func quietClaimer(t *testing.T, cooldown time.Duration) (c *claim.Claimer, bell chan struct{}, asked chan time.Time, col *collector) {
	t.Helper()
	pool := pgtest.Pool(t)
	bell, asked = make(chan struct{}, 1), make(chan time.Time, 8)
	c = claim.New(pool, &claim.Config{
		Idle: []string{"n:1:0", "n:1:1"}, Doorbell: bell, SafetyNet: time.Hour, Cooldown: cooldown,
		Quiet: func(until time.Time) bool { asked <- until; return true },
	})
	col = newCollector()
	run(t, c, col.deliver)
	waitFor(t, "the first look", func() bool { return c.Stats().Claims == 1 })
	insert(t, pool, 1, "default")
	return c, bell, asked, col
}

func quietAsked(t *testing.T, asked <-chan time.Time) time.Time {
	t.Helper()
	select {
	case until := <-asked:
		return until
	case <-time.After(patience):
		t.Fatal("Quiet not asked")
		return time.Time{}
	}
}
