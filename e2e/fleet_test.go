package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/harness"
)

// inputsDir holds the sample data set.
const inputsDir = "../testdata/inputs"

// sampleInputs returns the sample inputs by key (path below inputsDir),
// without the damaged ones unless damaged is set.
func sampleInputs(t *testing.T, damaged bool) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(inputsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !damaged && strings.HasPrefix(d.Name(), "damaged-") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(inputsDir, p)
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestFleet runs three `pgworker run` processes of four slots each on 300
// rows (the 200 good sample files, 100 of them twice, enqueued without
// keys) through MinIO: every
// row is done exactly once, its outputs are where its manifest says with the
// recorded checksums, and files.worker_metrics accounts for every row.
func TestFleet(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	inputs := sampleInputs(t, false)
	keys := sortedKeys(inputs)
	if len(keys) != 200 {
		t.Fatalf("want the 200 good sample files, found %d", len(keys))
	}
	if errs := parallel(len(keys), 8, func(i int) error {
		return s.TryPut(in, keys[i], inputs[keys[i]])
	}); len(errs) > 0 {
		t.Fatal(errs)
	}

	// cp forks nothing: the test measures pgworker, not the backend.
	var procs []*proc
	for range 3 {
		procs = append(procs, s.start("--exec", "cp -- {input} {output_dir}/copy", "--slots", "4",
			"--input-store", in, "--output-store", out+"/results"))
	}
	for _, p := range procs {
		s.waitSlots(time.Minute, p.Pid(), 4, "active")
	}

	sources := append(append([]string{}, keys...), keys[:100]...)
	res := s.Pgworker(strings.NewReader(strings.Join(sources, "\n")+"\n"), "enqueue", "--no-key", "--chunk-size", "128")
	if res.Code != 0 || !strings.Contains(res.Stdout, "queued 300 rows") {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	start := time.Now()
	s.WaitSettled(3 * time.Minute)
	t.Logf("300 rows settled in %s", time.Since(start).Round(time.Millisecond))

	rows := s.rows()
	if len(rows) != 300 {
		t.Fatalf("%d rows, want 300", len(rows))
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE state <> 'done'`); n != 0 {
		t.Fatalf("%d rows are not done", n)
	}
	// One done attempt per row, and it is the one the result belongs to; the
	// result is stored once, on the row.
	if n := s.MustCount(`SELECT count(*) FROM files.files f WHERE (SELECT count(*) FROM files.attempts a
		WHERE a.file_id = f.id AND a.outcome = 'done') <> 1`); n != 0 {
		t.Errorf("%d rows do not have exactly one done attempt", n)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files f JOIN files.attempts a ON a.file_id = f.id AND a.outcome = 'done'
		WHERE f.result->>'worker_id' IS DISTINCT FROM a.worker_id OR (f.result->>'attempt')::int IS DISTINCT FROM a.attempt
		   OR a.output IS NOT NULL`); n != 0 {
		t.Errorf("%d rows have a result that is not their done attempt's", n)
	}

	errs := parallel(len(rows), 8, func(i int) error {
		r := rows[i]
		m, err := r.manifest()
		if err != nil {
			return err
		}
		want := inputs[r.Source]
		if m.Input.SHA256 != harness.SHA256Hex(want) || m.Input.Size != int64(len(want)) {
			return fmt.Errorf("row %d (%s): manifest input %+v does not match the file", r.ID, r.Source, m.Input)
		}
		got, err := s.checkOutputs(r.ID, m)
		if err != nil {
			return err
		}
		if len(got) != 1 || string(got["copy"]) != string(want) {
			return fmt.Errorf("row %d (%s): outputs %v, want one copy of the input", r.ID, r.Source, sortedKeys(got))
		}
		return nil
	})
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-10)
			break
		}
		t.Error(err)
	}

	// files.worker_metrics accounts for every row, and every process did some.
	var total int
	for _, p := range procs {
		done := s.MustCount(`SELECT coalesce(sum(done), 0) FROM files.worker_metrics WHERE pid = $1`, p.Pid())
		failed := s.MustCount(`SELECT coalesce(sum(failed), 0) FROM files.worker_metrics WHERE pid = $1`, p.Pid())
		t.Logf("%s (pid %d): %d done, %d failed", p.Name, p.Pid(), done, failed)
		if done == 0 {
			t.Errorf("%s did no row", p.Name)
		}
		if failed != 0 {
			t.Errorf("%s failed %d attempts", p.Name, failed)
		}
		total += done
	}
	if total != 300 {
		t.Errorf("files.worker_metrics: %d rows done by the three processes, want 300", total)
	}

	for _, p := range procs {
		p.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.Wait(time.Minute); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", p.Name, code)
		}
		if st := s.slotStates(p.Pid()); strings.Join(st, ",") != "stopped,stopped,stopped,stopped" {
			t.Errorf("%s: slots %v after a clean stop, want 4 stopped", p.Name, st)
		}
	}
}
