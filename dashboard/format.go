package dashboard

import (
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgworker/pgworker/internal/human"
)

// funcs are the template functions. html/template escapes what they
// return; they only make text readable: control characters visible, long
// strings cut.
var funcs = template.FuncMap{
	"clip":     clip,
	"visible":  visible,
	"num":      num,
	"dur":      dur,
	"durp":     durp,
	"ts":       ts,
	"tsp":      tsp,
	"pct":      pct,
	"pctf":     pctf,
	"rate":     rate,
	"derefs":   deref[string],
	"derefi":   deref[int32],
	"derefi64": deref[int64],
	"bytes":    byteSize,
}

// visible writes control characters, bidirectional overrides and bytes
// that are not UTF-8 as Go escapes, and keeps newlines and tabs.
func visible(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029':
			if r < 0x100 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// clip is visible(s) cut to n characters, saying how many more there were.
func clip(n int, s string) string {
	cut, count := 0, 0
	for cut < len(s) && count < n {
		_, size := utf8.DecodeRuneInString(s[cut:])
		cut += size
		count++
	}
	if cut >= len(s) {
		return visible(s)
	}
	rest := utf8.RuneCountInString(s[cut:])
	return visible(s[:cut]) + fmt.Sprintf("… (%s more characters)", num(int64(rest)))
}

// num writes n with thousands separators (human.Int).
func num(n int64) string { return human.Int(n) }

// dur shows a duration the way a person reads it (human.Duration).
func dur(d time.Duration) string { return human.Duration(d) }

// durp is dur of a duration that may be unknown ("–").
func durp(d *time.Duration) string {
	if d == nil {
		return "–"
	}
	return dur(*d)
}

// ts shows a time in UTC to the second.
func ts(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func tsp(t *time.Time) string {
	if t == nil {
		return "–"
	}
	return ts(*t)
}

// pct is part of total as a width for a progress bar, "0" to "100".
func pct(part, total int64) string {
	if total <= 0 || part <= 0 {
		return "0"
	}
	return strconv.FormatFloat(float64(part)*100/float64(total), 'f', 2, 64)
}

// pctf is a ratio as a percentage for reading: 12.5%.
func pctf(part, total int64) string {
	if total <= 0 {
		return "–"
	}
	return strconv.FormatFloat(float64(part)*100/float64(total), 'f', 1, 64) + "%"
}

// rate shows rows per minute.
func rate(perMinute float64) string {
	switch {
	case perMinute == 0:
		return "0/min"
	case perMinute < 10:
		return strconv.FormatFloat(perMinute, 'f', 1, 64) + "/min"
	}
	return num(int64(perMinute+0.5)) + "/min"
}

// byteSize shows a size in bytes: 512 B, 1.5 KiB, 3.2 GiB.
func byteSize(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		v /= 1024
		unit = u
		if v < 1024 {
			break
		}
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
}
