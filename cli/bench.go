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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/bench"
	"github.com/pgworker/pgworker/blob"
)

var benchCommand = &command{
	name:    "bench",
	args:    "MODE [flags]",
	summary: "measure throughput, pickup latency, claim cost, herd, enqueue and pipeline speed, long transactions, soaks",
	help: `
Measures pgworker on the database that --database-url names, with the real
worker runtime, SQL API and enqueue path, and prints the figures with their
setup (--json: one JSON object on one line).

  throughput   pre-inserted rows burnt down by a no-op handler (rows/s)
  latency      rows inserted one at a time at a steady rate while every slot
               is idle: insert commit to handler start (p50, p90, p99, max)
  claim-depth  the time of one claim with up to millions of finished rows in
               the table, and how it grows with the table
  skiplocked   the bare database as a queue: FOR UPDATE SKIP LOCKED claims and
               completions of a table shaped like files.files, no queue code
  cpu          the database server's and the worker's CPU time, WAL and
               transactions per row, at a fixed rate or at peak
  notify       the bare database as a LISTEN/NOTIFY queue: the server's CPU
               per row of an insert, its notification, a bare claim of each
               notified row (and its pickup), and pgworker's own insert
  herd         many idle processes, one row at a time: claim queries per row
               and per process per wake-up, counted by the server
  enqueue      rows/s through pgworker enqueue's COPY path
  batches      files.batch_progress and the export of a batch (pgworker
               results) at millions of rows
  views        every operator view and function (status, scale-hint, the
               metrics endpoint, the dashboard) on a long history
  pipeline     rows/s of download, program, upload through MinIO or S3,
               beside the same steps in a loop with no queue at all and
               through a bare SKIP LOCKED queue
  long-tx      a producer at a fixed rate (or keeping a depth) and a worker,
               through phases clean, idle-in-tx (a held REPEATABLE READ
               snapshot) and recovery: rows/s, pickup, depth, dead tuples
  soak         a fixed rate for a long time: throughput, pickup, table and
               index sizes and dead tuples sampled over time

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
pgworker bench pipeline --input-store s3://bench/in --output-store s3://bench/out --rows 2000 --slots 8
pgworker bench long-tx --rate 1000 --slots 16 --phase 90s
pgworker bench soak --duration 30m --rate 500 --prune-every 1m`,
}

var benchModes = map[string]*command{
	"throughput": {
		name: "bench throughput", args: "[--rows N] [--slots N] [--payload-bytes N] [--json] [flags]",
		help: `
Loads --rows rows into the paused queue pgworker-bench with COPY (not timed),
starts a worker runtime with --slots slots and a no-op handler, resumes the
queue and times it until every outcome is recorded. JSON: rows_per_sec,
elapsed_ms, insert_ms, start_ms (the worker's start, not timed), claims.
--payload-bytes gives every row a payload of about that size as text (a
list of small JSON objects), to see what the rows' payloads cost.`,
		examples: "pgworker bench throughput --rows 20000 --slots 100\npgworker bench throughput --rows 50000 --slots 2000 --json\n" +
			"pgworker bench throughput --rows 20000 --slots 2000 --payload-bytes 10000",
	},
	"latency": {
		name: "bench latency", args: "[--rows N] [--rate R] [--slots N] [--json] [flags]",
		help: `
Starts a worker runtime with --slots idle slots, then inserts --rows rows one
at a time (one INSERT and commit each) at --rate per second, after five
warm-up rows. For each row it takes the time from the insert's commit
returning to the handler's start. JSON: p50_ms, p90_ms, p99_ms, max_ms,
mean_ms, and the same from just before the insert was sent (from_send).
--claim-cooldown gives the worker pgworker run's --claim-cooldown.`,
		examples: "pgworker bench latency --rows 500 --rate 50 --slots 100\npgworker bench latency --json | jq .p50_ms\npgworker bench latency --claim-cooldown 100ms --json",
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
	"skiplocked": {
		name: "bench skiplocked", args: "[--rows N] [--clients N] [--batch N] [--api | --bookkeeping] [--json] [flags]",
		help: `
Measures what the database does as a queue with no queue software: creates a
table with the columns, checks and defaults of files.files and a partial
index on its pending rows (as files_claim_idx), in a schema of its own
(pgworker_bench_skiplocked, dropped at the end), loads --rows rows (not
timed), and times --clients connections that each claim --batch rows with
UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) and mark them done
with a second UPDATE, one transaction each, until every row is done. No
history row, no notification, no fencing: the ceiling a queue on this
database can approach. JSON: rows_per_sec, elapsed_ms, and, when the server
runs on this machine, server_cpu_ms_per_row (its processes' CPU time over the
burn-down, per row, as bench cpu reads it) and client_cpu_ms_per_row (this
process's).

With --api the same loop runs on the rows of files.files through the SQL
API, as a worker in any language would: files.claim_batch for --batch slots
of each connection (committed asynchronously, as pgworker run claims) and
files.complete_many for what it took. Set beside the bare loop, it shows what
the bookkeeping of exactly-once outcomes costs at the same batch size.

With --bookkeeping the bare loop writes what pgworker's guarantees keep, and
nothing more: an index of the running rows by slot (as files_running_idx), a
token's hash written at the claim and checked at the completion, a history
row per outcome in a table of files.attempts' shape, and a line of counts per
completion in a table of files.queue_counts' shape; its claims commit
asynchronously, as pgworker's do. It is the ceiling of a queue that keeps
those rows on this database, with no functions and no runtime.`,
		examples: "pgworker bench skiplocked\npgworker bench skiplocked --rows 100000 --clients 8 --batch 100 --json\n" +
			"pgworker bench skiplocked --api --json\npgworker bench skiplocked --bookkeeping --json",
	},
	"cpu": {
		name: "bench cpu", args: "[--rate R] [--duration D] [--rows N] [--slots N] [--json] [flags]",
		help: `
Runs a worker runtime with --slots slots and a no-op handler on rows
inserted one per transaction at --rate per second for --duration, or, with
--rate 0, on --rows rows inserted beforehand (not measured) and burnt down at
peak. Between the start and the last outcome it reads the CPU time of every
process of the PostgreSQL server from /proc (the server must run on this
machine; its postmaster is found as the parent of a backend that is also
the parent of the server's checkpointer and writers), the CPU time of this
process (the worker and the inserts), the WAL written and the database's
transactions, and divides each by the rows. With the pg_stat_statements
extension in the database, the statements with the most execution time are
listed per row.
JSON: server_cpu_ms_per_row, worker_cpu_ms_per_row, wal_bytes_per_row,
xacts_per_row, statements. --claim-cooldown gives the worker pgworker run's
--claim-cooldown: River's trade of pickup latency for fewer claims.`,
		examples: "pgworker bench cpu --rate 200 --duration 10s\npgworker bench cpu --rate 0 --rows 50000 --slots 2000 --json\npgworker bench cpu --rate 200 --claim-cooldown 100ms --json",
	},
	"notify": {
		name: "bench notify", args: "[--rate R] [--duration D] [--json] [flags]",
		help: `
Measures what a queue driven by LISTEN/NOTIFY costs the database with no
queue software, on the table of bench skiplocked (in a schema of its own,
dropped at the end). Six phases each insert rows one per transaction at
--rate per second for --duration, on four connections, after five warm-up
rows:

  insert   the bare insert
  notify   the insert with a NOTIFY in the same statement, no session
           listening
  listen   the same, one session listening
  queue    the same, each notification answered at once by a bare claim
           (UPDATE ... FOR UPDATE SKIP LOCKED, committed asynchronously)
           and a completion: the least a queue with an immediate pickup
           does per row
  enqueue  pgworker's own insert into files.files (its trigger counts the
           row and notifies files_pending), one session listening, no
           worker
  api      the same, each notification answered at once through the SQL
           API as pgworker run calls it (files.claim_batch for two idle
           slots, committed asynchronously, and files.complete_many), with
           no runtime

Each phase's server CPU per row is read from /proc as in bench cpu (the
server must run on this machine). The queue and api phases also time the
pickup, from an insert's commit returning to the answer of the claim that
took its row, and the claim's round trip (the queue phase also its
notification's arrival): what pgworker's pickup (bench latency) can
approach on this database, with no queue software and with the SQL API
alone. JSON: phases (name, server_cpu_ms_per_row, wal_bytes_per_row,
rows_per_sec; pickup and claim for the queue and api phases,
commit_to_notify for the queue phase).`,
		examples: "pgworker bench notify\npgworker bench notify --rate 50 --duration 10s --json",
	},
	"herd": {
		name: "bench herd", args: "[--processes N] [--slots N] [--rows N] [--pool-url URL] [--idle D] [--json] [flags]",
		help: `
Starts --processes worker runtimes in this process, each with its own pool and
LISTEN connection as separate processes would have, and --slots idle slots
each. Inserts --rows rows one at a time, each once the previous one was
picked up and --interval passed, and counts the claim queries the server ran
(calls of files.claim_batch and files.claim in pg_stat_user_functions, read
once the statistics settle; they need track_functions, which a superuser's
benchmark turns on for its own sessions). JSON: claim_queries_per_row,
claim_queries_per_process_per_wakeup, and the runtimes' own counts.

With --pool-url the runtimes' pools connect there (a transaction-pooling
PgBouncer in front of the same database; --statement-mode applies, exec by
default) while their LISTEN connections stay on --database-url, as pgworker
run --listen-url sets them up. With --idle, the settled fleet is first
watched that long with no work: transactions and SQL API calls per second,
the claims the runtimes sent (none, for an idle fleet) and the server's CPU
(JSON: idle). server_conns is the database's client connections meanwhile.`,
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
	"views": {
		name: "bench views", args: "[--rows N] [--attempts N] [--slots N] [--queries N] [--json] [flags]",
		help: `
Fills files.files with --rows rows (85% done, 5% failed, 10% pending; one in
a hundred in a batch), --slots live slots each holding a row and as many
stopped ones, and --attempts attempts, all inserted by the server (not
timed); then times --queries reads of each operator view and function
(files.queue_summary, queue_stats, active_workers, worker_metrics,
batch_progress, scaling_hint, backlog) and of pgworker status's snapshot.
JSON: queries (name, p50_ms, p99_ms, ...), seed_s.`,
		examples: "pgworker bench views\npgworker bench views --rows 1000000 --attempts 1000000 --slots 200 --json",
	},
	"pipeline": {
		name: "bench pipeline", args: "--input-store URL --output-store URL [--rows N] [--slots N] [--json] [flags]",
		help: `
Uploads --rows objects of --size bytes under a prefix of its own in the input
store (not timed), then runs the pipeline of pgworker run (download, run
--exec, upload the outputs) on them three times with --slots at once: as a
loop that calls the pipeline on synthetic jobs with no queue at all (direct),
through the queue and the worker runtime (queued), and through a bare queue
(bare): as many connections as slots, each claiming one row of a scratch table
of files.files' shape with FOR UPDATE SKIP LOCKED, running it and completing
it, which is the least any queue does around a row. The rows are split into
--rounds, each run all three ways in an order that turns from round to round,
so that a load on the machine that changes during the run weighs on all alike;
a warm-up loop comes first. The objects, outputs and scratch table are deleted
at the end (a file:// store keeps the emptied directories). JSON: queued,
direct and bare (rows_per_sec, elapsed_ms), overhead_ratio (direct rate over
queued rate), overhead_pct and bare_overhead_pct (the queues' time over
direct's, in percent), round_ms (each round's times, three ways), and
cpu_ms_per_row: the CPU time a row of each way's timed parts (the rows' load
left out) of the database's processes (server, when it runs on this
machine), of this process (the handlers' downloads and uploads, and the
worker runtime), of the backend programs that ended (program), and of all
the machine's CPUs busy and idle (machine and idle, from /proc/stat; busy is
whatever ran, MinIO and the kernel's threads included), which shows what a
queue's work takes from the handlers on a machine they share.

The S3 endpoint and credentials come from PGWORKER_S3_ENDPOINT,
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for pgworker run. There is no
shell between pgworker and --exec: write 'cp {input} {output_dir}/out', not a
redirection.`,
		examples: "pgworker bench pipeline --input-store s3://bench/in --output-store s3://bench/out\n" +
			"pgworker bench pipeline --input-store file:///tmp/in --output-store file:///tmp/out --rows 500 --json",
	},
	"long-tx": {
		name: "bench long-tx", args: "[--rate R | --depth N] [--slots N] [--processes N] [--phase D] [--json] [flags]",
		help: `
Runs a producer and a worker runtime of --slots slots (no-op handler; with
--processes N, N runtimes in this process, each with its own pool and LISTEN
connection as separate processes would have) through three phases of
--phase each: clean; idle-in-tx, where a REPEATABLE READ transaction on a
connection of its own holds its snapshot open, so that no dead row of
files.files can be removed; and recovery. The
producer inserts --rate rows per second, or with --depth keeps that many rows
waiting (peak mode: the worker runs as fast as it can). Every --sample-every
it samples rows/s, pickup p50 and p99 (from the row's created_at to its
handler's start, and from the moment its insert's commit returned to the
producer, as bench latency counts it), the round trips (p99 and max) of
the producer's inserts and of the workers' outcome calls, how often a slot
waited for its own outcome (outcome_waits: as many outcomes waited already
as its process lets wait), the depth (rows inserted and not started), the workers'
claim queries (how many, how many returned no row, their round trips' p50,
p99 and max, and the longest time no claim was under way), the longest time
without a notification, the WAL the server wrote per row done, and
files.files' dead tuples and table and index sizes. At the end it waits for
the backlog to drain and checks that every row ended done. JSON: phases
(rows_per_sec, pickup, pickup_from_return, insert, depth_end, depth_max,
claim_ms: the server's mean time per claim, outcome_waits, wal_bytes_per_row, end: the
table's statistics),
held_over_clean, recovery_over_clean, samples.`,
		examples: "pgworker bench long-tx --rate 1000 --slots 16\npgworker bench long-tx --rate 200 --processes 4 --slots 4\npgworker bench long-tx --depth 5000 --slots 64 --phase 60s --json",
	},
	"soak": {
		name: "bench soak", args: "[--duration D] [--rate R] [--slots N] [--prune-every D] [--json] [flags]",
		help: `
Runs a producer at --rate rows per second and a worker runtime of --slots
slots (no-op handler) for --duration, sampling every --sample-every the
rows/s, pickup p50 and p99, depth, the claim queries (as long-tx does), and
files.files' dead tuples and table and index sizes: the lines of a queue that lasts stay flat. --prune-every calls
files.prune at that interval and once at the end, as retention's pruner
would, with the done rows of queue pgworker-bench kept for --keep
(files.keep_queue; the database must have retention). At the end it waits
for the backlog to drain and checks every row left ended done. JSON: summary
(as a phase of long-tx), prune_calls, pruned_rows and samples; bench/chart
(cd bench/chart && go run . -mode soak RESULT.json) draws the samples as a
PNG.`,
		examples: "pgworker bench soak --duration 30m --rate 500\npgworker bench soak --duration 5m --rate 200 --prune-every 30s --json",
	},
}

// benchModeOrder lists the modes for messages.
const benchModeOrder = "throughput, latency, claim-depth, skiplocked, cpu, notify, herd, enqueue, batches, views, pipeline, long-tx or soak"

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
	batches, exportRows, clients, attempts, depth, payloadBytes       int
	rate, present                                                     float64
	noKey, fairShare, api, bookkeeping                                bool
	maxRunning                                                        int
	depths, execCmd, inputStore, outputStore, poolURL                 string
	interval, duration, phase, sampleEvery, pruneEvery, keep          time.Duration
	claimCooldown                                                     time.Duration
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
		fs.IntVar(&f.payloadBytes, "payload-bytes", 0, "give each row a payload of `N` bytes as text (0: the empty object)")
	case "latency":
		fs.IntVar(&f.rows, "rows", 500, "`N` rows to insert and time")
		fs.Float64Var(&f.rate, "rate", 50, "rows inserted per second")
		fs.IntVar(&f.slots, "slots", 100, "`N` idle slots of the worker")
		fs.DurationVar(&f.claimCooldown, "claim-cooldown", 0, "the worker's --claim-cooldown (0: claim at once)")
	case "claim-depth":
		fs.StringVar(&f.depths, "depths", "10000,1000000,10000000", "table sizes to measure at: comma-separated `N`s (10k, 1M allowed)")
		fs.IntVar(&f.claims, "claims", 200, "`N` timed claims of each function per depth")
	case "skiplocked":
		fs.IntVar(&f.rows, "rows", 50000, "`N` rows to burn down")
		fs.IntVar(&f.clients, "clients", 8, "`N` connections claiming and completing at once")
		fs.IntVar(&f.batchSize, "batch", 100, "`N` rows per claim and per completion")
		fs.BoolVar(&f.api, "api", false, "claim and complete the rows of files.files through the SQL API (files.claim_batch, files.complete_many) instead of bare statements")
		fs.BoolVar(&f.bookkeeping, "bookkeeping", false, "the bare loop with the rows pgworker's guarantees write: a running index, a token's hash, a history row, counts")
	case "cpu":
		fs.Float64Var(&f.rate, "rate", 200, "rows inserted per second, one per transaction; 0: --rows burnt down at peak")
		fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to insert at --rate")
		fs.IntVar(&f.rows, "rows", 20000, "`N` rows burnt down at peak (--rate 0)")
		fs.IntVar(&f.slots, "slots", 100, "`N` slots of the worker")
		fs.IntVar(&f.maxConns, "max-conns", 8, "`N` connections in the worker's pool")
		fs.DurationVar(&f.claimCooldown, "claim-cooldown", 0, "the worker's --claim-cooldown (0: claim at once)")
	case "notify":
		fs.Float64Var(&f.rate, "rate", 200, "rows inserted per second, one per transaction, in each phase")
		fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long each phase inserts")
	case "herd":
		fs.IntVar(&f.processes, "processes", 20, "`N` worker runtimes, each with its own connections")
		fs.IntVar(&f.slots, "slots", 50, "`N` idle slots per runtime")
		fs.IntVar(&f.rows, "rows", 100, "`N` rows inserted one at a time")
		fs.DurationVar(&f.interval, "interval", 50*time.Millisecond, "pause after each row is picked up, before the next insert")
		fs.StringVar(&f.poolURL, "pool-url", "", "`URL` the runtimes' pools connect to (a PgBouncer), their listeners staying on --database-url")
		fs.DurationVar(&f.duration, "idle", 0, "watch the idle fleet this long before the rows (0: not at all)")
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
	case "views":
		fs.IntVar(&f.rows, "rows", 10_000_000, "`N` rows in the table")
		fs.IntVar(&f.attempts, "attempts", 10_000_000, "`N` attempts in the history")
		fs.IntVar(&f.slots, "slots", 2000, "`N` live slots, each holding a row (and as many stopped)")
		fs.IntVar(&f.claims, "queries", 20, "`N` timed reads of each")
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
	case "long-tx":
		fs.IntVar(&f.slots, "slots", 16, "`N` slots of each worker")
		fs.IntVar(&f.maxConns, "max-conns", 8, "`N` connections in each worker's pool")
		fs.IntVar(&f.processes, "processes", 1, "`N` worker runtimes, each with its own connections")
		fs.Float64Var(&f.rate, "rate", 1000, "rows inserted per second (unless --depth)")
		fs.IntVar(&f.depth, "depth", 0, "peak mode: keep `N` rows waiting instead of a fixed rate")
		fs.DurationVar(&f.phase, "phase", 90*time.Second, "length of each phase: clean, idle-in-tx, recovery")
		fs.DurationVar(&f.sampleEvery, "sample-every", 5*time.Second, "sampling interval")
	case "soak":
		fs.DurationVar(&f.duration, "duration", 30*time.Minute, "length of the run")
		fs.Float64Var(&f.rate, "rate", 500, "rows inserted per second")
		fs.IntVar(&f.slots, "slots", 16, "`N` slots of the worker")
		fs.IntVar(&f.maxConns, "max-conns", 8, "`N` connections in the worker's pool")
		fs.DurationVar(&f.sampleEvery, "sample-every", 10*time.Second, "sampling interval")
		fs.DurationVar(&f.pruneEvery, "prune-every", 0, "call files.prune at this interval, and once at the end (0: never)")
		fs.DurationVar(&f.keep, "keep", time.Minute, "with --prune-every: keep done rows this long (files.keep_queue)")
	}
}

// check validates the flags that need no I/O.
func (f *benchFlags) check(fs *flagSet) error {
	for _, fl := range []struct {
		name    string
		v, high int
	}{{"rows", f.rows, 100_000_000}, {"slots", f.slots, 10_000}, {"max-conns", f.maxConns, 1000}, {"claims", f.claims, 1_000_000},
		{"processes", f.processes, 500}, {"chunk-size", f.batchSize, 1_000_000}, {"size", f.size, 1 << 30}, {"rounds", f.rounds, 1000},
		{"batches", f.batches, 10_000}, {"export-rows", f.exportRows, 100_000_000}, {"queries", f.claims, 1_000_000},
		{"clients", f.clients, 1000}, {"batch", f.batchSize, 100_000}, {"attempts", f.attempts, 100_000_000}} {
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
	if f.claimCooldown < 0 || f.claimCooldown > time.Minute {
		return usagef("--claim-cooldown must be between 0 (claim at once) and 1m")
	}
	switch f.mode {
	case "latency":
		if f.rate <= 0 || f.rate > 100_000 {
			return usagef("--rate must be above 0 and at most 100000 rows per second")
		}
	case "cpu":
		if f.rate < 0 || f.rate > 100_000 {
			return usagef("--rate must be from 0 (peak) to 100000 rows per second")
		}
		if f.duration <= 0 {
			return usagef("--duration must be positive")
		}
	case "notify":
		if f.rate <= 0 || f.rate > 100_000 {
			return usagef("--rate must be above 0 and at most 100000 rows per second")
		}
		if f.duration <= 0 || f.duration > time.Hour {
			return usagef("--duration must be positive and at most 1h")
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
	case "long-tx", "soak":
		if f.rate <= 0 || f.rate > 100_000 {
			return usagef("--rate must be above 0 and at most 100000 rows per second")
		}
		if f.depth < 0 || f.depth > 1_000_000 {
			return usagef("--depth must be between 0 (a fixed rate) and 1000000")
		}
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"phase", f.phase}, {"sample-every", f.sampleEvery}, {"duration", f.duration}} {
			if fs.Lookup(d.name) != nil && d.v < time.Second {
				return usagef("--%s must be at least 1s", d.name)
			}
		}
		if f.pruneEvery < 0 || f.keep < 0 {
			return usagef("--prune-every and --keep must not be negative")
		}
		if need := f.phase*3 + f.duration + 10*time.Minute; f.timeout < need {
			return usagef("--timeout %s is shorter than the run needs (at least %s)", f.timeout, need)
		}
	case "herd":
		if f.interval < 0 || f.duration < 0 {
			return usagef("--interval and --idle must not be negative")
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
			MaxRunning: f.maxRunning, FairShare: f.fairShare, Batches: f.batches, PayloadBytes: f.payloadBytes})
	case "latency":
		return b.Latency(ctx, &bench.LatencyConfig{Rows: f.rows, Rate: f.rate, Slots: f.slots, ClaimCooldown: f.claimCooldown})
	case "claim-depth":
		return b.ClaimDepth(ctx, &bench.ClaimDepthConfig{Depths: f.depthList, Claims: f.claims})
	case "skiplocked":
		return b.SkipLocked(ctx, &bench.SkipLockedConfig{Rows: f.rows, Clients: f.clients, Batch: f.batchSize, API: f.api, Bookkeeping: f.bookkeeping})
	case "cpu":
		return b.CPU(ctx, &bench.CPUConfig{
			Rate: f.rate, Duration: f.duration, Rows: f.rows, Slots: f.slots, MaxConns: f.maxConns, ClaimCooldown: f.claimCooldown,
		})
	case "notify":
		return b.Notify(ctx, &bench.NotifyConfig{Rate: f.rate, Duration: f.duration})
	case "herd":
		cfg := &bench.HerdConfig{Processes: f.processes, Slots: f.slots, Rows: f.rows, Interval: f.interval, Idle: f.duration}
		if f.poolURL != "" {
			pc, err := pgxpool.ParseConfig(f.poolURL)
			if err != nil {
				return nil, usagef("--pool-url %s: %s", RedactURL(f.poolURL), scrub(err.Error(), f.poolURL))
			}
			pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			if mode, ok := statementModes[inv.db.statementMode]; ok {
				pc.ConnConfig.DefaultQueryExecMode = mode
			}
			cfg.PoolConfig = pc
		}
		return b.Herd(ctx, cfg)
	case "enqueue":
		return b.Enqueue(ctx, &bench.EnqueueConfig{Rows: f.rows, BatchSize: f.batchSize, Present: f.present, NoKey: f.noKey,
			Load: c.enqueueLoader(inv.env, &inv.db, &inv.logs)})
	case "batches":
		return b.Batches(ctx, &bench.BatchesConfig{Rows: f.rows, Batches: f.batches, Queries: f.claims, ExportRows: f.exportRows})
	case "views":
		return b.Views(ctx, &bench.ViewsConfig{Rows: f.rows, Attempts: f.attempts, Slots: f.slots, Queries: f.claims})
	case "pipeline":
		return benchPipeline(ctx, b, inv.logger(), &bench.PipelineConfig{Rows: f.rows, Slots: f.slots, ObjectSize: f.size, Rounds: f.rounds, Exec: f.execCmd},
			f.inputStore, f.outputStore)
	case "long-tx":
		return b.LongTx(ctx, &bench.LongTxConfig{Slots: f.slots, MaxConns: f.maxConns, Processes: f.processes, Rate: f.rate, Depth: f.depth,
			Phase: f.phase, SampleEvery: f.sampleEvery})
	case "soak":
		return b.Soak(ctx, &bench.SoakConfig{Duration: f.duration, Rate: f.rate, Slots: f.slots, MaxConns: f.maxConns,
			SampleEvery: f.sampleEvery, PruneEvery: f.pruneEvery, Keep: f.keep})
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

// mib is a size in MiB.
func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }

// benchText is a result in a line or a few.
func benchText(res any) string {
	switch r := res.(type) {
	case *bench.ThroughputResult:
		return fmt.Sprintf("throughput: %d rows, %d slots: %.0f rows/s (%.2f s, %d claim queries)",
			r.Rows, r.Slots, r.RowsPerSec, r.ElapsedMS/1000, r.Claims)
	case *bench.LatencyResult:
		line := fmt.Sprintf("latency: %d rows at %g/s, %d idle slots: insert commit to handler start p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms "+
			"(from sending the insert: p50 %.2f ms)", r.Rows, r.Rate, r.Slots, r.P50MS, r.P90MS, r.P99MS, r.MaxMS, r.FromSend.P50MS)
		if s := r.Steps; s != nil {
			line += fmt.Sprintf("\n  p50 (p99) of %d rows: commit to notification %.3f (%.3f) ms, to claim sent %.3f (%.3f), claim %.3f (%.3f), to handler %.3f (%.3f)",
				s.Traced, s.CommitToNotify.P50MS, s.CommitToNotify.P99MS, s.NotifyToClaim.P50MS, s.NotifyToClaim.P99MS,
				s.Claim.P50MS, s.Claim.P99MS, s.ClaimToHandler.P50MS, s.ClaimToHandler.P99MS)
		}
		return line
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
	case *bench.SkipLockedResult:
		kind := "bare"
		switch {
		case r.API:
			kind = "SQL API"
		case r.Bookkeeping:
			kind = "bare with bookkeeping"
		}
		return fmt.Sprintf("skiplocked (%s): %d rows, %d clients, %d rows per statement: %.0f rows/s (%.2f s)",
			kind, r.Rows, r.Clients, r.Batch, r.RowsPerSec, r.ElapsedMS/1000)
	case *bench.CPUResult:
		rate := "at peak"
		if r.Rate > 0 {
			rate = fmt.Sprintf("at %g rows/s", r.Rate)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "cpu: %d rows %s, %d slots (%.0f rows/s): server CPU %.3f ms per row, worker process %.3f ms, WAL %.0f bytes, %.2f transactions",
			r.Rows, rate, r.Slots, r.RowsPerSec, r.ServerCPUMSPerRow, r.WorkerCPUMSPerRow, r.WALBytesPerRow, r.XactsPerRow)
		for _, s := range r.Statements {
			fmt.Fprintf(&b, "\n  %6.3f calls %7.4f ms exec %7.4f ms plan  %s", s.CallsPerRow, s.ExecMSPerRow, s.PlanMSPerRow, s.Query)
		}
		return b.String()
	case *bench.NotifyResult:
		var b strings.Builder
		fmt.Fprintf(&b, "notify: rows inserted one per transaction at %g rows/s; server CPU per row", r.Rate)
		for _, p := range r.Phases {
			fmt.Fprintf(&b, "\n  %-8s %6d rows %7.0f rows/s  %.3f ms  WAL %.0f bytes", p.Name, p.Rows, p.RowsPerSec, p.ServerCPUMSPerRow, p.WALBytesPerRow)
			if p.Pickup != nil {
				fmt.Fprintf(&b, "  pickup p50 %.3f ms, p99 %.3f (commit to notification %.3f, claim %.3f)",
					p.Pickup.P50MS, p.Pickup.P99MS, p.CommitToNotify.P50MS, p.Claim.P50MS)
			}
		}
		return b.String()
	case *bench.HerdResult:
		idle := ""
		if i := r.IdleFleet; i != nil {
			idle = fmt.Sprintf("; idle for %.1f s: %.1f transactions/s, %d claims, server CPU %.1f ms/s, calls/s %v",
				i.WindowMS/1000, i.XactsPerSec, i.ClaimCalls, i.ServerCPUMSPS, i.CallsPerSec)
		}
		return fmt.Sprintf("herd: %d processes x %d idle slots, %d rows one at a time: %.2f claim queries per row, "+
			"%.3f per process per wake-up (server-side; the runtimes counted %d, %d of them empty); %d server connections",
			r.Processes, r.Slots, r.Rows, r.ClaimQueriesPerRow, r.ClaimQueriesPerProcessPerWakeup, r.ClientClaims, r.ClientRacesLost, r.ServerConns) + idle
	case *bench.EnqueueResult:
		return fmt.Sprintf("enqueue: %d rows in %.2f s: %.0f rows/s (batches of %d)", r.Rows, r.ElapsedMS/1000, r.RowsPerSec, r.BatchSize)
	case *bench.BatchesResult:
		return fmt.Sprintf("batches: %d rows in %d batches: files.batch_progress whole p50 %.2f ms (p99 %.2f), one batch p50 %.2f ms (p99 %.2f); "+
			"export of %d rows %.0f rows/s, peak RSS %.1f MiB", r.Rows, r.Batches, r.AllBatches.P50MS, r.AllBatches.P99MS,
			r.OneBatch.P50MS, r.OneBatch.P99MS, r.ExportRows, r.ExportRowsPerSec, r.PeakRSSMiB)
	case *bench.ViewsResult:
		var b strings.Builder
		fmt.Fprintf(&b, "views: %d rows, %d attempts, %d live slots (seeded in %.0f s):", r.Rows, r.Attempts, r.Slots, r.SeedS)
		for _, q := range r.Queries {
			fmt.Fprintf(&b, "\n  %-22s p50 %8.2f ms  p99 %8.2f ms", q.Name, q.P50MS, q.P99MS)
		}
		return b.String()
	case *bench.LongTxResult:
		var b strings.Builder
		load := fmt.Sprintf("%g rows/s", r.Rate)
		if r.Depth > 0 {
			load = fmt.Sprintf("keeping %d rows waiting", r.Depth)
		}
		done := "all done"
		if r.Undrained > 0 {
			done = fmt.Sprintf("%d not done when the drain gave up", r.Undrained)
		}
		slots := fmt.Sprintf("%d slots", r.Slots)
		if r.Processes > 1 {
			slots = fmt.Sprintf("%d processes of %d slots", r.Processes, r.Slots)
		}
		fmt.Fprintf(&b, "long-tx: %s, %s, phases of %gs; %d rows, %s\n", load, slots, r.PhaseSec, r.Rows, done)
		for _, p := range r.Phases {
			fmt.Fprintf(&b, "  %-10s %7.0f rows/s, pickup p50 %.1f ms p99 %.1f ms, depth at end %d (max %d), claim %.3f ms, "+
				"dead tuples %d, table %s, claim index %s\n", p.Name, p.RowsPerSec, p.Pickup.P50MS, p.Pickup.P99MS,
				p.DepthEnd, p.DepthMax, p.ClaimMS, p.End.DeadTuples, mib(p.End.TableBytes), mib(p.End.ClaimIndexBytes))
		}
		fmt.Fprintf(&b, "  held snapshot / clean: %.2f; recovery / clean: %.2f", r.HeldOverClean, r.RecoveryOverClean)
		return b.String()
	case *bench.SoakResult:
		p := r.Summary
		return fmt.Sprintf("soak: %g rows/s for %gs, %d slots: %.0f rows/s, pickup p50 %.1f ms p99 %.1f ms, depth at end %d (max %d); "+
			"at the end dead tuples %d, table %s, indexes %s; %d samples, %d prune calls", r.Rate, r.DurationSec, r.Slots,
			p.RowsPerSec, p.Pickup.P50MS, p.Pickup.P99MS, p.DepthEnd, p.DepthMax, p.End.DeadTuples, mib(p.End.TableBytes),
			mib(p.End.IndexBytes), len(r.Samples), r.PruneCalls)
	case *bench.PipelineResult:
		var b strings.Builder
		fmt.Fprintf(&b, "pipeline: %d objects of %d bytes, %d slots, %s: through the queue %.0f rows/s, without a queue %.0f rows/s: "+
			"overhead %.1f%%; through a bare queue %.0f rows/s: overhead %.1f%%",
			r.Rows, r.ObjectBytes, r.Slots, r.Exec, r.Queued.RowsPerSec, r.Direct.RowsPerSec, r.OverheadPct, r.Bare.RowsPerSec, r.BareOverheadPct)
		for _, w := range []struct {
			name string
			cpu  bench.PipelineCPU
		}{{"direct", r.CPU.Direct}, {"queued", r.CPU.Queued}, {"bare", r.CPU.Bare}} {
			fmt.Fprintf(&b, "\n  %-6s CPU a row: database %s, this process %.3f ms, program %.3f ms, machine busy %s, idle %s",
				w.name, msOrUnknown(w.cpu.Server), w.cpu.Process, w.cpu.Program, msOrUnknown(w.cpu.Machine), msOrUnknown(w.cpu.Idle))
		}
		return b.String()
	}
	return fmt.Sprint(res)
}

// msOrUnknown prints a figure that may not have been read.
func msOrUnknown(v *float64) string {
	if v == nil {
		return "unknown"
	}
	return fmt.Sprintf("%.3f ms", *v)
}
