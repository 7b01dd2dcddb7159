package cli

import "testing"

func TestSizeFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want int64
		text string
	}{
		{"0", 0, "0"}, {"1000", 1000, "1000"}, {"512KiB", 512 << 10, "512KiB"}, {"1M", 1 << 20, "1MiB"},
		{"500MB", 500e6, "500000000"}, {"10GiB", 10 << 30, "10GiB"}, {"2 TB", 2e12, "1953125000KiB"}, {"7B", 7, "7"},
	} {
		var s sizeFlag
		if err := s.Set(tt.in); err != nil || int64(s) != tt.want || s.String() != tt.text {
			t.Errorf("Set(%q): %d %q %v, want %d %q", tt.in, int64(s), s.String(), err, tt.want, tt.text)
		}
	}
	for _, bad := range []string{"", "-1", "1.5GiB", "ten", "10PiB", "9999999999TiB"} {
		var s sizeFlag
		if err := s.Set(bad); err == nil {
			t.Errorf("Set(%q) = %d, want an error", bad, int64(s))
		}
	}
}
