package backend

import (
	"strconv"
	"strings"
)

// Placeholders lists the names a command template may use, in the order the
// documentation gives them. Each is written {name} and is replaced, inside the
// word where it stands, by:
//
//	{input}       path of the downloaded input file (Job.Input)
//	{output_dir}  directory the program writes its outputs to (Job.OutputDir)
//	{id}          row id (Job.ID)
//	{source}      the row's source, as enqueued (Job.Source)
//	{attempt}     attempt number, from 1 (Job.Attempt)
//	{queue}       the row's queue (Job.Queue)
//	{work_dir}    the slot's work directory, the program's working directory (Job.WorkDir)
//	{payload_file} path of the file holding the row's payload (Job.PayloadFile)
//
// A literal brace is written twice: {{ gives {, }} gives }.
var Placeholders = []string{"input", "output_dir", "id", "source", "attempt", "queue", "work_dir", "payload_file"}

type placeholder int

const (
	literal placeholder = iota
	phInput
	phOutputDir
	phID
	phSource
	phAttempt
	phQueue
	phWorkDir
	phPayloadFile
)

var placeholderByName = map[string]placeholder{
	"input":        phInput,
	"output_dir":   phOutputDir,
	"id":           phID,
	"source":       phSource,
	"attempt":      phAttempt,
	"queue":        phQueue,
	"work_dir":     phWorkDir,
	"payload_file": phPayloadFile,
}

// part is a literal piece of a word or a placeholder.
type part struct {
	kind placeholder
	text string // for literal
}

// Template is a parsed command line: argv with placeholders, ready to be
// expanded for each job. It is immutable and safe for concurrent use.
type Template struct {
	command string
	words   [][]part
}

// Parse splits a command line into words (see Split) and then finds the
// placeholders inside the words (see Placeholders). A value put in by a
// placeholder is never split, quoted or interpreted: a source named
// `a b; rm -rf / $(x)` becomes part of exactly one argument, byte for byte.
//
// Parse returns ErrEmptyCommand for a command without words, and a
// *SyntaxError (with the column) for an unterminated quote, a trailing
// backslash, an unknown placeholder or a single brace.
func Parse(command string) (*Template, error) {
	words, err := split(command)
	if err != nil {
		return nil, err
	}
	if len(words) == 0 {
		return nil, ErrEmptyCommand
	}
	if words[0].text == "" {
		return nil, syntaxError(command, words[0].start, "the program name is empty")
	}
	t := &Template{command: command, words: make([][]part, len(words))}
	for i, w := range words {
		parts, err := parseWord(command, w)
		if err != nil {
			return nil, err
		}
		t.words[i] = parts
	}
	return t, nil
}

func parseWord(command string, w word) ([]part, error) {
	var (
		parts []part
		lit   strings.Builder
	)
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, part{kind: literal, text: lit.String()})
			lit.Reset()
		}
	}
	s := w.text
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '{':
			if i+1 < len(s) && s[i+1] == '{' {
				lit.WriteByte('{')
				i++
				continue
			}
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return nil, syntaxError(command, w.pos[i], "unclosed { (write {{ for a literal brace)")
			}
			name := s[i+1 : i+1+end]
			kind, ok := placeholderByName[name]
			if !ok {
				return nil, syntaxError(command, w.pos[i], "unknown placeholder {%s} (known: %s; write {{ and }} for literal braces)",
					name, knownPlaceholders())
			}
			flush()
			parts = append(parts, part{kind: kind})
			i += end + 1
		case '}':
			if i+1 < len(s) && s[i+1] == '}' {
				lit.WriteByte('}')
				i++
				continue
			}
			return nil, syntaxError(command, w.pos[i], "single } (write }} for a literal brace)")
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	if len(parts) == 0 {
		// An empty word ('' in the command) is an empty argument.
		parts = []part{{kind: literal}}
	}
	return parts, nil
}

func knownPlaceholders() string {
	names := make([]string, len(Placeholders))
	for i, n := range Placeholders {
		names[i] = "{" + n + "}"
	}
	return strings.Join(names, " ")
}

// String returns the command line the template was parsed from.
func (t *Template) String() string { return t.command }

// Program returns the program word when it holds no placeholder, and ""
// when it does (the program is then known only per job).
func (t *Template) Program() string {
	if w := t.words[0]; len(w) == 1 && w[0].kind == literal {
		return w[0].text
	}
	return ""
}

// Uses reports whether the template uses the placeholder name (without
// braces), for example to skip downloading an input nobody reads.
func (t *Template) Uses(name string) bool {
	kind, ok := placeholderByName[name]
	if !ok {
		return false
	}
	for _, w := range t.words {
		for _, p := range w {
			if p.kind == kind {
				return true
			}
		}
	}
	return false
}

// Expand returns the argv for a job: one argument per word of the template,
// whatever the values hold.
func (t *Template) Expand(job *Job) []string {
	argv := make([]string, len(t.words))
	for i, w := range t.words {
		if len(w) == 1 && w[0].kind == literal {
			argv[i] = w[0].text
			continue
		}
		var b strings.Builder
		for _, p := range w {
			b.WriteString(p.value(job))
		}
		argv[i] = b.String()
	}
	return argv
}

func (p part) value(job *Job) string {
	switch p.kind {
	case phInput:
		return job.Input
	case phOutputDir:
		return job.OutputDir
	case phID:
		return strconv.FormatInt(job.ID, 10)
	case phSource:
		return job.Source
	case phAttempt:
		return strconv.Itoa(job.Attempt)
	case phQueue:
		return job.Queue
	case phWorkDir:
		return job.WorkDir
	case phPayloadFile:
		return job.PayloadFile
	}
	return p.text
}
