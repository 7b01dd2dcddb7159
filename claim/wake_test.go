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

// The slots a claim names: twice what the last one found, and twice as many
// again while claims come back full, never fewer than two.
func TestNextAsk(t *testing.T) {
	for _, c := range []struct{ ask, asked, got, want int }{
		{2, 2, 2, 4},       // full: double
		{4, 3, 3, 6},       // full with fewer idle than planned: double what it named
		{64, 3, 3, 64},     // full, but the plan was larger: keep it
		{2, 2, 1, 2},       // a lone row
		{100, 100, 0, 2},   // nothing
		{100, 100, 30, 60}, // some
	} {
		if got := nextAsk(c.ask, c.asked, c.got); got != c.want {
			t.Errorf("nextAsk(%d, %d, %d) = %d, want %d", c.ask, c.asked, c.got, got, c.want)
		}
	}
}
