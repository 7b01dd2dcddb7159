package metrics_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/metrics"
	"github.com/pgworker/pgworker/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handler completes "ok-*" rows, reporting 250ms of processing, and fails
// the others for good.
var handler = worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
	if strings.HasPrefix(job.Source, "ok-") {
		return &worker.Result{Output: "done", Duration: 250 * time.Millisecond}, nil
	}
	return &worker.Result{Duration: 100 * time.Millisecond}, worker.Permanent(errors.New("bad input"))
})

// stack is a worker whose metrics are served on a free port.
type stack struct {
	pool *pgxpool.Pool
	w    *worker.Worker
	m    *metrics.Metrics
	base string            // http://127.0.0.1:PORT
	ends chan worker.Event // the rows' end events, once m has counted them
}

func newStack(t *testing.T, cfg *metrics.Config) *stack {
	t.Helper()
	pool := pgtest.Pool(t)
	if cfg == nil {
		cfg = &metrics.Config{}
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = patience // a loaded machine's slow read is not an error
	}
	m := metrics.New(pool, cfg)
	srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(context.Background()); err != nil {
			t.Errorf("stop server: %v", err)
		}
	})
	ends := make(chan worker.Event, 1000)
	after := worker.ObserverFunc(func(e worker.Event) {
		if e.Kind != worker.RowStarted {
			ends <- e
		}
	})
	w, err := worker.New(pool, &worker.Config{
		Handler: handler, Slots: 4, Observer: worker.Observers(m, after), SafetyNet: time.Hour,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &stack{pool: pool, w: w, m: m, base: "http://" + srv.Addr(), ends: ends}
}

// awaitEnds waits until n rows have ended and the metrics have counted them.
func (s *stack) awaitEnds(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(patience)
	defer timeout.Stop()
	for i := range n {
		select {
		case <-s.ends:
		case <-timeout.C:
			t.Fatalf("%d of %d rows ended", i, n)
		}
	}
}

func (s *stack) start(t *testing.T) {
	t.Helper()
	s.m.Watch(s.w)
	if err := s.w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		if err := s.w.Stop(ctx); err != nil {
			t.Errorf("stop worker: %v", err)
		}
	})
	waitFor(t, "the worker to listen", func() bool { s := s.w.Stats(); return s.Listening && s.Claims >= 1 })
}

func (s *stack) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := s.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// client keeps no idle connections, which would outlive the tests.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: patience}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// samples is a scrape: each sample's value under its name and sorted labels,
// e.g. `pgworker_rows_failed_total{final="true",queue="default"}`.
type samples map[string]float64

func (s *stack) scrape(t *testing.T) samples {
	t.Helper()
	code, body := get(t, s.base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	return parse(t, body)
}

func parse(t *testing.T, body string) samples {
	t.Helper()
	out := samples{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		key := line[:i]
		if name, labels, ok := strings.Cut(key, "{"); ok {
			pairs := strings.Split(strings.TrimSuffix(labels, "}"), ",")
			sort.Strings(pairs)
			key = name + "{" + strings.Join(pairs, ",") + "}"
		}
		out[key] = v
	}
	return out
}

func (m samples) value(t *testing.T, key string) float64 {
	t.Helper()
	v, ok := m[key]
	if !ok {
		t.Fatalf("no sample %s in the scrape", key)
	}
	return v
}

func (m samples) want(t *testing.T, key string, want float64) {
	t.Helper()
	if got := m.value(t, key); got != want {
		t.Errorf("%s = %v, want %v", key, got, want)
	}
}

// patience bounds every wait for something that must happen: long enough
// for a machine loaded by other suites, so that only a defect times out.
const patience = 2 * time.Minute

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testhelp.WaitFor(t, patience, what, cond)
}

// A real scrape of a running worker: every metric is there, and the row
// counters, the duration histogram, the process counters and the queue
// gauges move with the work.
func TestScrapeFollowsTheWork(t *testing.T) {
	t.Parallel()
	s := newStack(t, &metrics.Config{QueueRefresh: time.Nanosecond})
	s.start(t)
	s.exec(t, "SELECT files.pause_queue('held')")
	s.exec(t, "INSERT INTO files.files (queue, source) SELECT 'held', 'held-' || g FROM generate_series(1, 3) g")

	before := s.scrape(t)
	for _, name := range []string{
		"pgworker_slots", "pgworker_slots_busy", "pgworker_slots_idle", "pgworker_claim_queries_total",
		"pgworker_claim_races_lost_total", "pgworker_claim_serialization_failures_total", "pgworker_claim_errors_total",
		"pgworker_lease_losses_total", "pgworker_listener_up", "pgworker_listener_reconnects_total", "pgworker_listener_quiets_total", "pgworker_outcome_records_deferred_total",
		"pgworker_outcomes_unrecorded", "pgworker_outcome_waits_total", "pgworker_heartbeats_total", "pgworker_heartbeat_errors_total", "pgworker_reaped_rows_total",
		"pgworker_scaling_needed_nodes", "pgworker_scaling_desired_nodes", "pgworker_scaling_backlog_per_instance",
		"pgworker_queue_stats_reads_total", "pgworker_queue_stats_errors_total", "pgworker_queue_stats_age_seconds",
		"go_goroutines", "process_resident_memory_bytes",
	} {
		before.value(t, name)
	}
	before.want(t, "pgworker_slots", 4)
	before.want(t, "pgworker_slots_idle", 4)
	before.want(t, "pgworker_listener_up", 1)
	before.want(t, "pgworker_outcomes_unrecorded", 0)
	before.want(t, `pgworker_queue_pending_rows{queue="held"}`, 3)
	before.want(t, `pgworker_queue_paused{queue="held"}`, 1)
	if v := before.value(t, `pgworker_queue_oldest_pending_age_seconds{queue="held"}`); v <= 0 {
		t.Errorf("oldest pending age %v, want > 0", v)
	}
	for _, absent := range []string{`pgworker_rows_done_total{queue="default"}`, "pgworker_scaling_mean_attempt_seconds"} {
		if _, ok := before[absent]; ok {
			t.Errorf("%s before any row", absent)
		}
	}

	s.exec(t, "INSERT INTO files.files (source) SELECT 'ok-' || g FROM generate_series(1, 5) g")
	s.exec(t, "INSERT INTO files.files (source, queue) VALUES ('bad-1', 'default'), ('bad-2', 'other')")
	s.awaitEnds(t, 7)
	// The heartbeat counter moves once per interval, however fast the rows
	// went: wait for one after the first scrape.
	beats := uint64(before.value(t, "pgworker_heartbeats_total"))
	waitFor(t, "a heartbeat after the first scrape", func() bool { return s.w.Stats().Heartbeats > beats })

	after := s.scrape(t)
	after.want(t, `pgworker_rows_claimed_total{queue="default"}`, 6)
	after.want(t, `pgworker_rows_claimed_total{queue="other"}`, 1)
	after.want(t, `pgworker_rows_done_total{queue="default"}`, 5)
	after.want(t, `pgworker_rows_failed_total{final="true",queue="default"}`, 1)
	after.want(t, `pgworker_rows_failed_total{final="true",queue="other"}`, 1)
	after.want(t, `pgworker_backend_duration_seconds_count{outcome="done",queue="default"}`, 5)
	after.want(t, `pgworker_backend_duration_seconds_sum{outcome="done",queue="default"}`, 1.25)
	after.want(t, `pgworker_backend_duration_seconds_bucket{le="0.25",outcome="done",queue="default"}`, 5)
	after.want(t, `pgworker_backend_duration_seconds_bucket{le="0.1",outcome="done",queue="default"}`, 0)
	after.want(t, `pgworker_backend_duration_seconds_count{outcome="failed",queue="other"}`, 1)
	after.want(t, "pgworker_slots_busy", 0)
	if a, b := after.value(t, "pgworker_claim_queries_total"), before.value(t, "pgworker_claim_queries_total"); a <= b {
		t.Errorf("claim queries did not move: %v then %v", b, a)
	}
	if a, b := after.value(t, "pgworker_heartbeats_total"), before.value(t, "pgworker_heartbeats_total"); a <= b {
		t.Errorf("heartbeats did not move: %v then %v", b, a)
	}
	if a, b := after.value(t, "pgworker_queue_stats_reads_total"), before.value(t, "pgworker_queue_stats_reads_total"); a != b+1 {
		t.Errorf("queue gauges read %v times between two scrapes, want once (refresh 1ns)", a-b)
	}
	after.want(t, `pgworker_queue_pending_rows{queue="default"}`, 0)
	after.want(t, `pgworker_queue_paused{queue="default"}`, 0)
	after.want(t, `pgworker_queue_pending_rows{queue="held"}`, 3)
	// Nothing outstanding but a paused queue's rows: no node needed; and now
	// a mean attempt time is known.
	after.want(t, "pgworker_scaling_needed_nodes", 0)
	after.want(t, "pgworker_scaling_desired_nodes", 0)
	if v := after.value(t, "pgworker_scaling_mean_attempt_seconds"); v <= 0 {
		t.Errorf("mean attempt seconds %v", v)
	}
	after.value(t, "pgworker_scaling_target_backlog_per_instance")

	// The listener's connection is cut: it comes back, and the counter says
	// so. (A loaded machine may have made it reconnect before: count from
	// here.)
	reconnects := s.w.Stats().ListenerReconnects
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgworker listener'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listen connections: %v", n, err)
	}
	waitFor(t, "the listener to reconnect", func() bool {
		st := s.w.Stats()
		return st.ListenerReconnects > reconnects && st.Listening
	})
	if v := s.scrape(t).value(t, "pgworker_listener_reconnects_total"); v <= float64(reconnects) {
		t.Errorf("listener reconnects %v after a reconnect, want more than %d", v, reconnects)
	}
}

// Scrapes within the refresh interval get the cached queue gauges: 20
// nodes scraping every few seconds cost the database one query per node and
// interval.
func TestQueueGaugesAreReadOncePerInterval(t *testing.T) {
	t.Parallel()
	s := newStack(t, &metrics.Config{QueueRefresh: time.Hour})
	s.exec(t, "SELECT files.pause_queue('q')")
	s.exec(t, "INSERT INTO files.files (queue, source) VALUES ('q', 'a')")
	first := s.scrape(t)
	first.want(t, "pgworker_queue_stats_reads_total", 1)
	first.want(t, `pgworker_queue_pending_rows{queue="q"}`, 1)

	s.exec(t, "INSERT INTO files.files (queue, source) VALUES ('q', 'b')")
	for range 5 {
		again := s.scrape(t)
		again.want(t, "pgworker_queue_stats_reads_total", 1)
		again.want(t, `pgworker_queue_pending_rows{queue="q"}`, 1)
	}
}

// A failed read keeps the last gauges, counts the error and says so once in
// the log; the next read after the interval recovers.
func TestQueueGaugesSurviveAFailedRead(t *testing.T) {
	t.Parallel()
	s := newStack(t, &metrics.Config{QueueRefresh: time.Nanosecond})
	s.exec(t, "INSERT INTO files.files (source) VALUES ('a')")
	s.scrape(t).want(t, `pgworker_queue_pending_rows{queue="default"}`, 1)

	s.exec(t, "ALTER VIEW files.scaling_hint RENAME TO scaling_hint_away")
	broken := s.scrape(t)
	broken.want(t, "pgworker_queue_stats_errors_total", 1)
	broken.want(t, `pgworker_queue_pending_rows{queue="default"}`, 1)

	s.exec(t, "ALTER VIEW files.scaling_hint_away RENAME TO scaling_hint")
	s.exec(t, "INSERT INTO files.files (source) VALUES ('b')")
	fixed := s.scrape(t)
	fixed.want(t, "pgworker_queue_stats_errors_total", 1)
	fixed.want(t, `pgworker_queue_pending_rows{queue="default"}`, 2)
	if age := fixed.value(t, "pgworker_queue_stats_age_seconds"); age > 5 {
		t.Errorf("queue gauges %vs old after a successful read", age)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	if code, body := get(t, s.base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	// No worker yet: not ready.
	if code, body := get(t, s.base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no worker started yet") {
		t.Errorf("/readyz before the worker: %d %q", code, body)
	}
	s.start(t)
	if code, body := get(t, s.base+"/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ready") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, body := get(t, s.base+"/"); code != http.StatusOK || !strings.Contains(body, "/metrics") {
		t.Errorf("/: %d %q", code, body)
	}
	if code, _ := get(t, s.base+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d", code)
	}

	// A database nobody answers for: alive, not ready, and it says why.
	down := closedPool(t)
	m := metrics.New(down, &metrics.Config{QueryTimeout: 2 * time.Second})
	m.Watch(s.w)
	srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	if code, _ := get(t, "http://"+srv.Addr()+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the database down: %d", code)
	}
	if code, body := get(t, "http://"+srv.Addr()+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database:") {
		t.Errorf("/readyz with the database down: %d %q", code, body)
	}
	// The scrape still answers, with the errors counted.
	code, body := get(t, "http://"+srv.Addr()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics with the database down: %d", code)
	}
	parse(t, body).want(t, "pgworker_queue_stats_errors_total", 1)
}

// /readyz is for anyone who reaches the port: when the database does not
// answer it gives a short reason, and the error, which names the user, the
// database and the host, goes to the log, once per change of state.
func TestReadinessKeepsTheDatabaseErrorInTheLog(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := pgtest.StartProxy(t, dbURL)
	proxy.Refuse()
	pool := pgtest.PoolFor(t, proxy.URL(t, dbURL))
	var log testhelp.SyncBuffer
	m := metrics.New(pool, &metrics.Config{
		QueryTimeout: 10 * time.Second,
		Logger:       slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	readyz := "http://" + srv.Addr() + "/readyz"

	pu, err := url.Parse(proxy.URL(t, dbURL))
	if err != nil {
		t.Fatal(err)
	}
	user, database := u.User.Username(), strings.TrimPrefix(u.Path, "/")
	secrets := []string{user, database, u.Hostname(), u.Port(), pu.Hostname(), pu.Port()}
	down := func(when string) {
		t.Helper()
		code, body := get(t, readyz)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "database: unreachable") {
			t.Errorf("/readyz %s: %d %q, want 503 and \"database: unreachable\"", when, code, body)
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(body, s) {
				t.Errorf("/readyz %s shows %q: %q", when, s, body)
			}
		}
		for _, e := range loggedErrors(t, &log) {
			if strings.Contains(body, e) {
				t.Errorf("/readyz %s shows the error %q", when, e)
			}
		}
	}

	down("with the database refusing")
	down("with the database still refusing")
	errs := loggedErrors(t, &log)
	if len(errs) != 1 {
		t.Fatalf("log after two probes of an unreachable database: %d errors, want 1:\n%s", len(errs), log.String())
	}
	for _, s := range []string{user, database, pu.Port()} {
		if !strings.Contains(errs[0], s) {
			t.Errorf("the logged error %q does not say %q", errs[0], s)
		}
	}

	proxy.Restore()
	if _, body := get(t, readyz); strings.Contains(body, "database") {
		t.Errorf("/readyz with the database back: %q", body)
	}
	if !strings.Contains(log.String(), "the database answers again") {
		t.Errorf("no line in the log when the database answered again:\n%s", log.String())
	}
	proxy.Refuse()
	proxy.Drop()
	down("with the database gone again")
	down("with the database still gone")
	if n := len(loggedErrors(t, &log)); n != 2 {
		t.Errorf("log after the database went away twice: %d errors, want 2:\n%s", n, log.String())
	}
}

// loggedErrors returns the "error" attribute of each logged line that has
// one.
func loggedErrors(t *testing.T, b *testhelp.SyncBuffer) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Error != "" {
			out = append(out, rec.Error)
		}
	}
	return out
}

// closedPool is a pool on a port nobody listens on.
func closedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Stop lets a request in progress finish, then the port is closed.
func TestServerStopsGracefully(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		fmt.Fprint(w, "finished")
	})
	srv := metrics.NewServer(h, &metrics.ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("Addr %s: want the port picked", addr)
	}
	if err := srv.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
	busy := metrics.NewServer(h, &metrics.ServerConfig{Addr: addr})
	if err := busy.Start(context.Background()); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("Start on a port in use: %v", err)
	}

	type reply struct {
		body string
		err  error
	}
	replies := make(chan reply, 1)
	go func() {
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			replies <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		replies <- reply{string(b), err}
	}()
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Stop(context.Background()) }()
	waitFor(t, "the port to close", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a request was in progress", err)
	default:
	}
	close(release)
	if r := <-replies; r.err != nil || r.body != "finished" {
		t.Errorf("the request in progress: %q %v", r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// A check added with AddReadyCheck makes /readyz say not ready, with the
// check's short reason, and ready again once it passes.
func TestReadyCheck(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	var mu sync.Mutex
	problem := errors.New("work directory out of space")
	s.m.AddReadyCheck(func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return problem
	})
	s.start(t)
	if code, body := get(t, s.base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "work directory out of space") {
		t.Errorf("/readyz with a failing check: %d %q", code, body)
	}
	mu.Lock()
	problem = nil
	mu.Unlock()
	if code, body := get(t, s.base+"/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ready") {
		t.Errorf("/readyz once the check passes: %d %q", code, body)
	}
}
