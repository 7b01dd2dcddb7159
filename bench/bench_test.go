package bench_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/bench"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := miniotest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newBench returns a Bench on a fresh migrated database, and its pool.
func newBench(t *testing.T, cfg *bench.Config) (*bench.Bench, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	b, err := bench.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b, pool
}

// shape marshals res and returns it as a JSON object, checking that the
// setup fields are there.
func shape(t *testing.T, res any, mode string) map[string]any {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["mode"] != mode || m["system"] != "pgworker" || m["queue"] != bench.Queue {
		t.Errorf("setup of %s: %s", mode, b)
	}
	for _, k := range []string{"version", "go_version", "postgres_version"} {
		if s, _ := m[k].(string); s == "" {
			t.Errorf("%s: %s is missing: %s", mode, k, b)
		}
	}
	return m
}

// positive checks that each key of m holds a number above zero.
func positive(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := m[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, m[k])
		}
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// cleanedUp checks that the benchmark left no row, slot or queue behind.
func cleanedUp(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, q := range []string{
		"SELECT count(*) FROM files.files WHERE queue = 'pgworker-bench'",
		"SELECT count(*) FROM files.attempts a LEFT JOIN files.files f ON f.id = a.file_id WHERE f.id IS NULL",
		"SELECT count(*) FROM files.workers WHERE worker_id LIKE 'pgworker-bench:%'",
		"SELECT count(*) FROM files.queues WHERE queue = 'pgworker-bench'",
		"SELECT count(*) FROM pg_namespace WHERE nspname = 'pgworker_bench_skiplocked'",
	} {
		if n := count(t, pool, q); n != 0 {
			t.Errorf("%s: %d, want 0", q, n)
		}
	}
}

func TestThroughput(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Throughput(context.Background(), &bench.ThroughputConfig{Rows: 50, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "throughput")
	positive(t, m, "rows_per_sec", "elapsed_ms", "insert_ms", "start_ms", "claims", "max_conns")
	if m["rows"] != 50.0 || m["slots"] != 4.0 {
		t.Errorf("rows %v, slots %v", m["rows"], m["slots"])
	}
	cleanedUp(t, pool)
}

// Rows with payloads of a given size burn down as others do, and the run
// says the size it gave them.
func TestThroughputWithPayloads(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Throughput(context.Background(), &bench.ThroughputConfig{Rows: 50, Slots: 4, PayloadBytes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "throughput")
	if n, ok := m["payload_bytes"].(float64); !ok || n > 2000 || n < 1950 {
		t.Errorf("payload_bytes %v, want about 2000", m["payload_bytes"])
	}
	cleanedUp(t, pool)
}

func TestLatency(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Latency(context.Background(), &bench.LatencyConfig{Rows: 10, Rate: 100, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "latency")
	positive(t, m, "rate", "slots", "rows", "claims")
	for _, k := range []string{"p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"} {
		if _, ok := m[k].(float64); !ok {
			t.Errorf("%s missing", k)
		}
	}
	if !(res.P50MS <= res.P90MS && res.P90MS <= res.P99MS && res.P99MS <= res.MaxMS) {
		t.Errorf("percentiles out of order: %+v", res.Percentiles)
	}
	if res.FromSend.P50MS < res.P50MS || res.FromSend.MaxMS <= 0 {
		t.Errorf("from_send %+v should not be shorter than from commit %+v", res.FromSend, res.Percentiles)
	}
	// Every row's pickup was traced step by step; a claim takes time, and
	// a claim's answer comes before the handler starts.
	if s := res.Steps; s == nil || s.Traced == 0 || s.Claim.P50MS <= 0 || s.ClaimToHandler.P50MS < 0 {
		t.Errorf("steps %+v", res.Steps)
	}
	cleanedUp(t, pool)
}

func TestSkipLocked(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.SkipLocked(context.Background(), &bench.SkipLockedConfig{Rows: 1000, Clients: 3, Batch: 7})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "skiplocked")
	// The server is on this machine: its CPU is read.
	positive(t, m, "rows_per_sec", "elapsed_ms", "server_cpu_ms_per_row", "client_cpu_ms_per_row")
	if res.Rows != 1000 || res.Clients != 3 || res.Batch != 7 {
		t.Errorf("result %+v", res)
	}
	cleanedUp(t, pool)
}

// The same burn-down through the SQL API: every row done, nothing left.
func TestSkipLockedThroughTheAPI(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.SkipLocked(context.Background(), &bench.SkipLockedConfig{Rows: 1000, Clients: 3, Batch: 7, API: true})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "skiplocked")
	positive(t, m, "rows_per_sec", "elapsed_ms", "server_cpu_ms_per_row", "client_cpu_ms_per_row")
	if !res.API || m["api"] != true {
		t.Errorf("result %+v", res)
	}
	cleanedUp(t, pool)
}

// The bare loop with the rows the guarantees write burns every row down (a
// completion that recorded fewer outcomes than it was given, its token
// checked, fails the run) and leaves no scratch schema; it does not go with
// the SQL API.
func TestSkipLockedWithBookkeeping(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.SkipLocked(context.Background(), &bench.SkipLockedConfig{Rows: 1000, Clients: 3, Batch: 7, Bookkeeping: true})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "skiplocked")
	positive(t, m, "rows_per_sec", "elapsed_ms", "server_cpu_ms_per_row", "client_cpu_ms_per_row")
	if !res.Bookkeeping || m["bookkeeping"] != true || res.API {
		t.Errorf("result %+v", res)
	}
	cleanedUp(t, pool)

	if _, err := b.SkipLocked(context.Background(), &bench.SkipLockedConfig{API: true, Bookkeeping: true}); err == nil {
		t.Errorf("--api with --bookkeeping: no error")
	}
}

func TestCPU(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  bench.CPUConfig
		rows int
	}{
		{"rate", bench.CPUConfig{Rate: 100, Duration: 300 * time.Millisecond, Slots: 4}, 30},
		{"peak", bench.CPUConfig{Rows: 200, Slots: 4}, 200},
		{"rate with a claim cooldown", bench.CPUConfig{Rate: 100, Duration: 300 * time.Millisecond, Slots: 4, ClaimCooldown: 50 * time.Millisecond}, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b, pool := newBench(t, nil)
			res, err := b.CPU(context.Background(), &c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := shape(t, res, "cpu")
			// A row costs the server a transaction or more, WAL and CPU.
			positive(t, m, "rows_per_sec", "server_cpu_ms_per_row", "wal_bytes_per_row", "xacts_per_row", "claims")
			if res.Rows != c.rows || res.CooldownMS != float64(c.cfg.ClaimCooldown.Milliseconds()) {
				t.Errorf("rows %d (want %d), claim cooldown %g ms", res.Rows, c.rows, res.CooldownMS)
			}
			cleanedUp(t, pool)
		})
	}
}

// Notify's five phases each insert their rows, and the bare queue claims
// every row of its phase and times each pickup; the scratch schema and the
// rows of files.files go at the end.
func TestNotify(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Notify(context.Background(), &bench.NotifyConfig{Rate: 100, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "notify")
	positive(t, m, "rate")
	var names []string
	for _, p := range res.Phases {
		names = append(names, p.Name)
		if p.Rows != 20 || p.RowsPerSec <= 0 || p.ServerCPUMSPerRow < 0 || p.WALBytesPerRow <= 0 {
			t.Errorf("phase %s: %+v", p.Name, p)
		}
		// Both queues time their pickups; the bare one's notifications
		// name their rows, pgworker's name the queue.
		timed := p.Pickup != nil && p.Claim != nil
		if want := p.Name == bench.PhaseQueue || p.Name == bench.PhaseAPI; timed != want {
			t.Errorf("phase %s: pickup timed %v, want %v", p.Name, timed, want)
		}
		if notified, want := p.CommitToNotify != nil, p.Name == bench.PhaseQueue; notified != want {
			t.Errorf("phase %s: notification timed %v, want %v", p.Name, notified, want)
		}
		if timed && (p.Pickup.MaxMS <= 0 || p.Claim.P50MS <= 0) {
			t.Errorf("phase %s: pickup %+v, claim %+v", p.Name, *p.Pickup, *p.Claim)
		}
	}
	if want := []string{bench.PhaseInsert, bench.PhaseNotify, bench.PhaseListen, bench.PhaseQueue, bench.PhaseEnqueue, bench.PhaseAPI}; !slices.Equal(names, want) {
		t.Errorf("phases %v, want %v", names, want)
	}
	cleanedUp(t, pool)
}

func TestClaimDepth(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.ClaimDepth(context.Background(), &bench.ClaimDepthConfig{Depths: []int{1000, 200}, Claims: 5})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "claim-depth")
	positive(t, m, "ratio_claim_batch", "ratio_claim", "claims", "pending_percent")
	if len(res.Depths) != 2 || res.Depths[0].Rows != 200 || res.Depths[1].Rows != 1000 {
		t.Fatalf("depths: %+v", res.Depths)
	}
	if res.Depths[0].Pending != 2 || res.Depths[1].Pending != 10 {
		t.Errorf("pending rows %d and %d, want 2 and 10", res.Depths[0].Pending, res.Depths[1].Pending)
	}
	if res.RatioDepths != [2]int{1000, 200} {
		t.Errorf("ratio_depths %v", res.RatioDepths)
	}
	for _, d := range res.Depths {
		if d.ClaimBatch.P50MS <= 0 || d.Claim.P50MS <= 0 {
			t.Errorf("depth %d: %+v", d.Rows, d)
		}
	}
	var track string
	if err := pool.QueryRow(context.Background(), "SELECT current_setting('track_functions')").Scan(&track); err != nil {
		t.Fatal(err)
	}
	if track != "none" && (res.Depths[0].ClaimBatchServerMS == nil || res.Depths[0].ClaimServerMS == nil) {
		t.Errorf("track_functions is %s, but no server-side time was read", track)
	}
	cleanedUp(t, pool)
}

func TestHerd(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Herd(context.Background(), &bench.HerdConfig{Processes: 3, Slots: 2, Rows: 4, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "herd")
	positive(t, m, "claim_batch_calls", "claim_queries_per_row", "claim_queries_per_process_per_wakeup",
		"client_claims", "max_process_claims_per_row")
	// Every row is claimed by someone: at least one query per row.
	if res.ClaimBatchCalls+res.ClaimCalls < 4 {
		t.Errorf("%d claim queries for 4 rows", res.ClaimBatchCalls+res.ClaimCalls)
	}
	if int64(res.ClientClaims) > res.ClaimBatchCalls+res.ClaimCalls {
		t.Errorf("the runtimes sent %d claims, the server counted %d", res.ClientClaims, res.ClaimBatchCalls+res.ClaimCalls)
	}
	cleanedUp(t, pool)
}

// copyLines is a stand-in for the enqueue command, which the cli package
// passes (and its tests run through pgworker bench enqueue).
func copyLines(pool *pgxpool.Pool) func(ctx context.Context, queue string, batchSize int, r io.Reader) error {
	return func(ctx context.Context, queue string, _ int, r io.Reader) error {
		var rows [][]any
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			rows = append(rows, []any{queue, sc.Text()})
		}
		if err := sc.Err(); err != nil {
			return err
		}
		_, err := pool.CopyFrom(ctx, pgx.Identifier{"files", "files"}, []string{"queue", "source"}, pgx.CopyFromRows(rows))
		return err
	}
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	var first string
	load := copyLines(pool)
	res, err := b.Enqueue(context.Background(), &bench.EnqueueConfig{
		Rows: 1234,
		Load: func(ctx context.Context, queue string, batchSize int, noKey bool, r io.Reader) error {
			if queue != bench.Queue || batchSize != 10000 {
				t.Errorf("Load(%q, %d)", queue, batchSize)
			}
			br := bufio.NewReader(r)
			first, _ = br.ReadString('\n')
			return load(ctx, queue, batchSize, io.MultiReader(strings.NewReader(first), br))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "enqueue")
	positive(t, m, "rows_per_sec", "elapsed_ms", "batch_size")
	if first != "enqueue/000000001\n" {
		t.Errorf("first source %q", first)
	}
	cleanedUp(t, pool)

	_, err = b.Enqueue(context.Background(), &bench.EnqueueConfig{Rows: 10})
	if err == nil || !strings.Contains(err.Error(), "Load is required") {
		t.Errorf("Enqueue without Load: %v", err)
	}
	_, err = b.Enqueue(context.Background(), &bench.EnqueueConfig{
		Rows: 10,
		Load: func(ctx context.Context, queue string, batchSize int, _ bool, r io.Reader) error {
			return load(ctx, queue, batchSize, io.LimitReader(r, 5*18)) // five lines
		},
	})
	if err == nil || !strings.Contains(err.Error(), "loaded 5 rows, want 10") {
		t.Errorf("Enqueue that loses rows: %v", err)
	}
}

func TestPipeline(t *testing.T) {
	t.Parallel()
	srv := miniotest.Shared(t)
	bucket := srv.Bucket(t)
	opts := blob.Options{Endpoint: srv.Endpoint, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, Region: "us-east-1"}
	open := func(u string) blob.Store {
		s, err := blob.Open(context.Background(), u, &opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	in, out := open("s3://"+bucket+"/in"), open("s3://"+bucket+"/out")
	b, pool := newBench(t, nil)
	res, err := b.Pipeline(context.Background(), &bench.PipelineConfig{Rows: 6, Slots: 2, ObjectSize: 100, Rounds: 3, Input: in, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "pipeline")
	positive(t, m, "overhead_ratio", "object_bytes")
	for _, k := range []string{"queued", "direct", "bare"} {
		r, _ := m[k].(map[string]any)
		positive(t, r, "rows_per_sec", "elapsed_ms")
	}
	// Each round ran all three ways.
	for _, ms := range [][]float64{res.RoundMS.Direct, res.RoundMS.Queued, res.RoundMS.Bare} {
		if len(ms) != 3 {
			t.Errorf("round times %v, want 3", ms)
		}
	}
	// Each way's CPU: the handlers' transfers in this process, the program in
	// its children.
	cpu, _ := m["cpu_ms_per_row"].(map[string]any)
	for _, k := range []string{"direct", "queued", "bare"} {
		w, _ := cpu[k].(map[string]any)
		positive(t, w, "process", "program")
	}
	if res.Exec != bench.DefaultPipelineExec || res.InputStore != "s3://"+bucket+"/in/" {
		t.Errorf("exec %q, input store %q", res.Exec, res.InputStore)
	}
	cleanedUp(t, pool)
	for _, s := range []blob.Store{in, out} {
		for info, err := range s.List(context.Background(), "") {
			if err != nil {
				t.Fatal(err)
			}
			t.Errorf("%s: object %s left behind", s.Location(), info.Key)
		}
	}
}

// TestScratchOnly: a database in use is refused unless forced, and its rows
// survive either way.
func TestScratchOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, pool := newBench(t, nil)
	if _, err := pool.Exec(ctx, "INSERT INTO files.files (queue, source) VALUES ('photos', 'a.jpg'), ('pgworker-bench', 'leftover')"); err != nil {
		t.Fatal(err)
	}
	_, err := b.Throughput(ctx, &bench.ThroughputConfig{Rows: 5, Slots: 1})
	if !errors.Is(err, bench.ErrNotScratch) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("Throughput on a database in use: %v", err)
	}
	forced, err := bench.New(pool, &bench.Config{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := forced.Throughput(ctx, &bench.ThroughputConfig{Rows: 5, Slots: 1}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files WHERE queue = 'photos' AND state = 'pending'"); n != 1 {
		t.Errorf("the user's row: %d left pending, want 1", n)
	}
	cleanedUp(t, pool)

	// Live slots of a user's worker count as use too.
	if _, err := pool.Exec(ctx, "DELETE FROM files.files"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT files.register_worker('node:1:0')"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Latency(ctx, &bench.LatencyConfig{Rows: 1}); !errors.Is(err, bench.ErrNotScratch) {
		t.Errorf("Latency beside a live slot: %v", err)
	}
}

func TestNoSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolFor(t, pgtest.EmptyURL(t))
	b, err := bench.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Herd(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "pgworker migrate up") {
		t.Errorf("Herd without the schema: %v", err)
	}
}

func TestLongTx(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  bench.LongTxConfig
	}{
		{"fixed rate", bench.LongTxConfig{Rate: 200, Slots: 4, Phase: time.Second, SampleEvery: 400 * time.Millisecond}},
		{"peak", bench.LongTxConfig{Depth: 50, Slots: 4, Phase: time.Second, SampleEvery: 400 * time.Millisecond}},
		{"processes", bench.LongTxConfig{Rate: 200, Processes: 3, Slots: 2, Phase: time.Second, SampleEvery: 400 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, pool := newBench(t, nil)
			res, err := b.LongTx(context.Background(), &tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := shape(t, res, "long-tx")
			positive(t, m, "rows", "slots", "processes", "phase_sec")
			if want := max(tc.cfg.Processes, 1); res.Processes != want {
				t.Errorf("processes %d, want %d", res.Processes, want)
			}
			var names []string
			for i, p := range res.Phases {
				names = append(names, p.Name)
				if p.HeldSnapshot != (i == 1) {
					t.Errorf("phase %s: held_snapshot %v", p.Name, p.HeldSnapshot)
				}
				if p.End.TableBytes <= 0 {
					t.Errorf("phase %s: table size %d", p.Name, p.End.TableBytes)
				}
				if p.DepthEnd < 0 || p.DepthMax < 0 {
					t.Errorf("phase %s: depth at end %d, max %d", p.Name, p.DepthEnd, p.DepthMax)
				}
				// Each row done wrote WAL: its claim and its outcome at least.
				if p.RowsPerSec > 0 && p.WALBytesPerRow <= 0 {
					t.Errorf("phase %s: %g bytes of WAL per row", p.Name, p.WALBytesPerRow)
				}
			}
			if strings.Join(names, ",") != "clean,idle-in-tx,recovery" {
				t.Errorf("phases %v", names)
			}
			// Every sample belongs to a phase, in order, and the run's rows
			// all ended done (LongTx checks it before it returns).
			last := -1.0
			claims, empty, heard, inserts, outcomes := 0, 0, false, false, false
			var waits uint64
			for _, s := range res.Samples {
				if !slices.Contains(names, s.Phase) || s.AtSec <= last || s.Depth < 0 {
					t.Errorf("sample %+v after %gs", s, last)
				}
				last = s.AtSec
				claims, empty = claims+s.Claims, empty+s.EmptyClaims
				heard = heard || s.NotifyIdleMaxMS > 0
				if s.NotifyIdleMaxMS < 0 {
					t.Errorf("sample %+v: notifications' gap", s)
				}
				if s.Claims > 0 && (s.ClaimP50MS <= 0 || s.ClaimMaxMS < s.ClaimP99MS || s.ClaimIdleMaxMS < 0) {
					t.Errorf("sample %+v: claims' round trips", s)
				}
				// From the insert's answer, a pickup is shorter than from
				// its created_at: that adds the insert's own round trip.
				if s.PickupFromReturnP50MS < 0 || s.PickupFromReturnP50MS > s.PickupP50MS ||
					s.PickupFromReturnP99MS > s.PickupP99MS || s.InsertMaxMS < s.InsertP99MS || s.OutcomeMaxMS < s.OutcomeP99MS {
					t.Errorf("sample %+v: pickups from the insert's answer, or the inserts' or outcomes' round trips", s)
				}
				inserts = inserts || s.InsertP99MS > 0
				outcomes = outcomes || s.OutcomeP99MS > 0
				waits += s.OutcomeWaits
			}
			// A slot waits for its own outcome at most once a row.
			if waits > uint64(res.Rows) {
				t.Errorf("slots waited for their outcomes %d times for %d rows", waits, res.Rows)
			}
			if !inserts || !outcomes {
				t.Errorf("the samples timed the producer's inserts: %v, the workers' outcome calls: %v", inserts, outcomes)
			}
			for _, p := range res.Phases {
				if p.Pickup.P50MS > 0 && (p.PickupFromReturn.P50MS > p.Pickup.P50MS || p.Insert.P50MS <= 0) {
					t.Errorf("phase %s: pickup %+v, from the insert's answer %+v, inserts %+v", p.Name, p.Pickup, p.PickupFromReturn, p.Insert)
				}
			}
			// The samples saw the workers' claims: each row was returned by
			// one of them, and a claim returns at most a row per slot.
			if slotsAll := int64(res.Slots * res.Processes); int64(claims-empty)*slotsAll < res.Rows/2 || empty > claims {
				t.Errorf("samples saw %d claims (%d empty) for %d rows", claims, empty, res.Rows)
			}
			// The first runtime's listener heard the producer's inserts.
			if !heard {
				t.Errorf("no sample recorded two notifications")
			}
			if len(res.Samples) < 3 {
				t.Errorf("%d samples", len(res.Samples))
			}
			cleanedUp(t, pool)
		})
	}
}

func TestSoak(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Soak(context.Background(), &bench.SoakConfig{Duration: 1500 * time.Millisecond, Rate: 100, Slots: 2,
		SampleEvery: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "soak")
	positive(t, m, "rows", "rate", "duration_sec")
	if res.Summary.Name != "soak" || len(res.Samples) < 2 || res.PruneCalls != 0 {
		t.Errorf("summary %+v, %d samples, %d prune calls", res.Summary, len(res.Samples), res.PruneCalls)
	}
	cleanedUp(t, pool)

	// Pruning needs retention (files.prune, files.keep_queue); without it
	// the soak does not start, with it every such run prunes.
	var retention bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regproc('files.prune') IS NOT NULL").Scan(&retention); err != nil {
		t.Fatal(err)
	}
	res, err = b.Soak(context.Background(), &bench.SoakConfig{Duration: time.Second, Rate: 100, Slots: 2, PruneEvery: time.Second})
	switch {
	case !retention && (err == nil || !strings.Contains(err.Error(), "files.prune")):
		t.Errorf("soak with pruning and no files.prune: %v", err)
	case retention && err != nil:
		t.Errorf("soak with pruning: %v", err)
	case retention && res.PruneCalls < 1:
		t.Errorf("soak with pruning made %d prune calls", res.PruneCalls)
	}
	cleanedUp(t, pool)
}

// Views leaves nothing behind, its made-up live slots neither: the next
// mode runs on the same database.
func TestViews(t *testing.T) {
	t.Parallel()
	b, pool := newBench(t, nil)
	res, err := b.Views(context.Background(), &bench.ViewsConfig{Rows: 2000, Attempts: 2000, Slots: 32, Queries: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := shape(t, res, "views")
	if qs, _ := m["queries"].([]any); len(qs) < 7 {
		t.Errorf("%d reads timed, want every view and pgworker status", len(qs))
	}
	cleanedUp(t, pool)
	if n := count(t, pool, "SELECT count(*) FROM files.workers"); n != 0 {
		t.Errorf("%d slots left behind", n)
	}
	if _, err := b.Throughput(context.Background(), &bench.ThroughputConfig{Rows: 20, Slots: 2}); err != nil {
		t.Fatalf("a run after views: %v", err)
	}
}
