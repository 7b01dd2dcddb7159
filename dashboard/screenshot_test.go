package dashboard_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/dashboard"
)

var screenshots = flag.String("dashboard.screenshots", "", "write PNGs of the pages, from a seeded database, into this `directory` (docs/ keeps them)")

// TestScreenshots seeds a database that looks like a fleet at work and
// takes a picture of each page: go test ./dashboard -run TestScreenshots
// -args -dashboard.screenshots=$PWD/docs.
func TestScreenshots(t *testing.T) {
	if *screenshots == "" {
		t.Skip("pictures only with -dashboard.screenshots DIR")
	}
	out := t.TempDir()
	store, err := blob.Open(t.Context(), "file://"+out, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s := newStack(t, nil, &dashboard.Config{AllowActions: true, Token: testToken, OutputStore: store})
	done := seedFleet(t, s, out)
	s.refresh()
	tb := newTab(t)
	for _, p := range []struct{ name, path string }{
		{"overview", "/"},
		{"workers", "/workers"},
		{"failures", "/failures?group=" + url.QueryEscape("exit status 2: tesseract: cannot read image")},
		{"row", "/rows/" + strconv.FormatInt(done, 10)},
		{"queues", "/queues"},
	} {
		tb.open(s.url(p.path))
		if p.name == "overview" {
			tb.do("the chart", chromedp.WaitReady(chromedp.CSS("#chart .uplot")))
		}
		height := int64(900)
		if p.name == "row" {
			height = 520 // down to the outputs: the manifest below names the test's temporary directory
		}
		tb.do("size", chromedp.EmulateViewport(1280, height))
		tb.screenshot(filepath.Join(*screenshots, "dashboard-"+p.name+".png"))
	}
	tb.noConsoleErrors()
}

// seedFleet fills the database as three worker nodes draining three queues
// would, with an hour of history, and returns a done row with outputs.
func seedFleet(t *testing.T, s *stack, out string) int64 {
	t.Helper()
	s.exec(`INSERT INTO files.files (queue, source, priority, batch)
	        SELECT q, format('scans/%s/%s.tif', q, lpad(g::text, 6, '0')), (g % 3),
	               CASE q WHEN 'ocr' THEN 'scans-2026-11' WHEN 'thumbnails' THEN 'thumbs-nightly' END
	        FROM (VALUES ('ocr', 1200), ('thumbnails', 400), ('archive', 150)) v(q, n), generate_series(1, n) g`)
	// An hour of attempts: what the chart draws.
	s.exec(`INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error, exit_code, duration)
	        SELECT 1, 1, 'vm-a:100:0', t - interval '20 seconds', t, CASE WHEN g % 23 = 0 THEN 'failed' ELSE 'done' END,
	               CASE WHEN g % 23 = 0 THEN 'exit status 2' END, CASE WHEN g % 23 = 0 THEN 2 ELSE 0 END, interval '20 seconds'
	        FROM (SELECT g, now() - random() * interval '58 minutes' - interval '1 minute' AS t
	              FROM generate_series(1, 1400) g) x
	        ORDER BY t`)
	var done int64
	for node := range 3 {
		for slot := range 4 {
			w := fmt.Sprintf("vm-%c:%d:%d", 'a'+node, 4100+node, slot)
			q := []string{"ocr", "ocr", "thumbnails", "archive"}[slot]
			for i := range 40 {
				c := s.claim(w, q)
				switch {
				case i%13 == 5:
					s.fail(c, "exit status 2: tesseract: cannot read image\nError in pixReadStream", "Tesseract Open Source OCR Engine v5.3.0\nError in pixReadStream: Unknown format: no pix returned\nError in pixRead: pix not read\nError during processing.")
				case i%29 == 7:
					s.fail(c, "download scans/ocr/missing.tif: object not found", "")
				default:
					s.complete(c, manifest(t, s, out, c))
					done = c.ID
				}
			}
			s.claim(w, q) // each slot holds a row
		}
	}
	s.exec(`UPDATE files.workers SET node = split_part(worker_id, ':', 1), pid = split_part(worker_id, ':', 2)::int,
	        slot = split_part(worker_id, ':', 3)::int, version = '0.9.0'`)
	s.exec(`UPDATE files.workers SET last_heartbeat_at = now() - interval '9 seconds' WHERE worker_id = 'vm-b:4101:2'`)
	s.exec(`INSERT INTO files.workers (worker_id, node, pid, slot, state, version, started_at, last_heartbeat_at, stopped_at)
	        VALUES ('vm-d:4200:0', 'vm-d', 4200, 0, 'dead', '0.9.0', now() - interval '40 minutes', now() - interval '12 minutes',
	                now() - interval '12 minutes')`)
	s.exec(`UPDATE files.workers SET state = 'draining' WHERE worker_id LIKE 'vm-c:%'`)
	s.exec(`SELECT files.pause_queue('archive')`)
	return done
}

// manifest writes two outputs of c into the store at out and returns the
// result pgworker run would record.
func manifest(t *testing.T, s *stack, out string, c claimed) string {
	t.Helper()
	prefix := fmt.Sprintf("%d/%d-a1b2c3", c.ID, c.Attempt)
	type object struct {
		URL    string `json:"url"`
		Key    string `json:"key"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	var objs []object
	for _, name := range []string{"page.txt", "page.hocr"} {
		data := []byte(fmt.Sprintf("text of row %d, %s\n", c.ID, name))
		p := filepath.Join(out, prefix, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		objs = append(objs, object{URL: "file://" + p, Key: prefix + "/" + name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	}
	b, _ := json.Marshal(map[string]any{"outputs": objs, "output_root": "file://" + filepath.Join(out, prefix),
		"exit_code": 0, "duration_ms": 18250, "worker_id": c.Worker, "attempt": c.Attempt})
	return string(b)
}
