// Package human writes values the way a person reads them, for the text
// output of the command line and the pages of the dashboard.
package human

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Duration shows d as 850ms, 4.2s, 3m12s, 2h5m or 3d4h; a negative d as 0s.
func Duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		text := d.Round(time.Second).String()
		if strings.HasSuffix(text, "m0s") {
			text = strings.TrimSuffix(text, "0s")
		}
		return text
	case d < 48*time.Hour:
		text := strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
		if strings.HasSuffix(text, "h0m") {
			text = strings.TrimSuffix(text, "0m")
		}
		return text
	}
	days := int(d / (24 * time.Hour))
	hours := int((d - time.Duration(days)*24*time.Hour) / time.Hour)
	if hours == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, hours)
}

// ParseDuration reads a duration as time.ParseDuration does, and also with
// whole days in front: 7d, 30d, 1d12h.
func ParseDuration(s string) (time.Duration, error) {
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseUint(days, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("duration %q: the days must be a whole number, as in 7d or 1d12h", s)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest != "" {
		more, err := time.ParseDuration(rest)
		if err != nil || more < 0 {
			return 0, fmt.Errorf("duration %q: after the days, a duration such as 12h", s)
		}
		d += more
	}
	return d, nil
}

// Int shows n with thousands separators: 1,234,567.
func Int(n int64) string {
	s := strconv.FormatInt(n, 10)
	digits := strings.TrimPrefix(s, "-")
	var b strings.Builder
	if len(digits) < len(s) {
		b.WriteByte('-')
	}
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
