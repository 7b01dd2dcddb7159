package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
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

// TestCPUTimesLeaveOutUnread: a time that either reading could not read adds
// nothing, and the others still add.
func TestCPUTimesLeaveOutUnread(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	var sum cpuTimes
	sum.add(cpuTimes{server: 10 * ms, process: 5 * ms, program: 0, machine: 100 * ms, idle: 20 * ms},
		cpuTimes{server: 30 * ms, process: 9 * ms, program: 4 * ms, machine: 150 * ms, idle: 30 * ms})
	// The server read before and lost after, /proc/stat the other way round.
	sum.add(cpuTimes{server: 30 * ms, process: 9 * ms, program: 4 * ms, machine: unread, idle: unread},
		cpuTimes{server: unread, process: 10 * ms, program: 6 * ms, machine: 190 * ms, idle: 35 * ms})
	want := cpuTimes{server: 20 * ms, process: 5 * ms, program: 6 * ms, machine: 50 * ms, idle: 10 * ms}
	if sum != want {
		t.Errorf("sum %+v, want %+v", sum, want)
	}
	if got := sum.perRow(4); got != (PipelineCPU{Server: 5, Process: 1.25, Program: 1.5, Machine: 12.5, Idle: 2.5}) {
		t.Errorf("per row %+v", got)
	}
}

// TestMachineCPU: /proc/stat's busy and idle times grow.
func TestMachineCPU(t *testing.T) {
	t.Parallel()
	busy, idle, ok := machineCPU()
	if !ok || busy <= 0 || idle < 0 {
		t.Fatalf("machineCPU() = %v, %v, %v", busy, idle, ok)
	}
}
