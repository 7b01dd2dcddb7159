package worker

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The hand-written encoding of a report is the JSON that files.complete and
// files.fail read, member for member.
func TestReportMarshal(t *testing.T) {
	zero, code := 0, 3
	for _, r := range []report{
		{DurationMS: 0},
		{DurationMS: 12.345, ExitCode: &zero},
		{DurationMS: 1e9, ExitCode: &code, StderrTail: "line \"one\"\n\ttwo \u2028 \\ end"},
		{DurationMS: 0.001, Output: json.RawMessage(`{"outputs":[{"key":"a/b","size":3}]}`)},
		{DurationMS: 7, ExitCode: &code, StderrTail: "x", Output: json.RawMessage(`[1,2]`)},
	} {
		got := r.marshal()
		var back map[string]any
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Fatalf("%q is not JSON: %v", got, err)
		}
		want := map[string]any{"duration_ms": r.DurationMS}
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
