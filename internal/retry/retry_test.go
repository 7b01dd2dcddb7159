package retry

import (
	"context"
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	for n := 1; n <= 40; n++ {
		full := min(time.Second, 10*time.Millisecond<<min(n-1, 29))
		if n >= 30 {
			full = time.Second
		}
		for range 50 {
			d := Backoff(10*time.Millisecond, time.Second, n)
			if d < full/2 || d > full {
				t.Fatalf("Backoff(10ms, 1s, %d) = %s, want within [%s, %s]", n, d, full/2, full)
			}
		}
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a cancelled context reported it alive")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep on a live context reported it ended")
	}
}
