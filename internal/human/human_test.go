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

func TestInt(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45000: "-45,000"} {
		if got := Int(n); got != want {
			t.Errorf("Int(%d) = %q, want %q", n, got, want)
		}
	}
}
