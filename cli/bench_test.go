package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchHelp(t *testing.T) {
	t.Parallel()
	out := ok(t, "", "", "bench", "--help")
	for _, want := range []string{"Usage: pgworker bench MODE", "claim-depth", "pipeline", "--force", "Examples:\n  pgworker bench"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --help lacks %q:\n%s", want, out)
		}
	}
	if out := ok(t, "", "", "help", "bench"); !strings.Contains(out, "Usage: pgworker bench MODE") {
		t.Errorf("pgworker help bench:\n%s", out)
	}
	if out := ok(t, "", "", "--help"); !strings.Contains(out, "\n  bench ") {
		t.Errorf("pgworker --help does not list bench:\n%s", out)
	}
	for mode, flags := range map[string][]string{
		"throughput":  {"--rows N", "--slots N", "--json", "--force"},
		"latency":     {"--rows N", "--rate", "--slots N"},
		"claim-depth": {"--depths N", "--claims N"},
		"herd":        {"--processes N", "--slots N", "--interval"},
		"notify":      {"--rate", "--duration", "queue", "enqueue"},
		"enqueue":     {"--rows N", "--chunk-size N"},
		"pipeline":    {"--input-store URL", "[$PGWORKER_INPUT_STORE]", "--output-store URL", "--exec COMMAND", "--size BYTES"},
		"long-tx":     {"--rate", "--depth N", "--slots N", "--processes N", "--phase", "--sample-every"},
		"soak":        {"--duration", "--rate", "--slots N", "--prune-every", "--keep"},
	} {
		out := ok(t, "", "", "bench", mode, "--help")
		for _, want := range append(flags, "Usage: pgworker bench "+mode, "--database-url URL", "Examples:\n  pgworker bench "+mode) {
			if !strings.Contains(out, want) {
				t.Errorf("bench %s --help lacks %q:\n%s", mode, want, out)
			}
		}
	}
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "name a mode: throughput, latency"},
		{[]string{"bench", "speed"}, `unknown bench mode "speed"`},
		{[]string{"bench", "throughput", "--rows", "0"}, "--rows must be between 1 and"},
		{[]string{"bench", "throughput", "extra"}, `unexpected argument "extra"`},
		{[]string{"bench", "latency", "--rate", "0"}, "--rate must be above 0"},
		{[]string{"bench", "claim-depth", "--depths", "10k,lots"}, `--depths "10k,lots"`},
		{[]string{"bench", "herd", "--processes", "-1"}, "--processes must be between 1"},
		{[]string{"bench", "pipeline"}, "needs --input-store and --output-store"},
		{[]string{"bench", "pipeline", "--input-store", "ftp://x", "--output-store", "s3://b"}, `--input-store "ftp://x"`},
		{[]string{"bench", "enqueue"}, "missing database URL"},
		{[]string{"bench", "long-tx", "--rate", "0"}, "--rate must be above 0"},
		{[]string{"bench", "long-tx", "--processes", "0"}, "--processes must be between 1"},
		{[]string{"bench", "notify", "--rate", "-5"}, "--rate must be above 0"},
		{[]string{"bench", "notify", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"bench", "long-tx", "--phase", "10ms"}, "--phase must be at least 1s"},
		{[]string{"bench", "soak", "--duration", "2h"}, "--timeout 1h0m0s is shorter than the run needs"},
		{[]string{"bench", "soak", "--prune-every", "-1s"}, "--prune-every and --keep must not be negative"},
	} {
		fails(t, "", "", 2, []string{tc.want}, tc.args...)
	}
}

// TestBenchJSON runs two modes through the binary: throughput, and enqueue,
// whose code path is the enqueue command's own.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"throughput", "--rows", "30", "--slots", "3"}, []string{"rows_per_sec", "elapsed_ms", "claims"}},
		{[]string{"enqueue", "--rows", "2500", "--chunk-size", "1000"}, []string{"rows_per_sec", "elapsed_ms", "batch_size"}},
	} {
		args := append([]string{"bench"}, tc.args...)
		res := pgworker(t, url, "", append(args, "--json", "--log-level", "warn")...)
		if res.Code != 0 || res.Stderr != "" {
			t.Fatalf("pgworker %s: exit %d\n%s%s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
		}
		if strings.Count(res.Stdout, "\n") != 1 {
			t.Errorf("%s: want one line of JSON:\n%s", tc.args[0], res.Stdout)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(res.Stdout), &m); err != nil {
			t.Fatalf("%s: %v\n%s", tc.args[0], err, res.Stdout)
		}
		if m["mode"] != tc.args[0] || m["system"] != "pgworker" || !strings.HasPrefix(m["go_version"].(string), "go") {
			t.Errorf("%s: setup: %s", tc.args[0], res.Stdout)
		}
		for _, k := range tc.keys {
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%s: %s = %v", tc.args[0], k, m[k])
			}
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 0 {
		t.Errorf("%d rows left behind", n)
	}

	// Without --json: one line of text.
	out := ok(t, url, "", "bench", "enqueue", "--rows", "100", "--log-level", "warn")
	if !strings.HasPrefix(out, "enqueue: 100 rows in ") || !strings.Contains(out, "rows/s") {
		t.Errorf("bench enqueue: %q", out)
	}
}

func TestBenchRefusesDatabaseInUse(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	exec(t, pool, "INSERT INTO files.files (source) VALUES ('keep-me')")
	fails(t, url, "", 1, []string{"the database is in use", "rows of other queues", "--force"},
		"bench", "enqueue", "--rows", "10", "--log-level", "warn")
	out := ok(t, url, "", "bench", "enqueue", "--rows", "10", "--force", "--log-level", "error")
	if !strings.HasPrefix(out, "enqueue: 10 rows") {
		t.Errorf("bench enqueue --force: %q", out)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE source = 'keep-me'"); n != 1 {
		t.Errorf("the user's row: %d left, want 1", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 1 {
		t.Errorf("%d rows in the table, want the user's one", n)
	}
}
