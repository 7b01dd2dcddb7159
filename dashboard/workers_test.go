package dashboard_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/dashboard"
	"github.com/pgworker/pgworker/internal/harness"
	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

var pgworkerBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// binary builds pgworker once for the tests that run it.
func binary(t *testing.T) string {
	t.Helper()
	pgworkerBin.once.Do(func() {
		if pgworkerBin.dir, pgworkerBin.err = os.MkdirTemp("", "pgworker-dashboard-test-"); pgworkerBin.err == nil {
			pgworkerBin.path, pgworkerBin.err = pgworkerbin.Build(pgworkerBin.dir)
		}
	})
	if pgworkerBin.err != nil {
		t.Fatal(pgworkerBin.err)
	}
	return pgworkerBin.path
}

// TestWithRealWorkers runs `pgworker run` on rows and checks what the
// dashboard shows of them: the queue's counts, the process's slots, a row's
// outputs, and the download of one through the dashboard, streamed from a
// file:// or an s3:// output store.
func TestWithRealWorkers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if _, err := miniotest.Binary(); kind == "s3" && err != nil {
				t.Skipf("no MinIO server binary (make tools builds bin/minio): %v", err)
			}
			runWorkersAndDownload(t, kind)
		})
	}
}

func runWorkersAndDownload(t *testing.T, kind string) {
	h := harness.New(t, binary(t), &harness.Config{Strict: true})
	in := h.FileStore("in")
	out, opts := h.FileStore("out"), &blob.Options{}
	if kind == "s3" {
		out = h.Bucket()
		opts = &blob.Options{Endpoint: h.S3.Endpoint, AccessKeyID: h.S3.AccessKey, SecretAccessKey: h.S3.SecretKey}
	}
	store, err := blob.Open(context.Background(), out, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	s := newStack(t, h.DB, &dashboard.Config{OutputStore: store})
	content := []byte(strings.Repeat("the quick brown fox\n", 5000))
	h.Put(in, "a.txt", content)
	h.Enqueue([]string{"--queue", "copies", "--max-attempts", "1"}, "a.txt", "missing.txt")
	p := h.Start("run-1", nil, "run", "--exec", `sh -c 'cp "$1" "$2/copy.txt"' sh {input} {output_dir}`,
		"--slots", "2", "--input-store", in, "--output-store", out, "--work-dir", filepath.Join(h.Dir, "work"),
		"--heartbeat", "250ms", "--lease-timeout", "5s")
	h.WaitSettled(2 * time.Minute)
	s.refresh()

	_, body, _ := s.get("/")
	if !strings.Contains(body, `value="2" max="2"`) || !regexp.MustCompile(`n-done">1<`).MatchString(body) {
		t.Errorf("overview after the run:\n%s", body)
	}
	if _, body, _ := s.get("/workers"); !strings.Contains(body, p.Prefix+"0") {
		t.Errorf("workers lacks the slots of %s:\n%s", p.Prefix, body)
	}
	if _, body, _ := s.get("/failures"); !strings.Contains(body, "missing.txt") {
		t.Errorf("failures lacks the missing input:\n%s", body)
	}
	var id int64
	if err := h.DB.QueryRow(context.Background(), "SELECT id FROM files.files WHERE state = 'done'").Scan(&id); err != nil {
		t.Fatal(err)
	}
	_, body, _ = s.get("/rows/" + strconv.FormatInt(id, 10))
	link := "/rows/" + strconv.FormatInt(id, 10) + "/outputs/0"
	if !strings.Contains(body, "copy.txt") || !strings.Contains(body, harness.SHA256Hex(content)) || !strings.Contains(body, `href="`+link+`"`) {
		t.Fatalf("row %d lacks its output and download link:\n%s", id, body)
	}
	resp, err := http.Get(s.url(link))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || string(got) != string(content) {
		t.Fatalf("download: %s, %d bytes (%v), want %d", resp.Status, len(got), err, len(content))
	}
	if cd := resp.Header.Get("Content-Disposition"); cd != `attachment; filename=copy.txt` {
		t.Errorf("Content-Disposition %q", cd)
	}
	if code, _, _ := s.get("/rows/" + strconv.FormatInt(id, 10) + "/outputs/1"); code != http.StatusNotFound {
		t.Errorf("an output past the manifest: %d, want 404", code)
	}
}
