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
