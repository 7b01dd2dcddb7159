package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/harness"
)

// TestFileStores runs the sample backend, summarize, with file:// input and
// output stores and sources listed by `pgworker enqueue --from`: the good
// files are summarized, each output is where the manifest says with the
// recorded checksum, and a damaged file fails with summarize's reason.
func TestFileStores(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out/results")
	inputs := sampleInputs(t, true)
	keys := []string{"notes/" + firstKey(inputs, "notes/"), "logs/" + firstKey(inputs, "logs/"),
		"sales/sales-001.csv", "sales/damaged-01.csv"}
	for _, k := range keys {
		s.Put(in, k, inputs[k])
	}
	summarize, err := filepath.Abs("../testdata/backend/summarize")
	if err != nil {
		t.Fatal(err)
	}
	res := s.Pgworker(nil, "enqueue", "--from", in, "--max-attempts", "1")
	if res.Code != 0 || !strings.Contains(res.Stdout, "queued 4,") {
		t.Fatalf("enqueue --from: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	s.start("--exec", summarize+" {input} {output_dir}", "--slots", "2", "--input-store", in, "--output-store", out)
	s.WaitSettled(2 * time.Minute)

	for _, r := range s.rows() {
		key := strings.TrimPrefix(r.Source, in+"/")
		if key == r.Source {
			t.Errorf("row %d: source %q is not a URL inside %s", r.ID, r.Source, in)
		}
		if strings.Contains(key, "damaged-") {
			as := s.attempts(r.ID)
			if r.State != "failed" || !strings.Contains(r.lastError(), "exit status 2") ||
				!strings.Contains(r.lastError(), "not a sales file") || len(as) != 1 || as[0].ExitCode == nil || *as[0].ExitCode != 2 {
				t.Errorf("row %d (%s): state %s, last_error %q; want failed with summarize's reason", r.ID, key, r.State, r.lastError())
			}
			continue
		}
		if r.State != "done" {
			t.Errorf("row %d (%s): %s (%s), want done", r.ID, key, r.State, r.lastError())
			continue
		}
		m, err := r.manifest()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(m.OutputRoot, out+"/") {
			t.Errorf("row %d: output root %s is not in the output store %s", r.ID, m.OutputRoot, out)
		}
		if m.Input.SHA256 != harness.SHA256Hex(inputs[key]) {
			t.Errorf("row %d: input sha256 %s, want %s", r.ID, m.Input.SHA256, harness.SHA256Hex(inputs[key]))
		}
		got, err := s.checkOutputs(r.ID, m)
		if err != nil {
			t.Error(err)
			continue
		}
		if len(got) != 2 || !strings.HasPrefix(string(got["SHA256SUMS"]), harness.SHA256Hex(inputs[key])+"  ") ||
			!strings.Contains(string(got["summary.txt"]), filepath.Base(key)) {
			t.Errorf("row %d (%s): outputs %q", r.ID, key, got)
		}
	}
}

// firstKey returns the name of the first input under dir.
func firstKey(inputs map[string][]byte, dir string) string {
	for _, k := range sortedKeys(inputs) {
		if strings.HasPrefix(k, dir) {
			return strings.TrimPrefix(k, dir)
		}
	}
	return ""
}
