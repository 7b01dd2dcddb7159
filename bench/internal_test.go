package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"testing/iotest"
	"time"
)

func TestPercentiles(t *testing.T) {
	t.Parallel()
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 ... 1, unsorted
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want Percentiles
	}{
		{"empty", nil, Percentiles{}},
		{"one", ms(7), Percentiles{P50MS: 7, P90MS: 7, P99MS: 7, MaxMS: 7, MeanMS: 7}},
		{"nearest rank", ms(hundred...), Percentiles{P50MS: 50, P90MS: 90, P99MS: 99, MaxMS: 100, MeanMS: 50.5}},
		{"negative", ms(-1, 1, 3), Percentiles{P50MS: 1, P90MS: 3, P99MS: 3, MaxMS: 3, MeanMS: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentiles(tc.in); got != tc.want {
				t.Errorf("percentiles = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestClaimSteps(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	claim := func(sent, answered int, empty bool) claimSpan {
		return claimSpan{span: span{sent: at(sent), answered: at(answered)}, empty: empty}
	}
	// Two claims overlap (10-14 and 12-20), then none is under way from 20
	// to 50; the interval began with the last answer at 4.
	claims := []claimSpan{claim(10, 14, false), claim(12, 20, true), claim(50, 51, true)}
	n, empty, rtt, idle, last := claimSteps(claims, at(4))
	if n != 3 || empty != 2 {
		t.Errorf("%d claims, %d empty; want 3, 2", n, empty)
	}
	if rtt.P50MS != 4 || rtt.MaxMS != 8 {
		t.Errorf("round trips %+v, want p50 4 ms, max 8 ms", rtt)
	}
	if idle != 30*time.Millisecond || !last.Equal(at(51)) {
		t.Errorf("idle %v, last answer %v; want 30ms, %v", idle, last, at(51))
	}
	// With no answer before them, the time before the first claim is not
	// counted; with no claims, nothing is, and the last answer stays.
	if _, _, _, idle, _ := claimSteps(claims[:2], time.Time{}); idle != 0 {
		t.Errorf("idle %v with no answer before, want 0", idle)
	}
	if n, _, _, idle, last := claimSteps(nil, at(4)); n != 0 || idle != 0 || !last.Equal(at(4)) {
		t.Errorf("no claims: %d, idle %v, last %v", n, idle, last)
	}
}

func TestLongestGap(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ts := []time.Time{at(10), at(12), at(40), at(45)}
	if gap, last := longestGap(ts, at(0)); gap != 28*time.Millisecond || !last.Equal(at(45)) {
		t.Errorf("gap %v, last %v; want 28ms, %v", gap, last, at(45))
	}
	// From the last of the interval before: its 100 ms without one count.
	if gap, _ := longestGap(ts, at(-100)); gap != 110*time.Millisecond {
		t.Errorf("gap %v, want 110ms", gap)
	}
	if gap, last := longestGap(nil, at(3)); gap != 0 || !last.Equal(at(3)) {
		t.Errorf("none: gap %v, last %v", gap, last)
	}
}

func TestPickupsFromReturn(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Rows 0-9 came back at 10 ms, 10-14 at 50.
	p := &producer{returned: []insertReturn{{first: 0, last: 9, at: at(10)}, {first: 10, last: 14, at: at(50)}}}
	starts := []rowStart{
		{seq: 3, at: at(12), created: 20 * time.Millisecond},
		{seq: 9, at: at(30), created: 38 * time.Millisecond},
		{seq: 10, at: at(45), created: 40 * time.Millisecond}, // before its insert's answer
		{seq: 14, at: at(53), created: 48 * time.Millisecond},
		{seq: 15, at: at(60), created: 1 * time.Millisecond}, // its insert not answered yet
		{seq: -1, at: at(61), created: 7 * time.Millisecond}, // not the producer's
	}
	created, returned := p.pickups(starts)
	if want := []time.Duration{20, 38, 40, 48, 1, 7}; len(created) != len(want) {
		t.Fatalf("from created_at %v", created)
	} else {
		for i := range want {
			if created[i] != want[i]*time.Millisecond {
				t.Errorf("from created_at %v, want %v ms", created, want)
				break
			}
		}
	}
	want := []time.Duration{2 * time.Millisecond, 20 * time.Millisecond, 0, 3 * time.Millisecond, 0}
	if !slices.Equal(returned, want) {
		t.Errorf("from the insert's return %v, want %v", returned, want)
	}
}

func TestLines(t *testing.T) {
	t.Parallel()
	if err := iotest.TestReader(newLines("x/", 3), []byte("x/000000001\nx/000000002\nx/000000003\n")); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(iotest.OneByteReader(newLines("enqueue/", 12345)))
	n := 0
	for sc.Scan() {
		n++
		if want := fmt.Sprintf("enqueue/%09d", n); sc.Text() != want {
			t.Fatalf("line %d = %q, want %q", n, sc.Text(), want)
		}
	}
	if n != 12345 {
		t.Errorf("%d lines, want 12345", n)
	}
}

// A payload of n bytes is a JSON object of at most n bytes, within one item
// of n, and none is made below the size of one item.
func TestPayloadOf(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 10, 33, 34, 40, 1000, 10000} {
		p := payloadOf(n)
		if n < 34 { // {"items":[{"i":0,"v":"01234567"}]}
			if p != nil {
				t.Errorf("payloadOf(%d) = %q, want nil", n, p)
			}
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(p, &v); err != nil || len(p) > n || len(p) < n-30 {
			t.Errorf("payloadOf(%d): %d bytes, %v", n, len(p), err)
		}
	}
}

// TestCPUTimesLoseAFailedReading: a time that a reading could not read
// makes the sum's unknown; the others still add.
func TestCPUTimesLoseAFailedReading(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	var sum cpuTimes
	sum.add(cpuTimes{server: 10 * ms, process: 5 * ms, program: 0, machine: 100 * ms, idle: 20 * ms},
		cpuTimes{server: 30 * ms, process: 9 * ms, program: 4 * ms, machine: 150 * ms, idle: 30 * ms})
	if got, want := sum.perRow(4), (PipelineCPU{Server: new(5.0), Process: 1, Program: 1, Machine: new(12.5), Idle: new(2.5)}); !samePipelineCPU(got, want) {
		t.Errorf("per row %s, want %s", fmtPipelineCPU(got), fmtPipelineCPU(want))
	}
	// The server lost after a round's start: its time is unknown from then on.
	sum.add(cpuTimes{server: 30 * ms, process: 9 * ms, program: 4 * ms, machine: 150 * ms, idle: 30 * ms},
		cpuTimes{serverLost: true, process: 13 * ms, program: 8 * ms, machine: 190 * ms, idle: 34 * ms})
	if got, want := sum.perRow(4), (PipelineCPU{Process: 2, Program: 2, Machine: new(22.5), Idle: new(3.5)}); !samePipelineCPU(got, want) {
		t.Errorf("per row %s, want %s", fmtPipelineCPU(got), fmtPipelineCPU(want))
	}
	// /proc/stat unreadable at a round's start.
	sum.add(cpuTimes{machineLost: true, serverLost: true}, cpuTimes{process: 4 * ms, program: 4 * ms})
	if got, want := sum.perRow(4), (PipelineCPU{Process: 3, Program: 3}); !samePipelineCPU(got, want) {
		t.Errorf("per row %s, want %s", fmtPipelineCPU(got), fmtPipelineCPU(want))
	}
}

func samePipelineCPU(a, b PipelineCPU) bool { return fmtPipelineCPU(a) == fmtPipelineCPU(b) }

func fmtPipelineCPU(c PipelineCPU) string {
	f := func(p *float64) string {
		if p == nil {
			return "unknown"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("server %s, process %v, program %v, machine %s, idle %s", f(c.Server), c.Process, c.Program, f(c.Machine), f(c.Idle))
}

func TestParseCPULine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line       string
		busy, idle time.Duration
		ok         bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"cpu  100 2 30 500 7 1 2 40 9 0", 1350 * time.Millisecond, 5070 * time.Millisecond, true},
		{"cpu 100 2 30 500 7 1 2 40", 1350 * time.Millisecond, 5070 * time.Millisecond, true},
		{"cpu 100 2 30 500 7 1 2", 0, 0, false},
		{"cpu0 100 2 30 500 7 1 2 40 9 0", 0, 0, false},
		{"cpu 100 2 x 500 7 1 2 40 9 0", 0, 0, false},
	} {
		busy, idle, ok := parseCPULine(tc.line)
		if busy != tc.busy || idle != tc.idle || ok != tc.ok {
			t.Errorf("parseCPULine(%q) = %v, %v, %v; want %v, %v, %v", tc.line, busy, idle, ok, tc.busy, tc.idle, tc.ok)
		}
	}
}
