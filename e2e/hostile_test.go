package e2e

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

// TestHostileSources: sources that lead outside the input store (.., an
// absolute path, a URL of another place), and one that does not exist, fail
// at once, without retries, with an error on the row and in the log that
// names them; the backend never sees them and the rows around them are
// unaffected.
func TestHostileSources(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	root := filepath.Join(s.Dir, "stores")
	in, out := s.FileStore("stores/in/data"), s.FileStore("stores/out")
	// Right outside the input store: what a traversal would read.
	if err := os.WriteFile(filepath.Join(root, "in", "secret.txt"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Put(in, "ok.txt", []byte("fine"))
	ran := filepath.Join(s.Dir, "ran")
	backend := s.script("record", `echo "$PGWORKER_SOURCE" >> `+shq(ran)+`
cp -- "$1" "$2/copy"
`)
	hostile := []string{
		"../../etc/passwd",
		"../secret.txt",
		"sub/../../secret.txt",
		"/etc/passwd",
		"file:///etc/passwd",
		"file://" + filepath.Join(root, "in", "secret.txt"),
		"missing.txt",
	}
	s.Enqueue(nil, append([]string{"ok.txt"}, hostile...)...)
	p := s.start("--exec", backend+" {input} {output_dir}", "--slots", "2", "--input-store", in, "--output-store", out)
	s.WaitSettled(time.Minute)

	log := p.LogText()
	for _, r := range s.rows() {
		if r.Source == "ok.txt" {
			if r.State != "done" {
				t.Errorf("row %d (%s): %s, want done", r.ID, r.Source, r.State)
			}
			continue
		}
		if r.State != "failed" || r.Attempt != 1 {
			t.Errorf("row %d (%s): %s after %d attempts, want failed at once (max_attempts 5)", r.ID, r.Source, r.State, r.Attempt)
		}
		if !strings.Contains(r.lastError(), strconv.Quote(r.Source)) {
			t.Errorf("row %d: last_error %q does not name the source %q", r.ID, r.lastError(), r.Source)
		}
		if !strings.Contains(log, r.Source) {
			t.Errorf("row %d: the log does not name the source %q", r.ID, r.Source)
		}
		t.Logf("row %d (%s): %s", r.ID, r.Source, r.lastError())
	}
	b, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "ok.txt" {
		t.Errorf("the backend ran for %q, want only ok.txt", got)
	}
}

// TestHostileArgv: a source full of shell syntax reaches the program as one
// literal argument, and nothing in it is executed. The program does not get
// the worker's credentials either.
func TestHostileArgv(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	mark := func(n int) string { return filepath.Join(s.Dir, "pwned-"+strconv.Itoa(n)) }
	sources := []string{
		"odd/name; touch " + mark(1),
		"odd/$(touch " + mark(2) + ")",
		"odd/`touch " + mark(3) + "`",
		"odd/it's a \"quoted\" name && touch " + mark(4) + " | cat > " + mark(5),
		"odd/*",
		"odd/$HOME ${PATH} {id} {{input}}",
	}
	for _, src := range sources {
		s.Put(in, src, []byte(src))
	}
	backend := s.script("argv", `printf '%s\n' "$#" "$@" > "$PGWORKER_OUTPUT_DIR/argv"
export -p > "$PGWORKER_OUTPUT_DIR/env"
`)
	s.Enqueue(nil, sources...)
	s.start("--exec", backend+" {source} {input} {id}", "--slots", "2", "--input-store", in, "--output-store", out)
	s.WaitSettled(time.Minute)

	for _, r := range s.rows() {
		if r.State != "done" {
			t.Errorf("row %d (%q): %s (%s), want done", r.ID, r.Source, r.State, r.lastError())
			continue
		}
		m, err := r.manifest()
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.checkOutputs(r.ID, m)
		if err != nil {
			t.Error(err)
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(got["argv"]), "\n"), "\n")
		if len(argv) != 4 || argv[0] != "3" || argv[1] != r.Source ||
			!strings.HasSuffix(argv[2], "/"+path.Base(r.Source)) || argv[3] != strconv.FormatInt(r.ID, 10) {
			t.Errorf("row %d: the backend got argv %q; want 3 arguments: %q, the input path, %d", r.ID, argv, r.Source, r.ID)
		}
		env := string(got["env"])
		if !strings.Contains(env, "PGWORKER_ID") {
			t.Errorf("row %d: the backend's environment lacks PGWORKER_ID:\n%s", r.ID, env)
		}
		for _, secret := range []string{s.S3.SecretKey, "AWS_ACCESS_KEY_ID", "PGWORKER_DATABASE_URL", s.DatabaseURL} {
			if strings.Contains(env, secret) {
				t.Errorf("row %d: the backend's environment holds %q", r.ID, secret)
			}
		}
	}
	for n := 1; n <= 5; n++ {
		if _, err := os.Stat(mark(n)); err == nil {
			t.Errorf("%s exists: a source was executed", mark(n))
		}
	}
}

// TestExecRefused: `pgworker run` with a program that does not exist or
// cannot be executed refuses to start, with one line that says why, before
// it registers any slot.
func TestExecRefused(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	out := s.FileStore("out")
	notExec := filepath.Join(s.Dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(s.Dir, "no", "such", "program")
	for _, tc := range []struct {
		exec, want string
	}{
		{missing + " {input}", missing + " does not exist"},
		{notExec + " {input}", notExec + " has no execute permission"},
		{s.Dir + " {input}", s.Dir + " is a directory"},
		{"no-such-program-in-path {input}", `"no-such-program-in-path" is not in PATH`},
	} {
		start := time.Now()
		res := s.Pgworker(nil, "run", "--exec", tc.exec, "--output-store", out)
		lines := pgworkerbin.Lines(res.Stderr)
		// A program that cannot run is a runtime error (exit 1), not a
		// command-line mistake: it may be on a mount that is not there yet.
		if res.Code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "pgworker: --exec: ") ||
			!strings.Contains(lines[0], tc.want) {
			t.Errorf("--exec %q: exit %d, stderr %q; want exit 1 and one line saying %q", tc.exec, res.Code, res.Stderr, tc.want)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("--exec %q: took %s to refuse", tc.exec, d)
		}
	}
	if n := s.MustCount(`SELECT count(*) FROM files.workers`); n != 0 {
		t.Errorf("%d slots registered by runs that refused to start", n)
	}
}

// TestEnqueueBadPayload: a --payload that is not one JSON object is a usage
// error (exit 2) and nothing is enqueued.
func TestEnqueueBadPayload(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, payload := range []string{`{not json`, `[1, 2]`, `"text"`, `{"a": 1} {"b": 2}`, ``} {
		res := s.Pgworker(strings.NewReader("c\nd\n"), "enqueue", "--payload", payload, "a", "b", "-")
		lines := pgworkerbin.Lines(res.Stderr)
		if res.Code != 2 || res.Stdout != "" || len(lines) != 1 || !strings.Contains(lines[0], "--payload") {
			t.Errorf("--payload %q: exit %d, stdout %q, stderr %q; want exit 2 and one line about --payload",
				payload, res.Code, res.Stdout, res.Stderr)
		}
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files`); n != 0 {
		t.Errorf("%d rows enqueued with a bad payload", n)
	}
	// The same command with a good payload works: the failures were the payload's.
	res := s.Pgworker(strings.NewReader("c\nd\n"), "enqueue", "--payload", `{"size": 200}`, "a", "b", "-")
	if res.Code != 0 {
		t.Fatalf("good payload: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE payload = '{"size": 200}'`); n != 4 {
		t.Errorf("%d rows with the good payload, want 4", n)
	}
}

// A program that was there at startup and has gone since (an NFS mount that
// dropped, a deploy half done) is the node's trouble, not the rows': they are
// handed back without spending attempts instead of failing one after another.
func TestProgramGoneAfterStart(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	for i := range 3 {
		s.Put(in, fmt.Sprintf("in-%d.txt", i), []byte("x"))
	}
	prog := s.script("copy", `cp "$1" "$2/"`+"\n")
	p := s.start("--exec", prog+" {input} {output_dir}", "--input-store", in, "--output-store", out,
		"--heartbeat", "200ms", "--lease-timeout", "2s")
	s.waitFor(30*time.Second, "the slot to register", func() bool {
		return s.MustCount(`SELECT count(*) FROM files.workers WHERE state = 'active'`) == 1
	})
	if err := os.Chmod(prog, 0o644); err != nil {
		t.Fatal(err)
	}
	s.Enqueue([]string{"--max-attempts", "5"}, "in-0.txt", "in-1.txt", "in-2.txt")
	s.waitFor(30*time.Second, "releases", func() bool {
		return s.MustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'released' AND error LIKE '%not executable%'`) >= 3
	})
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE state = 'failed'`); n != 0 {
		t.Fatalf("%d rows failed because the node lost its program", n)
	}

	// The program is back: the rows finish.
	if err := os.Chmod(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	s.waitFor(time.Minute, "the rows to finish", func() bool {
		return s.MustCount(`SELECT count(*) FROM files.files WHERE state = 'done'`) == 3
	})
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.LogTail(20))
	}
}
