package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDemo runs the whole demo, as make demo does, and checks what it
// promises: every sample row ends, the six damaged files fail with their
// error, the outputs stay, and nothing it started is left behind.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo: a PostgreSQL cluster, MinIO and three workers")
	}
	t.Parallel()
	out := filepath.Join(t.TempDir(), "demo-output")
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{Out: out}, &buf)
	text := buf.String()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, text)
	}
	inputs := countFiles(t, filepath.Join("..", "..", "..", "testdata", "inputs"), "")
	if rep.Total != inputs || rep.Done != inputs-6 || rep.Failed != 6 {
		t.Errorf("report: %+v, want %d rows, 6 failed\n%s", rep, inputs, text)
	}
	for _, want := range []string{
		"started 3 x pgworker run --slots 4",
		"pgworker dashboard on http://127.0.0.1:",
		"all 206 rows finished",
		"200 done, 6 failed",
		`pgworker_rows_claimed_total{queue="default"}`,
		"Per-worker metrics",
		"Failed rows (6",
		"Outputs: 200 summaries in",
		"Done in",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`sales/damaged-01\.csv\s+2\s+exit status 2: summarize: damaged-01\.csv: not a sales file`).MatchString(text) {
		t.Errorf("the failed rows lack damaged-01.csv's error:\n%s", text)
	}
	migrations, err := filepath.Glob(filepath.Join("..", "..", "..", "migrations", "*.sql"))
	if err != nil || !strings.Contains(text, "pgworker migrate up: "+strconv.Itoa(len(migrations))+" migrations applied") {
		t.Errorf("the demo did not apply the %d migrations (%v):\n%s", len(migrations), err, text)
	}
	// The per-worker table has the 12 slots, each with rows processed.
	if n := len(regexp.MustCompile(`(?m)^  \S+:\d+:\d+\s+[1-9]\d*\s`).FindAllString(text, -1)); n != 12 {
		t.Errorf("per-worker table: %d slots with work, want 12:\n%s", n, text)
	}
	if rep.MinIO != strings.Contains(text, "MinIO on ") {
		t.Errorf("MinIO %v, but the output says otherwise:\n%s", rep.MinIO, text)
	}
	if n := countFiles(t, filepath.Join(out, "results"), "summary.txt"); n != 200 {
		t.Errorf("%d summaries in the outputs, want 200", n)
	}
	for i := 1; i <= 3; i++ {
		b, err := os.ReadFile(filepath.Join(out, "logs", "worker-"+string(rune('0'+i))+".log"))
		if err != nil || !bytes.Contains(b, []byte(`"msg":"row finished"`)) || !bytes.Contains(b, []byte(`"msg":"stopped after a clean drain"`)) {
			t.Errorf("worker %d's log: %v\n%.2000s", i, err, b)
		}
	}
	assertCleanedUp(t, rep)

	// A directory the demo did not make is left alone.
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "precious"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, &Config{Out: foreign}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not made by the demo") {
		t.Errorf("a foreign output directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(foreign, "precious")); err != nil {
		t.Errorf("the foreign directory was touched: %v", err)
	}
}

// Ctrl-C while the rows run: the demo stops, and cleans up all the same.
func TestDemoInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and three workers")
	}
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &watchWriter{on: "pgworker enqueue", then: cancel}
	rep, err := Run(ctx, &Config{Out: filepath.Join(t.TempDir(), "out"), NoMinIO: true}, w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted demo: %v\n%s", err, w.String())
	}
	if len(rep.PIDs) != 4 {
		t.Fatalf("interrupted before the dashboard and the workers started: %+v\n%s", rep, w.String())
	}
	if !strings.Contains(w.String(), "Interrupted. Everything it started was stopped and removed.") {
		t.Errorf("output:\n%s", w.String())
	}
	assertCleanedUp(t, rep)
}

// watchWriter calls then once a write holds on.
type watchWriter struct {
	bytes.Buffer
	on   string
	then func()
}

func (w *watchWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if w.then != nil && strings.Contains(w.Buffer.String(), w.on) {
		w.then()
		w.then = nil
	}
	return n, err
}

func assertCleanedUp(t *testing.T, rep *Report) {
	t.Helper()
	if len(rep.TempDirs) < 2 {
		t.Errorf("temporary directories: %q, want the demo's and the cluster's", rep.TempDirs)
	}
	for _, dir := range rep.TempDirs {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there (%v)", dir, err)
		}
	}
	for _, pid := range rep.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("worker process %d is still there (%v)", pid, err)
		}
	}
}

// countFiles counts the files under dir, those named name when name is set.
func countFiles(t *testing.T, dir, name string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (name == "" || d.Name() == name) {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
