package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	oexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// Enqueueing the same sources again queues only the new ones, and says so.
func TestEnqueueAgainQueuesOnce(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	if out := ok(t, url, "a\nb\nc\nb\n", "enqueue", "--batch", "set-1", "--labels", `{"owner": "ops"}`); out != "queued 3, already there 1 (queue \"default\", batch \"set-1\")\n" {
		t.Errorf("first enqueue: %q", out)
	}
	if out := ok(t, url, "a\nb\nc\nd\n", "enqueue", "--batch", "set-1", "--chunk-size", "2"); out != "queued 1, already there 3 (queue \"default\", batch \"set-1\")\n" {
		t.Errorf("second enqueue: %q", out)
	}
	// A done row's key is there too: it is not queued again.
	exec(t, pool, "DELETE FROM files.files WHERE source = 'c'")
	if out := ok(t, url, "", "enqueue", "--batch", "set-1", "c", "a"); out != "queued 1, already there 1 (queue \"default\", batch \"set-1\")\n" {
		t.Errorf("after deleting c: %q", out)
	}
	if out := ok(t, url, "", "enqueue", "--no-key", "a"); out != "queued 1 row (queue \"default\")\n" {
		t.Errorf("--no-key: %q", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE source = 'a'"); n != 2 {
		t.Errorf("%d rows of a, want 2 (one keyed, one not)", n)
	}
	if n := count(t, pool, `SELECT total FROM files.batch_progress WHERE batch = 'set-1' AND labels = '{"owner": "ops"}'`); n != 4 {
		t.Errorf("batch set-1 has %d rows, want 4", n)
	}
	fails(t, url, "", 2, []string{"--batch", "control"}, "enqueue", "--batch", "bad\x1b[2Jname", "x")
	fails(t, url, "", 2, []string{"--labels", "--batch"}, "enqueue", "--labels", `{}`, "x")
}

// startWait runs pgworker wait in the background and returns what it will
// answer; it returns once the command listens.
func startWait(t *testing.T, url string, pool *pgxpool.Pool, args ...string) <-chan waitResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := oexec.CommandContext(ctx, bin, append([]string{"wait"}, args...)...)
	cmd.Env = append(os.Environ(), "PGWORKER_DATABASE_URL="+url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan waitResult, 1)
	go func() {
		cmd.Wait() //nolint:errcheck // the exit code says it
		done <- waitResult{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
	}()
	testhelp.WaitEvery(t, time.Minute, 20*time.Millisecond, "pgworker wait to LISTEN", func() bool {
		return count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN files_batch'") > 0
	})
	return done
}

type waitResult struct {
	code           int
	stdout, stderr string
}

func claimAll(t *testing.T, pool *pgxpool.Pool, batch string) (ids []int64, tokens []string) {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT id, claim_token FROM files.claim('w-'||$1, ARRAY[$1], 100, 'test-key-0123456789') ORDER BY id", batch)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var token string
		if err := rows.Scan(&id, &token); err != nil {
			t.Fatal(err)
		}
		ids, tokens = append(ids, id), append(tokens, token)
	}
	return ids, tokens
}

// pgworker wait wakes on the batch's end (--interval is an hour, so nothing
// but the notification ends its wait) and exits 0 when every row is done,
// 3 when some failed, 4 on --timeout, 1 for an unknown batch.
func TestWaitExitStatus(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	exec(t, pool, "INSERT INTO files.files (queue, source, batch) VALUES ('good', 'a', 'good'), ('good', 'b', 'good')")
	exec(t, pool, "INSERT INTO files.files (queue, source, batch) VALUES ('bad', 'c', 'bad'), ('bad', 'd', 'bad')")

	res := pgworker(t, url, "", "wait", "--batch", "good", "--timeout", "300ms")
	if res.Code != 4 || !strings.Contains(res.Stderr, "did not end within 300ms") {
		t.Errorf("--timeout: exit %d, %s", res.Code, res.Stderr)
	}
	fails(t, url, "", 1, []string{"no such batch"}, "wait", "--batch", "nope")
	fails(t, url, "", 2, []string{"--batch is missing"}, "wait")

	done := startWait(t, url, pool, "--batch", "good", "--interval", "1h")
	ids, tokens := claimAll(t, pool, "good")
	for i := range ids[:2] {
		exec(t, pool, "SELECT files.complete($1, 'w-good', 1, $2)", ids[i], tokens[i])
	}
	r := <-done
	if r.code != 0 || !strings.Contains(r.stdout, "batch good ended: 2 done, 0 failed, 0 cancelled of 2") {
		t.Errorf("good: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	done = startWait(t, url, pool, "--batch", "bad", "--interval", "1h")
	ids, tokens = claimAll(t, pool, "bad")
	exec(t, pool, "SELECT files.complete($1, 'w-bad', 1, $2)", ids[0], tokens[0])
	exec(t, pool, "SELECT files.fail($1, 'w-bad', 1, $2, 'broken', false)", ids[1], tokens[1])
	r = <-done
	if r.code != 3 || !strings.Contains(r.stderr, "1 failed") {
		t.Errorf("bad: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// pgworker results lists a batch's rows with their outputs, as JSON lines
// or CSV, and --download fetches the outputs, checked against the manifest.
func TestResults(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	store := t.TempDir()
	content := map[string]string{"1/1-aa/x.txt": "x output", "1/1-aa/sub/y.txt": "y output", "2/1-bb/z.txt": "z output"}
	for k, v := range content {
		p := filepath.Join(store, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifest := func(keys ...string) string {
		var outs []map[string]any
		for _, k := range keys {
			sum := sha256.Sum256([]byte(content[k]))
			outs = append(outs, map[string]any{"key": k, "size": len(content[k]), "sha256": hex.EncodeToString(sum[:])})
		}
		b, _ := json.Marshal(map[string]any{"outputs": outs})
		return string(b)
	}
	exec(t, pool, "INSERT INTO files.files (queue, source, batch) VALUES ('r', 'in/1', 'r'), ('r', 'in/2', 'r'), ('r', 'in/3', 'r'), ('q', 'other', 'q')")
	ids, tokens := claimAll(t, pool, "r")
	exec(t, pool, "SELECT files.complete($1, 'w-r', 1, $2, $3)", ids[0], tokens[0], manifest("1/1-aa/x.txt", "1/1-aa/sub/y.txt"))
	exec(t, pool, "SELECT files.complete($1, 'w-r', 1, $2, $3)", ids[1], tokens[1], manifest("2/1-bb/z.txt"))
	exec(t, pool, "SELECT files.fail($1, 'w-r', 1, $2, 'bad <input>', false)", ids[2], tokens[2])

	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(ok(t, url, "", "results", "--batch", "r")))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want the 3 rows of batch r", len(lines))
	}
	if lines[0]["source"] != "in/1" || len(lines[0]["outputs"].([]any)) != 2 || lines[2]["state"] != "failed" || lines[2]["last_error"] != "bad <input>" {
		t.Errorf("lines: %v", lines)
	}
	if out := ok(t, url, "", "results", "--batch", "r", "--queue", "q"); out != "" {
		t.Errorf("rows of batch r in queue q: %q, want none", out)
	}
	if n := strings.Count(ok(t, url, "", "results", "--batch", "r", "--queue", "q", "--queue", "r"), "\n"); n != 3 {
		t.Errorf("rows of batch r in queues q and r: %d lines, want 3", n)
	}
	csvOut := ok(t, url, "", "results", "--batch", "r", "--format", "csv", "--state", "failed")
	if want := "id,queue,source,state,attempts,outputs,last_error\n"; !strings.HasPrefix(csvOut, want) || strings.Count(csvOut, "\n") != 2 || !strings.Contains(csvOut, ",failed,1,[],bad <input>") {
		t.Errorf("csv:\n%s", csvOut)
	}

	dir := filepath.Join(t.TempDir(), "out")
	res := pgworker(t, url, "", "results", "--batch", "r", "--download", dir, "--output-store", "file://"+store)
	if res.Code != 0 || !strings.Contains(res.Stderr, "downloaded 3 files (24 bytes)") {
		t.Fatalf("--download: exit %d %s", res.Code, res.Stderr)
	}
	for k, v := range content {
		if b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(k))); err != nil || string(b) != v {
			t.Errorf("%s: %q %v", k, b, err)
		}
	}
	// An object that no longer matches its manifest is refused.
	if err := os.WriteFile(filepath.Join(store, "2", "1-bb", "z.txt"), []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	fails(t, url, "", 1, []string{"does not match its manifest"}, "results", "--batch", "r", "--download", t.TempDir(), "--output-store", "file://"+store)
	fails(t, url, "", 2, []string{"--output-store"}, "results", "--batch", "r", "--download", t.TempDir())
	// A manifest naming a key that leads out of the directory is refused
	// before anything is written.
	exec(t, pool, `UPDATE files.files SET result = '{"outputs": [{"key": "../../escape.txt", "size": 8}]}' WHERE id = $1`, ids[1])
	out := t.TempDir()
	fails(t, url, "", 1, []string{"escape.txt"}, "results", "--batch", "r", "--download", filepath.Join(out, "d"), "--output-store", "file://"+store)
	if entries, _ := os.ReadDir(out); len(entries) != 1 {
		t.Errorf("%d entries next to the download directory, want only it", len(entries))
	}
	fails(t, url, "", 1, []string{"no such batch"}, "results", "--batch", "nope")
	fails(t, url, "", 2, []string{"--format"}, "results", "--batch", "r", "--format", "xml")
}

// pgworker status shows each open batch with a bar.
func TestStatusShowsBatches(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	exec(t, pool, "INSERT INTO files.files (queue, source, batch) SELECT 'nightly', 's' || i, 'nightly' FROM generate_series(1, 4) i")
	ids, tokens := claimAll(t, pool, "nightly")
	exec(t, pool, "SELECT files.complete($1, 'w-nightly', 1, $2)", ids[0], tokens[0])
	out := ok(t, url, "", "status")
	if !strings.Contains(out, "BATCH") || !strings.Contains(out, "nightly  [#####...............]  25.0%") {
		t.Errorf("status:\n%s", out)
	}
	var st struct {
		Batches []struct {
			Batch         string
			Total, Done   int
			Running       int
			Percent, Rate float64
		}
	}
	if err := json.Unmarshal([]byte(ok(t, url, "", "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Batches) != 1 || st.Batches[0].Total != 4 || st.Batches[0].Done != 1 || st.Batches[0].Running != 3 {
		t.Errorf("status --json batches: %+v", st.Batches)
	}
}

func TestRunThenFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--then", "next"}, "--then needs --queue"},
		{[]string{"--queue", "a", "--queue", "b", "--then", "b"}, "its outputs would come back"},
		{[]string{"--queue", "a", "--then", strings.Repeat("x", 129)}, "--then must have"},
	} {
		fails(t, "postgres://nowhere.invalid/x", "", 2, []string{tt.want}, append([]string{"run", "--exec", "true"}, tt.args...)...)
	}
}
