package backend

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

var sampleJob = &Job{
	ID:        42,
	Queue:     "images",
	Source:    "photos/a b; rm -rf / $(x).jpg",
	Attempt:   3,
	Input:     "/work/slot-1/input/a b.jpg",
	OutputDir: "/work/slot-1/output",
	WorkDir:   "/work/slot-1",
}

func TestTemplateExpand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cmd  string
		want []string
	}{
		{"prog", []string{"prog"}},
		{"prog {input}", []string{"prog", sampleJob.Input}},
		{"prog {source}", []string{"prog", sampleJob.Source}},
		{"prog --in={input} --out '{output_dir}/x y.png'", []string{"prog", "--in=" + sampleJob.Input, "--out", sampleJob.OutputDir + "/x y.png"}},
		{"prog {id}-{attempt} {queue} {work_dir}", []string{"prog", "42-3", "images", "/work/slot-1"}},
		{`prog "{source}{source}"`, []string{"prog", sampleJob.Source + sampleJob.Source}},
		{"prog {{input}} {{ }} a{{b}}c", []string{"prog", "{input}", "{", "}", "a{b}c"}},
		{`awk '{{print $1}}' {input}`, []string{"awk", "{print $1}", sampleJob.Input}},
		{"prog '' {source}", []string{"prog", "", sampleJob.Source}},
		// Placeholders are found after quote removal.
		{`prog {in"put}"`, []string{"prog", sampleJob.Input}},
	}
	for _, tt := range tests {
		tmpl, err := Parse(tt.cmd)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.cmd, err)
			continue
		}
		if got := tmpl.Expand(sampleJob); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%q).Expand = %q, want %q", tt.cmd, got, tt.want)
		}
	}
}

func TestTemplateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cmd    string
		column int
		msg    string
	}{
		{"prog {inptu}", 6, "unknown placeholder {inptu}"},
		{"prog {input", 6, "unclosed {"},
		{"prog a}b", 7, "single }"},
		{`jq '{a: .b}'`, 5, "unknown placeholder {a: .b}"},
		{"prog 'x' {}", 10, "unknown placeholder {}"},
		{"prog {HOME}", 6, "unknown placeholder {HOME}"},
		{"'' x", 1, "program name is empty"},
		{"prog 'abc", 6, "unterminated single quote"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.cmd)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) error = %v, want a *SyntaxError", tt.cmd, err)
			continue
		}
		if se.Column != tt.column || !strings.Contains(se.Msg, tt.msg) {
			t.Errorf("Parse(%q) = %q at column %d, want %q at column %d", tt.cmd, se.Msg, se.Column, tt.msg, tt.column)
		}
	}
	for _, cmd := range []string{"", "   ", "\n"} {
		if _, err := Parse(cmd); !errors.Is(err, ErrEmptyCommand) {
			t.Errorf("Parse(%q) error = %v, want ErrEmptyCommand", cmd, err)
		}
	}
}

func TestTemplateProgramAndUses(t *testing.T) {
	t.Parallel()
	tmpl, err := Parse("/usr/bin/convert {input} out.png")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Program() != "/usr/bin/convert" || !tmpl.Uses("input") || tmpl.Uses("source") || tmpl.Uses("nope") {
		t.Errorf("Program = %q, Uses(input) = %v, Uses(source) = %v", tmpl.Program(), tmpl.Uses("input"), tmpl.Uses("source"))
	}
	tmpl, err = Parse("{work_dir}/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Program() != "" {
		t.Errorf("Program of a placeholder program word = %q, want empty", tmpl.Program())
	}
}

// escapeBraces writes s as template text that means s literally.
func escapeBraces(s string) string {
	return strings.NewReplacer("{", "{{", "}", "}}").Replace(s)
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"prog {input}", "prog '{output_dir}/out file' {id} {source} {attempt}", "prog {{x}}", "prog {nope}",
		"prog {", "prog }", `awk '{{print}}'`, "{input}", "prog a{source}b{source}c",
	} {
		f.Add(s, "photos/a b; rm -rf / $(touch x) `id` {input} '\"", int64(7))
	}
	f.Fuzz(func(t *testing.T, cmd, source string, id int64) {
		job := &Job{ID: id, Source: source, Input: "IN", OutputDir: "OUT", Attempt: 1, Queue: "q", WorkDir: "WD"}

		// A value stays one argument, byte for byte, whatever it holds.
		tmpl, err := Parse(Join([]string{"prog", "{source}", "x{source}y"}))
		if err != nil {
			t.Fatal(err)
		}
		if got := tmpl.Expand(job); !reflect.DeepEqual(got, []string{"prog", source, "x" + source + "y"}) {
			t.Fatalf("source %q expanded to %q", source, got)
		}
		// Escaped braces give the literal text back.
		tmpl, err = Parse(Join([]string{"prog", escapeBraces(source)}))
		if err != nil {
			t.Fatalf("escaped literal %q: %v", source, err)
		}
		if got := tmpl.Expand(job); !reflect.DeepEqual(got, []string{"prog", source}) {
			t.Fatalf("escaped literal %q expanded to %q", source, got)
		}

		tmpl, err = Parse(cmd)
		if err != nil {
			var se *SyntaxError
			if !errors.Is(err, ErrEmptyCommand) && (!errors.As(err, &se) || se.Offset < 0 || se.Offset > len(cmd)) {
				t.Fatalf("Parse(%q): bad error %#v", cmd, err)
			}
			return
		}
		words, err := Split(cmd)
		if err != nil {
			t.Fatalf("Parse accepted %q but Split fails: %v", cmd, err)
		}
		argv := tmpl.Expand(job)
		if len(argv) != len(words) {
			t.Fatalf("Parse(%q).Expand has %d words, Split has %d", cmd, len(argv), len(words))
		}
		for i, w := range words {
			if !strings.ContainsAny(w, "{}") && argv[i] != w {
				t.Fatalf("word %d of %q: %q expanded to %q", i, cmd, w, argv[i])
			}
		}
	})
}
