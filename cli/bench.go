package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pgworker/pgworker/bench"
	"github.com/pgworker/pgworker/blob"
)

var benchCommand = &command{
	name:    "bench",
	args:    "MODE [flags]",
	summary: "measure throughput, pickup latency, claim cost, herd, enqueue and pipeline speed",
	help: `
Measures pgworker on the database that --database-url names, with the real
worker runtime, SQL API and enqueue path, and prints the figures with their
setup (--json: one JSON object on one line).

  throughput   pre-inserted rows burnt down by a no-op handler (rows/s)
  latency      rows inserted one at a time at a steady rate while every slot
               is idle: insert commit to handler start (p50, p90, p99, max)
  claim-depth  the time of one claim with up to millions of finished rows in
               the table, and how it grows with the table
  herd         many idle processes, one row at a time: claim queries per row
               and per process per wake-up, counted by the server
  enqueue      rows/s through pgworker enqueue's COPY path
  batches      files.batch_progress and the export of a batch (pgworker
               results) at millions of rows
  pipeline     rows/s of download, program, upload through MinIO or S3,
               beside the same steps in a loop with no queue at all

The scratch rows go to the queue pgworker-bench, and are deleted when the
mode ends. A benchmark belongs on a scratch database: bench refuses one that
holds rows of other queues or live worker slots unless --force is given (it
then still deletes only the rows of queue pgworker-bench; but live workers
that serve every queue would take some of them). The user must own the files
schema (it writes files.files directly). The sizes have no environment
twins: the command line says what was measured. To make a scratch database:

  createdb pgworker_bench
  pgworker migrate up --database-url postgres:///pgworker_bench

Run 'pgworker bench MODE --help' for a mode's flags.`,
	examples: `
pgworker bench throughput --database-url postgres:///pgworker_bench --rows 20000 --slots 100
pgworker bench latency --rows 500 --rate 50 --slots 100 --json
pgworker bench claim-depth --depths 10k,1M
pgworker bench herd --processes 20 --slots 50
pgworker bench enqueue --rows 1000000
pgworker bench pipeline --input-store s3://bench/in --output-store s3://bench/out --rows 2000 --slots 8`,
}

var benchModes = map[string]*command{
	"throughput": {
		name: "bench throughput", args: "[--rows N] [--slots N] [--json] [flags]",
		help: `
Loads --rows rows into the paused queue pgworker-bench with COPY (not timed),
starts a worker runtime with --slots slots and a no-op handler, resumes the
queue and times it until every outcome is recorded. JSON: rows_per_sec,
elapsed_ms, insert_ms, start_ms (the worker's start, not timed), claims.`,
		examples: "pgworker bench throughput --rows 20000 --slots 100\npgworker bench throughput --rows 50000 --slots 2000 --json",
	},
	"latency": {
		name: "bench latency", args: "[--rows N] [--rate R] [--slots N] [--json] [flags]",
		help: `
Starts a worker runtime with --slots idle slots, then inserts --rows rows one
at a time (one INSERT and commit each) at --rate per second, after five
warm-up rows. For each row it takes the time from the insert's commit
returning to the handler's start. JSON: p50_ms, p90_ms, p99_ms, max_ms,
mean_ms, and the same from just before the insert was sent (from_send).`,
		examples: "pgworker bench latency --rows 500 --rate 50 --slots 100\npgworker bench latency --json | jq .p50_ms",
	},
	"claim-depth": {
		name: "bench claim-depth", args: "[--depths N,N,...] [--claims N] [--json] [flags]",
		help: `
Grows the table through --depths rows (1% pending, the rest done; with
INSERT ... SELECT generate_series, a million rows a statement, then VACUUM
ANALYZE) and times at each depth --claims committed claims of one row for one
slot, with files.claim_batch (what the worker runtime sends) and with
files.claim, alternately; each claimed row is released at once. JSON: per
depth the percentiles of both, the server's mean per call when
track_functions is on, and ratio_claim_batch and ratio_claim: the median at
the largest depth over the one at the smallest.

Ten million rows take a few minutes to build and need about 2 GB of disk;
--depths picks the sizes (k and M suffixes allowed).`,
		examples: "pgworker bench claim-depth\npgworker bench claim-depth --depths 10k,1M --claims 500 --json",
	},
	"herd": {
		name: "bench herd", args: "[--processes N] [--slots N] [--rows N] [--json] [flags]",
		help: `
Starts --processes worker runtimes in this process, each with its own pool and
LISTEN connection as separate processes would have, and --slots idle slots
each. Inserts --rows rows one at a time, each once the previous one was
picked up and --interval passed, and counts the claim queries the server ran
(calls of files.claim_batch and files.claim in pg_stat_user_functions, read
once the statistics settle; they need track_functions, which a superuser's
benchmark turns on for its own sessions). JSON: claim_queries_per_row,
claim_queries_per_process_per_wakeup, and the runtimes' own counts.`,
		examples: "pgworker bench herd --processes 20 --slots 50\npgworker bench herd --processes 5 --rows 20 --json",
	},
	"enqueue": {
		name: "bench enqueue", args: "[--rows N] [--chunk-size N] [--present P] [--no-key] [--json] [flags]",
		help: `
Runs pgworker enqueue itself on --rows generated sources fed as lines of
standard input, into queue pgworker-bench, and times it from its start
(connecting included) to the commit of the last batch. Rows are keyed by
their source, as pgworker enqueue does unless --no-key; --present enqueues
that share of the sources first (not timed), as when an enqueue runs again
after it stopped halfway. JSON: rows_per_sec, elapsed_ms, batch_size,
present, keyed.`,
		examples: "pgworker bench enqueue --rows 1000000\npgworker bench enqueue --rows 100000 --chunk-size 1000 --json",
	},
	"batches": {
		name: "bench batches", args: "[--rows N] [--batches N] [--export-rows N] [--queries N] [--json] [flags]",
		help: `
Fills files.files with --rows rows in --batches batches (half of them done,
with a result manifest each; inserted by the server, not timed), then times
--queries reads of files.batch_progress, whole and for one batch, and the
export of one batch of --export-rows rows through the queue package's
Results, as pgworker results reads it. JSON: all_batches and one_batch
(p50_ms, p99_ms, ...), export_rows_per_sec, peak_rss_mib (the process's
peak resident memory after the export).`,
		examples: "pgworker bench batches --rows 10000000\npgworker bench batches --rows 200000 --export-rows 100000 --json",
	},
	"pipeline": {
		name: "bench pipeline", args: "--input-store URL --output-store URL [--rows N] [--slots N] [--json] [flags]",
		help: `
Uploads --rows objects of --size bytes under a prefix of its own in the input
store (not timed), then runs the pipeline of pgworker run (download, run
--exec, upload the outputs) on them twice with --slots at once: as a loop that
calls the pipeline on synthetic jobs with no queue at all, and through the
queue and the worker runtime. The rows are split into --rounds, each run both
ways in alternating order, so that a load on the machine that changes during
the run weighs on both alike; a warm-up loop comes first. The objects and
outputs are deleted at the end (a file:// store keeps the emptied
directories). JSON: queued and direct (rows_per_sec, elapsed_ms),
overhead_ratio (direct rate over queued rate) and overhead_pct.

The S3 endpoint and credentials come from PGWORKER_S3_ENDPOINT,
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for pgworker run. There is no
shell between pgworker and --exec: write 'cp {input} {output_dir}/out', not a
redirection.`,
		examples: "pgworker bench pipeline --input-store s3://bench/in --output-store s3://bench/out\n" +
			"pgworker bench pipeline --input-store file:///tmp/in --output-store file:///tmp/out --rows 500 --json",
	},
}

// benchModeOrder lists the modes for messages.
const benchModeOrder = "throughput, latency, claim-depth, herd, enqueue, batches or pipeline"

func (c *CLI) bench(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("name a mode: %s (see 'pgworker bench --help')", benchModeOrder)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		e.invocation(benchCommand).fs.printHelp(e.stdout)
		return nil
	}
	mode := args[0]
	sub, ok := benchModes[mode]
	if !ok {
		return usagef("unknown bench mode %q: say %s", mode, benchModeOrder)
	}
	inv := e.invocation(sub)
	f := &benchFlags{mode: mode}
	f.add(inv.fs)
	if help, err := inv.parse(args[1:]); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	if err := f.check(inv.fs); err != nil {
		return err
	}
	if err := inv.resolve(); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	pool, err := inv.connect(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	b, err := bench.New(pool, &bench.Config{Force: f.force, Version: version(), Logger: inv.logger()})
	if err != nil {
		return err
	}
	res, err := c.runBench(ctx, inv, b, f)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("bench %s: gave up after --timeout %s: %w", mode, f.timeout, err)
		}
		return err
	}
	if f.asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	_, err = fmt.Fprintln(e.stdout, benchText(res))
	return err
}

// benchFlags are the flags of one bench mode: the common ones, and those
// of the mode (the others stay zero).
type benchFlags struct {
	mode    string
	asJSON  bool
	force   bool
	timeout time.Duration

	rows, slots, maxConns, claims, processes, batchSize, size, rounds int
	batches, exportRows                                               int
	rate, present                                                     float64
	noKey, fairShare                                                  bool
	maxRunning                                                        int
	depths, execCmd, inputStore, outputStore                          string
	interval                                                          time.Duration
	depthList                                                         []int // parsed from depths
}

func (f *benchFlags) add(fs *flagSet) {
	fs.BoolVar(&f.asJSON, "json", false, "print the result as one line of JSON")
	fs.BoolVar(&f.force, "force", false, "run on a database that holds rows of other queues or live worker slots (only rows of queue pgworker-bench are deleted)")
	fs.DurationVar(&f.timeout, "timeout", time.Hour, "give up after this long")
	switch f.mode {
	case "throughput":
		fs.IntVar(&f.rows, "rows", 20000, "`N` rows to burn down")
		fs.IntVar(&f.slots, "slots", 100, "`N` slots of the worker")
		fs.IntVar(&f.maxConns, "max-conns", 8, "`N` connections in the worker's pool")
		fs.IntVar(&f.maxRunning, "max-running", 0, "cap the queue's running rows at `N` (files.queues.max_running), to measure what the cap costs; 0 for none")
		fs.BoolVar(&f.fairShare, "fair-share", false, "let the queue's batches take turns (files.queues.fair_share)")
		fs.IntVar(&f.batches, "batches", 0, "spread the rows over `N` batches (0: rows without a batch)")
	case "latency":
		fs.IntVar(&f.rows, "rows", 500, "`N` rows to insert and time")
		fs.Float64Var(&f.rate, "rate", 50, "rows inserted per second")
		fs.IntVar(&f.slots, "slots", 100, "`N` idle slots of the worker")
	case "claim-depth":
		fs.StringVar(&f.depths, "depths", "10000,1000000,10000000", "table sizes to measure at: comma-separated `N`s (10k, 1M allowed)")
		fs.IntVar(&f.claims, "claims", 200, "`N` timed claims of each function per depth")
	case "herd":
		fs.IntVar(&f.processes, "processes", 20, "`N` worker runtimes, each with its own connections")
		fs.IntVar(&f.slots, "slots", 50, "`N` idle slots per runtime")
		fs.IntVar(&f.rows, "rows", 100, "`N` rows inserted one at a time")
		fs.DurationVar(&f.interval, "interval", 50*time.Millisecond, "pause after each row is picked up, before the next insert")
	case "enqueue":
		fs.IntVar(&f.rows, "rows", 1_000_000, "`N` sources to enqueue")
		fs.IntVar(&f.batchSize, "chunk-size", defaultBatchSize, "`N` rows per COPY batch and transaction, as pgworker enqueue --chunk-size")
		fs.Float64Var(&f.present, "present", 0, "share `P` (0 to below 1) of the sources enqueued before the timed run, as after an enqueue stopped halfway")
		fs.BoolVar(&f.noKey, "no-key", false, "enqueue without keys, as pgworker enqueue --no-key")
	case "batches":
		fs.IntVar(&f.rows, "rows", 10_000_000, "`N` rows in the table")
		fs.IntVar(&f.batches, "batches", 10, "`N` batches the rows are spread over")
		fs.IntVar(&f.exportRows, "export-rows", 1_000_000, "`N` rows of the batch that is exported")
		fs.IntVar(&f.claims, "queries", 50, "`N` timed reads of each kind")
	case "pipeline":
		fs.IntVar(&f.rows, "rows", 2000, "`N` rows, one input object each")
		fs.IntVar(&f.slots, "slots", 8, "`N` slots of the worker, and goroutines of the loop without a queue")
		fs.IntVar(&f.size, "size", 4096, "`BYTES` per input object")
		fs.IntVar(&f.rounds, "rounds", 4, "`N` rounds, each running its share of the rows both ways")
		fs.StringVar(&f.execCmd, "exec", bench.DefaultPipelineExec, "the backend `COMMAND`, with placeholders as for pgworker run")
		fs.StringVar(&f.inputStore, "input-store", "", "`URL` to upload the inputs to: s3://bucket/prefix or file:///dir")
		fs.env("input-store", "PGWORKER_INPUT_STORE")
		fs.StringVar(&f.outputStore, "output-store", "", "`URL` for the outputs: s3://bucket/prefix or file:///dir")
		fs.env("output-store", "PGWORKER_OUTPUT_STORE")
	}
}

// check validates the flags that need no I/O.
func (f *benchFlags) check(fs *flagSet) error {
	for _, fl := range []struct {
		name    string
		v, high int
	}{{"rows", f.rows, 100_000_000}, {"slots", f.slots, 10_000}, {"max-conns", f.maxConns, 1000}, {"claims", f.claims, 1_000_000},
		{"processes", f.processes, 500}, {"chunk-size", f.batchSize, 1_000_000}, {"size", f.size, 1 << 30}, {"rounds", f.rounds, 1000},
		{"batches", f.batches, 10_000}, {"export-rows", f.exportRows, 100_000_000}, {"queries", f.claims, 1_000_000}} {
		low := 1
		if f.mode == "throughput" && fl.name == "batches" {
			low = 0 // rows without a batch
		}
		if fs.Lookup(fl.name) != nil && (fl.v < low || fl.v > fl.high) {
			return usagef("--%s must be between %d and %d", fl.name, low, fl.high)
		}
	}
	if f.maxRunning < 0 {
		return usagef("--max-running must not be negative (0: no cap)")
	}
	if f.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	switch f.mode {
	case "latency":
		if f.rate <= 0 || f.rate > 100_000 {
			return usagef("--rate must be above 0 and at most 100000 rows per second")
		}
	case "claim-depth":
		var err error
		if f.depthList, err = parseDepths(f.depths); err != nil {
			return err
		}
	case "enqueue":
		if f.present < 0 || f.present >= 1 || (f.present > 0 && f.noKey) {
			return usagef("--present must be at least 0 and below 1, without --no-key")
		}
	case "herd":
		if f.interval < 0 {
			return usagef("--interval must not be negative")
		}
	case "pipeline":
		if f.inputStore == "" || f.outputStore == "" {
			return usagef("bench pipeline needs --input-store and --output-store (s3://bucket/prefix or file:///dir; or PGWORKER_INPUT_STORE and PGWORKER_OUTPUT_STORE)")
		}
		for _, s := range []struct{ flag, url string }{{"--input-store", f.inputStore}, {"--output-store", f.outputStore}} {
			if err := checkStoreURL(s.url); err != nil {
				return usagef("%s %q: %v", s.flag, s.url, err)
			}
		}
	}
	return nil
}

// runBench runs the mode.
func (c *CLI) runBench(ctx context.Context, inv *invocation, b *bench.Bench, f *benchFlags) (any, error) {
	switch f.mode {
	case "throughput":
		return b.Throughput(ctx, &bench.ThroughputConfig{Rows: f.rows, Slots: f.slots, MaxConns: f.maxConns,
			MaxRunning: f.maxRunning, FairShare: f.fairShare, Batches: f.batches})
	case "latency":
		return b.Latency(ctx, &bench.LatencyConfig{Rows: f.rows, Rate: f.rate, Slots: f.slots})
	case "claim-depth":
		return b.ClaimDepth(ctx, &bench.ClaimDepthConfig{Depths: f.depthList, Claims: f.claims})
	case "herd":
		return b.Herd(ctx, &bench.HerdConfig{Processes: f.processes, Slots: f.slots, Rows: f.rows, Interval: f.interval})
	case "enqueue":
		return b.Enqueue(ctx, &bench.EnqueueConfig{Rows: f.rows, BatchSize: f.batchSize, Present: f.present, NoKey: f.noKey,
			Load: c.enqueueLoader(inv.env, &inv.db, &inv.logs)})
	case "batches":
		return b.Batches(ctx, &bench.BatchesConfig{Rows: f.rows, Batches: f.batches, Queries: f.claims, ExportRows: f.exportRows})
	case "pipeline":
		return benchPipeline(ctx, b, inv.logger(), &bench.PipelineConfig{Rows: f.rows, Slots: f.slots, ObjectSize: f.size, Rounds: f.rounds, Exec: f.execCmd},
			f.inputStore, f.outputStore)
	}
	return nil, usagef("unknown bench mode %q: say %s", f.mode, benchModeOrder)
}

// enqueueLoader runs the enqueue command itself, with the database flags of
// the benchmark (the URL through the environment, so that it is not taken
// for one typed on the command line), on the sources the benchmark streams
// in.
func (c *CLI) enqueueLoader(e *env, db *dbFlags, logs *logFlags) func(ctx context.Context, queue string, batchSize int, noKey bool, r io.Reader) error {
	return func(ctx context.Context, queue string, batchSize int, noKey bool, r io.Reader) error {
		lookup := func(name string) (string, bool) {
			if name == "PGWORKER_DATABASE_URL" {
				return db.url, true
			}
			return e.lookup(name)
		}
		sub := &env{stdin: r, stdout: io.Discard, stderr: e.stderr, lookup: lookup}
		args := []string{"--queue", queue, "--chunk-size", strconv.Itoa(batchSize),
			"--log-format", logs.format, "--log-level", logs.level}
		if db.statementMode != "" {
			args = append(args, "--statement-mode", db.statementMode)
		}
		if noKey {
			args = append(args, "--no-key")
		}
		return c.enqueue(ctx, sub, args)
	}
}

// benchPipeline opens the stores as pgworker run does and runs the mode.
func benchPipeline(ctx context.Context, b *bench.Bench, logger *slog.Logger, cfg *bench.PipelineConfig, in, out string) (*bench.PipelineResult, error) {
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return nil, usagef("%v", err)
	}
	opts.Logger = logger
	if cfg.Input, err = blob.Open(ctx, in, &opts); err != nil {
		return nil, fmt.Errorf("--input-store: %w", err)
	}
	defer cfg.Input.Close()
	if cfg.Output, err = blob.Open(ctx, out, &opts); err != nil {
		return nil, fmt.Errorf("--output-store: %w", err)
	}
	defer cfg.Output.Close()
	return b.Pipeline(ctx, cfg)
}

// parseDepths parses 10000,1M,10M.
func parseDepths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
			mult, f = 1000, f[:len(f)-1]
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, f[:len(f)-1]
		}
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || n < 1 || n > 1_000_000_000/mult {
			return nil, usagef("--depths %q: give table sizes such as 10000,1M,10M (each from 1 to 1000M rows)", s)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// benchText is a result in a line or a few.
func benchText(res any) string {
	switch r := res.(type) {
	case *bench.ThroughputResult:
		return fmt.Sprintf("throughput: %d rows, %d slots: %.0f rows/s (%.2f s, %d claim queries)",
			r.Rows, r.Slots, r.RowsPerSec, r.ElapsedMS/1000, r.Claims)
	case *bench.LatencyResult:
		return fmt.Sprintf("latency: %d rows at %g/s, %d idle slots: insert commit to handler start p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms "+
			"(from sending the insert: p50 %.2f ms)", r.Rows, r.Rate, r.Slots, r.P50MS, r.P90MS, r.P99MS, r.MaxMS, r.FromSend.P50MS)
	case *bench.ClaimDepthResult:
		var b strings.Builder
		fmt.Fprintf(&b, "claim-depth: median of %d claims of one row for one slot (%g%% of the rows pending)\n", r.Claims, r.PendingPercent)
		for _, d := range r.Depths {
			fmt.Fprintf(&b, "  %11d rows: files.claim_batch %.3f ms, files.claim %.3f ms (p99 %.3f / %.3f ms)\n",
				d.Rows, d.ClaimBatch.P50MS, d.Claim.P50MS, d.ClaimBatch.P99MS, d.Claim.P99MS)
		}
		fmt.Fprintf(&b, "  claim at %d rows / at %d rows: claim_batch %.2fx, claim %.2fx",
			r.RatioDepths[0], r.RatioDepths[1], r.RatioClaimBatch, r.RatioClaim)
		return b.String()
	case *bench.HerdResult:
		return fmt.Sprintf("herd: %d processes x %d idle slots, %d rows one at a time: %.2f claim queries per row, "+
			"%.3f per process per wake-up (server-side; the runtimes counted %d, %d of them empty)",
			r.Processes, r.Slots, r.Rows, r.ClaimQueriesPerRow, r.ClaimQueriesPerProcessPerWakeup, r.ClientClaims, r.ClientRacesLost)
	case *bench.EnqueueResult:
		return fmt.Sprintf("enqueue: %d rows in %.2f s: %.0f rows/s (batches of %d)", r.Rows, r.ElapsedMS/1000, r.RowsPerSec, r.BatchSize)
	case *bench.BatchesResult:
		return fmt.Sprintf("batches: %d rows in %d batches: files.batch_progress whole p50 %.2f ms (p99 %.2f), one batch p50 %.2f ms (p99 %.2f); "+
			"export of %d rows %.0f rows/s, peak RSS %.1f MiB", r.Rows, r.Batches, r.AllBatches.P50MS, r.AllBatches.P99MS,
			r.OneBatch.P50MS, r.OneBatch.P99MS, r.ExportRows, r.ExportRowsPerSec, r.PeakRSSMiB)
	case *bench.PipelineResult:
		return fmt.Sprintf("pipeline: %d objects of %d bytes, %d slots, %s: through the queue %.0f rows/s, without a queue %.0f rows/s: overhead %.1f%%",
			r.Rows, r.ObjectBytes, r.Slots, r.Exec, r.Queued.RowsPerSec, r.Direct.RowsPerSec, r.OverheadPct)
	}
	return fmt.Sprint(res)
}
