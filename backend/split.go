package backend

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrEmptyCommand is returned for a command line that holds no word at all.
var ErrEmptyCommand = errors.New("empty command: give the program to run, for example --exec 'convert {input} {output_dir}/out.png'")

// SyntaxError reports a command line that cannot be split or parsed, with
// the position of the problem.
type SyntaxError struct {
	// Offset is the byte offset of the problem in the command line.
	Offset int
	// Column is the 1-based character position of the problem.
	Column int
	// Msg says what is wrong and how to fix it.
	Msg string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("column %d: %s", e.Column, e.Msg)
}

func syntaxError(s string, offset int, format string, args ...any) *SyntaxError {
	return &SyntaxError{
		Offset: offset,
		Column: utf8.RuneCountInString(s[:offset]) + 1,
		Msg:    fmt.Sprintf(format, args...),
	}
}

// Split splits a command line into words the way a POSIX shell does, and
// does nothing else:
//
//   - blanks (space, tab, newline) separate words;
//   - 'single quotes' keep everything up to the next single quote literally;
//   - "double quotes" keep everything literally except that a backslash
//     escapes ", \, $, ` and newline (a backslash-newline is removed); before
//     any other character the backslash stays;
//   - outside quotes a backslash makes the next character literal, and a
//     backslash-newline is removed (line continuation);
//   - quotes and escapes can be mixed within a word: a'b c'"d" is one word,
//     and ” is an empty word.
//
// There is no expansion, substitution, globbing, redirection or command
// separation: $HOME, $(cmd), `cmd`, *, ~, ;, |, &&, > and # are ordinary
// characters that end up in the words as written.
//
// Split returns a *SyntaxError for an unterminated quote or a trailing
// backslash.
func Split(s string) ([]string, error) {
	words, err := split(s)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = w.text
	}
	return out, nil
}

// word is a split word with, for each of its bytes, the offset of the byte in
// the command line it came from (for error positions in templates).
type word struct {
	text  string
	pos   []int
	start int // offset where the word begins
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' }

func split(s string) ([]word, error) {
	var (
		words  []word
		buf    []byte
		pos    []int
		inWord bool
		start  int
	)
	begin := func(at int) {
		if !inWord {
			inWord, start = true, at
		}
	}
	add := func(c byte, at int) {
		buf = append(buf, c)
		pos = append(pos, at)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isBlank(c):
			if inWord {
				words = append(words, word{text: string(buf), pos: pos, start: start})
				buf, pos, inWord = nil, nil, false
			}
		case c == '\\':
			if i+1 >= len(s) {
				return nil, syntaxError(s, i, `trailing backslash: nothing follows it to escape (write \\ for a literal backslash)`)
			}
			if s[i+1] == '\n' {
				i++
				continue // line continuation
			}
			begin(i)
			i++
			add(s[i], i)
		case c == '\'':
			begin(i)
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, syntaxError(s, i, "unterminated single quote: add the closing '")
			}
			for j := i + 1; j <= i+end; j++ {
				add(s[j], j)
			}
			i += end + 1
		case c == '"':
			begin(i)
			end, err := doubleQuoted(s, i, add)
			if err != nil {
				return nil, err
			}
			i = end
		default:
			begin(i)
			add(c, i)
		}
	}
	if inWord {
		words = append(words, word{text: string(buf), pos: pos, start: start})
	}
	return words, nil
}

// doubleQuoted adds the text of the double-quoted string that opens at
// s[open], where a backslash escapes only ", \, $, ` and a newline, and
// returns the offset of the closing quote.
func doubleQuoted(s string, open int, add func(c byte, at int)) (int, error) {
	for i := open + 1; i < len(s); i++ {
		d := s[i]
		if d == '"' {
			return i, nil
		}
		if d == '\\' && i+1 < len(s) {
			switch s[i+1] {
			case '"', '\\', '$', '`':
				i++
				add(s[i], i)
				continue
			case '\n':
				i++
				continue
			}
		}
		add(d, i)
	}
	return 0, syntaxError(s, open, `unterminated double quote: add the closing "`)
}

// Join quotes words so that Split gives them back: the inverse of Split, for
// showing an argv to a person or pasting it into a shell.
func Join(words []string) string {
	var b strings.Builder
	for i, w := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(w))
	}
	return b.String()
}

func quote(w string) string {
	if w == "" {
		return "''"
	}
	safe := true
	for i := 0; i < len(w); i++ {
		if !isSafe(w[i]) {
			safe = false
			break
		}
	}
	if safe {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

func isSafe(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("_@%+=:,./-", c) >= 0
}
