package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const sample = `{"mode":"throughput","system":"pgworker","version":"devel","go_version":"go1.26.8","postgres_version":"15.18","postgres_settings":{"fsync":"off","synchronous_commit":"on","shared_buffers":"256MB"},"rows":20000,"slots":100,"max_conns":8,"elapsed_ms":2000,"rows_per_sec":10000,"claims":90,"start_ms":40}
{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":3000,"elapsed_ms":16000}
{"mode":"throughput","system":"river","rows":50000,"slots":2000,"fetch_cooldown_ms":100,"rows_per_sec":1000}
{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":2000,"elapsed_ms":25000}
{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":5000,"elapsed_ms":10000}
{"mode":"throughput","system":"river","rows":50000,"slots":2000,"fetch_cooldown_ms":100,"rows_per_sec":3000}
{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"p50_ms":1.5,"p90_ms":2,"p99_ms":3,"max_ms":4,"from_send":{"p50_ms":2}}
{"mode":"claim-depth","system":"pgworker","claims":200,"pending_percent":1,"depths":[{"rows":10000,"pending":100,"build_ms":100,"claim_batch":{"p50_ms":0.5},"claim":{"p50_ms":0.4},"claim_batch_server_ms":0.3}],"ratio_claim_batch":2.5,"ratio_claim":1.1,"ratio_depths":[10000000,10000]}
{"mode":"herd","system":"pgworker","processes":20,"slots":50,"rows":100,"claim_queries_per_row":20,"claim_queries_per_process_per_wakeup":1}
{"mode":"enqueue","system":"pgworker","rows":1000000,"batch_size":10000,"elapsed_ms":8000,"rows_per_sec":125000}
{"mode":"views","system":"pgworker","rows":10000000,"attempts":10000000,"slots":2000,"reads":20,"seed_s":300,"queries":[{"name":"files.queue_stats","p50_ms":1.2,"p99_ms":3},{"name":"files.worker_metrics","p50_ms":62,"p99_ms":80}]}
not json: a log line
{"mode":"throughput","system":"river","river_version":"v0.51.2","rows":20000,"slots":100,"fetch_cooldown_ms":100,"rows_per_sec":1000}
{"mode":"throughput","system":"river","rows":50000,"slots":2000,"fetch_cooldown_ms":100,"rows_per_sec":2000}
{"mode":"latency","system":"river","rows":500,"slots":100,"fetch_cooldown_ms":100,"p50_ms":45}
{"mode":"latency","system":"river","rows":500,"slots":100,"fetch_cooldown_ms":1,"p50_ms":3}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":3500,"elapsed_ms":14000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"api":true,"rows_per_sec":1000,"elapsed_ms":50000}
{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"p50_ms":0.6,"p90_ms":1,"p99_ms":1.5,"max_ms":4,"from_send":{"p50_ms":1},"steps":{"traced":500,"commit_to_notify":{"p50_ms":0.1,"p99_ms":0.3},"notify_to_claim":{"p50_ms":0.02,"p99_ms":0.05},"claim":{"p50_ms":0.4,"p99_ms":1.1},"claim_to_handler":{"p50_ms":0.05,"p99_ms":0.2}}}
{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"p50_ms":0.65,"p90_ms":1,"p99_ms":1.8,"max_ms":4,"from_send":{"p50_ms":1}}
{"mode":"cpu","system":"pgworker","rate":200,"rows":2000,"slots":100,"rows_per_sec":199,"server_cpu_ms_per_row":0.5,"worker_cpu_ms_per_row":0.2,"wal_bytes_per_row":900,"xacts_per_row":3,"statements":[{"query":"SELECT a | b","calls_per_row":1,"exec_ms_per_row":0.2,"plan_ms_per_row":0}]}
{"mode":"cpu","system":"pgworker","rate":200,"rows":2000,"slots":100,"claim_cooldown_ms":100,"rows_per_sec":199,"server_cpu_ms_per_row":0.7,"worker_cpu_ms_per_row":0.2,"wal_bytes_per_row":900,"xacts_per_row":2}
{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"claim_cooldown_ms":100,"p50_ms":40,"p90_ms":80,"p99_ms":99,"max_ms":100,"from_send":{"p50_ms":41},"steps":{"traced":500,"commit_to_notify":{"p50_ms":0.1,"p99_ms":0.3},"notify_to_claim":{"p50_ms":39,"p99_ms":99},"claim":{"p50_ms":0.4,"p99_ms":1.1},"claim_to_handler":{"p50_ms":0.05,"p99_ms":0.2}}}
{"mode":"cpu","system":"river","rate":200,"rows":2000,"slots":100,"rows_per_sec":199,"server_cpu_ms_per_row":0.6,"worker_cpu_ms_per_row":0.3,"wal_bytes_per_row":800,"xacts_per_row":3}
{"mode":"cpu","system":"river","rate":200,"rows":2000,"slots":100,"fetch_cooldown_ms":1,"rows_per_sec":199,"server_cpu_ms_per_row":0.1,"worker_cpu_ms_per_row":0.3,"wal_bytes_per_row":800,"xacts_per_row":3}
{"mode":"cpu","system":"pgworker","rate":0,"rows":50000,"slots":2000,"rows_per_sec":20000,"server_cpu_ms_per_row":0.4,"worker_cpu_ms_per_row":0.1,"wal_bytes_per_row":900,"xacts_per_row":0.1}
{"mode":"cpu","system":"river","rate":0,"rows":50000,"slots":2000,"rows_per_sec":10000,"server_cpu_ms_per_row":0.3,"worker_cpu_ms_per_row":0.1,"wal_bytes_per_row":800,"xacts_per_row":0.1}
{"mode":"long-tx","system":"pgworker","slots":16,"rate":0,"depth":2000,"phase_sec":60,"held_over_clean":0.8,"phases":[{"name":"clean","seconds":60,"rows_per_sec":5000,"pickup":{"p99_ms":5},"end":{}},{"name":"idle-in-tx","seconds":60,"rows_per_sec":4000,"pickup":{"p99_ms":9},"end":{}},{"name":"recovery","seconds":60,"rows_per_sec":5100,"pickup":{},"end":{}}],"samples":[{"at_sec":5}]}
{"mode":"long-tx","system":"pgworker","slots":16,"rate":1000,"depth":0,"phase_sec":90,"phases":[{"name":"clean","seconds":90,"rows_per_sec":1000,"pickup":{"p50_ms":3,"p99_ms":9},"depth_end":3,"end":{"dead_tuples":1200,"table_bytes":1048576,"claim_index_bytes":16384}},{"name":"idle-in-tx","seconds":90,"rows_per_sec":998,"pickup":{"p50_ms":4,"p99_ms":25},"depth_end":40,"end":{}},{"name":"recovery","seconds":90,"rows_per_sec":1000,"pickup":{},"end":{}}],"samples":[{"at_sec":5}]}
{"mode":"long-tx","system":"pgworker","slots":4,"processes":4,"rate":1000,"depth":0,"phase_sec":90,"phases":[{"name":"clean","seconds":90,"rows_per_sec":1000,"pickup":{"p50_ms":3,"p99_ms":8},"end":{}},{"name":"idle-in-tx","seconds":90,"rows_per_sec":1000,"pickup":{"p50_ms":3,"p99_ms":24.5},"pickup_from_return":{"p50_ms":1.5,"p99_ms":12.5},"insert":{"p50_ms":1.2,"p99_ms":6,"max_ms":40},"depth_end":2,"claim_ms":0.8,"wal_bytes_per_row":2750.4,"end":{}},{"name":"recovery","seconds":90,"rows_per_sec":1000,"pickup":{},"end":{}}],"samples":[{"at_sec":5}]}
{"mode":"soak","system":"pgworker","slots":16,"rate":500,"duration_sec":1800,"prune_every_sec":60,"summary":{"rows_per_sec":500,"pickup":{"p50_ms":3,"p99_ms":8},"depth_max":12,"end":{"dead_tuples":3000,"table_bytes":2097152,"index_bytes":1048576}},"samples":[{"at_sec":10}]}
`

func TestGoals(t *testing.T) {
	t.Parallel()
	rs := readSample(t, sample)
	if len(rs) != 30 {
		t.Fatalf("read %d results, want 30", len(rs))
	}
	rp := &report{results: rs, date: time.Now(), commands: []string{
		"pgworker bench throughput --rows 20000 --slots 100 --json",
		"pgworker bench throughput --rows 50000 --slots 2000 --json",
		"pgworker bench throughput --rows 50000 --slots 2000 --json",
	}}
	want := map[string]string{
		// Medians: pgworker 3,000 of 2,000, 3,000 and 5,000; River 2,000 of
		// 1,000, 2,000 and 3,000. The first runs alone would make 3x. And
		// 3x River is more than the bare loop's 3,500.
		"throughput at 2,000 slots": "bounded: 3x River is 6,000 rows/s, more than the bare SKIP LOCKED loop moves on this database (3,500 rows/s, median of 1 runs)",
		"throughput at 100 slots":   "met",
		// 3,000 of 3,500: 85% (the loop through the SQL API is not the bare one).
		"throughput at 2,000 slots vs bare SKIP LOCKED": "met",
		// Medians of 1.5, 0.6 and 0.65 ms; of 3, 1.5 and 1.8 ms (the run
		// with a claim cooldown is not one of them).
		"pickup p50":                         "met",
		"pickup p99":                         "met",
		"pickup p50 vs River tuned":          "met",
		"pickup p50 vs River":                "met",
		"database CPU per row at 200 rows/s": "met",
		"database CPU per row at peak":       "missed: 1.33x River's",
		// With the claim cooldown: 0.7 against River's 0.6 ms.
		"database CPU per row at 200 rows/s at River's trade, claim cooldown 100 ms": "missed: 1.17x River's",
		"claim at 10M rows vs 10k":   "missed: 2.50x, over 2x",
		"herd":                       "met",
		"enqueue":                    "met",
		"pipeline overhead":          "not measured",
		"operator reads at 10M rows": "missed: files.worker_metrics takes 62.0 ms",
		// 4,000 of 5,000 rows/s; 40 rows behind; p99 25 ms.
		"held snapshot: peak rows/s":              "met",
		"held snapshot: 1,000 rows/s at 16 slots": "met",
		"held snapshot: pickup p99":               "missed: 5.0 ms over",
		"held snapshot: pickup p99, 4 processes":  "met",
	}
	for _, g := range rp.goals() {
		if w, ok := want[g.name]; !ok || g.verdict != w {
			t.Errorf("goal %q: %q (%s), want %q", g.name, g.verdict, g.measured, w)
		}
		delete(want, g.name)
	}
	for name := range want {
		t.Errorf("goal %q missing", name)
	}

	var b bytes.Buffer
	render(&b, rp)
	out := b.String()
	for _, s := range []string{"medians of 3 and 3 runs; pgworker 2,000-5,000, River 1,000-3,000", "LISTEN/NOTIFY queue run in 3 rounds, pgworker",
		"--slots 2000 --json  # 2 runs\n", "## Machine", "| PostgreSQL | 15.18 |", "fsync off", "## Goals", "## Commands",
		"pgworker bench throughput --rows 20000", "### Throughput", "| River | 20,000 | 100 | **1,000** |",
		"### Claim at depth", "| 10,000 | 100 |",
		"### Bare SKIP LOCKED", "| bare | 50,000 | 8 | 100 | **3,500** |", "| SQL API | 50,000 | 8 | 100 | **1,000** |", "### Where a pickup's time goes", "| 1 | 500 | 0.100 / 0.300 |",
		"### Database CPU per row", "| 200 rows/s | pgworker | 1 | 199 | **0.500 ms** |", "| 200 rows/s | River tuned | 1 | 199 | **0.100 ms** |",
		"| 200 rows/s | pgworker, claim cooldown 100 ms | 1 | 199 | **0.700 ms** |", "pgworker's statements at 200 rows/s (pg_stat_statements", "| **40.00 ms** | 80.00 ms | 99.00 ms | 100.00 ms | 41.00 ms | claim cooldown 100 ms |", "| peak | River |", "`SELECT a \\| b`", "0.300 ms", "### Herd", "### Enqueue", "**125,000**",
		"### Operator reads at scale", "| files.queue_stats | **1.20 ms** | 3.00 ms |",
		"### Long transaction beside the queue", "| peak (depth 2,000) | 16 | idle-in-tx (60s) | **4,000** |", "| 1,000 rows/s | 16 | clean (90s) | **1,000** |  |  | 3.0 / 9.0 ms |  | 3 |",
		"| 1,000 rows/s | 4 processes of 4 | idle-in-tx (90s) | **1,000** | 1.5 ms | **12.5 ms** | 3.0 / 24.5 ms | 6.0 / 40.0 ms | 2 | 0.80 ms | 2,750 B |",
		"12.5 ms from the insert's answer; 24.5 ms from its created_at (the producer's inserts p99 6.0 ms, max 40.0 ms); 1,000 rows/s, 2 waiting at the end",
		"25.0 ms (from created_at)",
		"### Soak", "| 500 | 16 | 30m | 60s | 500 |", "## Raw results"} {
		if !strings.Contains(out, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	// The raw results are valid JSON lines.
	raw := out[strings.Index(out, "```json\n")+8:]
	raw = raw[:strings.Index(raw, "```")]
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		if !json.Valid([]byte(l)) {
			t.Errorf("raw line %q is not JSON", l)
		}
		if strings.Contains(l, `"samples"`) {
			t.Errorf("raw line %q keeps its samples", l)
		}
	}
}

// The pickup, the 2,000-slot burn-down beside the bare loop and the CPU at
// River's trade may alternate in more rounds than the other runs; the
// report says so.
func TestRounds(t *testing.T) {
	t.Parallel()
	pickup := `{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"p50_ms":0.7,"p99_ms":1.5}
{"mode":"latency","system":"river","rows":500,"slots":100,"fetch_cooldown_ms":1,"p50_ms":0.8}
`
	burn := `{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":3000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":3500}
`
	trade := `{"mode":"cpu","system":"pgworker","rate":200,"rows":2000,"slots":100,"claim_cooldown_ms":100,"server_cpu_ms_per_row":0.7}
{"mode":"cpu","system":"river","rate":200,"rows":2000,"slots":100,"fetch_cooldown_ms":100,"server_cpu_ms_per_row":0.6}
`
	for _, tc := range []struct {
		extra string
		want  string
	}{
		{"", "queue run in 3 rounds, pgworker"},
		{pickup + pickup, "queue run in 3 rounds (the pickup, River tuned's and the bare queue's at the pickup's rate in 5), pgworker"},
		{pickup + pickup + burn + trade + trade + trade, "queue run in 3 rounds (the pickup, River tuned's and the bare queue's " +
			"at the pickup's rate in 5; pgworker's burn-down at 2,000 slots and the bare SKIP LOCKED loop in 4; " +
			"the database's CPU per row at 200 rows/s at River's trade and River's in 4), pgworker"},
	} {
		var b bytes.Buffer
		render(&b, &report{results: readSample(t, sample+tc.extra), date: time.Now()})
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("with %d more runs, the report lacks %q", strings.Count(tc.extra, "\n"), tc.want)
		}
	}
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.6: "1,234,568", -4500: "-4,500"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%g) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{10000: "10k", 1e7: "10M", 1500: "1,500"} {
		if got := short(in); got != want {
			t.Errorf("short(%g) = %q, want %q", in, got, want)
		}
	}
}

// The goals a run shows out of reach: each bounded by a measurement of the
// same run, or missed where the bound does not account for the gap.
func TestBoundedGoals(t *testing.T) {
	t.Parallel()
	const results = `{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":25000}
{"mode":"throughput","system":"river","rows":50000,"slots":2000,"fetch_cooldown_ms":100,"rows_per_sec":10000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":27000}
{"mode":"latency","system":"pgworker","rows":500,"rate":50,"slots":100,"p50_ms":1.3,"p99_ms":3}
{"mode":"latency","system":"river","rows":500,"rate":50,"slots":100,"fetch_cooldown_ms":100,"p50_ms":45}
{"mode":"cpu","system":"pgworker","rate":200,"rows":2000,"slots":100,"server_cpu_ms_per_row":2.3}
{"mode":"cpu","system":"pgworker","rate":200,"rows":2000,"slots":100,"claim_cooldown_ms":100,"server_cpu_ms_per_row":1.2}
{"mode":"cpu","system":"river","rate":200,"rows":2000,"slots":100,"fetch_cooldown_ms":100,"server_cpu_ms_per_row":1}
{"mode":"cpu","system":"pgworker","rate":1000,"rows":10000,"slots":100,"server_cpu_ms_per_row":2}
{"mode":"cpu","system":"pgworker","rate":1000,"rows":10000,"slots":100,"claim_cooldown_ms":100,"server_cpu_ms_per_row":1.2}
{"mode":"cpu","system":"river","rate":1000,"rows":10000,"slots":100,"fetch_cooldown_ms":100,"server_cpu_ms_per_row":0.8}
{"mode":"notify","system":"pgworker","rate":50,"phases":[{"name":"queue","rows_per_sec":50,"server_cpu_ms_per_row":2,"pickup":{"p50_ms":0.9,"p99_ms":2.2},"commit_to_notify":{"p50_ms":0.05,"p99_ms":0.2},"claim":{"p50_ms":0.8,"p99_ms":1.9}},{"name":"api","rows_per_sec":50,"server_cpu_ms_per_row":2.5,"pickup":{"p50_ms":1.1,"p99_ms":2.6},"claim":{"p50_ms":1,"p99_ms":2.4}}]}
{"mode":"notify","system":"pgworker","rate":200,"phases":[{"name":"insert","rows_per_sec":200,"server_cpu_ms_per_row":0.5},{"name":"notify","rows_per_sec":200,"server_cpu_ms_per_row":0.75},{"name":"queue","rows_per_sec":200,"server_cpu_ms_per_row":1.5},{"name":"enqueue","rows_per_sec":200,"server_cpu_ms_per_row":0.9}]}
{"mode":"notify","system":"pgworker","rate":1000,"phases":[{"name":"insert","rows_per_sec":1000,"server_cpu_ms_per_row":0.4},{"name":"notify","rows_per_sec":1000,"server_cpu_ms_per_row":0.5},{"name":"queue","rows_per_sec":1000,"server_cpu_ms_per_row":0.7},{"name":"enqueue","rows_per_sec":1000,"server_cpu_ms_per_row":0.65}]}
`
	rs := readSample(t, results)
	rp := &report{results: rs, date: time.Now()}
	want := map[string]string{
		// 3x River is 30,000 rows/s, the bare loop 27,000.
		"throughput at 2,000 slots": "bounded: 3x River is 30,000 rows/s",
		// The bare queue's pickup: 0.9 ms, p99 2.2 ms.
		"pickup p50": "bounded: the bare LISTEN/NOTIFY queue's own pickup is 0.90 ms",
		"pickup p99": "bounded: the bare LISTEN/NOTIFY queue's own p99 is 2.20 ms",
		// At 200 rows/s the bare queue spends 1.5 ms, River 1 ms; at River's
		// trade, without the notification's 0.25 ms, 0.95 ms.
		"database CPU per row at 200 rows/s":                                         "bounded: a bare LISTEN/NOTIFY queue that claims each row as it comes spends 1.500 ms",
		"database CPU per row at 200 rows/s at River's trade, claim cooldown 100 ms": "bounded: the notification each insert sends costs 0.250 ms",
		// At 1,000 rows/s the bare queue spends less than River (0.7 against
		// 0.8 ms), and the notification's 0.1 ms leaves 1.1 ms at River's
		// trade: missed both.
		"database CPU per row at 1,000 rows/s": "missed: 2.50x River's",
		// What pgworker's insert costs beyond the bare one: 0.25 ms, without
		// which 0.95 ms.
		"database CPU per row at 1,000 rows/s at River's trade, claim cooldown 100 ms": "missed: 1.50x River's; pgworker's insert into files.files costs 0.250 ms per row more than the bare insert (its trigger notifies, counts the row for the operator reads and registers its queue; bench notify: 0.650 against 0.400 ms, medians of 1 runs), without which 0.950 ms",
	}
	for _, g := range rp.goals() {
		w, ok := want[g.name]
		if !ok {
			continue
		}
		if !strings.HasPrefix(g.verdict, w) {
			t.Errorf("goal %q: %q (%s), want %q...", g.name, g.verdict, g.measured, w)
		}
		// The pickup's measured figure names the two queues of bench notify.
		if g.name == "pickup p99" && !strings.HasSuffix(g.measured, "; the bare queue 2.20 ms, the SQL API with no runtime 2.60 ms") {
			t.Errorf("goal %q measured %q", g.name, g.measured)
		}
		delete(want, g.name)
	}
	for name := range want {
		t.Errorf("goal %q missing", name)
	}
	var b bytes.Buffer
	render(&b, rp)
	for _, s := range []string{"### The bare LISTEN/NOTIFY queue", "| 200 rows/s | bare insert | 1 | 200 | **0.500 ms** |",
		"| 200 rows/s | pgworker's insert into files.files, a session listening | 1 | 200 | **0.900 ms** |",
		"| 50 rows/s | bare | 1 | **0.900 / 2.200** | 0.050 / 0.200 | 0.800 / 1.900 |",
		"| 50 rows/s | SQL API | 1 | **1.100 / 2.600** | – | 1.000 / 2.400 |",
		"| 50 rows/s | the queue through the SQL API: pgworker's insert, claim, completion | 1 | 50 | **2.500 ms** |"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

// A missed share of the bare loop says where a row's CPU goes at peak, and
// what the sums predict.
func TestSkipLockedGoalSplitsTheCPU(t *testing.T) {
	t.Parallel()
	const results = `{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":15000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":27000,"server_cpu_ms_per_row":0.02,"client_cpu_ms_per_row":0.002}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"api":true,"rows_per_sec":9000,"server_cpu_ms_per_row":0.05,"client_cpu_ms_per_row":0.006}
{"mode":"cpu","system":"pgworker","rate":0,"rows":50000,"slots":2000,"server_cpu_ms_per_row":0.03,"worker_cpu_ms_per_row":0.008}
`
	rs := readSample(t, results)
	g := (&report{results: rs, date: time.Now()}).skipLockedGoal()
	for _, want := range []string{"missed: 55%, 25 points short", "the database 0.0300 ms for pgworker against 0.0200 ms for the bare loop (1.50x",
		"the worker process 0.0080 ms against the bare client's 0.0020 ms", "the sums predict 58%"} {
		if !strings.Contains(g.verdict, want) {
			t.Errorf("verdict %q lacks %q", g.verdict, want)
		}
	}
	// Without the CPU figures, the verdict is the share alone.
	rs = rs[:1:1]
	rs = append(rs, result{"mode": "skiplocked", "system": "pgworker", "rows_per_sec": 27000.0})
	if g := (&report{results: rs, date: time.Now()}).skipLockedGoal(); g.verdict != "missed: 55%, 25 points short" {
		t.Errorf("verdict without CPU figures: %q", g.verdict)
	}
}

// The bare loop with the guarantees' rows is a step of its own between the
// bare loop and the SQL API, never taken for the bare loop itself.
func TestSkipLockedGoalSteps(t *testing.T) {
	t.Parallel()
	const results = `{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":15000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":30000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"bookkeeping":true,"rows_per_sec":24000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"api":true,"rows_per_sec":12000}
`
	g := (&report{results: readSample(t, results), date: time.Now()}).skipLockedGoal()
	if !strings.Contains(g.measured, "15,000 vs 30,000 rows/s: 50%") {
		t.Errorf("measured %q: the bare loop is not the one without bookkeeping", g.measured)
	}
	for _, want := range []string{"the bare loop 30,000", "the token's hash, the counts) 24,000, 80% of it",
		"through the SQL API's functions 12,000, 40% of it"} {
		if !strings.Contains(g.verdict, want) {
			t.Errorf("verdict %q lacks %q", g.verdict, want)
		}
	}
}

// The bare loop that writes the guarantees' rows bounds both 2,000-slot
// goals when it misses them itself, and only then.
func TestBookkeepingBoundsTheThroughputGoals(t *testing.T) {
	t.Parallel()
	results := func(kept int) string {
		return fmt.Sprintf(`{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":15000}
{"mode":"throughput","system":"river","rows":50000,"slots":2000,"rows_per_sec":9000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":30000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"bookkeeping":true,"rows_per_sec":%d}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"api":true,"rows_per_sec":12000}
`, kept)
	}
	for _, c := range []struct {
		kept            int
		vsRiver, vsBare string
	}{
		// 3x River is 27,000 rows/s, 80% of the bare loop 24,000.
		{23000, "bounded: 3x River is 27,000 rows/s, more than the bare SKIP LOCKED loop moves on this database when it writes the rows the guarantees keep (23,000 rows/s",
			"bounded: the bare loop that writes the rows the guarantees keep moves 76% of the bare loop's rows/s (median of 1 runs). Step by step"},
		{25000, "bounded: 3x River is 27,000 rows/s, more than the bare SKIP LOCKED loop moves on this database when it writes",
			"missed: 50%, 30 points short. Step by step"},
		{28000, "missed: 1.66x, not 3x", "missed: 50%, 30 points short"},
	} {
		rp := &report{results: readSample(t, results(c.kept)), date: time.Now()}
		if g := rp.throughputGoal(2000, 3); !strings.HasPrefix(g.verdict, c.vsRiver) {
			t.Errorf("kept %d: vs River %q, want %q...", c.kept, g.verdict, c.vsRiver)
		}
		if g := rp.skipLockedGoal(); !strings.HasPrefix(g.verdict, c.vsBare) {
			t.Errorf("kept %d: vs bare %q, want %q...", c.kept, g.verdict, c.vsBare)
		}
	}
}

// readSample reads results as readResults reads a file of them.
func readSample(t *testing.T, results string) []result {
	t.Helper()
	path := filepath.Join(t.TempDir(), "results.jsonl")
	if err := os.WriteFile(path, []byte(results), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// Runs that pair up round by round are counted; runs that do not pair up
// (a different number of each) are not.
func TestLowerIn(t *testing.T) {
	for _, c := range []struct {
		pg, other []float64
		want      string
	}{
		{[]float64{1.0, 1.2, 0.9}, []float64{1.1, 1.1, 1.0}, "; pgworker lower in 2 of 3 rounds"},
		{[]float64{1.0, 1.0}, []float64{1.0, 0.9}, "; pgworker lower in 0 of 2 rounds"},
		{[]float64{1.0, 1.2, 0.9}, []float64{1.1, 1.1}, ""},
		{[]float64{1.0}, []float64{1.1}, ""},
	} {
		if got := lowerIn(c.pg, c.other); got != c.want {
			t.Errorf("lowerIn(%v, %v) = %q, want %q", c.pg, c.other, got, c.want)
		}
	}
}

// Burn-downs and bare loops run in turn say how many rounds reached 80% of
// their own round's bare loop; the medians alone decide the verdict.
func TestSkipLockedGoalCountsTheRounds(t *testing.T) {
	t.Parallel()
	const results = `{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":8500}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":10000}
{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":7000}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":10000}
{"mode":"throughput","system":"pgworker","rows":50000,"slots":2000,"rows_per_sec":7900}
{"mode":"skiplocked","system":"pgworker","rows":50000,"clients":8,"batch":100,"rows_per_sec":9000}
`
	g := (&report{results: readSample(t, results), date: time.Now()}).skipLockedGoal()
	if want := "7,900 vs 10,000 rows/s: 79% (medians of 3 and 3 runs; 80% of the same round's bare loop in 2 of 3 rounds)"; g.measured != want {
		t.Errorf("measured %q, want %q", g.measured, want)
	}
	if want := "missed: 79%, 1 point short"; g.verdict != want {
		t.Errorf("verdict %q, want %q", g.verdict, want)
	}
}

// Several enqueues are judged on their median, not on the best or the last.
func TestEnqueueGoalTakesTheMedian(t *testing.T) {
	t.Parallel()
	const results = `{"mode":"enqueue","system":"pgworker","rows":1000000,"batch_size":10000,"rows_per_sec":125000}
{"mode":"enqueue","system":"pgworker","rows":1000000,"batch_size":10000,"rows_per_sec":90000}
{"mode":"enqueue","system":"pgworker","rows":1000000,"batch_size":10000,"rows_per_sec":95000}
`
	g := (&report{results: readSample(t, results), date: time.Now()}).enqueueGoal()
	if want := "median 95,000 of 90,000-125,000 rows/s"; g.measured != want {
		t.Errorf("measured %q, want %q", g.measured, want)
	}
	if want := "missed: 5% short of 100,000"; g.verdict != want {
		t.Errorf("verdict %q, want %q", g.verdict, want)
	}
}

// The pipeline's overhead is bounded only when the bare queue of the same
// run misses the target too; a run from before the bare queue is judged on
// its own figure.
func TestPipelineGoalBesideTheBareQueue(t *testing.T) {
	t.Parallel()
	line := func(over, bare string, cpu, server bool) string {
		s := `{"mode":"pipeline","system":"pgworker","rows":900,"slots":8,"rounds":3,"exec":"cp","overhead_pct":` + over +
			`,"queued":{"rows_per_sec":100},"direct":{"rows_per_sec":110}`
		if bare != "" {
			s += `,"bare_overhead_pct":` + bare + `,"bare":{"rows_per_sec":104},` +
				`"round_ms":{"direct":[100,100,100],"queued":[112,109,111],"bare":[110,111,104]}`
		}
		if cpu {
			figs := `,"cpu_ms_per_row":{"direct":{"server":0.05,"process":5.45,"program":6.7,"machine":16.05,"idle":1.15},` +
				`"queued":{"server":1.52,"process":5.69,"program":6.57,"machine":17.87,"idle":1.52},` +
				`"bare":{"server":1.07,"process":5.55,"program":6.66,"machine":17.35,"idle":1.51}}`
			if !server { // a database on another machine
				figs = regexp.MustCompile(`"server":[0-9.]+,`).ReplaceAllString(figs, "")
			}
			s += figs
		}
		return s + "}\n"
	}
	for _, tc := range []struct {
		over, bare  string
		cpu, server bool
		verdict     string
	}{
		{"8.5", "6.0", false, false, "met"},
		{"13.5", "6.0", false, false, "missed: 3.5 points over 10%"},
		{"13.5", "6.0", true, true, "missed: 3.5 points over 10%; the machine's CPU a row +0.52 ms over the bare queue's, the database's +0.45 ms"},
		{"13.5", "6.0", true, false, "missed: 3.5 points over 10%; the machine's CPU a row +0.52 ms over the bare queue's"},
		{"13.5", "11.2", false, false, "bounded: the bare queue (one SKIP LOCKED claim and one completion a row, no queue software) adds 11.2% to the same pipeline in the same run"},
		{"13.5", "", false, false, "missed: 3.5 points over 10%"},
	} {
		rp := &report{results: readSample(t, line(tc.over, tc.bare, tc.cpu, tc.server)), date: time.Now()}
		g := rp.pipelineGoal()
		if g.verdict != tc.verdict {
			t.Errorf("overhead %s, bare %q: verdict %q, want %q", tc.over, tc.bare, g.verdict, tc.verdict)
		}
		if tc.bare == "" {
			continue
		}
		if want := "; pgworker lower in 1 of 3 rounds"; !strings.Contains(g.measured, want) {
			t.Errorf("measured %q lacks %q", g.measured, want)
		}
		var b bytes.Buffer
		render(&b, rp)
		if want := "Each round's overheads (queued / bare): 12.0% / 10.0%, 9.0% / 11.0%, 11.0% / 4.0%."; !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
		cpuRow := "| 900 | queued | 1.520 | 5.690 | 6.570 | 17.870 | 1.520 |"
		if !tc.server {
			cpuRow = "| 900 | queued | — | 5.690 | 6.570 | 17.870 | 1.520 |"
		}
		if got := strings.Contains(b.String(), cpuRow); got != tc.cpu {
			t.Errorf("with the ways' CPU %v, the report has %q: %v\n%s", tc.cpu, cpuRow, got, b.String())
		}
	}
}
