package backend

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// lineReader reads lines of at most max bytes; the rest of a longer line is
// skipped and counted.
type lineReader struct {
	br *bufio.Reader
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{br: bufio.NewReaderSize(r, max)}
}

// next returns the next line without its line ending, how many bytes of it
// were left out, and the read error (io.EOF at the end) that follows it.
func (l *lineReader) next() (line []byte, cut int, err error) {
	line, err = l.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		line = bytes.Clone(line)
		var rest []byte
		for err == bufio.ErrBufferFull {
			rest, err = l.br.ReadSlice('\n')
			cut += len(rest)
		}
		if bytes.HasSuffix(rest, []byte("\n")) {
			cut--
			if bytes.HasSuffix(rest, []byte("\r\n")) {
				cut--
			}
		}
		cut = max(cut, 0)
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 && err != nil && cut == 0 {
		return nil, 0, err
	}
	return line, cut, err
}

// tailBuffer keeps the last size bytes written to it.
type tailBuffer struct {
	buf   []byte
	size  int
	w     int
	full  bool
	total int64
}

func newTailBuffer(size int) *tailBuffer {
	return &tailBuffer{buf: make([]byte, size), size: size}
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	t.total += int64(n)
	if n >= t.size {
		copy(t.buf, p[n-t.size:])
		t.w, t.full = 0, true
		return n, nil
	}
	c := copy(t.buf[t.w:], p)
	if c < n {
		copy(t.buf, p[c:])
		t.w, t.full = n-c, true
	} else if t.w += c; t.w == t.size {
		t.w, t.full = 0, true
	}
	return n, nil
}

// String returns the kept bytes as valid UTF-8 without NUL bytes, and
// whether earlier bytes were dropped.
func (t *tailBuffer) String() (string, bool) {
	var b []byte
	if t.full {
		b = append(append(make([]byte, 0, t.size), t.buf[t.w:]...), t.buf[:t.w]...)
	} else {
		b = t.buf[:t.w]
	}
	truncated := t.total > int64(t.size)
	if truncated {
		// Do not start in the middle of a character.
		for i := 0; i < 3 && len(b) > 0 && !isRuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return s, truncated
}
