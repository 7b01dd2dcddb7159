package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/bench/peers/internal/benchdb"
)

func TestRunThroughputJSON(t *testing.T) {
	t.Parallel()
	// The command makes and drops <db>_riverbench beside this database.
	url := benchdb.New(t)
	var out, errOut bytes.Buffer
	err := run([]string{"throughput", "--database-url", url, "--rows", "200", "--slots", "10", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errOut.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	for _, k := range []string{"rows_per_sec", "rows", "slots", "river_version", "go_version"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, out.String())
		}
	}
	if res["rows"] != 200.0 || res["slots"] != 10.0 {
		t.Errorf("rows, slots = %v, %v; want 200, 10", res["rows"], res["slots"])
	}
}

func TestRunLatencyDedicated(t *testing.T) {
	t.Parallel()
	url := benchdb.New(t)
	args := []string{"latency", "--dedicated", "--database-url", url, "--rows", "200", "--rate", "100", "--slots", "10", "--tuned"}
	var out, errOut bytes.Buffer
	if err := run(args, &out, &errOut); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errOut.String())
	}
	if s := out.String(); !strings.Contains(s, "p50") || !strings.Contains(s, "p99") || !strings.Contains(s, "fetch cooldown 1ms") {
		t.Errorf("text output = %q", s)
	}
	// A second run in the same dedicated database would meet the first's jobs.
	out.Reset()
	errOut.Reset()
	if err := run(args, &out, &errOut); err == nil || !strings.Contains(err.Error(), "river_job is not empty") {
		t.Errorf("second run in a used dedicated database: err = %v, want river_job is not empty", err)
	}
}

func TestRunUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "name a mode"},
		{[]string{"bogus"}, "name a mode"},
		{[]string{"throughput", "--database-url", ""}, "missing database URL"},
		{[]string{"latency", "--database-url", "postgres://x/y", "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Setenv("RIVERBENCH_DATABASE_URL", "")
			t.Setenv("PGWORKER_DATABASE_URL", "")
			t.Setenv("DATABASE_URL", "")
			var out, errOut bytes.Buffer
			err := run(tt.args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
