package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/pgworkerbin"
	"github.com/pgworker/pgworker/migrations"
)

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"migrate"}, {"migrate", "up"}, {"migrate", "down"}, {"migrate", "status"}, {"enqueue"}, {"run"},
		{"status"}, {"retry"}, {"cancel"}, {"pause"}, {"resume"}, {"version"},
	} {
		name := strings.Join(args, " ")
		out := ok(t, "", "", append(args, "--help")...)
		for _, want := range []string{"Usage: pgworker " + name, "Examples:\n  pgworker " + args[0]} {
			if !strings.Contains(out, want) {
				t.Errorf("pgworker %s --help lacks %q:\n%s", name, want, out)
			}
		}
		if args[0] != "version" && !strings.Contains(out, "--database-url URL") {
			t.Errorf("pgworker %s --help does not list --database-url:\n%s", name, out)
		}
	}
	// The env twins are documented.
	if out := ok(t, "", "", "run", "--help"); !strings.Contains(out, "[$PGWORKER_EXEC]") || !strings.Contains(out, "[$PGWORKER_DATABASE_URL, $DATABASE_URL]") {
		t.Errorf("run --help lacks environment twins:\n%s", out)
	}
	overview := ok(t, "", "", "--help")
	for _, cmd := range []string{"migrate", "enqueue", "run", "status", "retry", "cancel", "pause", "resume", "version"} {
		if !strings.Contains(overview, "\n  "+cmd+" ") {
			t.Errorf("pgworker --help does not list %s:\n%s", cmd, overview)
		}
	}
	if out := ok(t, "", "", "help", "enqueue"); !strings.Contains(out, "Usage: pgworker enqueue") {
		t.Errorf("pgworker help enqueue:\n%s", out)
	}

	res := pgworker(t, "", "")
	if res.Code != 2 || !strings.Contains(res.Stderr, "Usage: pgworker COMMAND") {
		t.Errorf("pgworker without arguments: exit %d\n%s", res.Code, res.Stderr)
	}
	fails(t, "", "", 2, []string{`unknown command "frobnicate"`}, "frobnicate")
	fails(t, "", "", 2, []string{"pgworker status:", "flag provided but not defined: -nope", "pgworker status --help"}, "status", "--nope")
	fails(t, "", "", 2, []string{`unknown migrate command "sideways"`}, "migrate", "sideways")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out := ok(t, "", "", "version")
	if !strings.HasPrefix(out, "pgworker ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: %q", out)
	}
	if out2 := ok(t, "", "", "--version"); out2 != out {
		t.Errorf("--version = %q, version = %q", out2, out)
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := pgtest.EmptyURL(t)
	pool := pgtest.PoolFor(t, url)
	var names []string
	fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if strings.HasSuffix(p, ".sql") {
			names = append(names, path.Base(p))
		}
		return err
	})
	slices.Sort(names)
	if len(names) < 2 {
		t.Fatalf("found %d migrations", len(names))
	}
	last := names[len(names)-1]
	schemaExists := func() bool {
		return count(t, pool, "SELECT count(*) FROM pg_namespace WHERE nspname = 'files'") == 1
	}
	status := func() map[string]string {
		out := ok(t, url, "", "migrate", "status")
		states := map[string]string{}
		for _, line := range pgworkerbin.Lines(out)[1:] {
			f := strings.Fields(line)
			states[f[1]] = f[2]
		}
		return states
	}

	for name, state := range status() {
		if state != "pending" {
			t.Errorf("empty database: %s is %s", name, state)
		}
	}
	out := ok(t, url, "", "migrate", "up")
	for _, n := range names {
		if !strings.Contains(out, "applied "+n) {
			t.Errorf("migrate up output lacks %s:\n%s", n, out)
		}
	}
	if !schemaExists() {
		t.Fatal("no files schema after migrate up")
	}
	for name, state := range status() {
		if state != "applied" {
			t.Errorf("after up: %s is %s", name, state)
		}
	}
	if out := ok(t, url, "", "migrate", "up"); !strings.Contains(out, "already up to date") {
		t.Errorf("second migrate up: %q", out)
	}
	if out := ok(t, url, "", "migrate", "down"); strings.TrimSpace(out) == "" || !strings.HasPrefix(out, "rolled back "+last) {
		t.Errorf("migrate down: %q, want rolled back %s", out, last)
	}
	if st := status(); st[last] != "pending" || st[names[0]] != "applied" {
		t.Errorf("after down: %v", st)
	}
	out = ok(t, url, "", "migrate", "down", "--to", "0")
	if n := len(pgworkerbin.Lines(out)); n != len(names)-1 {
		t.Errorf("migrate down --to 0 rolled back %d migrations, want %d:\n%s", n, len(names)-1, out)
	}
	if schemaExists() {
		t.Error("files schema still there after migrate down --to 0")
	}
	if out := ok(t, url, "", "migrate", "down"); !strings.Contains(out, "nothing to roll back") {
		t.Errorf("migrate down on an empty database: %q", out)
	}
	fails(t, url, "", 2, []string{"--to"}, "migrate", "up", "--to", "0")
}

func TestEnqueueArguments(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	out := ok(t, url, "", "enqueue", "--queue", "img", "--priority", "7", "--max-attempts", "2", "--payload", `{"size": 200}`,
		"a.jpg", "dir/b c.jpg", "$(touch x); `id`", "--", "-odd")
	if out != "queued 4, already there 0 (queue \"img\")\n" {
		t.Errorf("output %q", out)
	}
	rows, err := pool.Query(context.Background(), "SELECT source, queue, priority, max_attempts, payload->>'size', state FROM files.files ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var src, queue, size, state string
		var prio, maxAttempts int
		if err := rows.Scan(&src, &queue, &prio, &maxAttempts, &size, &state); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s|%s|%d|%d|%s|%s", src, queue, prio, maxAttempts, size, state))
	}
	want := []string{"a.jpg|img|7|2|200|pending", "dir/b c.jpg|img|7|2|200|pending", "$(touch x); `id`|img|7|2|200|pending", "-odd|img|7|2|200|pending"}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Defaults: queue "default", priority 0, the table's max_attempts, payload {}.
	ok(t, url, "", "enqueue", "plain")
	if n := count(t, pool, `SELECT count(*) FROM files.files WHERE source = 'plain' AND queue = 'default' AND priority = 0
		AND max_attempts = 5 AND payload = '{}'`); n != 1 {
		t.Error("enqueue without flags did not use the defaults")
	}
	// The queue's env twin.
	res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env("PGWORKER_DATABASE_URL="+url, "PGWORKER_QUEUE=from-env"), "enqueue", "x")
	if res.Code != 0 || count(t, pool, "SELECT count(*) FROM files.files WHERE queue = 'from-env'") != 1 {
		t.Errorf("PGWORKER_QUEUE: exit %d %s", res.Code, res.Stderr)
	}
	fails(t, url, "", 2, []string{"argument 2", "invalid UTF-8"}, "enqueue", "ok", "bad\xff")
	fails(t, url, "", 2, []string{"argument 1", "empty source"}, "enqueue", "")
}

func TestEnqueueStdin(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	var in bytes.Buffer
	for i := range 100000 {
		fmt.Fprintf(&in, "obj-%06d\n", i)
		if i%10000 == 0 {
			in.WriteString("\n  \t\n") // blank lines are skipped
		}
	}
	in.WriteString("crlf-line\r\nlast-without-newline")
	out := ok(t, url, in.String(), "enqueue", "--chunk-size", "7000")
	if out != "queued 100002, already there 0 (queue \"default\")\n" {
		t.Errorf("output %q", out)
	}
	if n := count(t, pool, "SELECT count(DISTINCT source) FROM files.files WHERE source LIKE 'obj-%'"); n != 100000 {
		t.Errorf("%d distinct obj- rows, want 100000", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE source IN ('crlf-line', 'last-without-newline')"); n != 2 {
		t.Errorf("crlf and last lines: %d rows", n)
	}
	// Rows keep the input order.
	if n := count(t, pool, `SELECT count(*) FROM (SELECT source, lag(source) OVER (ORDER BY id) AS prev FROM files.files
		WHERE source LIKE 'obj-%') s WHERE prev > source`); n != 0 {
		t.Errorf("%d rows out of order", n)
	}

	// "-" reads stdin in the middle of the arguments.
	ok(t, url, "x\ny\n", "enqueue", "--queue", "mixed", "a", "-", "b")
	rows, _ := pool.Query(context.Background(), "SELECT source FROM files.files WHERE queue = 'mixed' ORDER BY id")
	var got []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		got = append(got, s)
	}
	if !slices.Equal(got, []string{"a", "x", "y", "b"}) {
		t.Errorf("a - b: %q", got)
	}
}

func TestEnqueueBadLineStopsItsBatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, line, want string
	}{
		{"invalid UTF-8", "bad-\xc3\x28", "invalid UTF-8 at byte 5"},
		{"NUL", "bad\x00nul", "NUL byte at byte 4"},
		{"too long", strings.Repeat("x", 5000), "longer than 4096 bytes"},
		{"very long", strings.Repeat("x", 100000), "longer than 4096 bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url, pool := newDB(t)
			var in strings.Builder
			for i := 1; i <= 2500; i++ {
				if i == 2200 {
					in.WriteString(tt.line + "\n")
				} else {
					fmt.Fprintf(&in, "line-%d\n", i)
				}
			}
			fails(t, url, in.String(), 1, []string{"stdin line 2200", tt.want, "2000 rows", "tail -n +2001"},
				"enqueue", "--chunk-size", "1000")
			if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 2000 {
				t.Errorf("%d rows loaded, want the 2000 of the two batches before the bad line", n)
			}
			if n := count(t, pool, "SELECT count(*) FROM files.files WHERE source = 'line-2001' OR source = 'line-2199'"); n != 0 {
				t.Error("rows of the bad line's batch were loaded")
			}
		})
	}
}

func TestEnqueuePayloadRejected(t *testing.T) {
	t.Parallel()
	// The database is unreachable: a usage error must come before any attempt.
	url := pgworkerbin.ClosedURL(t)
	for _, payload := range []string{`not json`, `[1, 2]`, `"text"`, `42`, `null`, `{"a": 1} {"b": 2}`, `{"a": `} {
		stderr := fails(t, url, "", 2, []string{"--payload must be", "JSON object"}, "enqueue", "--payload", payload, "src")
		if strings.Contains(stderr, "cannot reach") {
			t.Errorf("--payload %s: the database was tried first", payload)
		}
	}
	fails(t, url, "", 2, []string{"--chunk-size"}, "enqueue", "--chunk-size", "0", "src")
	fails(t, url, "", 2, []string{"--queue"}, "enqueue", "--queue", "", "src")
	fails(t, url, "", 2, []string{"--max-attempts"}, "enqueue", "--max-attempts", "0", "src")
	fails(t, url, "", 2, []string{"not several"}, "enqueue", "--from", "s3://b/p", "src")
}

func TestStatementModes(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	for i, mode := range []string{"prepared", "describe", "exec", "simple"} {
		ok(t, url, "a\nb\n", "enqueue", "--statement-mode", mode, "--queue", mode, "--payload", `{"mode": "`+mode+`"}`)
		out := ok(t, url, "", "status", "--json", "--statement-mode", mode)
		var rep struct{ Queues []struct{ Queue string } }
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Queues) != i+1 {
			t.Errorf("--statement-mode %s: status %v %s", mode, err, out)
		}
		ok(t, url, "", "pause", mode, "--statement-mode", mode)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE payload->>'mode' = queue"); n != 8 {
		t.Errorf("%d rows, want 8", n)
	}
	res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env("PGWORKER_DATABASE_URL="+url, "PGWORKER_STATEMENT_MODE=simple"), "status")
	if res.Code != 0 {
		t.Errorf("PGWORKER_STATEMENT_MODE=simple: %s", res.Stderr)
	}
	fails(t, url, "", 2, []string{"--statement-mode \"bouncy\""}, "status", "--statement-mode", "bouncy")
}

func TestStatus(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	ctx := context.Background()
	if out := ok(t, url, "", "status"); !strings.Contains(out, "No queues yet") || !strings.Contains(out, "No live workers") {
		t.Errorf("status of an empty queue:\n%s", out)
	}
	ok(t, url, "a\nb\nc\nd\ne\n", "enqueue", "--queue", "img")
	ok(t, url, "", "enqueue", "--queue", "doc", "x", "y")
	ok(t, url, "", "pause", "doc")
	exec(t, pool, "SELECT files.register_worker('node-a:1:0', 'node-a', 1, 0, 'v-test', key => 'cli-test-key-0123456')")

	claim := func(worker string) (id int64, attempt int, token string) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim($1, ARRAY['img'], 1, 'cli-test-key-0123456')", worker).Scan(&id, &attempt, &token); err != nil {
			t.Fatalf("claim: %v", err)
		}
		return id, attempt, token
	}
	id, att, token := claim("node-b:2:0")
	exec(t, pool, `SELECT files.complete($1, 'node-b:2:0', $2, $3, '{}', '{"duration_ms": 1500}')`, id, att, token)
	id, att, token = claim("node-b:2:0")
	exec(t, pool, `SELECT files.fail($1, 'node-b:2:0', $2, $3, 'boom', false, '{"duration_ms": 500}')`, id, att, token)
	heldID, _, _ := claim("node-a:1:0")

	out := ok(t, url, "", "status")
	for _, want := range []string{
		"QUEUE  PAUSED  PENDING  SCHEDULED  RUNNING  DONE  FAILED  CANCELLED  OLDEST PENDING",
		"img    no      2        0          1        1     1       0",
		"doc    yes     2        0          0        0     0       0",
		"node-a:1:0  active  ",
		fmt.Sprintf("  %d     img    1        ", heldID),
		"WORKER      STATE   PROCESSED  DONE  FAILED  LOST  FAILURE RATE  MEAN  P95",
		"node-b:2:0  active  2          1     1       0     50.0%         1s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	var rep map[string]any
	if err := json.Unmarshal([]byte(ok(t, url, "", "status", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	queues := rep["queues"].([]any)
	img := queues[1].(map[string]any)
	if img["queue"] != "img" || img["pending"] != 2.0 || img["running"] != 1.0 || img["done"] != 1.0 || img["failed"] != 1.0 ||
		img["paused"] != false || img["oldest_pending_seconds"] == nil || img["finished_last_minute"] != 2.0 || img["finished_last_hour"] != 2.0 {
		t.Errorf("queue img: %v", img)
	}
	if doc := queues[0].(map[string]any); doc["queue"] != "doc" || doc["paused"] != true {
		t.Errorf("queue doc: %v", doc)
	}
	var held map[string]any
	for _, w := range rep["active_workers"].([]any) {
		if w := w.(map[string]any); w["worker_id"] == "node-a:1:0" {
			held = w
		}
	}
	if held == nil || held["file_id"] != float64(heldID) || held["node"] != "node-a" || held["version"] != "v-test" ||
		held["attempt"] != 1.0 || held["queue"] != "img" || held["running_for_seconds"] == nil {
		t.Errorf("active worker node-a:1:0: %v", held)
	}
	var b map[string]any
	for _, m := range rep["worker_metrics"].([]any) {
		if m := m.(map[string]any); m["worker_id"] == "node-b:2:0" {
			b = m
		}
	}
	if b == nil || b["processed"] != 2.0 || b["failed"] != 1.0 || b["failure_rate"] != 0.5 || b["mean_seconds"] != 1.0 {
		t.Errorf("metrics of node-b:2:0: %v", b)
	}
	for _, key := range []string{"generated_at", "queues", "active_workers", "worker_metrics"} {
		if _, ok := rep[key]; !ok {
			t.Errorf("status --json lacks %q", key)
		}
	}
}

func TestRetryCancelPauseResume(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	ctx := context.Background()
	ok(t, url, "", "enqueue", "--queue", "q", "r1", "r2", "r3", "r4")
	ids := func(where string) []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT id FROM files.files WHERE "+where+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for rows.Next() {
			var id int64
			rows.Scan(&id)
			out = append(out, id)
		}
		return out
	}
	all := ids("true")
	for range 2 {
		var id int64
		var att int
		var token string
		if err := pool.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim('w:1:0')").Scan(&id, &att, &token); err != nil {
			t.Fatal(err)
		}
		exec(t, pool, "SELECT files.fail($1, 'w:1:0', $2, $3, 'broken', false)", id, att, token)
	}
	if failed := ids("state = 'failed'"); len(failed) != 2 {
		t.Fatalf("failed rows: %v", failed)
	}
	if out := ok(t, url, "", "retry", "--failed", "--queue", "other"); out != "requeued 0 rows\n" {
		t.Errorf("retry --failed --queue other: %q", out)
	}
	if out := ok(t, url, "", "retry", "--failed"); out != "requeued 2 rows\n" {
		t.Errorf("retry --failed: %q", out)
	}
	if n := len(ids("state = 'pending' AND attempt = 0")); n != 4 {
		t.Errorf("%d pending rows after retry, want 4", n)
	}

	out := ok(t, url, "", "cancel", strconv.FormatInt(all[0], 10), strconv.FormatInt(all[1], 10), "999999")
	if !strings.HasPrefix(out, "cancelled 2 rows\n") || !strings.Contains(out, "1 of the 3 rows given") {
		t.Errorf("cancel: %q", out)
	}
	if got := ids("state = 'cancelled'"); !slices.Equal(got, all[:2]) {
		t.Errorf("cancelled rows %v, want %v", got, all[:2])
	}
	if out := ok(t, url, "", "retry", strconv.FormatInt(all[0], 10)); out != "requeued 1 row\n" {
		t.Errorf("retry ID: %q", out)
	}
	if out := ok(t, url, "", "retry", strconv.FormatInt(all[2], 10)); !strings.Contains(out, "requeued 0 rows") || !strings.Contains(out, "left alone") {
		t.Errorf("retry of a pending row: %q", out)
	}

	if out := ok(t, url, "", "pause", "q"); !strings.HasPrefix(out, `paused queue "q"`) {
		t.Errorf("pause: %q", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.claim('w:1:0', ARRAY['q'])"); n != 0 {
		t.Error("a paused queue handed out a row")
	}
	if out := ok(t, url, "", "resume", "q"); out != "resumed queue \"q\"\n" {
		t.Errorf("resume: %q", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.claim('w:1:0', ARRAY['q'])"); n != 1 {
		t.Error("a resumed queue handed out no row")
	}
	if out := ok(t, url, "", "pause", "later"); !strings.Contains(out, "a new queue") {
		t.Errorf("pause of a new queue: %q", out)
	}
	fails(t, url, "", 1, []string{`no queue named "nope"`}, "resume", "nope")

	fails(t, url, "", 2, []string{"--failed, or their ids"}, "retry")
	fails(t, url, "", 2, []string{"not both"}, "retry", "--failed", "3")
	fails(t, url, "", 2, []string{`"abc" is not a row id`}, "cancel", "abc")
	fails(t, url, "", 2, []string{"give the ids"}, "cancel")
	fails(t, url, "", 2, []string{"exactly one queue"}, "pause")
	fails(t, url, "", 2, []string{"exactly one queue"}, "resume", "a", "b")
}

func TestDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	url := pgworkerbin.ClosedURL(t)
	const password = "Sup3rS3cretPw"
	for _, args := range [][]string{
		{"status"}, {"enqueue", "a"}, {"migrate", "up"}, {"migrate", "status"}, {"retry", "--failed"}, {"cancel", "1"},
		{"pause", "q"}, {"resume", "q"}, {"run", "--exec", "/bin/true", "--work-dir", t.TempDir()},
	} {
		res := pgworker(t, url, "", args...)
		lines := pgworkerbin.Lines(res.Stderr)
		if res.Code != 1 || len(lines) != 1 || res.Stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s", args, res.Code, res.Stdout, res.Stderr)
			continue
		}
		want := "pgworker: cannot reach the database at postgres://app:xxxxx@" + strings.TrimPrefix(url, "postgres://app:"+password+"@") +
			": connection refused (check --database-url or PGWORKER_DATABASE_URL)"
		if lines[0] != want {
			t.Errorf("%v:\n got %s\nwant %s", args, lines[0], want)
		}
		if strings.Contains(res.Stderr, password) {
			t.Errorf("%v: the password was printed", args)
		}
	}

	// From DATABASE_URL, the message says where to look.
	res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env("DATABASE_URL="+url), "status")
	if res.Code != 1 || !strings.Contains(res.Stderr, "check DATABASE_URL") || strings.Contains(res.Stderr, password) {
		t.Errorf("DATABASE_URL: exit %d %s", res.Code, res.Stderr)
	}
	// A database that does not exist, on a server that answers.
	missing := pgtest.WithDatabase(t, pgtest.ServerURL(t), "pgworker_no_such_db")
	fails(t, missing, "", 1, []string{"cannot connect to the database", `database "pgworker_no_such_db" does not exist`}, "status")
	// No URL at all.
	fails(t, "", "", 2, []string{"missing database URL (set --database-url or PGWORKER_DATABASE_URL)"}, "status")
	// A URL that does not parse: still redacted, still one line.
	stderr := fails(t, "postgres://app:"+password+"@db:notaport/q", "", 1, []string{"invalid database URL", "xxxxx"}, "status")
	if strings.Contains(stderr, password) {
		t.Error("the password of an invalid URL was printed")
	}
	// A schema that is not there says what to do.
	fails(t, pgtest.EmptyURL(t), "", 1, []string{"pgworker migrate up"}, "status")
}

func TestRunFlags(t *testing.T) {
	t.Parallel()
	url := pgworkerbin.ClosedURL(t)
	for _, tt := range []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{[]string{}, nil, 2, "missing --exec"},
		{[]string{"--exec", "prog 'unterminated"}, nil, 2, "column 6: unterminated single quote"},
		{[]string{"--exec", "prog {inptu}"}, nil, 2, "unknown placeholder {inptu}"},
		{[]string{"--exec", "/nonexistent/program {input}"}, nil, 1, "program not found: /nonexistent/program does not exist"},
		{[]string{"--exec", "/bin/true", "--heartbeat", "5s", "--lease-timeout", "5s"}, nil, 2, "--lease-timeout (5s) must exceed --heartbeat (5s)"},
		{[]string{"--exec", "/bin/true", "--heartbeat", "20s"}, nil, 2, "must exceed --heartbeat (20s)"},
		{[]string{"--exec", "/bin/true", "--slots", "0"}, nil, 2, "--slots \"0\""},
		{[]string{"--exec", "/bin/true", "--slots", "8-2"}, nil, 2, "minimum exceeds its maximum"},
		{[]string{"--exec", "/bin/true", "--slots", "many"}, nil, 2, "--slots \"many\""},
		{[]string{"--exec", "/bin/true", "--metrics-addr", "9090"}, nil, 2, "--metrics-addr"},
		{[]string{"--exec", "/bin/true", "--input-store", "ftp://x/y"}, nil, 2, "unknown scheme \"ftp\""},
		{[]string{"--exec", "/bin/true", "--output-store", "s3:///nobucket"}, nil, 2, "bucket is missing"},
		{[]string{"--exec", "/bin/true", "--timeout", "soon"}, nil, 2, "invalid value \"soon\" for flag -timeout"},
		{[]string{"--exec", "/bin/true", "extra"}, nil, 2, "the command goes in --exec"},
		{[]string{"--exec", "/bin/true", "--claim-cooldown", "-1s"}, nil, 2, "--claim-cooldown must be between 0"},
		{[]string{}, []string{"PGWORKER_EXEC=/bin/true", "PGWORKER_CLAIM_COOLDOWN=2m"}, 2, "--claim-cooldown must be between 0"},
		{[]string{}, []string{"PGWORKER_EXEC=/bin/true", "PGWORKER_SLOTS=abc"}, 2, "--slots \"abc\""},
		{[]string{}, []string{"PGWORKER_EXEC=/bin/true", "PGWORKER_HEARTBEAT=often"}, 2, "PGWORKER_HEARTBEAT=\"often\""},
		{[]string{}, []string{"PGWORKER_EXEC=prog {x}"}, 2, "unknown placeholder {x}"},
		// Everything right: the database is next.
		{[]string{"--exec", "/bin/true {input}", "--slots", "2-8", "--queue", "a", "--queue", "b", "--claim-cooldown", "100ms"}, nil, 1, "cannot reach the database"},
	} {
		env := append([]string{"PGWORKER_DATABASE_URL=" + url, "PGWORKER_WORK_DIR=" + t.TempDir()}, tt.env...)
		res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env(env...), append([]string{"run"}, tt.args...)...)
		lines := pgworkerbin.Lines(res.Stderr)
		if res.Code != tt.code || len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
			t.Errorf("run %q %v: exit %d, stderr:\n%s\nwant exit %d and one line with %q", tt.args, tt.env, res.Code, res.Stderr, tt.code, tt.want)
		}
	}
}

func TestQueueSet(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	if out := ok(t, url, "", "queue", "set", "--max-running", "4", "--fair-share", "on", "lic"); !strings.Contains(out, `queue "lic": at most 4 running rows across the fleet`) ||
		!strings.Contains(out, "its batches take turns") {
		t.Errorf("queue set:\n%s", out)
	}
	var maxRunning *int32
	var fair bool
	read := func() {
		t.Helper()
		if err := pool.QueryRow(context.Background(), "SELECT max_running, fair_share FROM files.queues WHERE queue = 'lic'").Scan(&maxRunning, &fair); err != nil {
			t.Fatal(err)
		}
	}
	read()
	if maxRunning == nil || *maxRunning != 4 || !fair {
		t.Fatalf("after queue set: max_running %v, fair_share %v", maxRunning, fair)
	}
	var st struct {
		Queues []struct {
			MaxRunning *int `json:"max_running"`
			FairShare  bool `json:"fair_share"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(ok(t, url, "", "status", "--json")), &st); err != nil || len(st.Queues) != 1 ||
		st.Queues[0].MaxRunning == nil || *st.Queues[0].MaxRunning != 4 || !st.Queues[0].FairShare {
		t.Errorf("status --json: %+v, %v", st, err)
	}
	if out := ok(t, url, "", "status"); !strings.Contains(out, "MAX RUNNING  FAIR SHARE") {
		t.Errorf("status lacks the settings' columns:\n%s", out)
	}
	ok(t, url, "", "queue", "set", "--max-running", "none", "--fair-share", "off", "lic")
	read()
	if maxRunning != nil || fair {
		t.Fatalf("after lifting: max_running %v, fair_share %v", maxRunning, fair)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "set", "lic"}, "say what to set"},
		{[]string{"queue", "set", "--max-running", "-1", "lic"}, "give a number of rows"},
		{[]string{"queue", "set", "--max-running", "lots", "lic"}, "give a number of rows"},
		{[]string{"queue", "set", "--fair-share", "maybe", "lic"}, "say on or off"},
		{[]string{"queue", "set", "--max-running", "1"}, "exactly one queue name"},
		{[]string{"queue", "unset", "lic"}, "unknown queue command"},
		{[]string{"queue"}, "say set"},
	} {
		fails(t, url, "", 2, []string{tc.want}, tc.args...)
	}
}
