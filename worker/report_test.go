package worker

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// The hand-written encoding of a report is the JSON that files.complete and
// files.fail read, member for member.
func TestReportMarshal(t *testing.T) {
	zero, code := 0, 3
	for _, r := range []report{
		{Duration: 0},
		{Duration: 12345 * time.Microsecond, ExitCode: &zero},
		{Duration: 1e9 * time.Millisecond, ExitCode: &code, StderrTail: "line \"one\"\n\ttwo \u2028 \\ end"},
		{Duration: time.Microsecond, Output: json.RawMessage(`{"outputs":[{"key":"a/b","size":3}]}`)},
		{Duration: 7 * time.Millisecond, ExitCode: &code, StderrTail: "x", Output: json.RawMessage(`[1,2]`)},
		{Duration: 1050 * time.Microsecond},
		{Duration: 30*time.Minute + 7*time.Nanosecond}, // below the microsecond: dropped
		{Duration: 2*time.Second + 340*time.Microsecond},
	} {
		got := r.marshal()
		var back map[string]any
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Fatalf("%q is not JSON: %v", got, err)
		}
		want := map[string]any{"duration_ms": float64(r.Duration.Microseconds()) / 1000}
		if r.ExitCode != nil {
			want["exit_code"] = float64(*r.ExitCode)
		}
		if r.StderrTail != "" {
			want["stderr_tail"] = r.StderrTail
		}
		if r.Output != nil {
			var out any
			if err := json.Unmarshal(r.Output, &out); err != nil {
				t.Fatal(err)
			}
			want["output"] = out
		}
		if !reflect.DeepEqual(back, want) {
			t.Errorf("marshal() = %s, decodes to %v, want %v", got, back, want)
		}
	}
}
