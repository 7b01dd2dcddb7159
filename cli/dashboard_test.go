package cli_test

import (
	"bufio"
	"io"
	"net/http"
	osexec "os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

func TestDashboardFlags(t *testing.T) {
	t.Parallel()
	url, _ := newDB(t)
	out := ok(t, "", "", "dashboard", "--help")
	for _, want := range []string{"[$PGWORKER_DASHBOARD_ADDR]", "--allow-actions", "PGWORKER_DASHBOARD_TOKEN", `(default "127.0.0.1:8080")`} {
		if !strings.Contains(out, want) {
			t.Errorf("dashboard --help lacks %q:\n%s", want, out)
		}
	}
	fails(t, url, "", 2, []string{"--allow-actions needs a token", "PGWORKER_DASHBOARD_TOKEN"}, "dashboard", "--allow-actions")
	fails(t, url, "", 2, []string{`--addr "nowhere"`}, "dashboard", "--addr", "nowhere")
	fails(t, url, "", 2, []string{"--output-store"}, "dashboard", "--output-store", "ftp://x")
}

// TestDashboardServes starts pgworker dashboard, loads the Overview and
// stops it with SIGTERM.
func TestDashboardServes(t *testing.T) {
	t.Parallel()
	url, pool := newDB(t)
	exec(t, pool, "INSERT INTO files.files (queue, source) VALUES ('photos', 'a.jpg')")
	cmd := osexec.Command(bin, "dashboard", "--addr", "127.0.0.1:0", "--allow-actions")
	cmd.Env = pgworkerbin.Env("PGWORKER_DATABASE_URL="+url, "PGWORKER_DASHBOARD_TOKEN=a-token-of-enough-characters")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v\n%s", err, stderr.String())
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "pgworker dashboard on ")
	if !ok {
		t.Fatalf("first line %q", line)
	}
	resp, err := http.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `data-queue="photos"`) {
		t.Errorf("GET %s: %d\n%s", addr, resp.StatusCode, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("dashboard exited: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("dashboard did not stop on SIGTERM\n%s", stderr.String())
	}
}
