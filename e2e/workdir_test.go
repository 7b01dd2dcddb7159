package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkDirRefusedByRun: pgworker run refuses a work directory that other
// users can write to, at once (exit status 2), and says how to fix it.
func TestWorkDirRefusedByRun(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	dir := filepath.Join(s.Dir, "shared-work")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	res := s.Pgworker(nil, "run", "--exec", "/bin/true", "--work-dir", dir, "--output-store", s.FileStore("out"))
	if res.Code != 2 || !strings.Contains(res.Stderr, "writable by other users") || !strings.Contains(res.Stderr, "chmod go-w "+dir) {
		t.Errorf("exit %d, stderr %q; want 2 and a message that says to run chmod go-w", res.Code, res.Stderr)
	}
}

// TestOutputBounds: rows whose program writes more files or bytes than
// --max-output-files and --max-output-bytes allow fail at once, with
// nothing uploaded and an error that names the flag; a row within the
// bounds is done.
func TestOutputBounds(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	for _, k := range []string{"files", "bytes", "fine"} {
		s.Put(in, k, []byte(k))
	}
	backend := s.script("writer", `case "$PGWORKER_SOURCE" in
files) for i in 1 2 3; do echo $i > "$2/f$i"; done ;;
bytes) truncate -s 3M "$2/sparse" ;;
fine) echo ok > "$2/ok" ;;
esac
`)
	s.Enqueue(nil, "files", "bytes", "fine")
	s.start("--exec", backend+" {input} {output_dir}", "--input-store", in, "--output-store", out,
		"--max-output-files", "2", "--max-output-bytes", "1MiB")
	s.WaitSettled(2 * time.Minute)
	want := map[string]string{"files": "--max-output-files", "bytes": "--max-output-bytes"}
	for _, r := range s.rows() {
		flag, bounded := want[r.Source]
		switch {
		case !bounded && r.State != "done":
			t.Errorf("row %s: %s (%s), want done", r.Source, r.State, r.lastError())
		case bounded && (r.State != "failed" || r.Attempt != 1 || !strings.Contains(r.lastError(), flag)):
			t.Errorf("row %s: %s after %d attempts, %q; want failed at once, naming %s", r.Source, r.State, r.Attempt, r.lastError(), flag)
		}
	}
	entries, err := os.ReadDir(strings.TrimPrefix(out, "file://"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("the output store holds %d row directories, want 1 (the row within the bounds)", len(entries))
	}
}
