package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/queue"
)

// pgworker scale-hint prints files.scaling_hint: the table and the JSON agree
// with the arithmetic, and the flags override files.scaling_settings.
func TestScaleHint(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	// Two nodes of four slots; 100 rows outstanding; attempts of 2 seconds.
	exec(t, pool, "SELECT files.register_worker('n' || p || ':' || p || ':' || g, 'n' || p, p, g, key => 'cli-test-key-0123456') FROM generate_series(1, 2) p, generate_series(0, 3) g")
	exec(t, pool, "INSERT INTO files.files (source) SELECT 'r' || g FROM generate_series(1, 120) g")
	exec(t, pool, "SELECT files.complete(c.id, c.worker_id, c.attempt, c.claim_token, '{}') FROM files.claim('n1:1:0', NULL, 20, 'cli-test-key-0123456') c")
	exec(t, pool, "UPDATE files.attempts SET started_at = finished_at - interval '2 seconds'")
	exec(t, pool, "SELECT files.pause_queue('later')")
	exec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('later', 'x')")

	// Settings: 15 minutes, 0 to 20 nodes. 200 s of work: 1 node.
	out := ok(t, url, "", "scale-hint")
	for _, want := range []string{
		"QUEUE", "NEEDED", "DESIRED", "BACKLOG/INSTANCE",
		"later (paused)", "all queues",
		"Desired nodes: 1 (target drain 15m, between 0 and 20 nodes).",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scale-hint lacks %q:\n%s", want, out)
		}
	}

	if f := lineFields(out, "default"); len(f) < 9 || f[1] != "100" || f[5] != "2" || f[6] != "4" || f[7] != "1" || f[8] != "1" {
		t.Errorf("the default queue's line: %q\n%s", f, out)
	}

	// 200 s in 10 s: 20 slots, 5 nodes of 4, capped at 3.
	var h queue.ScaleHint
	out = ok(t, url, "", "scale-hint", "--json", "--target-drain", "10s", "--max", "3")
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f := h.Fleet
	if h.TargetDrainSeconds != 10 || h.MinNodes != 0 || h.MaxNodes != 3 || f.Queue != nil || f.Pending != 100 || f.Running != 0 ||
		f.RecentAttempts != 20 || f.MeanAttemptSeconds == nil || *f.MeanAttemptSeconds != 2 || f.Nodes != 2 || f.Slots != 8 ||
		f.SlotsPerNode != 4 || f.NeededNodes != 5 || f.DesiredNodes != 3 || f.BacklogPerInstance != 50 ||
		f.TargetBacklogPerInstance == nil || *f.TargetBacklogPerInstance != 20 {
		t.Errorf("fleet: %+v\n%s", f, out)
	}
	if len(h.Queues) != 2 || *h.Queues[0].Queue != "default" || *h.Queues[1].Queue != "later" || !*h.Queues[1].Paused ||
		h.Queues[1].Pending != 1 || h.Queues[1].NeededNodes != 0 {
		t.Errorf("queues: %s", out)
	}
	for _, field := range []string{`"backlog_per_instance": 50`, `"desired_nodes": 3`, `"oldest_pending_seconds": `} {
		if !strings.Contains(out, field) {
			t.Errorf("JSON lacks %s:\n%s", field, out)
		}
	}

	// The settings table is what everyone sees; --min lifts the answer.
	exec(t, pool, "UPDATE files.scaling_settings SET target_drain = '20 seconds', max_nodes = 10")
	out = ok(t, url, "", "scale-hint", "--json")
	h = queue.ScaleHint{}
	if err := json.Unmarshal([]byte(out), &h); err != nil || h.TargetDrainSeconds != 20 || h.MaxNodes != 10 || h.Fleet.DesiredNodes != 3 {
		t.Errorf("with the settings: %v %+v", err, h)
	}
	if out = ok(t, url, "", "scale-hint", "--min", "4"); !strings.Contains(out, "Desired nodes: 4 (target drain 20s, between 4 and 10 nodes).") {
		t.Errorf("--min 4:\n%s", out)
	}

	fails(t, url, "", 2, []string{"--target-drain must be positive"}, "scale-hint", "--target-drain", "0s")
	fails(t, url, "", 2, []string{"--max (1) must not be below --min (2)"}, "scale-hint", "--min", "2", "--max", "1")
	fails(t, url, "", 2, []string{"--min must not be negative"}, "scale-hint", "--min", "-1")
	if out := ok(t, "", "", "scale-hint", "--help"); !strings.Contains(out, "Usage: pgworker scale-hint") || !strings.Contains(out, "backlog_per_instance") {
		t.Errorf("--help:\n%s", out)
	}
	if out := ok(t, "", "", "--help"); !strings.Contains(out, "\n  scale-hint ") {
		t.Errorf("pgworker --help does not list scale-hint:\n%s", out)
	}
}

// Before any work the hint is all zeros and unknowns, and says so.
func TestScaleHintEmpty(t *testing.T) {
	t.Parallel()
	url, _ := newDB(t)
	var h queue.ScaleHint
	out := ok(t, url, "", "scale-hint", "--json")
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Queues) != 0 || h.Fleet.DesiredNodes != 0 || h.Fleet.MeanAttemptSeconds != nil || h.Fleet.TargetBacklogPerInstance != nil ||
		!strings.Contains(out, `"mean_attempt_seconds": null`) {
		t.Errorf("empty database: %s", out)
	}
	if out := ok(t, url, "", "scale-hint"); !strings.Contains(out, "all queues") || !strings.Contains(out, "Desired nodes: 0") {
		t.Errorf("empty database:\n%s", out)
	}
}

// lineFields returns the fields of the first line of out that starts with prefix.
func lineFields(out, prefix string) []string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix+" ") {
			return strings.Fields(l)
		}
	}
	return nil
}
