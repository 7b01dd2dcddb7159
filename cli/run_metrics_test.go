package cli_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

// runProcess is a `pgworker run` process whose JSON log lines are collected.
type runProcess struct {
	cmd    *osexec.Cmd
	exited chan struct{} // closed when the process has exited; then err is set
	err    error

	mu    sync.Mutex
	lines []map[string]any
	raw   strings.Builder
}

func startRun(t *testing.T, url string, args ...string) *runProcess {
	t.Helper()
	cmd := osexec.Command(bin, append([]string{"run", "--log-format", "json"}, args...)...)
	cmd.Env = pgworkerbin.Env("PGWORKER_DATABASE_URL=" + url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &runProcess{cmd: cmd, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			p.mu.Lock()
			p.raw.WriteString(sc.Text() + "\n")
			if m != nil {
				p.lines = append(p.lines, m)
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		<-read
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // an error when it has exited already
		<-p.exited
	})
	return p
}

// stop sends SIGTERM and waits for the exit.
func (p *runProcess) stop(t *testing.T) error {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	return p.err
}

// logs returns the log lines whose msg is msg.
func (p *runProcess) logs(msg string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, l := range p.lines {
		if l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

func (p *runProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func httpGet(url string) (int, string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sampleValue finds a sample line of a scrape that starts with prefix (name
// and labels as printed) and returns its value text.
func sampleValue(scrape, prefix string) (string, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			return strings.TrimPrefix(line, prefix+" "), true
		}
	}
	return "", false
}

// pgworker run with --metrics-addr serves /metrics, /healthz and /readyz
// while it runs, the scrape follows the rows, every row gets one log line
// when it starts and one when it ends, and a SIGTERM stops it all.
func TestRunServesMetricsAndLogsRows(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	for _, d := range []string{in, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ok-1.txt", "ok-2.txt", "bad.txt"} {
		if err := os.WriteFile(filepath.Join(in, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(dir, "backend.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncase \"${1##*/}\" in *bad*) echo 'refused: bad input' >&2; exit 3;; esac\ncp \"$1\" \"$2/\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	p := startRun(t, url, "--exec", script+" {input} {output_dir}", "--slots", "2", "--heartbeat", "200ms", "--lease-timeout", "2s",
		"--input-store", "file://"+in, "--output-store", "file://"+out, "--work-dir", filepath.Join(dir, "work"),
		"--metrics-addr", "127.0.0.1:0")
	var base string
	waitUntil(t, "the metrics server", func() bool {
		if l := p.logs("serving metrics"); len(l) > 0 {
			base = "http://" + l[0]["addr"].(string)
			return true
		}
		return false
	})
	if code, body, err := httpGet(base + "/healthz"); err != nil || code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q %v", code, body, err)
	}
	waitUntil(t, "/readyz", func() bool { code, _, _ := httpGet(base + "/readyz"); return code == 200 })
	_, before, err := httpGet(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := sampleValue(before, "pgworker_slots"); !ok || v != "2" {
		t.Fatalf("pgworker_slots %q before work:\n%s", v, before)
	}
	if _, ok := sampleValue(before, `pgworker_rows_done_total{queue="default"}`); ok {
		t.Fatal("rows done before any row")
	}

	ok(t, url, "", "enqueue", "--max-attempts", "1", "ok-1.txt", "ok-2.txt", "bad.txt")
	waitUntil(t, "the rows to end", func() bool {
		return count(t, pool, "SELECT count(*) FROM files.files WHERE state IN ('done', 'failed')") == 3
	})
	var after string
	waitUntil(t, "the scrape to show the rows", func() bool {
		_, after, _ = httpGet(base + "/metrics")
		v, _ := sampleValue(after, `pgworker_rows_failed_total{final="true",queue="default"}`)
		return v == "1"
	})
	for prefix, want := range map[string]string{
		`pgworker_rows_claimed_total{queue="default"}`:                            "3",
		`pgworker_rows_done_total{queue="default"}`:                               "2",
		`pgworker_backend_duration_seconds_count{outcome="done",queue="default"}`: "2",
		`pgworker_listener_up`:                                                    "1",
	} {
		if v, ok := sampleValue(after, prefix); !ok || v != want {
			t.Errorf("%s = %q, want %s", prefix, v, want)
		}
	}
	// The queue gauges are read at the first scrape, then at most once per
	// 10s: how many reads a slow run makes is not fixed (package metrics
	// tests the interval).
	if v, ok := sampleValue(after, "pgworker_queue_stats_reads_total"); !ok || v == "0" {
		t.Errorf("pgworker_queue_stats_reads_total = %q, want at least 1", v)
	}

	// One line when each row starts, one when it ends.
	var ids []int64
	rows, err := pool.Query(t.Context(), "SELECT id FROM files.files ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitUntil(t, "the end lines", func() bool { return len(p.logs("row finished")) == 3 })
	for i, id := range ids {
		for _, msg := range []string{"row started", "row finished"} {
			var mine []map[string]any
			for _, l := range p.logs(msg) {
				if l["id"] == float64(id) {
					mine = append(mine, l)
				}
			}
			if len(mine) != 1 {
				t.Errorf("row %d: %d %q lines, want 1\n%s", id, len(mine), msg, p.log())
				continue
			}
			l := mine[0]
			if l["level"] != "INFO" || l["queue"] != "default" || l["attempt"] != float64(1) || l["worker_id"] == nil {
				t.Errorf("row %d %s: %v", id, msg, l)
			}
			if msg == "row finished" {
				wantOutcome := "done"
				if i == 2 {
					wantOutcome = "failed"
					if e, _ := l["error"].(string); !strings.Contains(e, "refused: bad input") || l["final"] != true {
						t.Errorf("row %d: failure line %v", id, l)
					}
				}
				if l["outcome"] != wantOutcome || l["duration"] == nil {
					t.Errorf("row %d: end line %v, want outcome %s and a duration", id, l, wantOutcome)
				}
			}
		}
	}

	if err := p.stop(t); err != nil {
		t.Fatalf("pgworker run after SIGTERM: %v\n%s", err, p.log())
	}
	if _, _, err := httpGet(base + "/healthz"); err == nil {
		t.Error("the metrics server still answers after pgworker run exited")
	}
}

// A port in use is one clear error at start, before any slot registers.
func TestRunMetricsAddrInUse(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	dir := t.TempDir()
	p := startRun(t, url, "--exec", "/bin/true", "--output-store", "file://"+dir, "--work-dir", filepath.Join(dir, "work"),
		"--metrics-addr", "127.0.0.1:0")
	var addr string
	waitUntil(t, "the metrics server", func() bool {
		if l := p.logs("serving metrics"); len(l) > 0 {
			addr = l[0]["addr"].(string)
			return true
		}
		return false
	})
	res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env("PGWORKER_DATABASE_URL="+url), "run", "--exec", "/bin/true",
		"--output-store", "file://"+dir, "--work-dir", filepath.Join(dir, "work2"), "--metrics-addr", addr, "--log-format", "json")
	if res.Code != 1 || !strings.Contains(res.Stderr, "pgworker: run: --metrics-addr: metrics: listen on "+addr) {
		t.Errorf("second run on %s: exit %d\n%s", addr, res.Code, res.Stderr)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.workers WHERE pid <> $1", p.cmd.Process.Pid); n != 0 {
		t.Errorf("the failed run registered %d slots", n)
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("pgworker run after SIGTERM: %v", err)
	}
}
