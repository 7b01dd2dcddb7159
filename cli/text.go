package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgworker/pgworker/internal/human"
)

// printable returns s with what could drive a terminal written as Go
// escapes: control characters (ESC, BEL, CR, tab, C1 controls such as
// CSI), bidirectional overrides, line and paragraph separators, and bytes
// that are not UTF-8. Worker ids, queue names, sources and database errors
// are written by whoever reaches the database; text output prints them
// through printable (--json escapes them as JSON does).
func printable(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if escaped(r, size) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case escaped(r, size) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case escaped(r, size):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func escaped(r rune, size int) bool {
	return r == utf8.RuneError && size == 1 || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) ||
		r == '\u2028' || r == '\u2029'
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// clip shortens s for a message, quoted.
func clip(s string, n int) string {
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q...", s[:cut])
}

// clipText shortens s to n characters for a table.
func clipText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// secondsText shows a duration of s seconds the way a person reads it
// (human.Duration), "-" when unknown.
func secondsText(s *float64) string {
	if s == nil {
		return "-"
	}
	return human.Duration(time.Duration(*s * float64(time.Second)))
}

// writeJSON writes v as indented JSON. Beyond what encoding/json escapes,
// it escapes the C1 controls and the bidirectional overrides, which a
// terminal showing the JSON would otherwise obey.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	b := buf.Bytes()
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r >= 0x80 && escaped(r, size) {
			fmt.Fprintf(&out, `\u%04x`, r) // only strings hold such runes
		} else {
			out.Write(b[:size])
		}
		b = b[size:]
	}
	_, err := w.Write(out.Bytes())
	return err
}
