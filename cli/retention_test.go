package cli_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// pgworker prune deletes what the retention lets go, says what, and never a
// row that is open or a row of a batch that is; pgworker retention shows and
// sets the settings.
func TestPruneAndRetentionCommands(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	ok(t, url, "old-1\nold-2\nnew\n", "enqueue", "--queue", "thumbs")
	ok(t, url, "open\n", "enqueue", "--queue", "thumbs", "--no-key", "--max-attempts", "1")
	ok(t, url, "b-1\nb-2\n", "enqueue", "--queue", "thumbs", "--batch", "nightly")
	exec(t, pool, `UPDATE files.files SET state = 'done', finished_at = now() - interval '8 days' WHERE source IN ('old-1', 'old-2')`)
	exec(t, pool, `UPDATE files.files SET state = 'done', finished_at = now() WHERE source = 'new'`)
	exec(t, pool, "SELECT files.cancel(id) FROM files.files WHERE batch = 'nightly' AND source = 'b-1'")
	exec(t, pool, "SELECT files.recount()") // the rows were changed behind the SQL API's back

	if out := ok(t, url, "", "prune", "--dry-run"); !strings.Contains(out, "would delete 2 finished rows and 0 worker slots") ||
		!strings.Contains(out, "thumbs") {
		t.Errorf("dry run:\n%s", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 6 {
		t.Fatalf("the dry run deleted rows: %d left", n)
	}
	if out := ok(t, url, "", "prune", "--max-rows", "1"); !strings.Contains(out, "deleted 2 finished rows") {
		t.Errorf("prune:\n%s", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE source IN ('new', 'open', 'b-1', 'b-2')"); n != 4 {
		t.Fatalf("prune deleted a row it must keep: %d of 4 left", n)
	}

	// An open batch: prune --batch says it goes when it finishes.
	if out := ok(t, url, "", "prune", "--batch", "nightly"); !strings.Contains(out, `batch "nightly" has not finished: it and its 2 rows will be deleted`) {
		t.Errorf("prune --batch of an open batch: %q", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE batch = 'nightly'"); n != 2 {
		t.Fatalf("%d rows of the open batch left, want 2", n)
	}
	exec(t, pool, "SELECT files.cancel(id) FROM files.files WHERE batch = 'nightly' AND state = 'pending'")
	if out := ok(t, url, "", "prune", "--json"); !strings.Contains(out, `"batch": "nightly"`) {
		t.Errorf("prune after the batch finished: %s", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.batches WHERE batch = 'nightly'"); n != 0 {
		t.Error("the batch is still there")
	}

	ok(t, url, "", "retention", "--queue", "thumbs", "--done", "2d")
	ok(t, url, "", "retention", "--queue", "audit", "--failed", "forever")
	ok(t, url, "x\n", "enqueue", "--batch", "keep-me")
	ok(t, url, "", "retention", "--batch", "keep-me", "--keep", "1d12h")
	out := ok(t, url, "", "retention", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("retention --json: %v\n%s", err, out)
	}
	want := map[string]string{"thumbs": "172800 2592000", "audit": "604800 <nil>", "keep-me": "129600"}
	for _, r := range list {
		name, got := str(r["queue"]), str(r["keep_done_seconds"])+" "+str(r["keep_failed_seconds"])
		if _, ok := r["batch"]; ok {
			name, got = str(r["batch"]), str(r["keep_seconds"])
		}
		if w, ok := want[name]; ok && got != w {
			t.Errorf("%s: retention %s, want %s", name, got, w)
		}
		delete(want, name)
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v\n%s", want, out)
	}
	if out := ok(t, url, "", "retention"); !strings.Contains(out, "thumbs") || !strings.Contains(out, "2d") || !strings.Contains(out, "36h") {
		t.Errorf("retention:\n%s", out)
	}

	fails(t, url, "", 2, []string{"--done", "--queue"}, "retention", "--done", "1d")
	fails(t, url, "", 2, []string{"--batch", "--dry-run"}, "prune", "--batch", "x", "--dry-run")
	fails(t, url, "", 2, []string{"duration"}, "retention", "--queue", "q", "--done", "soon")
	fails(t, url, "", 1, []string{"no batch"}, "retention", "--batch", "none", "--keep", "1d")
}

func str(v any) string {
	switch v := v.(type) {
	case nil:
		return "<nil>"
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		return v
	}
	return "?"
}
