// Command benchreport renders BENCHMARKS.md from the JSON lines that
// `pgworker bench --json` and the River peer benchmark print, with the
// machine they ran on, the commands, the figures and the goals:
//
//	go run ./bench/cmd/benchreport -commands commands.txt -o BENCHMARKS.md pgworker.jsonl river.jsonl
//
// make bench runs it (bench/run.sh). Each input line is one result
// object with "system" (pgworker or river) and "mode"; other lines are
// skipped with a warning.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgworker/pgworker/internal/human"
)

func main() {
	commands := flag.String("commands", "", "`file` of the command lines that produced the results, one per line")
	out := flag.String("o", "", "write the report to `file` (default standard output)")
	appendix := flag.String("append", "", "append the Markdown `file` (measurements made by other means) to the report")
	soakChart := flag.String("soak-chart", "", "the soak's chart, a PNG `path` relative to the report, to show in it")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchreport [-commands FILE] [-o FILE] RESULTS.jsonl...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var rs []result
	for _, name := range flag.Args() {
		got, err := readResults(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		rs = append(rs, got...)
	}
	var cmds []string
	if *commands != "" {
		b, err := os.ReadFile(*commands)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(l) != "" {
				cmds = append(cmds, l)
			}
		}
	}
	var buf bytes.Buffer
	render(&buf, &report{results: rs, commands: cmds, machine: thisMachine(), date: time.Now().UTC(), soakChart: *soakChart})
	if *appendix != "" {
		b, err := os.ReadFile(*appendix)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		buf.WriteString("\n")
		buf.Write(b)
	}
	if *out == "" {
		_, _ = os.Stdout.Write(buf.Bytes())
		return
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// result is one JSON object, kept whole; get reads fields by path.
type result map[string]any

func (r result) str(key string) string {
	s, _ := r[key].(string)
	return s
}

// get reads a value by a dotted path ("queued.rows_per_sec"); nil when
// there is none.
func (r result) get(path string) any {
	var v any = map[string]any(r)
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// num reads a number by a dotted path.
func (r result) num(path string) (float64, bool) {
	f, ok := r.get(path).(float64)
	return f, ok
}

func (r result) n(path string) float64 {
	f, _ := r.num(path)
	return f
}

// floats reads an array of numbers by a dotted path; nil when there is none.
func (r result) floats(path string) []float64 {
	a, _ := r.get(path).([]any)
	var out []float64
	for _, x := range a {
		if f, ok := x.(float64); ok {
			out = append(out, f)
		}
	}
	return out
}

func readResults(name string) ([]result, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "benchreport: %s does not exist; its results are left out\n", name)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(text, "{") {
			continue
		}
		var r result
		if err := json.Unmarshal([]byte(text), &r); err != nil || r.str("system") == "" || r.str("mode") == "" {
			fmt.Fprintf(os.Stderr, "benchreport: %s:%d: not a benchmark result, skipped\n", name, line)
			continue
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// machine is what the report says about where it ran.
type machine struct {
	CPUs     int
	CPUModel string
	MemTotal string
	Kernel   string
	OS, Arch string
	Load     string // load averages when the report was written: the run's last 1, 5 and 15 minutes
}

func thisMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					m.MemTotal = fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.Load = strings.Join(f[:3], ", ")
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

type report struct {
	results   []result
	commands  []string
	machine   machine
	date      time.Time
	soakChart string
}

// find returns the first result of system and mode for which match holds.
func (rp *report) find(system, mode string, match func(result) bool) result {
	for _, r := range rp.results {
		if r.str("system") == system && r.str("mode") == mode && (match == nil || match(r)) {
			return r
		}
	}
	return nil
}

func (rp *report) all(system, mode string) []result {
	var out []result
	for _, r := range rp.results {
		if r.str("system") == system && r.str("mode") == mode {
			out = append(out, r)
		}
	}
	return out
}

// kind tells apart the settings a system ran with: pgworker answers each
// notification at once (plain) or holds claims back for a claim cooldown
// (cooled); River runs with its default fetch cooldown of 100 ms (plain) or
// a shorter one (tuned).
type kind int

const (
	plain kind = iota
	tuned
	cooled
)

func kindOf(r result) kind {
	switch {
	case r.str("system") == "river":
		if _, has := r["fetch_cooldown_ms"]; has && r.n("fetch_cooldown_ms") < 100 {
			return tuned
		}
	case r.n("claim_cooldown_ms") > 0:
		return cooled
	}
	return plain
}

// runs returns the results of system and mode at slotCount that ran with
// settings k, in run order.
func (rp *report) runs(system, mode string, slotCount float64, k kind) []result {
	var out []result
	for _, r := range rp.all(system, mode) {
		if r.n("slots") == slotCount && kindOf(r) == k {
			out = append(out, r)
		}
	}
	return out
}

// throughputs returns the rows/s of system's burn-downs at slotCount (see
// runs) of rows with the empty payload, in run order.
func (rp *report) throughputs(system string, slotCount float64) []float64 {
	var out []float64
	for _, r := range rp.runs(system, "throughput", slotCount, plain) {
		if r.n("payload_bytes") == 0 {
			out = append(out, r.n("rows_per_sec"))
		}
	}
	return out
}

// median of xs (the mean of the middle two for an even count); xs is not
// empty.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// span writes the lowest and highest of xs: "24,100-26,000".
func span(xs []float64) string {
	return thousands(slices.Min(xs)) + "-" + thousands(slices.Max(xs))
}

// spread describes several runs' figures: "24,100" for one run, else
// "median 25,000 of 24,100-26,000".
func spread(xs []float64) string {
	if len(xs) == 1 {
		return thousands(xs[0])
	}
	return fmt.Sprintf("median %s of %s", thousands(median(xs)), span(xs))
}

// inRounds counts the rounds in which ok holds of pgworker's figure and the
// other side's, when their runs pair up round by round (run.sh runs them in
// turn, in the same order); paired is false when they do not. A goal whose
// medians differ by less than the runs' spread can fall either way from one
// report to the next; the count shows how often it does within one.
func inRounds(pg, other []float64, ok func(pg, other float64) bool) (n int, paired bool) {
	if len(pg) != len(other) || len(pg) < 2 {
		return 0, false
	}
	for i := range pg {
		if ok(pg[i], other[i]) {
			n++
		}
	}
	return n, true
}

// lowerIn says in how many rounds pgworker's figure was the lower: "; pgworker
// lower in 5 of 7 rounds", or nothing when the runs do not pair up.
func lowerIn(pg, other []float64) string {
	n, paired := inRounds(pg, other, func(a, b float64) bool { return a < b })
	if !paired {
		return ""
	}
	return fmt.Sprintf("; pgworker lower in %d of %d rounds", n, len(pg))
}

// goal is one line of the goals table.
type goal struct {
	name, target, measured, verdict string
}

// goals compares the results with the project's goals, one line each.
func (rp *report) goals() []goal {
	var gs []goal
	for _, g := range []struct {
		slots float64
		times float64
	}{{2000, 3}, {100, 10}} {
		gs = append(gs, rp.throughputGoal(g.slots, g.times))
	}
	gs = append(gs, rp.skipLockedGoal())
	gs = append(gs, rp.latencyGoals()...)
	gs = append(gs, rp.cpuGoals()...)
	gs = append(gs, rp.claimDepthGoal(), rp.herdGoal(), rp.enqueueGoal(), rp.pipelineGoal(), rp.viewsGoal())
	return append(gs, rp.longTxGoals()...)
}

// viewQueries reads the queries of a views run.
func viewQueries(r result) []result {
	qs, _ := r["queries"].([]any)
	var out []result
	for _, q := range qs {
		if m, ok := q.(map[string]any); ok {
			out = append(out, result(m))
		}
	}
	return out
}

// viewsGoal: every operator read under 50 ms (p50) on the views run's
// table.
func (rp *report) viewsGoal() goal {
	const target = "< 50 ms each"
	v := rp.find("pgworker", "views", nil)
	if v == nil {
		return notMeasured("operator reads", target, "no views run")
	}
	worst, name := 0.0, ""
	for _, q := range viewQueries(v) {
		if ms := q.n("p50_ms"); ms > worst {
			worst, name = ms, q.str("name")
		}
	}
	return goal{fmt.Sprintf("operator reads at %s rows", short(v.n("rows"))), target,
		fmt.Sprintf("slowest p50 %.1f ms (%s)", worst, name), verdict(worst < 50, fmt.Sprintf("%s takes %.1f ms", name, worst))}
}

// phase returns the named phase of a long-tx result.
func phase(r result, name string) map[string]any {
	ps, _ := r["phases"].([]any)
	for _, p := range ps {
		if m, ok := p.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// longTxGoals: with a snapshot held open, peak throughput stays above 70%
// of the clean phase's, and a fixed 1,000 rows/s at 16 slots is kept up
// with (the depth at the end of the phase under a second's rows) with a
// pickup p99 under 20 ms, by one process and by a fleet of four.
func (rp *report) longTxGoals() []goal {
	const (
		peakTarget = "≥ 70% of the clean phase's rows/s"
		keepTarget = "depth at the end ≤ 1 s of rows"
		p99Target  = "< 20 ms"
	)
	var gs []goal
	if r := rp.find("pgworker", "long-tx", func(r result) bool { return r.n("depth") > 0 }); r == nil {
		gs = append(gs, notMeasured("held snapshot: peak rows/s", peakTarget, "no long-tx run in peak mode (--depth)"))
	} else {
		v := r.n("held_over_clean")
		gs = append(gs, goal{"held snapshot: peak rows/s", peakTarget,
			fmt.Sprintf("%.0f%% (%s of %s rows/s, %g slots)", v*100, thousands(result(phase(r, "idle-in-tx")).n("rows_per_sec")),
				thousands(result(phase(r, "clean")).n("rows_per_sec")), r.n("slots")),
			verdict(v >= 0.7, fmt.Sprintf("%.0f points under 70%%", 70-v*100))})
	}
	gs = append(gs, rp.fleetLongTxGoal(p99Target))
	r := rp.find("pgworker", "long-tx", func(r result) bool {
		return r.n("rate") == 1000 && r.n("slots") == 16 && r.n("processes") <= 1
	})
	if r == nil {
		gs = append(gs, notMeasured("held snapshot: 1,000 rows/s at 16 slots", keepTarget, "no long-tx run at --rate 1000 --slots 16"),
			notMeasured("held snapshot: pickup p99", p99Target, "no long-tx run at --rate 1000 --slots 16"))
		return gs
	}
	held := result(phase(r, "idle-in-tx"))
	depth, rate := held.n("depth_end"), held.n("rows_per_sec")
	gs = append(gs, goal{"held snapshot: 1,000 rows/s at 16 slots", keepTarget,
		fmt.Sprintf("%s rows/s, %s waiting at the end", thousands(rate), thousands(depth)),
		verdict(depth <= 1000, fmt.Sprintf("%s rows behind", thousands(depth)))})
	p99, measured := heldPickup(held)
	gs = append(gs, goal{"held snapshot: pickup p99", p99Target, measured,
		verdict(p99 < 20, fmt.Sprintf("%.1f ms over", p99-20))})
	return gs
}

// heldPickup is the pickup p99 of a long-tx phase that the goals judge,
// and how the report says it. Pickup runs from the insert's commit
// returning to the handler's start, as bench latency measures it; a run
// from before the benchmark timed the producer's inserts has only the
// pickup from the row's created_at, which holds the insert's own round
// trip and commit too.
func heldPickup(ph result) (float64, string) {
	fromCreated := ph.n("pickup.p99_ms")
	if !insertsTimed(ph) {
		return fromCreated, fmt.Sprintf("%.1f ms (from created_at)", fromCreated)
	}
	v := ph.n("pickup_from_return.p99_ms")
	return v, fmt.Sprintf("%.1f ms from the insert's answer; %.1f ms from its created_at (the producer's inserts p99 %.1f ms, max %.1f ms)",
		v, fromCreated, ph.n("insert.p99_ms"), ph.n("insert.max_ms"))
}

// insertsTimed says whether a long-tx phase timed the producer's inserts,
// and so has the pickup from the insert's answer.
func insertsTimed(ph result) bool { return ph.n("insert.p50_ms") > 0 }

// fleetLongTxGoal: with a snapshot held open, four processes of four slots
// at 1,000 rows/s, each woken by every notification, pick up with a p99
// under 20 ms too.
func (rp *report) fleetLongTxGoal(target string) goal {
	const name = "held snapshot: pickup p99, 4 processes"
	r := rp.find("pgworker", "long-tx", func(r result) bool {
		return r.n("rate") == 1000 && r.n("processes") == 4 && r.n("slots") == 4
	})
	if r == nil {
		return notMeasured(name, target, "no long-tx run at --rate 1000 --processes 4 --slots 4")
	}
	held := result(phase(r, "idle-in-tx"))
	p99, measured := heldPickup(held)
	return goal{name, target, fmt.Sprintf("%s; %s rows/s, %s waiting at the end", measured,
		thousands(held.n("rows_per_sec")), thousands(held.n("depth_end"))),
		verdict(p99 < 20, fmt.Sprintf("%.1f ms over", p99-20))}
}

func notMeasured(name, target, why string) goal {
	return goal{name, target, why, "not measured"}
}

// throughputGoal compares the throughput at slotCount with River's: at
// least times as many rows per second.
func (rp *report) throughputGoal(slotCount, times float64) goal {
	name := fmt.Sprintf("throughput at %s slots", thousands(slotCount))
	target := fmt.Sprintf("≥ %gx River", times)
	// Each system's median over its runs: the runs alternate, so that the
	// machine's drifting load falls on both alike.
	pg, rv := rp.throughputs("pgworker", slotCount), rp.throughputs("river", slotCount)
	switch {
	case len(pg) == 0:
		return notMeasured(name, target, "no pgworker run at these slots")
	case len(rv) == 0:
		return notMeasured(name, target, fmt.Sprintf("pgworker %s rows/s; no River run", spread(pg)))
	}
	ratio := median(pg) / median(rv)
	m := fmt.Sprintf("%s vs %s rows/s: %sx", thousands(median(pg)), thousands(median(rv)), floor2(ratio))
	if len(pg) > 1 || len(rv) > 1 {
		m += fmt.Sprintf(" (medians of %d and %d runs; pgworker %s, River %s)", len(pg), len(rv), span(pg), span(rv))
	}
	// No queue on this database moves more rows than the bare loop of the
	// same run, and none that keeps what pgworker's guarantees keep more
	// than the bare loop that writes those rows: a target above either is
	// bounded by the database.
	bound := ""
	if slotCount == 2000 {
		want := times * median(rv)
		if bare := rp.bareSkipLocked(); len(bare) > 0 && want > median(bare) {
			bound = fmt.Sprintf("%gx River is %s rows/s, more than the bare SKIP LOCKED loop moves on this database (%s rows/s, median of %d runs)",
				times, thousands(want), thousands(median(bare)), len(bare))
		} else if kept := rp.keptSkipLocked(); len(kept) > 0 && want > median(kept) {
			bound = fmt.Sprintf("%gx River is %s rows/s, more than the bare SKIP LOCKED loop moves on this database when it writes "+
				"the rows the guarantees keep (%s rows/s, median of %d runs; the step by step below)",
				times, thousands(want), thousands(median(kept)), len(kept))
		}
	}
	return goal{name, target, m,
		boundedVerdict(ratio >= times, bound, fmt.Sprintf("%sx, not %gx (%.2f%% more needed)", floor2(ratio), times, (times/ratio-1)*100))}
}

// bareSkipLocked returns the rows/s of the bare SKIP LOCKED loop's runs.
func (rp *report) bareSkipLocked() []float64 { return rp.bareFigures("rows_per_sec") }

// keptSkipLocked returns the rows/s of the bare SKIP LOCKED loop's runs that
// write the rows pgworker's guarantees keep (skiplocked --bookkeeping).
func (rp *report) keptSkipLocked() []float64 {
	return rp.skipLockedFigures("rows_per_sec", func(r result) bool { return r["bookkeeping"] == true })
}

// bareFigures returns key of the bare SKIP LOCKED loop's runs that report it
// (not those through the SQL API or with the guarantees' writes), in run
// order.
func (rp *report) bareFigures(key string) []float64 {
	return rp.skipLockedFigures(key, func(r result) bool { return r["api"] != true && r["bookkeeping"] != true })
}

// skipLockedFigures returns key of the skiplocked runs that report it and
// that keep accepts, in run order.
func (rp *report) skipLockedFigures(key string, keep func(result) bool) []float64 {
	var out []float64
	for _, r := range rp.all("pgworker", "skiplocked") {
		if keep(r) && r.n(key) > 0 {
			out = append(out, r.n(key))
		}
	}
	return out
}

// skipLockedGoal: the throughput at 2,000 slots at least 80% of the bare
// FOR UPDATE SKIP LOCKED loop's, medians of the runs of one report.
func (rp *report) skipLockedGoal() goal {
	const name, target = "throughput at 2,000 slots vs bare SKIP LOCKED", "≥ 80%"
	pg, bare := rp.throughputs("pgworker", 2000), rp.bareSkipLocked()
	switch {
	case len(pg) == 0:
		return notMeasured(name, target, "no pgworker run at 2,000 slots")
	case len(bare) == 0:
		return notMeasured(name, target, "no skiplocked run")
	}
	pct := median(pg) / median(bare) * 100
	// The bare loop that writes the rows the guarantees keep, and nothing
	// else, is as far as a queue that keeps them can go on this database.
	bound, why := "", rp.skipLockedSteps(bare)+rp.peakCPUSplit()
	if kept := rp.keptSkipLocked(); len(kept) > 0 && median(kept) < median(bare)*0.8 {
		bound = fmt.Sprintf("the bare loop that writes the rows the guarantees keep moves %.0f%% of the bare loop's rows/s (median of %d runs)",
			math.Floor(median(kept)/median(bare)*100), len(kept)) + why
	}
	// How often one round's burn-down reached 80% of its own round's bare loop.
	rounds := ""
	if n, paired := inRounds(pg, bare, func(a, b float64) bool { return a >= b*0.8 }); paired {
		rounds = fmt.Sprintf("; 80%% of the same round's bare loop in %d of %d rounds", n, len(pg))
	}
	return goal{name, target, fmt.Sprintf("%s vs %s rows/s: %.0f%% (medians of %d and %d runs%s)",
		thousands(median(pg)), thousands(median(bare)), math.Floor(pct), len(pg), len(bare), rounds),
		boundedVerdict(pct >= 80, bound, fmt.Sprintf("%.0f%%, %s short", math.Floor(pct), points(80-math.Floor(pct)))+why)}
}

// points says n percentage points: "1 point", "25 points".
func points(n float64) string {
	if n == 1 {
		return "1 point"
	}
	return fmt.Sprintf("%.0f points", n)
}

// skipLockedSteps says what each layer between the bare loop and the SQL
// API costs, medians of the runs: the rows the guarantees write (the bare
// loop with them), then the SQL API's functions. Empty when a figure is
// missing.
func (rp *report) skipLockedSteps(bare []float64) string {
	kept := rp.keptSkipLocked()
	api := rp.skipLockedFigures("rows_per_sec", func(r result) bool { return r["api"] == true })
	if len(kept) == 0 || len(api) == 0 {
		return ""
	}
	b, k, a := median(bare), median(kept), median(api)
	return fmt.Sprintf(". Step by step (medians, rows/s): the bare loop %s; with the rows the guarantees write (a history row, "+
		"the running rows' index, the token's hash, the counts) %s, %.0f%% of it; through the SQL API's functions %s, %.0f%% of it",
		thousands(b), thousands(k), math.Floor(k/b*100), thousands(a), math.Floor(a/b*100))
}

// peakCPUSplit says where a burnt-down row's CPU goes, pgworker's at 2,000
// slots (bench cpu at peak) against the bare loop's, medians of the runs:
// on a machine whose cores the database shares with the queue's client, the
// rows/s follow the sum. Empty when a figure is missing.
func (rp *report) peakCPUSplit() string {
	pgServer, pgWorker := rp.cpuFigures("pgworker", 0, "server_cpu_ms_per_row", plain), rp.cpuFigures("pgworker", 0, "worker_cpu_ms_per_row", plain)
	bareServer, bareClient := rp.bareFigures("server_cpu_ms_per_row"), rp.bareFigures("client_cpu_ms_per_row")
	if len(pgServer) == 0 || len(pgWorker) == 0 || len(bareServer) == 0 || len(bareClient) == 0 {
		return ""
	}
	ps, pw, bs, bc := median(pgServer), median(pgWorker), median(bareServer), median(bareClient)
	return fmt.Sprintf(". CPU per row at peak (medians): the database %.4f ms for pgworker against %.4f ms for the bare loop "+
		"(%.2fx), the worker process %.4f ms "+
		"against the bare client's %.4f ms; the machine's cores run both, and the sums predict %.0f%%",
		ps, bs, ps/bs, pw, bc, (bs+bc)/(ps+pw)*100)
}

// latencyP50s returns the pickup p50s and p99s of system's latency runs
// with settings k, in run order.
func (rp *report) latencyP50s(system string, slotCount float64, k kind) (p50, p99 []float64) {
	for _, r := range rp.runs(system, "latency", slotCount, k) {
		p50 = append(p50, r.n("p50_ms"))
		p99 = append(p99, r.n("p99_ms"))
	}
	return p50, p99
}

// pickups returns pgworker's first latency run with no cooldown (nil when
// there is none), and the pickup p50s and p99s of the runs like it.
func (rp *report) pickups() (pg result, p50, p99 []float64) {
	pg = rp.find("pgworker", "latency", func(r result) bool { return kindOf(r) == plain })
	if pg == nil {
		return nil, nil, nil
	}
	p50, p99 = rp.latencyP50s("pgworker", pg.n("slots"), plain)
	return pg, p50, p99
}

// latencyGoals are the pickup p50 and p99 on their own and against River's,
// each a median of the runs.
func (rp *report) latencyGoals() []goal {
	const target = "≥ 20x lower than River"
	pg, p50s, p99s := rp.pickups()
	if pg == nil {
		return []goal{notMeasured("pickup p50", "≤ 0.7 ms", "no pgworker latency run")}
	}
	slots := pg.n("slots")
	p50, p99 := median(p50s), median(p99s)
	runs := ""
	if len(p50s) > 1 {
		runs = fmt.Sprintf(" (median of %d runs: %s)", len(p50s), msList(p50s))
	}
	// The bare LISTEN/NOTIFY queue of bench notify at the same rate: the
	// pickup of a queue with no queue software on this database.
	bare50, bare99 := rp.notifyFigures(pg.n("rate"), "queue", "pickup.p50_ms"), rp.notifyFigures(pg.n("rate"), "queue", "pickup.p99_ms")
	bound50, bound99, with50, with99 := "", "", "", ""
	// The same queue through the SQL API with no runtime: what of the
	// pickup the functions take and what the runtime adds.
	api50, api99 := rp.notifyFigures(pg.n("rate"), "api", "pickup.p50_ms"), rp.notifyFigures(pg.n("rate"), "api", "pickup.p99_ms")
	if len(bare50) > 0 {
		b50, b99 := median(bare50), median(bare99)
		with50 = fmt.Sprintf("; the bare queue %.2f ms", b50)
		with99 = fmt.Sprintf("; the bare queue %.2f ms", b99)
		if len(api50) > 0 {
			with50 += fmt.Sprintf(", the SQL API with no runtime %.2f ms", median(api50))
			with99 += fmt.Sprintf(", the SQL API with no runtime %.2f ms", median(api99))
		}
		if b50 > 0.7 {
			bound50 = fmt.Sprintf("the bare LISTEN/NOTIFY queue's own pickup is %.2f ms on this database (bench notify, median of %d runs)", b50, len(bare50))
		}
		if b99 > 2 {
			bound99 = fmt.Sprintf("the bare LISTEN/NOTIFY queue's own p99 is %.2f ms on this database (bench notify, median of %d runs)", b99, len(bare99))
		}
	}
	gs := []goal{
		{"pickup p50", "≤ 0.7 ms", fmt.Sprintf("%.2f ms%s%s", p50, runs, with50), boundedVerdict(p50 <= 0.7, bound50, fmt.Sprintf("%.2f ms over 0.7 ms", p50-0.7))},
		{"pickup p99", "≤ 2 ms", fmt.Sprintf("%.2f ms%s", p99, with99), boundedVerdict(p99 <= 2, bound99, fmt.Sprintf("%.2f ms over 2 ms", p99-2))},
	}
	if rt, _ := rp.latencyP50s("river", slots, tuned); len(rt) > 0 {
		t := median(rt)
		gs = append(gs, goal{"pickup p50 vs River tuned", "below River with a 1 ms fetch cooldown",
			fmt.Sprintf("%.2f vs %.2f ms (medians of %d and %d runs%s)", p50, t, len(p50s), len(rt), lowerIn(p50s, rt)),
			verdict(p50 < t, fmt.Sprintf("%.2f ms above River's", p50-t))})
	} else {
		gs = append(gs, notMeasured("pickup p50 vs River tuned", "below River with a 1 ms fetch cooldown", "no tuned River latency run"))
	}
	rv, _ := rp.latencyP50s("river", slots, plain)
	if len(rv) == 0 {
		return append(gs, notMeasured("pickup p50 vs River", target, "no River latency run"))
	}
	ratio := median(rv) / p50
	return append(gs, goal{"pickup p50 vs River", target, fmt.Sprintf("%.2f vs %.2f ms: %.0fx lower", p50, median(rv), ratio),
		verdict(ratio >= 20, fmt.Sprintf("%.1fx, not 20x", ratio))})
}

// cooldownName names the claim cooldown of pgworker's cooled runs of mode
// ("claim cooldown 100 ms").
func (rp *report) cooldownName(mode string) string {
	r := rp.find("pgworker", mode, func(r result) bool { return kindOf(r) == cooled })
	return fmt.Sprintf("claim cooldown %g ms", r.n("claim_cooldown_ms"))
}

func msList(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(parts, " / ") + " ms"
}

// cpuRates are the rates of the CPU runs, 0 for peak, in the order the
// report shows them.
func (rp *report) cpuRates() []float64 {
	var rates []float64
	for _, r := range rp.results {
		if r.str("mode") == "cpu" && !slices.Contains(rates, r.n("rate")) {
			rates = append(rates, r.n("rate"))
		}
	}
	slices.SortFunc(rates, func(a, b float64) int {
		// Peak (0) last.
		if (a == 0) != (b == 0) {
			if a == 0 {
				return 1
			}
			return -1
		}
		return int(a - b)
	})
	return rates
}

// cpuFigures returns key of system's CPU runs at rate with settings k, in
// run order.
func (rp *report) cpuFigures(system string, rate float64, key string, k kind) []float64 {
	var out []float64
	for _, r := range rp.all(system, "cpu") {
		if r.n("rate") == rate && kindOf(r) == k {
			out = append(out, r.n(key))
		}
	}
	return out
}

func rateName(rate float64) string {
	if rate == 0 {
		return "peak"
	}
	return thousands(rate) + " rows/s"
}

// cpuGoals: the database's CPU per row at most River's at each rate,
// medians of the runs.
func (rp *report) cpuGoals() []goal {
	var gs []goal
	for _, rate := range rp.cpuRates() {
		name := "database CPU per row at " + rateName(rate)
		const target = "≤ River"
		pg, rv := rp.cpuFigures("pgworker", rate, "server_cpu_ms_per_row", plain), rp.cpuFigures("river", rate, "server_cpu_ms_per_row", plain)
		switch {
		case len(pg) == 0:
			gs = append(gs, notMeasured(name, target, "no pgworker run"))
			continue
		case len(rv) == 0:
			gs = append(gs, notMeasured(name, target, fmt.Sprintf("pgworker %.3f ms; no River run", median(pg))))
			continue
		}
		a, b := median(pg), median(rv)
		// A bare queue that answers each notification at once, as pgworker
		// does by default, pays a claim per row: when that alone costs more
		// than River's fetch per 100 ms, the goal is bounded by the trade.
		bound := ""
		if q := rp.notifyFigures(rate, "queue", "server_cpu_ms_per_row"); len(q) > 0 && median(q) > b {
			bound = fmt.Sprintf("a bare LISTEN/NOTIFY queue that claims each row as it comes spends %.3f ms (bench notify, median of %d runs), "+
				"%.2fx River's, which fetches once per 100 ms; see the line at River's trade", median(q), len(q), median(q)/b)
		}
		gs = append(gs, goal{name, target, fmt.Sprintf("%.3f vs %.3f ms: %.2fx (medians of %d and %d runs)", a, b, a/b, len(pg), len(rv)),
			boundedVerdict(a <= b, bound, fmt.Sprintf("%.2fx River's", a/b))})
		// The same at River's own trade: claims held back for as long as
		// River's fetch cooldown.
		if c := rp.cpuFigures("pgworker", rate, "server_cpu_ms_per_row", cooled); len(c) > 0 {
			a := median(c)
			// What is left may be the notification that pgworker sends
			// with every insert (files_pending, once per statement and
			// queue) and River's producer at most once per cooldown. (A
			// node in its cooldown does not listen: the wake-ups of
			// listening sessions are not part of it.)
			bound := ""
			ins, ntf := rp.notifyFigures(rate, "insert", "server_cpu_ms_per_row"), rp.notifyFigures(rate, "notify", "server_cpu_ms_per_row")
			if len(ins) > 0 && len(ntf) > 0 {
				if cost := median(ntf) - median(ins); cost > 0 && a-cost <= b {
					bound = fmt.Sprintf("the notification each insert sends costs %.3f ms per row here "+
						"(bench notify: %.3f against %.3f ms for the bare insert, medians of %d runs); without it %.3f ms, within River's",
						cost, median(ntf), median(ins), len(ntf), a-cost)
				}
			}
			// Otherwise, what pgworker's own insert costs beyond the bare
			// insert: its trigger's notification, the line of counts that
			// keeps the operator reads fast, the queue's registration.
			miss := fmt.Sprintf("%.2fx River's", a/b)
			if enq := rp.notifyFigures(rate, "enqueue", "server_cpu_ms_per_row"); len(ins) > 0 && len(enq) > 0 {
				if cost := median(enq) - median(ins); cost > 0 {
					miss += fmt.Sprintf("; pgworker's insert into files.files costs %.3f ms per row more than the bare insert (its trigger "+
						"notifies, counts the row for the operator reads and registers its queue; bench notify: %.3f against %.3f ms, medians of %d runs), "+
						"without which %.3f ms", cost, median(enq), median(ins), len(enq), a-cost)
				}
			}
			gs = append(gs, goal{name + " at River's trade, " + rp.cooldownName("cpu"), target,
				fmt.Sprintf("%.3f vs %.3f ms: %.2fx (medians of %d and %d runs%s)", a, b, a/b, len(c), len(rv), lowerIn(c, rv)),
				boundedVerdict(a <= b, bound, miss)})
		}
	}
	return gs
}

// claimDepthGoal: a claim at the largest depth within 2x of one at the
// smallest.
func (rp *report) claimDepthGoal() goal {
	cd := rp.find("pgworker", "claim-depth", nil)
	if cd == nil {
		return notMeasured("claim at 10M rows", "within 2x of 10k", "no claim-depth run")
	}
	d, _ := cd["ratio_depths"].([]any)
	hi, lo := 0.0, 0.0
	if len(d) == 2 {
		hi, _ = d[0].(float64)
		lo, _ = d[1].(float64)
	}
	ratio := cd.n("ratio_claim_batch")
	name := fmt.Sprintf("claim at %s rows vs %s", short(hi), short(lo))
	return goal{name, "within 2x", fmt.Sprintf("files.claim_batch %.2fx (files.claim %.2fx)", ratio, cd.n("ratio_claim")),
		verdict(ratio <= 2, fmt.Sprintf("%.2fx, over 2x", ratio))}
}

func (rp *report) herdGoal() goal {
	const target = "≤ 1 claim query per process per wake-up"
	h := rp.find("pgworker", "herd", nil)
	if h == nil {
		return notMeasured("herd", target, "no herd run")
	}
	v := h.n("claim_queries_per_process_per_wakeup")
	return goal{"herd", target,
		fmt.Sprintf("%.3f (%.1f per row, %g processes)", v, h.n("claim_queries_per_row"), h.n("processes")),
		verdict(v <= 1, fmt.Sprintf("%.2f above 1", v-1))}
}

func (rp *report) enqueueGoal() goal {
	const target = "≥ 100,000 rows/s"
	var xs []float64
	for _, r := range rp.all("pgworker", "enqueue") {
		xs = append(xs, r.n("rows_per_sec"))
	}
	if len(xs) == 0 {
		return notMeasured("enqueue", target, "no enqueue run")
	}
	v := median(xs)
	return goal{"enqueue", target, spread(xs) + " rows/s",
		verdict(v >= 100000, fmt.Sprintf("%.0f%% short of 100,000", (1-v/100000)*100))}
}

func (rp *report) pipelineGoal() goal {
	const target = "≤ 10%"
	p := rp.find("pgworker", "pipeline", nil)
	if p == nil {
		return notMeasured("pipeline overhead", target, "no pipeline run")
	}
	v := p.n("overhead_pct")
	measured := fmt.Sprintf("%.1f%% (%s vs %s rows/s)", v, thousands(p.n("queued.rows_per_sec")), thousands(p.n("direct.rows_per_sec")))
	if bare, ok := p.num("bare_overhead_pct"); ok { // not in a run from before the bare queue
		measured += fmt.Sprintf("; a bare queue %.1f%% (%s rows/s)%s", bare, thousands(p.n("bare.rows_per_sec")),
			lowerIn(p.floats("round_ms.queued"), p.floats("round_ms.bare")))
		if v > 10 && bare > 10 {
			return goal{"pipeline overhead", target, measured, fmt.Sprintf("bounded: the bare queue (one SKIP LOCKED claim and "+
				"one completion a row, no queue software) adds %.1f%% to the same pipeline in the same run", bare)}
		}
	}
	return goal{"pipeline overhead", target, measured, verdict(v <= 10, fmt.Sprintf("%.1f points over 10%%", v-10)+cpuOverBare(p))}
}

// cpuOverBare says how much more CPU a row the queued way of a pipeline run
// spent than the bare queue's, and how much of it was the database's; ""
// for a run from before the ways' CPU was measured.
func cpuOverBare(p result) string {
	q, okq := p.num("cpu_ms_per_row.queued.machine")
	b, okb := p.num("cpu_ms_per_row.bare.machine")
	if !okq || !okb {
		return "" // not measured, or /proc/stat unread
	}
	s := fmt.Sprintf("; the machine's CPU a row %+.2f ms over the bare queue's", q-b)
	qs, okq := p.num("cpu_ms_per_row.queued.server")
	bs, okb := p.num("cpu_ms_per_row.bare.server")
	if okq && okb {
		s += fmt.Sprintf(", the database's %+.2f ms", qs-bs)
	}
	return s
}

func verdict(met bool, miss string) string {
	if met {
		return "met"
	}
	return "missed: " + miss
}

// boundedVerdict is verdict for a goal that the same run may show out of
// reach: bound, when not empty, says what holds it back.
func boundedVerdict(met bool, bound, miss string) string {
	if !met && bound != "" {
		return "bounded: " + bound
	}
	return verdict(met, miss)
}

// notifyFigures returns key of the named phase of the notify runs at rate,
// in run order.
func (rp *report) notifyFigures(rate float64, phaseName, key string) []float64 {
	var out []float64
	for _, r := range rp.all("pgworker", "notify") {
		if r.n("rate") != rate {
			continue
		}
		if ph := phase(r, phaseName); ph != nil {
			if v, ok := result(ph).num(key); ok {
				out = append(out, v)
			}
		}
	}
	return out
}

// rounds says in how many rounds the report's runs alternated: those of
// River's 2,000-slot burn-down, and the runs that took more rounds.
func (rp *report) rounds() string {
	_, p50s, _ := rp.pickups()
	burn := len(rp.throughputs("pgworker", 2000))
	base := cmp.Or(len(rp.throughputs("river", 2000)), burn, len(p50s))
	var more []string
	for _, m := range []struct {
		what string
		n    int
	}{
		{"the pickup, River tuned's and the bare queue's at the pickup's rate", len(p50s)},
		{"pgworker's burn-down at 2,000 slots and the bare SKIP LOCKED loop", burn},
		{"the database's CPU per row at 200 rows/s at River's trade and River's", len(rp.cpuFigures("pgworker", 200, "server_cpu_ms_per_row", cooled))},
	} {
		if m.n > base {
			more = append(more, fmt.Sprintf("%s in %d", m.what, m.n))
		}
	}
	if len(more) == 0 {
		return roundsOf(base)
	}
	return fmt.Sprintf("%s (%s)", roundsOf(base), strings.Join(more, "; "))
}

func roundsOf(n int) string {
	if n == 1 {
		return "one round"
	}
	return fmt.Sprintf("%d rounds", n)
}

func render(w io.Writer, rp *report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("# Benchmarks\n\n")
	p("Generated by `make bench` on %s: every `pgworker bench` mode and the River peer\n", rp.date.Format("2006-01-02"))
	p("benchmark (`bench/peers`) on a throwaway PostgreSQL and MinIO on the same machine.\n")
	p("The burn-downs, the bare SKIP LOCKED loop, the pickup, the CPU per row and the bare\n")
	p("LISTEN/NOTIFY queue run in %s, pgworker and River alternating, and the goals\n", rp.rounds())
	if n := len(rp.all("pgworker", "enqueue")); n > 1 {
		p("compare the medians; the enqueue runs %d times, its goal on the median; every other\n", n)
		p("figure is from one run. The machine's other load\n")
	} else {
		p("compare the medians; every other figure is from one run. The machine's other load\n")
	}
	p("shows in them. A goal is \"bounded\" when the same run measures what holds it out of\n")
	p("reach on this machine: the database doing the same work with no queue software.\n")
	p("Where the two sides of a goal ran in turn, round by round, the goal also says in how\n")
	p("many rounds pgworker's figure was the better one: medians that differ by less than\n")
	p("the rounds' spread can fall either way from one report to the next.\n\n")
	renderMachine(p, rp)
	renderGoals(p, rp)
	renderReading(p, rp)
	renderCommands(p, rp)
	p("## Results\n\n")
	renderThroughput(p, rp)
	renderSkipLocked(p, rp)
	renderLatency(p, rp)
	renderSteps(p, rp)
	renderCPU(p, rp)
	renderNotify(p, rp)
	renderClaimDepth(p, rp)
	renderHerd(p, rp)
	renderEnqueue(p, rp)
	renderPipeline(p, rp)
	renderViews(p, rp)
	renderLongTx(p, rp)
	renderSoak(p, rp)
	renderRaw(p, rp)
}

type printer func(format string, args ...any)

// renderMachine writes the machine and the versions the results name.
func renderMachine(p printer, rp *report) {
	p("## Machine\n\n")
	m := rp.machine
	p("| | |\n| --- | --- |\n")
	p("| CPUs (nproc) | %d", m.CPUs)
	if m.CPUModel != "" {
		p(" × %s", m.CPUModel)
	}
	p(" |\n")
	if m.MemTotal != "" {
		p("| memory | %s |\n", m.MemTotal)
	}
	p("| OS | %s/%s", m.OS, m.Arch)
	if m.Kernel != "" {
		p(", Linux %s", m.Kernel)
	}
	p(" |\n")
	if m.Load != "" {
		p("| load average at the end (1, 5, 15 min) | %s |\n", m.Load)
	}
	if first := rp.firstOf("pgworker"); first != nil {
		p("| PostgreSQL | %s |\n", first.str("postgres_version"))
		if s, ok := first["postgres_settings"].(map[string]any); ok {
			p("| PostgreSQL settings | fsync %v, synchronous_commit %v, shared_buffers %v |\n", s["fsync"], s["synchronous_commit"], s["shared_buffers"])
		}
		p("| Go | %s |\n", first.str("go_version"))
		p("| pgworker | %s |\n", first.str("version"))
	}
	if rv := rp.find("river", "throughput", nil); rv != nil {
		p("| River | %s |\n", rv.str("river_version"))
	}
	p("\n")
}

// firstOf returns system's first result of any mode.
func (rp *report) firstOf(system string) result {
	for _, r := range rp.results {
		if r.str("system") == system {
			return r
		}
	}
	return nil
}

func renderGoals(p printer, rp *report) {
	p("## Goals\n\n")
	p("| goal | target | measured | |\n| --- | --- | --- | --- |\n")
	for _, g := range rp.goals() {
		p("| %s | %s | %s | %s |\n", g.name, g.target, g.measured, g.verdict)
	}
	p("\n")
}

func renderReading(p printer, rp *report) {
	p("## Reading the figures\n\n")
	p("- PostgreSQL, MinIO, the backend programs and the benchmark share the machine's cores.\n")
	p("  Where the database is the bottleneck (throughput at many slots, enqueue), the figures\n")
	p("  are those of this machine's PostgreSQL, not of a dedicated server; and every database\n")
	p("  round trip stretches while the cores are saturated.\n")
	fsync := "?"
	if first := rp.firstOf("pgworker"); first != nil {
		if s, ok := first["postgres_settings"].(map[string]any); ok {
			fsync = fmt.Sprint(s["fsync"])
		}
	}
	if fsync == "off" {
		p("- The throwaway cluster runs with fsync off: commits cost no disk flush, for pgworker\n")
		p("  and River alike.\n")
	} else {
		p("- The throwaway cluster runs with fsync %s, as production does: each commit waits for\n", fsync)
		p("  its WAL to reach the disk, for pgworker and River alike.\n")
	}
	p("- The load average above tells how much else ran meanwhile; figures of a loaded machine\n")
	p("  vary by tens of percent from run to run, River's as much as pgworker's.\n\n")
}

func renderCommands(p printer, rp *report) {
	if len(rp.commands) == 0 {
		return
	}
	p("## Commands\n\n")
	p("The database and object store come from the environment (`PGWORKER_DATABASE_URL`,\n")
	p("`PGWORKER_S3_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); riverbench\n")
	p("reads `PGWORKER_DATABASE_URL` too and works in a database of its own beside it.\n\n```sh\n")
	for _, c := range dedupe(rp.commands) {
		p("%s\n", c)
	}
	p("```\n\n")
}

func renderRaw(p printer, rp *report) {
	p("## Raw results\n\n<details><summary>JSON, one result per line</summary>\n\n```json\n")
	for _, r := range rp.results {
		if _, ok := r["samples"]; ok {
			// The samples are in the tables and the chart.
			r = maps.Clone(r)
			delete(r, "samples")
		}
		b, _ := json.Marshal(r)
		p("%s\n", b)
	}
	p("```\n\n</details>\n")
}

func renderThroughput(p printer, rp *report) {
	pg, rv := rp.all("pgworker", "throughput"), rp.all("river", "throughput")
	if len(pg)+len(rv) == 0 {
		return
	}
	p("### Throughput\n\n")
	p("Rows inserted beforehand (not timed), burnt down by a no-op handler; the clock stops\n")
	p("when the last outcome is recorded. pgworker's clock starts when the paused queue is\n")
	p("resumed, with the worker already started (its start is `start_ms`); River's when its\n")
	p("client starts.\n\n")
	p("| system | rows | slots | rows/s | elapsed | claim queries | setup |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range pg {
		p("| pgworker | %s | %s | **%s** | %.2f s | %s | pool of %g, start %.0f ms |\n", thousands(r.n("rows")), thousands(r.n("slots")),
			thousands(r.n("rows_per_sec")), r.n("elapsed_ms")/1000, thousands(r.n("claims")), r.n("max_conns"), r.n("start_ms"))
	}
	for _, r := range rv {
		p("| River | %s | %s | **%s** | %.2f s | | pool of %g, fetch cooldown %g ms, poll %g ms |\n", thousands(r.n("rows")), thousands(r.n("slots")),
			thousands(r.n("rows_per_sec")), r.n("elapsed_ms")/1000, r.n("max_conns"), r.n("fetch_cooldown_ms"), r.n("fetch_poll_interval_ms"))
	}
	p("\n")
}

func renderLatency(p printer, rp *report) {
	pg, rv := rp.all("pgworker", "latency"), rp.all("river", "latency")
	if len(pg)+len(rv) == 0 {
		return
	}
	p("### Pickup latency\n\n")
	p("Rows inserted one at a time (one transaction each) at a steady rate while every slot\n")
	p("is idle; the time from the insert's commit returning to the handler's start (from\n")
	p("sending the insert in the last column).\n\n")
	p("| system | rows | rate | slots | p50 | p90 | p99 | max | p50 from send | setup |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	row := func(name string, r result, setup string) {
		p("| %s | %s | %g/s | %g | **%.2f ms** | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %s |\n", name, thousands(r.n("rows")), r.n("rate"), r.n("slots"),
			r.n("p50_ms"), r.n("p90_ms"), r.n("p99_ms"), r.n("max_ms"), r.n("from_send.p50_ms"), setup)
	}
	for _, r := range pg {
		setup := ""
		if kindOf(r) == cooled {
			setup = fmt.Sprintf("claim cooldown %g ms", r.n("claim_cooldown_ms"))
		}
		row("pgworker", r, setup)
	}
	for _, r := range rv {
		row("River", r, fmt.Sprintf("fetch cooldown %g ms", r.n("fetch_cooldown_ms")))
	}
	p("\n")
}

func renderSkipLocked(p printer, rp *report) {
	rs := rp.all("pgworker", "skiplocked")
	if len(rs) == 0 {
		return
	}
	p("### Bare SKIP LOCKED\n\n")
	p("What this database does as a queue with no queue software: a table with the columns,\n")
	p("checks and defaults of `files.files` and a partial index on its pending rows, burnt\n")
	p("down by connections that each claim a batch with `UPDATE ... WHERE id IN (SELECT ...\n")
	p("FOR UPDATE SKIP LOCKED)` and mark it done with a second `UPDATE`, one transaction each:\n")
	p("no history row, no notification, no fencing. Through the SQL API: the same loop on\n")
	p("`files.files` calling `files.claim_batch` (committed asynchronously, as `pgworker run`\n")
	p("claims) and `files.complete_many`, as a worker in any language would, with no worker\n")
	p("runtime around them: what the bookkeeping of exactly-once outcomes costs at the same\n")
	p("batch size (slot keys, tokens, the history row, the queue's counts). Between the two,\n")
	p("the bare loop with the rows those guarantees write and nothing else (`--bookkeeping`): an\n")
	p("index of the running rows by slot, a token's hash written at the claim and checked at\n")
	p("the completion, a history row per outcome in a table of `files.attempts`' shape, a line\n")
	p("of counts per completion, its claims committed asynchronously: what the rows themselves\n")
	p("cost, apart from the functions that write them.\n\n")
	p("The CPU per row is the server's processes' (as `bench cpu` reads them) and the benchmark's\n")
	p("own, its clients', over the burn-down.\n\n")
	p("| statements | rows | clients | rows per statement | rows/s | elapsed | database CPU per row | client CPU per row |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		how := "bare"
		switch {
		case r["api"] == true:
			how = "SQL API"
		case r["bookkeeping"] == true:
			how = "bare, with the guarantees' rows"
		}
		server, client := "—", "—"
		if r.n("server_cpu_ms_per_row") > 0 {
			server, client = fmt.Sprintf("%.4f ms", r.n("server_cpu_ms_per_row")), fmt.Sprintf("%.4f ms", r.n("client_cpu_ms_per_row"))
		}
		p("| %s | %s | %g | %g | **%s** | %.2f s | %s | %s |\n", how, thousands(r.n("rows")), r.n("clients"), r.n("batch"),
			thousands(r.n("rows_per_sec")), r.n("elapsed_ms")/1000, server, client)
	}
	p("\n")
}

// renderSteps writes the pickup's breakdown of each pgworker latency run.
func renderSteps(p printer, rp *report) {
	var rs []result
	for _, r := range rp.all("pgworker", "latency") {
		if _, ok := r["steps"]; ok && kindOf(r) == plain {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return
	}
	p("### Where a pickup's time goes\n\n")
	p("Each pgworker latency run traced step by step by the benchmark alone (a subscriber of\n")
	p("the worker's listener, subscribed first, and a query tracer on its pool): the insert's\n")
	p("commit returned → the notification reached the listener (negative when it came before\n")
	p("the inserter saw its commit) → the claim query was sent → its answer came back → the\n")
	p("handler started. p50 / p99 of each, in ms.\n\n")
	p("| run | rows traced | commit → notification | → claim sent | claim | → handler | total p50 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i, r := range rs {
		pp := func(k string) string {
			return fmt.Sprintf("%.3f / %.3f", r.n("steps."+k+".p50_ms"), r.n("steps."+k+".p99_ms"))
		}
		p("| %d | %g | %s | %s | %s | %s | %.2f |\n", i+1, r.n("steps.traced"), pp("commit_to_notify"), pp("notify_to_claim"), pp("claim"), pp("claim_to_handler"), r.n("p50_ms"))
	}
	p("\n")
}

// renderCPU writes the CPU runs side by side, and the statements of
// pgworker's first run at each rate.
func renderCPU(p printer, rp *report) {
	rates := rp.cpuRates()
	if len(rates) == 0 {
		return
	}
	p("### Database CPU per row\n\n")
	p("Rows inserted one per transaction (four producer connections) at a fixed rate while the\n")
	p("worker keeps up, or, at peak, inserted beforehand (not measured) and burnt down at 2,000\n")
	p("slots. From the start to the last outcome: the CPU time of every PostgreSQL server\n")
	p("process (from `/proc`: the postmaster, found as the parent of a backend and of the\n")
	p("server's checkpointer and writers, the children it waited for, and those alive), of\n")
	p("the benchmark's own process (the worker or River client, and the producers), the WAL\n")
	p("written (`pg_current_wal_lsn()`) and the committed transactions of the database, each\n")
	p("divided by the rows. Medians of the alternating runs; every run in the raw results.\n\n")
	p("River tuned is River with its fetch cooldown at 1 ms, the setting of its fastest pickup;\n")
	p("the goal compares River's default. pgworker with a claim cooldown holds its claims back\n")
	p("as River's default holds its fetches (`pgworker run --claim-cooldown`): River's trade of\n")
	p("pickup latency for fewer claims.\n\n")
	p("| rate | system | runs | rows/s | server CPU per row | worker process CPU per row | WAL per row | transactions per row |\n")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	// name heads the table's rows; whose and with the statements' tables.
	systems := []struct {
		id, name, whose, with string
		k                     kind
	}{{"pgworker", "pgworker", "pgworker", "", plain},
		{"pgworker", "pgworker, " + rp.cooldownName("cpu"), "pgworker", " with " + rp.cooldownName("cpu"), cooled},
		{"river", "River", "River", "", plain}, {"river", "River tuned", "River", "", tuned}}
	for _, rate := range rates {
		for _, sys := range systems {
			fig := func(key string) []float64 { return rp.cpuFigures(sys.id, rate, key, sys.k) }
			srv := fig("server_cpu_ms_per_row")
			if len(srv) == 0 {
				continue
			}
			p("| %s | %s | %d | %s | **%.3f ms** | %.3f ms | %s B | %.2f |\n", rateName(rate), sys.name, len(srv),
				thousands(median(fig("rows_per_sec"))), median(srv), median(fig("worker_cpu_ms_per_row")),
				thousands(median(fig("wal_bytes_per_row"))), median(fig("xacts_per_row")))
		}
	}
	p("\n")
	for _, rate := range rates {
		for _, sys := range systems {
			if sys.k == tuned {
				continue // River's statements: those of its default, the first run
			}
			r := rp.find(sys.id, "cpu", func(r result) bool { return r.n("rate") == rate && kindOf(r) == sys.k })
			st, _ := r["statements"].([]any)
			if len(st) == 0 {
				continue
			}
			p("%s's statements at %s%s (pg_stat_statements, first run; execution time excludes the commit's flush):\n\n", sys.whose, rateName(rate), sys.with)
			p("| calls per row | exec ms per row | statement |\n| ---: | ---: | --- |\n")
			for _, x := range st[:min(len(st), 6)] {
				m, _ := x.(map[string]any)
				s := result(m)
				q := strings.ReplaceAll(s.str("query"), "|", "\\|")
				p("| %.3f | %.4f | `%s` |\n", s.n("calls_per_row"), s.n("exec_ms_per_row"), q)
			}
			p("\n")
		}
	}
}

// renderNotify writes the bare LISTEN/NOTIFY queue's phases at each rate,
// medians of the runs, and the bare queue's pickup.
func renderNotify(p printer, rp *report) {
	rs := rp.all("pgworker", "notify")
	if len(rs) == 0 {
		return
	}
	var rates []float64
	for _, r := range rs {
		if !slices.Contains(rates, r.n("rate")) {
			rates = append(rates, r.n("rate"))
		}
	}
	slices.Sort(rates)
	p("### The bare LISTEN/NOTIFY queue\n\n")
	p("What a queue driven by notifications costs this database with no queue software\n")
	p("(`pgworker bench notify`), on the table of the bare SKIP LOCKED loop. Each phase inserts\n")
	p("rows one per transaction (four producer connections) at the rate, after five warm-up\n")
	p("rows: the bare insert; the insert with a `NOTIFY` in the same statement, with nobody\n")
	p("listening and with a session listening; the bare queue, where each notification is\n")
	p("answered at once by a bare claim (`FOR UPDATE SKIP LOCKED`, committed asynchronously)\n")
	p("and a completion on a connection of its own, as `pgworker run` does with no claim\n")
	p("cooldown; and pgworker's own insert into\n")
	p("`files.files` (its trigger counts the row and notifies `files_pending`) with a session\n")
	p("listening and no worker; and the queue through the SQL API, where that insert's\n")
	p("notifications are answered as `pgworker run` answers them (`files.claim_batch` for two\n")
	p("idle slots, committed asynchronously, and `files.complete_many`) by a loop with no\n")
	p("runtime. Server CPU per row as in the table above, from the start of the phase's inserts\n")
	p("to its last commit (to its last completion for the two queues); medians of the runs.\n\n")
	phases := []struct{ id, name string }{{"insert", "bare insert"}, {"notify", "insert and NOTIFY, nobody listening"},
		{"listen", "insert and NOTIFY, a session listening"},
		{"queue", "the bare queue: insert, NOTIFY, claim, completion"}, {"enqueue", "pgworker's insert into files.files, a session listening"},
		{"api", "the queue through the SQL API: pgworker's insert, claim, completion"}}
	p("| rate | phase | runs | rows/s | server CPU per row | WAL per row |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, rate := range rates {
		for _, ph := range phases {
			cpu := rp.notifyFigures(rate, ph.id, "server_cpu_ms_per_row")
			if len(cpu) == 0 {
				continue
			}
			// Every run has the figures of its phases; an older one may lack some.
			fig := func(key string) string {
				if xs := rp.notifyFigures(rate, ph.id, key); len(xs) > 0 {
					return thousands(median(xs))
				}
				return "?"
			}
			p("| %s | %s | %d | %s | **%.3f ms** | %s B |\n", rateName(rate), ph.name, len(cpu),
				fig("rows_per_sec"), median(cpu), fig("wal_bytes_per_row"))
		}
	}
	p("\n")
	p("The two queues' pickup: from an insert's commit returning to the notification reaching\n")
	p("the listening session (the bare queue's notifications name their rows; pgworker's name\n")
	p("the queue), and to the answer of the claim that took the row; the claim's round trip.\n")
	p("p50 / p99 in ms, each run.\n\n")
	p("| rate | queue | run | pickup | commit → notification | claim |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, rate := range rates {
		for _, q := range []struct{ id, name string }{{"queue", "bare"}, {"api", "SQL API"}} {
			i := 0
			for _, r := range rs {
				ph := result(phase(r, q.id))
				if r.n("rate") != rate || ph == nil {
					continue
				}
				i++
				pp := func(k string) string {
					if _, ok := ph.num(k + ".p50_ms"); !ok {
						return "–"
					}
					return fmt.Sprintf("%.3f / %.3f", ph.n(k+".p50_ms"), ph.n(k+".p99_ms"))
				}
				p("| %s | %s | %d | **%s** | %s | %s |\n", rateName(rate), q.name, i, pp("pickup"), pp("commit_to_notify"), pp("claim"))
			}
		}
	}
	p("\n")
}

func renderClaimDepth(p printer, rp *report) {
	r := rp.find("pgworker", "claim-depth", nil)
	if r == nil {
		return
	}
	p("### Claim at depth\n\n")
	p("The time of one committed claim of one row for one slot, with the table grown to each\n")
	p("size (%g%% of the rows pending, the rest done); median of %g claims of each function,\n", r.n("pending_percent"), r.n("claims"))
	p("client round trip on the same machine. The server column is the server's own mean per\n")
	p("call (pg_stat_user_functions). The runtime claims with `files.claim_batch`, and with\n")
	p("`files.claim` when one slot is idle.\n\n")
	p("| rows | pending | build | claim_batch p50 | p99 | server | claim p50 | p99 | server |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	ds, _ := r["depths"].([]any)
	for _, x := range ds {
		m, _ := x.(map[string]any)
		d := result(m)
		p("| %s | %s | %.1f s | **%.3f ms** | %.3f ms | %s | %.3f ms | %.3f ms | %s |\n", thousands(d.n("rows")), thousands(d.n("pending")), d.n("build_ms")/1000,
			d.n("claim_batch.p50_ms"), d.n("claim_batch.p99_ms"), optMS(d, "claim_batch_server_ms"),
			d.n("claim.p50_ms"), d.n("claim.p99_ms"), optMS(d, "claim_server_ms"))
	}
	p("\nRatio of the medians, largest depth over smallest: claim_batch %.2fx, claim %.2fx.\n\n", r.n("ratio_claim_batch"), r.n("ratio_claim"))
}

func optMS(r result, key string) string {
	if v, ok := r.num(key); ok {
		return fmt.Sprintf("%.3f ms", v)
	}
	return "–"
}

func renderHerd(p printer, rp *report) {
	r := rp.find("pgworker", "herd", nil)
	if r == nil {
		return
	}
	p("### Herd\n\n")
	p("%g worker runtimes in one process, each with its own pool and LISTEN connection, %g idle\n", r.n("processes"), r.n("slots"))
	p("slots each; %g rows inserted one at a time, each once the previous one was taken and\n", r.n("rows"))
	p("%g ms passed. Claim queries counted by the server (pg_stat_user_functions) and by the\n", r.n("interval_ms"))
	p("runtimes.\n\n")
	p("| claim_batch calls | claim calls | per row | per process per wake-up | runtimes' count | of them empty | most from one process, per row |\n")
	p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	p("| %s | %s | %.2f | **%.3f** | %s | %s | %.2f |\n\n", thousands(r.n("claim_batch_calls")), thousands(r.n("claim_calls")), r.n("claim_queries_per_row"),
		r.n("claim_queries_per_process_per_wakeup"), thousands(r.n("client_claims")), thousands(r.n("client_races_lost")), r.n("max_process_claims_per_row"))
}

func renderEnqueue(p printer, rp *report) {
	rs := rp.all("pgworker", "enqueue")
	if len(rs) == 0 {
		return
	}
	p("### Enqueue\n\n")
	p("`pgworker enqueue` itself, fed generated sources on standard input; connecting included.\n\n")
	p("| rows | batch size | elapsed | rows/s |\n| ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		p("| %s | %s | %.2f s | **%s** |\n", thousands(r.n("rows")), thousands(r.n("batch_size")), r.n("elapsed_ms")/1000, thousands(r.n("rows_per_sec")))
	}
	p("\n")
}

func renderPipeline(p printer, rp *report) {
	rs := rp.all("pgworker", "pipeline")
	if len(rs) == 0 {
		return
	}
	p("### Pipeline\n\n")
	p("Download, run the backend, upload, on objects in MinIO: through the queue and the worker\n")
	p("runtime; as a loop calling the same pipeline handler on synthetic jobs with no queue\n")
	p("(direct); and through a bare queue, as many connections as slots each claiming one row\n")
	p("of a table of files.files' shape with FOR UPDATE SKIP LOCKED, running it and completing\n")
	p("it, with no queue software. The rounds take turns; the overheads are the queues' times\n")
	p("over the direct loop's.\n\n")
	p("| rows | object | slots | backend | rounds | queued rows/s | bare rows/s | direct rows/s | overhead | bare overhead |\n")
	p("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		bare, bareOver := "", ""
		if over, ok := r.num("bare_overhead_pct"); ok {
			bare, bareOver = thousands(r.n("bare.rows_per_sec")), fmt.Sprintf("%.1f%%", over)
		}
		p("| %s | %s B | %g | `%s` | %g | %s | %s | %s | **%.1f%%** | %s |\n", thousands(r.n("rows")), thousands(r.n("object_bytes")),
			r.n("slots"), r.str("exec"), r.n("rounds"), thousands(r.n("queued.rows_per_sec")), bare, thousands(r.n("direct.rows_per_sec")),
			r.n("overhead_pct"), bareOver)
	}
	p("\n")
	for _, r := range rs {
		d, q, b := r.floats("round_ms.direct"), r.floats("round_ms.queued"), r.floats("round_ms.bare")
		if len(d) == 0 || len(d) != len(q) || len(d) != len(b) {
			continue
		}
		p("Each round's overheads (queued / bare): ")
		for i := range d {
			if i > 0 {
				p(", ")
			}
			p("%.1f%% / %.1f%%", (q[i]/d[i]-1)*100, (b[i]/d[i]-1)*100)
		}
		p(".\n\n")
	}
	var cpu []result
	for _, r := range rs {
		if _, ok := r.num("cpu_ms_per_row.direct.process"); ok { // not in a run from before the ways' CPU was measured
			cpu = append(cpu, r)
		}
	}
	if len(cpu) == 0 {
		return
	}
	p("CPU time a row, in ms, of each way's timed parts (the rows' load left out): the server's processes;\n")
	p("the benchmark's, whose handlers download and upload and, queued, run the worker runtime; the backend\n")
	p("program's; all the machine's CPUs, busy (whatever ran on them, MinIO and the kernel's threads\n")
	p("included) and idle. A dash is a figure that could not be read.\n\n")
	p("| rows | way | database | benchmark process | program | machine busy | machine idle |\n")
	p("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range cpu {
		for _, way := range []string{"direct", "queued", "bare"} {
			c := "cpu_ms_per_row." + way + "."
			p("| %s | %s | %s | %.3f | %.3f | %s | %s |\n", thousands(r.n("rows")), way, msOrDash(r, c+"server"), r.n(c+"process"),
				r.n(c+"program"), msOrDash(r, c+"machine"), msOrDash(r, c+"idle"))
		}
	}
	p("\n")
}

// msOrDash prints a figure in ms to three places, or a dash where there is none.
func msOrDash(r result, path string) string {
	if v, ok := r.num(path); ok {
		return fmt.Sprintf("%.3f", v)
	}
	return "—"
}

func renderViews(p printer, rp *report) {
	v := rp.find("pgworker", "views", nil)
	if v == nil {
		return
	}
	p("### Operator reads at scale\n\n")
	p("What operators, `pgworker status`, `scale-hint`, the metrics endpoint and the dashboard read, each\n")
	p("timed %s times on a table of %s rows (85%% done, 5%% failed, 10%% pending), %s attempts and\n",
		thousands(v.n("reads")), thousands(v.n("rows")), thousands(v.n("attempts")))
	p("%s live slots each holding a row (and as many stopped), seeded by the server in %.0f s.\n\n", thousands(v.n("slots")), v.n("seed_s"))
	p("| read | p50 | p99 |\n| --- | ---: | ---: |\n")
	for _, q := range viewQueries(v) {
		p("| %s | **%.2f ms** | %.2f ms |\n", q.str("name"), q.n("p50_ms"), q.n("p99_ms"))
	}
	p("\n")
}

func renderLongTx(p printer, rp *report) {
	rs := rp.all("pgworker", "long-tx")
	if len(rs) == 0 {
		return
	}
	p("### Long transaction beside the queue\n\n")
	p("A producer and one worker process (or several, each with its own connections, woken by\n")
	p("every notification), through phases clean, idle-in-tx (a REPEATABLE READ\n")
	p("transaction on a connection of its own holds its snapshot open, so no dead row can be\n")
	p("removed) and recovery. Pickup runs from the moment the insert's commit returned to the\n")
	p("producer to the handler's start, as in bench latency (0 for a row started before the\n")
	p("answer came back); from created_at, the insert's own round trip and commit count too;\n")
	p("insert is the producer's inserts' round trips (one every 10 ms, each of the rows due).\n")
	p("Depth is the rows inserted and not started; claim is the server's mean time per claim;\n")
	p("WAL is what the server wrote in the phase per row done; the table's statistics are at\n")
	p("the end of the phase.\n\n")
	p("| load | slots | phase | rows/s | pickup p50 | pickup p99 | from created_at p50 / p99 | insert p99 / max | depth at end | claim | WAL per row | dead tuples | table | claim index |\n")
	p("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		load := fmt.Sprintf("%s rows/s", thousands(r.n("rate")))
		if r.n("depth") > 0 {
			load = fmt.Sprintf("peak (depth %s)", thousands(r.n("depth")))
		}
		slots := fmt.Sprintf("%g", r.n("slots"))
		if n := r.n("processes"); n > 1 {
			slots = fmt.Sprintf("%g processes of %g", n, r.n("slots"))
		}
		ps, _ := r["phases"].([]any)
		for _, x := range ps {
			ph := result(x.(map[string]any))
			// A run from before the inserts were timed: its pickup is
			// from created_at alone.
			p50, p99, created, insert, wal := "", "", fmt.Sprintf("%.1f / %.1f ms", ph.n("pickup.p50_ms"), ph.n("pickup.p99_ms")), "", ""
			if insertsTimed(ph) {
				p50, p99 = fmt.Sprintf("%.1f ms", ph.n("pickup_from_return.p50_ms")), fmt.Sprintf("**%.1f ms**", ph.n("pickup_from_return.p99_ms"))
				insert = fmt.Sprintf("%.1f / %.1f ms", ph.n("insert.p99_ms"), ph.n("insert.max_ms"))
			}
			if v := ph.n("wal_bytes_per_row"); v > 0 {
				wal = thousands(v) + " B"
			}
			p("| %s | %s | %s (%gs) | **%s** | %s | %s | %s | %s | %s | %.2f ms | %s | %s | %.1f MiB | %.2f MiB |\n", load, slots,
				ph.str("name"), ph.n("seconds"), thousands(ph.n("rows_per_sec")), p50, p99, created, insert,
				thousands(ph.n("depth_end")), ph.n("claim_ms"), wal, thousands(ph.n("end.dead_tuples")), ph.n("end.table_bytes")/(1<<20),
				ph.n("end.claim_index_bytes")/(1<<20))
		}
	}
	p("\n")
}

func renderSoak(p printer, rp *report) {
	rs := rp.all("pgworker", "soak")
	if len(rs) == 0 {
		return
	}
	p("### Soak\n\n")
	p("A fixed rate for a long time, with one worker process; samples over time in the chart.\n\n")
	p("| rate | slots | duration | prune every | rows/s | pickup p50 | pickup p99 | depth max | dead tuples at end | table at end | indexes at end |\n")
	p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		prune := "never"
		if v := r.n("prune_every_sec"); v > 0 {
			prune = fmt.Sprintf("%gs", v)
		}
		p("| %s | %g | %s | %s | %s | %.1f ms | %.1f ms | %s | %s | %.1f MiB | %.1f MiB |\n", thousands(r.n("rate")), r.n("slots"),
			human.Duration(time.Duration(r.n("duration_sec"))*time.Second), prune, thousands(r.n("summary.rows_per_sec")),
			r.n("summary.pickup.p50_ms"), r.n("summary.pickup.p99_ms"), thousands(r.n("summary.depth_max")),
			thousands(r.n("summary.end.dead_tuples")), r.n("summary.end.table_bytes")/(1<<20), r.n("summary.end.index_bytes")/(1<<20))
	}
	p("\n")
	if rp.soakChart != "" {
		p("![soak: rows/s, pickup, sizes and dead tuples over time](%s)\n\n", rp.soakChart)
	}
}

// dedupe lists each command once, in the order of first use, noting how
// many times it ran.
func dedupe(cmds []string) []string {
	count := map[string]int{}
	var order []string
	for _, c := range cmds {
		if count[c] == 0 {
			order = append(order, c)
		}
		count[c]++
	}
	for i, c := range order {
		if n := count[c]; n > 1 {
			order[i] = fmt.Sprintf("%s  # %d runs", c, n)
		}
	}
	return order
}

// thousands formats n rounded (half to even), with separators: 12,345.
func thousands(n float64) string { return human.Int(int64(math.RoundToEven(n))) }

// short formats a row count as 10k or 10M.
func short(n float64) string {
	switch {
	case n >= 1e6 && int64(n)%1e6 == 0:
		return fmt.Sprintf("%dM", int64(n)/1e6)
	case n >= 1e3 && int64(n)%1e3 == 0:
		return fmt.Sprintf("%dk", int64(n)/1e3)
	}
	return thousands(n)
}

// floor2 writes a ratio with two decimals, rounded down, so that a ratio
// just short of a goal never reads as the goal.
func floor2(r float64) string {
	return strconv.FormatFloat(math.Floor(r*100)/100, 'f', 2, 64)
}
