package human

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{850 * time.Millisecond, "850ms"},
		{4210 * time.Millisecond, "4.2s"},
		{3*time.Minute + 12*time.Second, "3m12s"},
		{5 * time.Minute, "5m"},
		{2*time.Hour + 5*time.Minute + 10*time.Second, "2h5m"},
		{76 * time.Hour, "3d4h"},
	} {
		if got := Duration(tt.d); got != tt.want {
			t.Errorf("Duration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
