package backend

import (
	"bytes"
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{"prog", []string{"prog"}},
		{"  prog  a\tb\nc  ", []string{"prog", "a", "b", "c"}},
		{"prog 'a b' \"c d\"", []string{"prog", "a b", "c d"}},
		{"prog a'b c'd", []string{"prog", "ab cd"}},
		{"prog '' \"\"", []string{"prog", "", ""}},
		{`prog 'it'\''s'`, []string{"prog", "it's"}},
		{`prog "say \"hi\""`, []string{"prog", `say "hi"`}},
		{`prog "a\\b" "\$HOME" "\` + "`" + `x\` + "`" + `"`, []string{"prog", `a\b`, "$HOME", "`x`"}},
		{`prog "\n\t\a"`, []string{"prog", `\n\t\a`}},
		{"prog \"a\\\nb\"", []string{"prog", "ab"}},
		{"prog a\\\nb", []string{"prog", "ab"}},
		{"prog \\\n x", []string{"prog", "x"}},
		{`prog a\ b \'c\' \"d\" \\`, []string{"prog", "a b", "'c'", `"d"`, `\`}},
		{`prog '\n' '\'`, []string{"prog", `\n`, `\`}},
		{`prog "'single' inside"`, []string{"prog", "'single' inside"}},
		{`prog '"double" inside'`, []string{"prog", `"double" inside`}},
		// Nothing is expanded, substituted, globbed, redirected or separated.
		{`echo $HOME ${HOME} $(id) ` + "`id`" + ` * ?.txt ~ ~/x`, []string{"echo", "$HOME", "${HOME}", "$(id)", "`id`", "*", "?.txt", "~", "~/x"}},
		{`a; b | c && d || e > f < g 2>&1 &`, []string{"a;", "b", "|", "c", "&&", "d", "||", "e", ">", "f", "<", "g", "2>&1", "&"}},
		{`prog # not a comment`, []string{"prog", "#", "not", "a", "comment"}},
		{`prog "$HOME" '$HOME'`, []string{"prog", "$HOME", "$HOME"}},
		{"prog {input} '{output_dir}/x y'", []string{"prog", "{input}", "{output_dir}/x y"}},
		{"prog héllo 'wörld ✓'", []string{"prog", "héllo", "wörld ✓"}},
		{"prog a\rb", []string{"prog", "a\rb"}},
		{"", nil},
		{" \t\n", nil},
	}
	for _, tt := range tests {
		got, err := Split(tt.in)
		if err != nil {
			t.Errorf("Split(%q): %v", tt.in, err)
			continue
		}
		if len(got) == 0 && len(tt.want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Split(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSplitErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		offset int
		column int
		msg    string
	}{
		{`prog 'abc`, 5, 6, "unterminated single quote"},
		{`prog "abc`, 5, 6, "unterminated double quote"},
		{`prog "abc\"`, 5, 6, "unterminated double quote"},
		{`prog "abc\`, 5, 6, "unterminated double quote"},
		{`prog abc\`, 8, 9, "trailing backslash"},
		{`é 'x`, 3, 3, "unterminated single quote"},
		{`a "b" 'c`, 6, 7, "unterminated single quote"},
	}
	for _, tt := range tests {
		_, err := Split(tt.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Split(%q) error = %v, want a *SyntaxError", tt.in, err)
			continue
		}
		if se.Offset != tt.offset || se.Column != tt.column || !strings.Contains(se.Error(), tt.msg) {
			t.Errorf("Split(%q) = offset %d column %d %q; want offset %d column %d containing %q",
				tt.in, se.Offset, se.Column, se.Error(), tt.offset, tt.column, tt.msg)
		}
	}
}

// shellWords asks /bin/sh how it splits s (s must not hold characters that
// the shell would expand or interpret).
func shellWords(t testing.TB, s string) []string {
	t.Helper()
	out, err := commandOutput(exec.Command("/bin/sh", "-c", `printf '%s\0' MARK `+s), false)
	if err != nil {
		t.Fatalf("sh -c printf %q: %v", s, err)
	}
	parts := strings.Split(string(out), "\x00")
	return parts[1 : len(parts)-1]
}

// shellComparable reports whether s holds only what Split and a POSIX shell
// agree on: no expansion, substitution, globbing, operators or comments.
func shellComparable(s string) bool {
	if strings.ContainsAny(s, "$`*?[]~#;&|<>(){}!=%\x00\r") {
		return false
	}
	if _, err := Split(s); err != nil {
		return false
	}
	// An unquoted newline separates commands in a shell, words here.
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '\'':
			i += strings.IndexByte(s[i+1:], '\'') + 1
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case '\n':
			return false
		}
	}
	return true
}

func TestSplitMatchesShell(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	inputs := []string{
		`a b c`,
		`'a b' "c d" e\ f`,
		`a'b'"c"d\ e`,
		`'' "" x`,
		`"a\\b" "a\b" "a\"b" 'a\b'`,
		"a\\\nb \"c\\\nd\" 'e\\\nf'",
		`\a\b\c \\ \' \"`,
		`"it's" 'say "hi"'`,
		"tab\there",
		"'new\nline' \"new\nline\"",
		`héllo "wörld ✓"`,
	}
	for _, in := range inputs {
		if !shellComparable(in) {
			t.Fatalf("test input %q is not comparable with the shell", in)
		}
		got, _ := Split(in)
		want := shellWords(t, in)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Split(%q) = %q, sh gives %q", in, got, want)
		}
	}
}

func TestJoin(t *testing.T) {
	t.Parallel()
	words := []string{"prog", "", "a b", "it's", `"q"`, `\`, "$HOME", "-x=1", "a\nb", "ü"}
	joined := Join(words)
	if want := `prog '' 'a b' 'it'\''s' '"q"' '\' '$HOME' -x=1 'a` + "\n" + `b' 'ü'`; joined != want {
		t.Errorf("Join = %s, want %s", joined, want)
	}
	got, err := Split(joined)
	if err != nil || !reflect.DeepEqual(got, words) {
		t.Errorf("Split(Join(%q)) = %q, %v", words, got, err)
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{
		"", "prog", `prog 'a b' "c d"`, `a\ b`, `"a\"b"`, `'it'\''s'`, "a\\\nb", `"unterminated`,
		`'unterminated`, `trailing\`, `$(rm -rf /) ; | && * ~`, "{input} {{x}}", "é 'ü' \"✓\"", "\"\\\n\"",
	} {
		f.Add(s)
	}
	_, err := exec.LookPath("/bin/sh")
	haveShell := err == nil
	f.Fuzz(func(t *testing.T, s string) {
		words, err := Split(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Offset < 0 || se.Offset >= len(s) || se.Column < 1 {
				t.Fatalf("Split(%q): bad error %#v", s, err)
			}
			return
		}
		again, err := Split(Join(words))
		if err != nil || (len(words) > 0 || len(again) > 0) && !reflect.DeepEqual(again, words) {
			t.Fatalf("Split(Join(%q)) = %q, %v", words, again, err)
		}
		if haveShell && shellComparable(s) && !bytes.Contains([]byte(s), []byte("\x00")) {
			want := shellWords(t, s)
			if (len(words) > 0 || len(want) > 0) && !reflect.DeepEqual(words, want) {
				t.Fatalf("Split(%q) = %q, sh gives %q", s, words, want)
			}
		}
	})
}

// commandOutput runs cmd as its Output (or, combined, CombinedOutput) would,
// started as a Runner starts a program: this test process is a subreaper
// (TestMain), and a sweep running beside would otherwise collect the exit
// status of a child it does not know.
func commandOutput(cmd *exec.Cmd, combined bool) ([]byte, error) {
	var b bytes.Buffer
	cmd.Stdout = &b
	if combined {
		cmd.Stderr = &b
	}
	if err := startProgram(cmd); err != nil {
		return nil, err
	}
	defer programEnded(cmd.Process.Pid)
	err := cmd.Wait()
	return b.Bytes(), err
}
