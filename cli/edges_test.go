package cli_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgworker/pgworker/internal/clitest"
	"github.com/pgworker/pgworker/migrations"
)

// terminalControls are bytes and runes that move a terminal: ESC (CSI and
// OSC sequences start with it), BEL (ends an OSC), CSI as one C1 byte, a
// bidirectional override.
var terminalControls = []string{"\x1b", "\x07", "\u009b", "\u202e", "\r"}

func holdsControls(s string) bool {
	for _, c := range terminalControls {
		if strings.Contains(s, c) {
			return true
		}
	}
	return false
}

// Worker ids, queue names and sources are written by whoever reaches the
// database; the text output shows their control characters as escapes.
func TestTextOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	const (
		worker = "evil\x1b]0;owned\x07:1:0"
		queue  = "q\x1b[31mred\u202e"
		source = "in/\x1b[2Jclear\u009b1m\rx.csv"
	)
	var key string
	if err := pool.QueryRow(context.Background(), "SELECT files.register_worker($1, 'node', 1, 0, 'v')", worker).Scan(&key); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, "INSERT INTO files.files (queue, source) VALUES ($1, $2), ($1, 'other')", queue, source)
	if n := count(t, pool, "SELECT count(*) FROM files.claim($1, ARRAY[$2], 1, $3)", worker, queue, key); n != 1 {
		t.Fatalf("claimed %d rows", n)
	}

	out := ok(t, url, "", "status")
	if holdsControls(out) {
		t.Errorf("status printed control characters raw:\n%q", out)
	}
	for _, want := range []string{`evil\x1b]0;owned\x07:1:0`, `q\x1b[31mred\u202e`, `in/\x1b[2Jclear\x9b1m\x0dx.csv`} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %s:\n%s", want, out)
		}
	}
	if out := ok(t, url, "", "status", "--json"); holdsControls(out) || !strings.Contains(out, `evil\u001b]0;owned\u0007:1:0`) {
		t.Errorf("status --json:\n%s", out)
	}
	if out := ok(t, url, "", "scale-hint"); holdsControls(out) || !strings.Contains(out, `q\x1b[31mred\u202e`) {
		t.Errorf("scale-hint:\n%q", out)
	}
	// Errors too: a URL that does not parse is quoted in the message.
	res := pgworker(t, "postgres://app@db:notaport/q\x1b]0;owned\x07", "", "status")
	if res.Code != 1 || holdsControls(res.Stderr) || !strings.Contains(res.Stderr, `\x1b]0;owned\x07`) {
		t.Errorf("invalid URL: exit %d, stderr %q", res.Code, res.Stderr)
	}
}

// An empty queue name is a usage error in every command that takes one,
// before the database is tried; it never means every queue.
func TestEmptyQueueName(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	exec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('a', 'x'), ('b', 'y')")
	for range 2 {
		exec(t, pool, `SELECT files.fail(c.id, 'w:1:0', c.attempt, c.claim_token, 'broken', false) FROM files.claim('w:1:0') c`)
	}
	for _, args := range [][]string{
		{"retry", "--failed", "--queue", ""},
		{"retry", "1", "--queue", ""},
		{"enqueue", "--queue", "", "src"},
		{"pause", ""},
		{"resume", ""},
		{"run", "--exec", "/bin/true", "--queue", "", "--work-dir", t.TempDir()},
	} {
		fails(t, url, "", 2, []string{"empty"}, args...)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE state = 'failed'"); n != 2 {
		t.Errorf("%d failed rows left, want 2: an empty --queue retried rows", n)
	}
	if out := ok(t, url, "", "retry", "--failed", "--queue", "a"); out != "requeued 1 row\n" {
		t.Errorf("retry --failed --queue a: %q", out)
	}
}

// A queue name may have migrations.MaxQueueNameLength characters, however
// many bytes they take: the schema counts characters, and so does every
// command that takes a queue.
func TestMultibyteQueueName(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	name := strings.Repeat("é", migrations.MaxQueueNameLength-1) + "列"
	if n := utf8.RuneCountInString(name); n != migrations.MaxQueueNameLength || len(name) <= migrations.MaxQueueNameLength {
		t.Fatalf("test name has %d characters in %d bytes", n, len(name))
	}
	ok(t, url, "", "enqueue", "--queue", name, "src")
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE queue = $1", name); n != 1 {
		t.Fatalf("%d rows in the queue, want 1", n)
	}
	ok(t, url, "", "pause", name)
	ok(t, url, "", "resume", name)
	ok(t, url, "", "retry", "--failed", "--queue", name)
	res := clitest.Run(t, bin, nil, clitest.Env("PGWORKER_DATABASE_URL="+clitest.ClosedURL(t), "PGWORKER_WORK_DIR="+t.TempDir()),
		"run", "--exec", "/bin/true", "--queue", name)
	if res.Code != 1 || !strings.Contains(res.Stderr, "cannot reach the database") {
		t.Errorf("run --queue with %d characters: exit %d, stderr:\n%s\nwant it past the flags, to the database", migrations.MaxQueueNameLength, res.Code, res.Stderr)
	}

	long := name + "é"
	fails(t, url, "", 2, []string{"--queue", "characters"}, "enqueue", "--queue", long, "src")
	fails(t, url, "", 2, []string{"--queue", "characters"}, "retry", "--failed", "--queue", long)
	if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 1 {
		t.Errorf("%d rows after a refused enqueue, want 1", n)
	}
}

// A password in a URL given as a flag is visible to every user in the
// process list: the command warns, without printing it; from the
// environment it is quiet.
func TestPasswordInFlagWarns(t *testing.T) {
	t.Parallel()
	url := clitest.ClosedURL(t) // with a password
	const password = "Sup3rS3cretPw"
	res := clitest.Run(t, bin, nil, clitest.Env(), "status", "--database-url", url, "--log-format", "json")
	if res.Code != 1 || !strings.Contains(res.Stderr, `"level":"WARN"`) || !strings.Contains(res.Stderr, "--database-url holds a password") ||
		!strings.Contains(res.Stderr, ".pgpass") {
		t.Errorf("--database-url with a password: exit %d, stderr:\n%s", res.Code, res.Stderr)
	}
	if strings.Contains(res.Stderr, password) {
		t.Errorf("the password was printed:\n%s", res.Stderr)
	}
	noPassword := strings.Replace(url, ":"+password+"@", "@", 1)
	for _, res := range []clitest.Result{
		clitest.Run(t, bin, nil, clitest.Env(), "status", "--database-url", noPassword),
		clitest.Run(t, bin, nil, clitest.Env("PGWORKER_DATABASE_URL="+url), "status"),
	} {
		if strings.Contains(res.Stderr, "holds a password") || len(clitest.Lines(res.Stderr)) != 1 {
			t.Errorf("a warning without a password on the command line:\n%s", res.Stderr)
		}
	}
}
