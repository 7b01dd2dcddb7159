package claim

import (
	"testing"
	"time"
)

// A claim covers the wake times asked for before it started; a time asked for
// while it ran survives it, even if already due: the row behind it may have
// become claimable after the claim's snapshot.
func TestWakeAskedForDuringAClaimSurvivesIt(t *testing.T) {
	c := &Claimer{safetyNet: time.Hour, rescheduled: make(chan struct{}, 1)}
	before := time.Now()
	c.WakeAt(before.Add(-time.Second)) // due and asked for before the claim
	started := time.Now()
	c.WakeAt(started.Add(-time.Millisecond)) // due before the claim started, asked for during it
	c.WakeAt(started.Add(time.Minute))       // due after the claim started
	c.dropWakes(started)

	if len(c.wakes) != 2 {
		t.Fatalf("%d wake times left, want 2: %+v", len(c.wakes), c.wakes)
	}
	if d := c.untilSafety(); d != 0 {
		t.Fatalf("the claimer would wait %v, want 0 (a wake time is due)", d)
	}
	c.dropWakes(time.Now()) // the next claim covers it
	if len(c.wakes) != 1 || !c.wakes[0].at.Equal(started.Add(time.Minute)) {
		t.Fatalf("wake times left: %+v", c.wakes)
	}
}
