package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

// Config configures Run.
type Config struct {
	// Pgworker is the binary to run. Defaults to one built from ./cmd/pgworker.
	Pgworker string
	// Out receives the outputs (results/) and the workers' logs (logs/). It
	// is replaced at each run, if an earlier run made it. Defaults to
	// "demo-output" in the module root.
	Out string
	// Workers and Slots: pgworker run processes, and slots of each. Default
	// to 3 and 4.
	Workers, Slots int
	// NoMinIO uses a file:// input store even when bin/minio exists.
	NoMinIO bool
	// Hold keeps everything running once the rows are done, until ctx ends.
	Hold bool
	// Root is the module root. Defaults to the directory of go.mod above the
	// working directory.
	Root string
}

// Report is what a run did.
type Report struct {
	Total, Done, Failed int
	MinIO               bool
	Took                time.Duration
	Out                 string
	// Removed at the end: the temporary directories, the PostgreSQL cluster's
	// among them; ended: the processes.
	TempDirs []string
	PIDs     []int
}

// demoQueue is the queue the demo fills; its retries wait 200ms, so that
// the damaged inputs fail for good within a second.
const demoQueue = "default"

// marker tells that a directory was made by the demo, which may replace it.
const marker = ".pgworker-demo"

// Run runs the demo, printing to w; see the package comment.
func Run(ctx context.Context, cfg *Config, w io.Writer) (rep *Report, err error) {
	d := &demo{cfg: *cfg, w: w, start: time.Now(), rep: &Report{}}
	if err := d.defaults(); err != nil {
		return d.rep, err
	}
	defer func() {
		d.cleanup()
		if ctx.Err() != nil && !d.held {
			err = fmt.Errorf("interrupted: %w", ctx.Err())
		}
		switch {
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(w, "\nInterrupted. Everything it started was stopped and removed.")
		case err != nil:
			fmt.Fprintf(w, "\nStopped: %v. Everything it started was stopped and removed.\n", err)
		}
	}()
	return d.rep, d.run(ctx)
}

type demo struct {
	cfg   Config
	w     io.Writer
	start time.Time
	rep   *Report

	cleanups []func()
	held     bool // Hold ended with ctx, as asked

	tmp     string // the demo's temporary directory
	dbURL   string
	db      *pgx.Conn
	env     []string // of the pgworker processes
	input   string   // input store URL
	from    string   // enqueue --from
	workers []*workerProc
	// dashboard is the URL of pgworker dashboard.
	dashboard string
}

func (d *demo) defaults() error {
	c := &d.cfg
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.Slots <= 0 {
		c.Slots = 4
	}
	if c.Root == "" {
		root, err := testhelp.ModuleRoot()
		if err != nil {
			return fmt.Errorf("%w: run the demo inside the pgworker module (make demo)", err)
		}
		c.Root = root
	}
	if c.Out == "" {
		c.Out = "demo-output"
	}
	if !filepath.IsAbs(c.Out) {
		c.Out = filepath.Join(c.Root, c.Out)
	}
	d.rep.Out = c.Out
	return nil
}

// step prints a line with the time since the start.
func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.w, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) onCleanup(f func()) { d.cleanups = append(d.cleanups, f) }

func (d *demo) cleanup() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
}

func (d *demo) run(ctx context.Context) error {
	fmt.Fprintf(d.w, "pgworker demo: the sample data set (testdata/inputs), %d workers of %d slots running testdata/backend/summarize\n\n",
		d.cfg.Workers, d.cfg.Slots)
	var err error
	if d.tmp, err = os.MkdirTemp("", "pgworker-demo-"); err != nil {
		return err
	}
	d.rep.TempDirs = append(d.rep.TempDirs, d.tmp)
	d.onCleanup(func() { os.RemoveAll(d.tmp) })
	if err := d.prepareOut(); err != nil {
		return err
	}
	if err := d.build(ctx); err != nil {
		return err
	}
	if err := d.startPostgres(ctx); err != nil {
		return err
	}
	if err := d.startStore(ctx); err != nil {
		return err
	}
	if err := d.migrate(ctx); err != nil {
		return err
	}
	if err := d.startDashboard(ctx); err != nil {
		return err
	}
	if err := d.startWorkers(ctx); err != nil {
		return err
	}
	began, err := d.enqueue(ctx)
	if err != nil {
		return err
	}
	if err := d.watch(ctx, began); err != nil {
		return err
	}
	d.showMetrics(ctx)
	if d.cfg.Hold {
		fmt.Fprintf(d.w, "\nHolding, with the workers and the dashboard (%s) running. In another terminal:\n  psql '%s'\n  psql '%s' -f sql/ops/running.sql\n  PGWORKER_DATABASE_URL='%s' %s status\nPress Ctrl-C to clean up.\n",
			d.dashboard, d.dbURL, d.dbURL, d.dbURL, d.cfg.Pgworker)
		<-ctx.Done()
		d.held = true
		fmt.Fprintf(d.w, "\nStopping the workers, PostgreSQL%s, and removing the temporary files.\n",
			map[bool]string{true: " and MinIO", false: ""}[d.rep.MinIO])
		return nil
	}
	if err := d.stopWorkers(); err != nil {
		return err
	}
	if err := d.summary(ctx); err != nil {
		return err
	}
	d.rep.Took = time.Since(d.start)
	fmt.Fprintf(d.w, "\nDone in %.1fs. Stopping PostgreSQL%s and removing the temporary files.\n", d.rep.Took.Seconds(),
		map[bool]string{true: " and MinIO", false: ""}[d.rep.MinIO])
	return nil
}

// prepareOut empties the output directory, if an earlier demo made it.
func (d *demo) prepareOut() error {
	out := d.cfg.Out
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(out, marker)); err != nil {
			return fmt.Errorf("%s exists and was not made by the demo: remove it or choose another --out", out)
		}
		if err := os.RemoveAll(out); err != nil {
			return err
		}
	}
	for _, dir := range []string{filepath.Join(out, "results"), filepath.Join(out, "logs")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(out, marker), []byte("made by the pgworker demo; replaced at each run\n"), 0o644)
}

func (d *demo) build(ctx context.Context) error {
	if d.cfg.Pgworker != "" {
		p, err := filepath.Abs(d.cfg.Pgworker)
		if err != nil {
			return err
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("--pgworker: %w", err)
		}
		d.cfg.Pgworker = p
		return nil
	}
	d.cfg.Pgworker = filepath.Join(d.tmp, "pgworker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", d.cfg.Pgworker, "./cmd/pgworker")
	cmd.Dir = d.cfg.Root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/pgworker: %v\n%s", err, out)
	}
	d.step("built pgworker")
	return nil
}

func (d *demo) startPostgres(ctx context.Context) error {
	c, err := pgtest.StartCluster(ctx, &pgtest.ClusterConfig{Settings: []string{"max_connections = 100"}})
	if err != nil {
		return fmt.Errorf("start PostgreSQL (the server binaries are needed: Debian's postgresql package, or PG_BINDIR): %w", err)
	}
	d.rep.TempDirs = append(d.rep.TempDirs, c.Dir)
	d.onCleanup(func() {
		if err := c.Destroy(); err != nil {
			fmt.Fprintln(d.w, "demo: stop PostgreSQL:", err)
		}
	})
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE DATABASE demo"); err != nil {
		return err
	}
	d.dbURL = c.URL("demo")
	if d.db, err = pgx.Connect(ctx, d.dbURL); err != nil {
		return err
	}
	d.onCleanup(func() { d.db.Close(context.Background()) })
	d.env = append(childEnv(), "PGWORKER_DATABASE_URL="+d.dbURL)
	d.step("PostgreSQL on 127.0.0.1:%d, a throwaway cluster: %s", c.Port, d.dbURL)
	return nil
}

// startStore starts MinIO with the inputs in bucket demo-input, or points
// at testdata/inputs as a file:// store.
func (d *demo) startStore(ctx context.Context) error {
	inputs := filepath.Join(d.cfg.Root, "testdata", "inputs")
	bin := filepath.Join(d.cfg.Root, "bin", "minio")
	if _, err := os.Stat(bin); err != nil || d.cfg.NoMinIO {
		d.input = "file://" + inputs
		d.from = d.input
		why := "no bin/minio (make tools builds it)"
		if d.cfg.NoMinIO {
			why = "--no-minio"
		}
		d.step("%s: inputs read from a file:// store, %s", why, d.input)
		return nil
	}
	srv, err := miniotest.Start(&miniotest.Config{Binary: bin, MemLimit: "512MiB"})
	if err != nil {
		return fmt.Errorf("start MinIO: %w", err)
	}
	d.rep.MinIO = true
	d.onCleanup(func() {
		if err := srv.Close(); err != nil {
			fmt.Fprintln(d.w, "demo: stop MinIO:", err)
		}
	})
	client, err := minio.New(srv.Host, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		return err
	}
	const bucket = "demo-input"
	if err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		return fmt.Errorf("create bucket: %w", err)
	}
	var keys []string
	err = filepath.WalkDir(inputs, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(inputs, p)
		keys = append(keys, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := client.FPutObject(ctx, bucket, k, filepath.Join(inputs, filepath.FromSlash(k)), minio.PutObjectOptions{}); err != nil {
			return fmt.Errorf("upload %s: %w", k, err)
		}
	}
	d.input = "s3://" + bucket
	d.from = d.input
	d.env = append(d.env, "PGWORKER_S3_ENDPOINT="+srv.Endpoint, "AWS_ACCESS_KEY_ID="+srv.AccessKey,
		"AWS_SECRET_ACCESS_KEY="+srv.SecretKey)
	d.step("MinIO on %s: uploaded the %d inputs to %s", srv.Host, len(keys), d.input)
	return nil
}

func (d *demo) pgworker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, d.cfg.Pgworker, args...)
	cmd.Env = d.env
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("pgworker %s: %s", strings.Join(args, " "), strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("pgworker %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func (d *demo) migrate(ctx context.Context) error {
	out, err := d.pgworker(ctx, "migrate", "up")
	if err != nil {
		return err
	}
	d.step("pgworker migrate up: %d migrations applied", strings.Count(out, "applied "))
	// Retries of the damaged inputs come back after 200ms, not 1s.
	if _, err := d.db.Exec(ctx, "INSERT INTO files.queues (queue, backoff_base, backoff_max) VALUES ($1, '200 milliseconds', '1 second')",
		demoQueue); err != nil {
		return err
	}
	d.step("queue %q: retry backoff 200ms (files.queues.backoff_base)", demoQueue)
	return nil
}

// workerProc is one pgworker run process.
type workerProc struct {
	n       int
	cmd     *exec.Cmd
	metrics string // host:port
	log     string
	exited  chan struct{}
	err     error
}

func (d *demo) startWorkers(ctx context.Context) error {
	summarize := filepath.Join(d.cfg.Root, "testdata", "backend", "summarize")
	for i := 1; i <= d.cfg.Workers; i++ {
		p := &workerProc{n: i, log: filepath.Join(d.cfg.Out, "logs", fmt.Sprintf("worker-%d.log", i)), exited: make(chan struct{})}
		p.cmd = exec.Command(d.cfg.Pgworker, "run",
			"--exec", quote(summarize)+" {input} {output_dir}",
			"--slots", fmt.Sprint(d.cfg.Slots),
			"--heartbeat", "1s", "--lease-timeout", "5s", "--timeout", "1m", "--drain-timeout", "10s",
			"--input-store", d.input,
			"--output-store", "file://"+filepath.Join(d.cfg.Out, "results"),
			"--work-dir", filepath.Join(d.tmp, fmt.Sprintf("work-%d", i)),
			"--metrics-addr", "127.0.0.1:0",
			"--log-format", "json")
		p.cmd.Env = d.env
		p.cmd.SysProcAttr = childAttr()
		logf, err := os.Create(p.log)
		if err != nil {
			return err
		}
		stderr, err := p.cmd.StderrPipe()
		if err != nil {
			logf.Close()
			return err
		}
		if err := p.cmd.Start(); err != nil {
			logf.Close()
			return fmt.Errorf("start pgworker run: %w", err)
		}
		d.rep.PIDs = append(d.rep.PIDs, p.cmd.Process.Pid)
		addr := make(chan string, 1)
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			defer logf.Close()
			sc := bufio.NewScanner(stderr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Bytes()
				logf.Write(append(line, '\n'))
				var l struct{ Msg, Addr string }
				if json.Unmarshal(line, &l) == nil && l.Msg == "serving metrics" {
					select {
					case addr <- l.Addr:
					default:
					}
				}
			}
		}()
		go func() {
			<-copied
			p.err = p.cmd.Wait()
			close(p.exited)
		}()
		d.workers = append(d.workers, p)
		d.onCleanup(func() {
			_ = p.cmd.Process.Kill() // an error once it has exited
			<-p.exited
		})
		select {
		case p.metrics = <-addr:
		case <-p.exited:
			return fmt.Errorf("pgworker run %d exited at start (%v); its log: %s", i, p.err, p.log)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Ready: each process's database connection and LISTEN are up.
	for _, p := range d.workers {
		if err := waitReady(ctx, p); err != nil {
			return err
		}
	}
	addrs := make([]string, len(d.workers))
	for i, p := range d.workers {
		addrs[i] = p.metrics
	}
	d.step("started %d x pgworker run --slots %d (heartbeat 1s, lease 5s); metrics on %s", len(d.workers), d.cfg.Slots,
		strings.Join(addrs, ", "))
	return nil
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func waitReady(ctx context.Context, p *workerProc) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := httpClient.Get("http://" + p.metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgworker run %d not ready within a minute; its log: %s", p.n, p.log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.exited:
			return fmt.Errorf("pgworker run %d exited (%v); its log: %s", p.n, p.err, p.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *demo) enqueue(ctx context.Context) (time.Time, error) {
	began := time.Now()
	out, err := d.pgworker(ctx, "enqueue", "--queue", demoQueue, "--max-attempts", "2", "--from", d.from)
	if err != nil {
		return began, err
	}
	d.step("pgworker enqueue --max-attempts 2 --from %s: %s", d.from, strings.TrimSpace(out))
	if err := d.db.QueryRow(ctx, "SELECT count(*) FROM files.files").Scan(&d.rep.Total); err != nil {
		return began, err
	}
	return began, nil
}

// watch shows the progress until every row is done or failed.
func (d *demo) watch(ctx context.Context, began time.Time) error {
	term := isTerminal(d.w)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	for {
		var done, failed, running, pending int
		rows, err := d.db.Query(ctx, "SELECT state, count(*) FROM files.files GROUP BY state")
		if err != nil {
			return err
		}
		for rows.Next() {
			var state string
			var n int
			if err := rows.Scan(&state, &n); err != nil {
				return err
			}
			switch state {
			case "done":
				done = n
			case "failed":
				failed = n
			case "running":
				running = n
			case "pending":
				pending = n
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		took := time.Since(began)
		line := fmt.Sprintf("done %3d  failed %d  running %2d  pending %3d   %5.1f rows/s", done, failed, running, pending,
			float64(done+failed)/took.Seconds())
		finished := done+failed == d.rep.Total
		switch {
		case term:
			fmt.Fprintf(d.w, "\r  %s ", line)
			if finished {
				fmt.Fprintln(d.w)
			}
		case finished || time.Since(lastPrint) >= 2*time.Second:
			fmt.Fprintf(d.w, "  %s\n", line)
			lastPrint = time.Now()
		}
		if finished {
			d.rep.Done, d.rep.Failed = done, failed
			d.step("all %d rows finished in %.1fs: %d done, %d failed", d.rep.Total, took.Seconds(), done, failed)
			return nil
		}
		for _, p := range d.workers {
			select {
			case <-p.exited:
				return fmt.Errorf("pgworker run %d exited (%v); its log: %s", p.n, p.err, p.log)
			default:
			}
		}
		if took > 3*time.Minute {
			return fmt.Errorf("the rows did not finish within 3 minutes; the workers' logs are in %s", filepath.Join(d.cfg.Out, "logs"))
		}
		select {
		case <-ctx.Done():
			if term {
				fmt.Fprintln(d.w)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// showMetrics prints a few lines of the first worker's /metrics.
func (d *demo) showMetrics(ctx context.Context) {
	p := d.workers[0]
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metrics+"/metrics", nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	fmt.Fprintf(d.w, "\nFrom http://%s/metrics (worker 1):\n", p.metrics)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		for _, prefix := range []string{"pgworker_rows_", "pgworker_slots", "pgworker_claim_races_lost_total", "pgworker_backend_duration_seconds_count"} {
			if strings.HasPrefix(l, prefix) {
				fmt.Fprintf(d.w, "  %s\n", l)
			}
		}
	}
}

// stopWorkers drains the workers with SIGTERM.
func (d *demo) stopWorkers() error {
	for _, p := range d.workers {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range d.workers {
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("pgworker run %d did not stop within 30s of SIGTERM; its log: %s", p.n, p.log)
		}
		if p.err != nil {
			return fmt.Errorf("pgworker run %d: %v; its log: %s", p.n, p.err, p.log)
		}
	}
	d.step("stopped the workers with SIGTERM: each drained and deregistered its slots")
	return nil
}

// summary prints the per-worker metrics, the failed rows and where the
// outputs are.
func (d *demo) summary(ctx context.Context) error {
	if err := d.printWorkerMetrics(ctx); err != nil {
		return err
	}
	if err := d.printFailedRows(ctx); err != nil {
		return err
	}
	d.printOutputs(ctx)
	return nil
}

// printWorkerMetrics prints files.worker_metrics, one line per worker slot.
func (d *demo) printWorkerMetrics(ctx context.Context) error {
	rows, err := d.db.Query(ctx, `
SELECT worker_id, processed, done, failed, lost, mean_duration, p95_duration
FROM files.worker_metrics WHERE processed > 0 OR lost > 0 ORDER BY pid, slot`)
	if err != nil {
		return err
	}
	fmt.Fprintln(d.w, "\nPer-worker metrics (files.worker_metrics; pgworker status shows them too):")
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  WORKER\tPROCESSED\tDONE\tFAILED\tLOST\tMEAN\tP95")
	for rows.Next() {
		var (
			id                        string
			processed, done, fail, lo int64
			mean, p95                 pgtype.Interval
		)
		if err := rows.Scan(&id, &processed, &done, &fail, &lo, &mean, &p95); err != nil {
			return err
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%s\t%s\n", id, processed, done, fail, lo, ms(mean), ms(p95))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return tw.Flush()
}

// printFailedRows prints the failed rows, with the first line of their
// error.
func (d *demo) printFailedRows(ctx context.Context) error {
	rows, err := d.db.Query(ctx, "SELECT id, source, attempt, coalesce(last_error, '') FROM files.files WHERE state = 'failed' ORDER BY id")
	if err != nil {
		return err
	}
	fmt.Fprintf(d.w, "\nFailed rows (%d; psql -f sql/ops/stuck_and_failed.sql lists them too):\n", d.rep.Failed)
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tSOURCE\tATTEMPTS\tERROR")
	for rows.Next() {
		var (
			id       int64
			src, msg string
			attempts int32
		)
		if err := rows.Scan(&id, &src, &attempts, &msg); err != nil {
			return err
		}
		msg, _, _ = strings.Cut(msg, "\n")
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\n", id, shortSource(src), attempts, clip(msg, 110))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return tw.Flush()
}

// printOutputs says where the outputs are, with the first lines of one.
func (d *demo) printOutputs(ctx context.Context) {
	var summaries []string
	results := filepath.Join(d.cfg.Out, "results")
	_ = filepath.WalkDir(results, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && e.Name() == "summary.txt" {
			summaries = append(summaries, p)
		}
		return nil
	})
	sort.Strings(summaries)
	rel := func(p string) string {
		if r, err := filepath.Rel(d.cfg.Root, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
		return p
	}
	fmt.Fprintf(d.w, "\nOutputs: %d summaries in %s/<id>/<attempt>-<token>/ (kept), e.g.\n", len(summaries), rel(results))
	var example string
	if err := d.db.QueryRow(ctx, `SELECT result->>'output_root' FROM files.files WHERE state = 'done' AND source LIKE '%.csv' ORDER BY id LIMIT 1`).
		Scan(&example); err == nil {
		example = strings.TrimPrefix(example, "file://") + "/summary.txt"
		fmt.Fprintf(d.w, "  %s\n", rel(example))
		if b, err := os.ReadFile(example); err == nil {
			for _, l := range strings.SplitN(string(b), "\n", 6)[:5] {
				fmt.Fprintf(d.w, "      %s\n", l)
			}
		}
	}
	for _, p := range summaries[:min(2, len(summaries))] {
		if p != example {
			fmt.Fprintf(d.w, "  %s\n", rel(p))
		}
	}
	fmt.Fprintf(d.w, "Each row's result (files.files.result) is its manifest: the outputs with their sizes and SHA-256.\n")
	fmt.Fprintf(d.w, "The workers' logs (JSON, one line per row start and end): %s\n", rel(filepath.Join(d.cfg.Out, "logs")))
}

func ms(iv pgtype.Interval) string {
	if !iv.Valid {
		return "-"
	}
	return (time.Duration(iv.Microseconds) * time.Microsecond).Round(time.Millisecond).String()
}

// shortSource shows the object key of a source URL.
func shortSource(s string) string {
	for _, prefix := range []string{"s3://demo-input/"} {
		s = strings.TrimPrefix(s, prefix)
	}
	if i := strings.Index(s, "/testdata/inputs/"); i >= 0 {
		s = s[i+len("/testdata/inputs/"):]
	}
	return s
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// quote quotes a path for --exec's shell-like splitting.
func quote(s string) string {
	if !strings.ContainsAny(s, " \t'\"\\{}") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// childEnv is the environment of the pgworker processes: the demo's, less
// whatever configures pgworker, libpq, S3 or MinIO.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PGWORKER_") || strings.HasPrefix(name, "PG") || name == "DATABASE_URL" ||
			strings.HasPrefix(name, "AWS_") || strings.HasPrefix(name, "MINIO_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
