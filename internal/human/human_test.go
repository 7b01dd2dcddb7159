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
		{7 * 24 * time.Hour, "7d"},
		{36 * time.Hour, "36h"},
	} {
		if got := Duration(tt.d); got != tt.want {
			t.Errorf("Duration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90s": 90 * time.Second, "36h": 36 * time.Hour, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "0d": 0,
	} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "xd", "-1d", "7d-1h", "7days", "1.5d", "soon"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
	// Round trip of what Duration writes for whole days and hours.
	for _, d := range []time.Duration{7 * 24 * time.Hour, 76 * time.Hour} {
		if got, err := ParseDuration(Duration(d)); err != nil || got != d {
			t.Errorf("ParseDuration(Duration(%v)) = %v, %v", d, got, err)
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
