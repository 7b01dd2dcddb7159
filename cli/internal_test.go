package cli

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgworker/pgworker/bench"
	"github.com/pgworker/pgworker/internal/pgtest"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/q", "postgres://app:xxxxx@db:5432/q"},
		{"postgresql://app:s3cret@db/q?sslmode=require", "postgresql://app:xxxxx@db/q?sslmode=require"},
		{"postgres://app@db/q", "postgres://app@db/q"},
		{"postgres://db/q", "postgres://db/q"},
		{"postgres://app:p%40ss%2Fw@db/q", "postgres://app:xxxxx@db/q"},
		{"postgres://app:p@ss/w@db/q", "postgres://app:xxxxx@db/q"},                       // unescaped @ and /: not a valid URL
		{"postgres://app:pw@h1:5432,h2:5432/q", "postgres://app:xxxxx@h1:5432,h2:5432/q"}, // multi-host
		{"postgres://db/q?user=app&password=s3cret&sslmode=disable", "postgres://db/q?user=app&password=xxxxx&sslmode=disable"},
		{"postgres://app:pw@db/q?sslpassword=keypw", "postgres://app:xxxxx@db/q?sslpassword=xxxxx"},
		{"host=db user=app password=s3cret dbname=q", "host=db user=app password=xxxxx dbname=q"},
		{"host=db password='s3 cret' dbname=q", "host=db password=xxxxx dbname=q"},
		{"password=s3cret", "password=xxxxx"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	msg := scrub("failed: password s3cret-Long rejected, p@ss/w too", "postgres://app:s3cret-Long@db/q", "postgres://app:p@ss/w@db/q")
	if strings.Contains(msg, "s3cret-Long") || strings.Contains(msg, "p@ss/w") {
		t.Errorf("scrub left a password: %q", msg)
	}
}

func TestDrainOnSignal(t *testing.T) {
	t.Parallel()
	sigs := make(chan os.Signal, 2)
	var logs bytes.Buffer
	ctx, hard, stop := drainOnSignal(context.Background(), sigs, slog.New(slog.NewTextHandler(&logs, nil)), time.Minute)
	defer stop()
	select {
	case <-ctx.Done():
		t.Fatal("drained before any signal")
	case <-hard:
		t.Fatal("stopped before any signal")
	default:
	}
	sigs <- syscall.SIGTERM
	<-ctx.Done()
	if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "draining") {
		t.Errorf("cause %v", cause)
	}
	select {
	case <-hard:
		t.Fatal("the first signal stopped at once")
	default:
	}
	sigs <- syscall.SIGINT
	<-hard
	if !strings.Contains(logs.String(), "draining") || !strings.Contains(logs.String(), "stopping at once") {
		t.Errorf("logs: %s", logs.String())
	}

	// The parent's cancellation drains too; stop ends the watch.
	parent, cancel := context.WithCancel(context.Background())
	ctx, hard, stop2 := drainOnSignal(parent, make(chan os.Signal, 1), slog.New(slog.DiscardHandler), time.Minute)
	cancel()
	<-ctx.Done()
	stop2()
	select {
	case <-hard:
		t.Error("hard stop without a second signal")
	default:
	}
}

func TestRunConfig(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	workDir := filepath.Join(t.TempDir(), "work")
	var got *RunConfig
	c := New(&Config{
		RunWorkers: func(ctx context.Context, cfg *RunConfig) error {
			got = cfg
			return cfg.Pool.Ping(ctx)
		},
		LookupEnv: func(name string) (string, bool) {
			v, ok := map[string]string{
				"PGWORKER_DATABASE_URL":   url,
				"PGWORKER_EXEC":           "/bin/echo {input} '{output_dir}/x y'",
				"PGWORKER_QUEUES":         "a, b,c",
				"PGWORKER_DRAIN_TIMEOUT":  "2m",
				"PGWORKER_CLAIM_COOLDOWN": "250ms",
				"PGWORKER_SLOTS":          "99", // the flag wins
				"PGWORKER_PASS_ENV":       "AWS_ACCESS_KEY_ID",
			}[name]
			return v, ok
		},
	})
	var stdout, stderr bytes.Buffer
	code := c.Main(context.Background(), []string{"run", "--slots", "2-8", "--timeout", "10m", "--heartbeat", "2s",
		"--lease-timeout", "7s", "--work-dir", workDir, "--metrics-addr", "127.0.0.1:9090", "--input-store", "s3://in/p",
		"--output-store", "file:///srv/out", "--log-format", "json"}, nil, &stdout, &stderr)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if got.SlotsMin != 2 || got.SlotsMax != 8 || !reflect.DeepEqual([]string(got.Queues), []string{"a", "b", "c"}) ||
		got.Timeout != 10*time.Minute || got.Heartbeat != 2*time.Second || got.LeaseTimeout != 7*time.Second ||
		got.DrainTimeout != 2*time.Minute || got.ClaimCooldown != 250*time.Millisecond || got.KillGrace != 10*time.Second || got.WorkDir != workDir ||
		got.MetricsAddr != "127.0.0.1:9090" || got.InputStore != "s3://in/p" || got.OutputStore != "file:///srv/out" ||
		got.DatabaseURL != url || got.ListenURL != "" || got.HardStop == nil || got.Logger == nil {
		t.Errorf("RunConfig: %+v", got)
	}
	if got.Backend.Program() != "/bin/echo" || got.Exec != "/bin/echo {input} '{output_dir}/x y'" {
		t.Errorf("backend: %q, exec %q", got.Backend.Program(), got.Exec)
	}
	if fi, err := os.Stat(workDir); err != nil || !fi.IsDir() {
		t.Errorf("work dir not created: %v", err)
	}
	if !strings.Contains(stderr.String(), `"msg":"pgworker run starting"`) {
		t.Errorf("no start log line: %s", stderr.String())
	}

	// The default runWorkers needs an output store, and says so in one line.
	stderr.Reset()
	code = New(&Config{LookupEnv: func(name string) (string, bool) {
		if name == "PGWORKER_DATABASE_URL" {
			return url, true
		}
		return "", false
	}}).Main(context.Background(), []string{"run", "--exec", "/bin/true", "--work-dir", workDir}, nil, &stdout, &stderr)
	if code != ExitUsage || !strings.Contains(stderr.String(), "pgworker run: run: missing output store (set --output-store or PGWORKER_OUTPUT_STORE") {
		t.Errorf("default runWorkers: exit %d %s", code, stderr.String())
	}
}

func TestEnqueueFrom(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	dir := t.TempDir()
	for _, name := range []string{"a.txt", "sub/b.txt", "sub/deeper/c d.txt"} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(name), 0o644)
	}
	// A lister over a real directory, standing in for the object store's.
	dirLister := func(ctx context.Context, uri string) (Lister, error) {
		root := strings.TrimPrefix(uri, "file://")
		return ListerFunc(func(ctx context.Context, fn func(string) error) error {
			return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				return fn("file://" + p)
			})
		}), nil
	}
	env := func(name string) (string, bool) {
		if name == "PGWORKER_DATABASE_URL" {
			return url, true
		}
		return "", false
	}
	var stdout, stderr bytes.Buffer
	code := New(&Config{OpenLister: dirLister, LookupEnv: env}).Main(context.Background(),
		[]string{"enqueue", "--queue", "listed", "--chunk-size", "2", "--from", "file://" + dir}, nil, &stdout, &stderr)
	if code != ExitOK || stdout.String() != "queued 3, already there 0 (queue \"listed\")\n" {
		t.Fatalf("exit %d: %s %s", code, stdout.String(), stderr.String())
	}
	var n int
	pool.QueryRow(context.Background(), "SELECT count(*) FROM files.files WHERE queue = 'listed' AND source = $1",
		"file://"+filepath.Join(dir, "sub/deeper/c d.txt")).Scan(&n)
	if n != 1 {
		t.Error("the listed object is not in the queue")
	}

	// The default lister reads the blob store itself.
	stdout.Reset()
	stderr.Reset()
	code = New(&Config{LookupEnv: env}).Main(context.Background(),
		[]string{"enqueue", "--queue", "blob", "--from", "file://" + dir + "/sub"}, nil, &stdout, &stderr)
	if code != ExitOK || stdout.String() != "queued 2, already there 0 (queue \"blob\")\n" {
		t.Fatalf("--from with the default lister: exit %d: %s %s", code, stdout.String(), stderr.String())
	}
	pool.QueryRow(context.Background(), "SELECT count(*) FROM files.files WHERE queue = 'blob' AND source = $1",
		"file://"+filepath.Join(dir, "sub/deeper/c d.txt")).Scan(&n)
	if n != 1 {
		t.Error("the object listed by the default lister is not in the queue")
	}
	stderr.Reset()
	code = New(&Config{LookupEnv: env}).Main(context.Background(),
		[]string{"enqueue", "--from", "file://" + dir + "/missing"}, nil, &stdout, &stderr)
	if code == ExitOK || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
		t.Errorf("--from a missing directory: exit %d, want one error line: %s", code, stderr.String())
	}
}

func TestParseSlots(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in       string
		min, max int
		ok       bool
	}{
		{"1", 1, 1, true}, {"16", 16, 16, true}, {"2-8", 2, 8, true}, {" 2 - 8 ", 2, 8, true}, {"4-4", 4, 4, true},
		{"0", 0, 0, false}, {"-3", 0, 0, false}, {"8-2", 0, 0, false}, {"1-2000", 0, 0, false}, {"x", 0, 0, false}, {"", 0, 0, false}, {"1-", 0, 0, false},
	} {
		lo, hi, err := parseSlots(tt.in)
		if (err == nil) != tt.ok || lo != tt.min || hi != tt.max {
			t.Errorf("parseSlots(%q) = %d, %d, %v", tt.in, lo, hi, err)
		}
	}
}

func TestSecondsText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    float64
		want string
	}{
		{0.0123, "12ms"}, {4.24, "4.2s"}, {192, "3m12s"}, {180, "3m"}, {7500, "2h5m"}, {3*86400 + 4*3600, "3d4h"},
	} {
		if got := secondsText(&tt.s); got != tt.want {
			t.Errorf("secondsText(%v) = %q, want %q", tt.s, got, tt.want)
		}
	}
	if secondsText(nil) != "-" {
		t.Error("nil")
	}
}

// A payload over 1 MiB is refused before the database is tried. It cannot
// pass through argv (the kernel bounds one argument to 128 KiB), so the
// command runs in this process.
func TestEnqueuePayloadBound(t *testing.T) {
	t.Parallel()
	env := func(name string) (string, bool) {
		if name == "PGWORKER_DATABASE_URL" {
			return "postgres://app@127.0.0.1:1/queue?sslmode=disable", true // nobody listens
		}
		return "", false
	}
	payload := `{"blob": "` + strings.Repeat("x", 1<<20) + `"}`
	var stdout, stderr bytes.Buffer
	code := New(&Config{LookupEnv: env}).Main(context.Background(), []string{"enqueue", "--payload", payload, "src"}, nil, &stdout, &stderr)
	if code != ExitUsage || !strings.Contains(stderr.String(), "--payload: payload of 1048587 bytes is over the bound of 1048576 bytes") {
		t.Errorf("exit %d, stderr %.300s", code, stderr.String())
	}
}

// TestPipelineText: the text summary gives each way's CPU a row, and says
// which figures were not read.
func TestPipelineText(t *testing.T) {
	t.Parallel()
	res := &bench.PipelineResult{Rows: 10, Slots: 2, Exec: "cp", CPU: bench.PipelineCPUs{
		Queued: bench.PipelineCPU{Server: new(1.5), Process: 5.25, Program: 6, Machine: new(17.5), Idle: new(1.25)},
		Bare:   bench.PipelineCPU{Process: 5, Program: 6},
	}}
	got := benchText(res)
	for _, want := range []string{
		"\n  queued CPU a row: database 1.500 ms, this process 5.250 ms, program 6.000 ms, machine busy 17.500 ms, idle 1.250 ms",
		"\n  bare   CPU a row: database unknown, this process 5.000 ms, program 6.000 ms, machine busy unknown, idle unknown",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("text lacks %q:\n%s", want, got)
		}
	}
}
