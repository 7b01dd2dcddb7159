// Package retry holds the waiting that the runtime's loops share: an
// exponential backoff with jitter, and a sleep that ends with its context.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before retry n (from 1): minDelay doubled n-1
// times, capped at maxDelay, with "equal jitter" (between half and all of
// it), so that many processes retrying at once spread out.
func Backoff(minDelay, maxDelay time.Duration, n int) time.Duration {
	d := maxDelay
	if n < 30 {
		d = min(maxDelay, minDelay<<(n-1))
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d, or less if ctx ends; it reports whether ctx is still alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// OrDefault returns d, or def when d is not positive: a configuration
// duration left at zero takes its default.
func OrDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
