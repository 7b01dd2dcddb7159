package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/migrations"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

var runCommand = &command{
	name:    "run",
	args:    "--exec 'PROGRAM ARGS...' [flags]",
	summary: "process the queue: run your program on each row, in N slots",
	help: `
Runs worker slots that claim rows, download each row's input, run the program
given by --exec on it, upload what it wrote to {output_dir}, and record the
outcome. Stop it with SIGTERM or Ctrl-C: the first signal drains (running rows
finish, within --drain-timeout, and no new row is claimed), a second one stops
at once (running programs are killed and their rows handed back).

The --exec string is split into words like a shell splits them (quotes and
backslashes), with no expansion, substitution, globbing or redirection: $HOME,
$(...), *, ; and | are plain characters. There is no shell in between: to use
one, say so (--exec 'sh -c "..." sh {input}'). Placeholders are replaced
inside the words, each value staying one argument whatever it holds:

  {input}       path of the downloaded input file
  {output_dir}  directory whose files are uploaded as the row's result
  {id}          row id             {attempt}   attempt number, from 1
  {source}      the row's source   {queue}     the row's queue
  {work_dir}    the slot's work directory (the program's working directory)
  {payload_file} file holding the row's payload (JSON)

Write {{ and }} for literal braces. The program also gets PGWORKER_INPUT,
PGWORKER_OUTPUT_DIR, PGWORKER_ID, PGWORKER_SOURCE, PGWORKER_ATTEMPT,
PGWORKER_QUEUE, PGWORKER_PAYLOAD_FILE, PGWORKER_PAYLOAD (only when the payload
has at most 32 KiB), PGWORKER_WORK_DIR and PGWORKER_WORKER_ID in
its environment, which is the worker's minus its credentials and settings
(PGWORKER_*, DATABASE_URL, PGPASSWORD, AWS_* keys, MINIO_* keys; --pass-env
lets named ones through). It runs in its own process group, which is killed
(SIGTERM, then SIGKILL after --kill-grace) on timeout, cancellation or stop;
what it leaves running, even in a session of its own (setsid), is killed
when its row ends. It cannot read the worker's memory or environment through
/proc; started as root, --run-as runs it as another user.

Exit status 0 completes the row; any other status, a signal or a timeout
fails the attempt, and the row is retried with backoff until its
max_attempts. A program that is missing or not executable fails the row at
once.

Across several --queue, rows of larger priority are taken first, then the
older. With --prefer the order of --queue is an order of preference: the
slots take the first queue's rows while it has claimable ones, and help with
the next queue's only when it has none ("stealing"). A queue's fleet-wide cap
and fair share between its batches are set with 'pgworker queue set'.`,
	examples: `
pgworker run --exec 'convert {input} -thumbnail 200x200 {output_dir}/thumb.jpg' \
    --input-store s3://photos --output-store s3://thumbs --slots 4
pgworker run --exec '/mnt/tools/bin/analyze --id {id} "{input}"' --queue urgent --queue default --timeout 30m
pgworker run --exec 'render {input} {output_dir}' --queue gpu --queue cpu --prefer --slots 8
PGWORKER_EXEC='ocr {input} {output_dir}' PGWORKER_SLOTS=2-16 pgworker run`,
}

// RunConfig is `pgworker run` once its flags are checked: what runWorkers
// needs to run the slots.
type RunConfig struct {
	// Exec is the --exec command line, and Backend the runner built from it
	// (with Timeout, KillGrace, PassEnv and Logger); its program was found.
	Exec    string
	Backend *backend.Runner

	// SlotsMin and SlotsMax bound the number of slots (--slots N sets both).
	SlotsMin, SlotsMax int
	// Queues to serve; nil means all.
	Queues []string
	// PreferQueues makes Queues an order of preference (--prefer).
	PreferQueues bool
	// Then is the queue that each completed row's outputs are enqueued
	// into (--then); "" for none.
	Then string

	Timeout time.Duration // per row; 0 means none
	// ClaimCooldown is the least time between two claims that
	// notifications prompt (--claim-cooldown); 0 answers each at once.
	ClaimCooldown time.Duration
	Heartbeat     time.Duration
	LeaseTimeout  time.Duration // > Heartbeat
	DrainTimeout  time.Duration // after the first signal
	KillGrace     time.Duration // SIGTERM to SIGKILL
	// PruneInterval is how often the worker runs files.prune; negative for
	// never.
	PruneInterval time.Duration

	// MetricsAddr is the host:port to serve metrics on; "" for none.
	MetricsAddr string
	// WorkDir is the directory under which each slot gets its work
	// directory. It exists and no other user can change it.
	WorkDir string
	// MaxOutputFiles and MaxOutputBytes bound what one row uploads;
	// negative means no bound.
	MaxOutputFiles int
	MaxOutputBytes int64

	// InputStore and OutputStore are s3://bucket/prefix or file:///dir URLs,
	// or "". S3 endpoint and credentials come from PGWORKER_S3_ENDPOINT and
	// the AWS_* variables.
	InputStore, OutputStore string

	// DatabaseURL and ListenURL may hold passwords: print them through
	// RedactURL. ListenURL is "" when LISTEN should use DatabaseURL.
	DatabaseURL, ListenURL string
	// Pool is connected to DatabaseURL, with --statement-mode applied and
	// room for SlotsMax+4 connections. runWorkers must not close it.
	Pool *pgxpool.Pool

	Logger  *slog.Logger
	Version string

	// HardStop is closed at the second SIGTERM or SIGINT: stop at once.
	// The first one cancels runWorkers' context: drain, within DrainTimeout.
	HardStop <-chan struct{}
}

func (c *CLI) run(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(runCommand)
	f := &runFlags{maxOutputBytes: sizeFlag(pipeline.DefaultMaxOutputBytes)}
	f.add(inv.fs)
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	cfg, err := f.check(inv.fs)
	if err != nil {
		return err
	}
	if err := inv.resolve(); err != nil {
		return err
	}
	cfg.DatabaseURL = inv.db.url
	cfg.Logger = inv.logger()
	if err := f.prepare(cfg); err != nil {
		return err
	}
	return c.startRun(ctx, inv, cfg)
}

// runFlags are the flags of pgworker run.
type runFlags struct {
	exec, slots, metricsAddr, workDir, listenURL              string
	inputStore, outputStore                                   string
	queues, passEnv                                           listFlag
	runAs, then                                               string
	prefer                                                    bool
	rowLogLines, rowLogBytes                                  int
	timeout, heartbeat, leaseTimeout, drainTimeout, killGrace time.Duration
	pruneInterval, claimCooldown                              time.Duration
	maxOutputFiles                                            int
	maxOutputBytes                                            sizeFlag
}

func (f *runFlags) add(fs *flagSet) {
	fs.StringVar(&f.exec, "exec", "", "the `COMMAND` to run for each row, with placeholders (see above)")
	fs.env("exec", "PGWORKER_EXEC")
	fs.StringVar(&f.slots, "slots", "1", "rows worked on at once: `N` or MIN-MAX")
	fs.env("slots", "PGWORKER_SLOTS")
	fs.Var(&f.queues, "queue", "serve this `QUEUE` (repeat for several; default all); the twin takes a comma-separated list")
	fs.env("queue", "PGWORKER_QUEUES")
	fs.BoolVar(&f.prefer, "prefer", false, "take the rows of each --queue only while the ones given before it have none claimable (default: larger priority first across the queues)")
	fs.env("prefer", "PGWORKER_PREFER")
	fs.DurationVar(&f.timeout, "timeout", time.Hour, "longest run of the program for one row; 0 for none")
	fs.env("timeout", "PGWORKER_TIMEOUT")
	fs.DurationVar(&f.heartbeat, "heartbeat", worker.DefaultHeartbeatInterval, "how often the slots prove they are alive")
	fs.env("heartbeat", "PGWORKER_HEARTBEAT")
	fs.DurationVar(&f.leaseTimeout, "lease-timeout", worker.DefaultLeaseTimeout, "silence after which a slot's row goes back to the queue; must exceed --heartbeat")
	fs.env("lease-timeout", "PGWORKER_LEASE_TIMEOUT")
	fs.DurationVar(&f.claimCooldown, "claim-cooldown", 0, "least time between two claims of this process that notifications prompt: rows announced sooner are claimed together when it ends, and outcomes that end sooner are recorded together. "+
		"Fewer claims for the database when rows trickle in to many nodes, for up to this much longer pickup; the node stops listening meanwhile, "+
		"so a cancellation reaches a running row with the next heartbeat (e.g. 100ms; default 0: at once)")
	fs.env("claim-cooldown", "PGWORKER_CLAIM_COOLDOWN")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "after SIGTERM, how long running rows may take to finish before they are stopped and handed back")
	fs.env("drain-timeout", "PGWORKER_DRAIN_TIMEOUT")
	fs.DurationVar(&f.killGrace, "kill-grace", 10*time.Second, "time between SIGTERM and SIGKILL when a program is stopped")
	fs.env("kill-grace", "PGWORKER_KILL_GRACE")
	fs.DurationVar(&f.pruneInterval, "prune-interval", time.Minute, "how often to delete finished rows past their retention (files.prune; one node at a time); 0 for never")
	fs.env("prune-interval", "PGWORKER_PRUNE_INTERVAL")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve metrics on this `HOST:PORT` (default: off)")
	fs.env("metrics-addr", "PGWORKER_METRICS_ADDR")
	defaultWorkDir, _ := pipeline.DefaultWorkDir()
	fs.StringVar(&f.workDir, "work-dir", defaultWorkDir, "`DIR` for the slots' inputs and outputs: it must belong to this user and be writable by nobody else, "+
		"below directories that only this user or root can change (or sticky ones, like /tmp); it is created with mode 0700 if missing (0711 with --run-as, so the program's user can pass through). "+
		"By default $STATE_DIRECTORY/work when systemd's StateDirectory= sets it, else pgworker in the user's cache directory ($XDG_CACHE_HOME or ~/.cache)")
	fs.env("work-dir", "PGWORKER_WORK_DIR")
	fs.IntVar(&f.maxOutputFiles, "max-output-files", pipeline.DefaultMaxOutputFiles, "most files one row may upload; a row with more fails, with nothing uploaded; 0 for no bound")
	fs.env("max-output-files", "PGWORKER_MAX_OUTPUT_FILES")
	fs.Var(&f.maxOutputBytes, "max-output-bytes", "most bytes one row may upload, e.g. 500MiB or 10GiB (a sparse file counts at its length); a row with more fails, with nothing uploaded; 0 for no bound")
	fs.env("max-output-bytes", "PGWORKER_MAX_OUTPUT_BYTES")
	fs.StringVar(&f.listenURL, "listen-url", "", "database `URL` for LISTEN when --database-url goes through a transaction-pooling PgBouncer (default: --database-url)")
	fs.env("listen-url", "PGWORKER_LISTEN_URL")
	fs.StringVar(&f.inputStore, "input-store", "", "`URL` where sources are read: s3://bucket/prefix or file:///dir")
	fs.env("input-store", "PGWORKER_INPUT_STORE")
	fs.StringVar(&f.outputStore, "output-store", "", "`URL` where outputs are written: s3://bucket/prefix or file:///dir")
	fs.env("output-store", "PGWORKER_OUTPUT_STORE")
	fs.Var(&f.passEnv, "pass-env", "hand the environment variable `NAME` to the program although it is withheld by default (repeatable); the twin takes a comma-separated list")
	fs.env("pass-env", "PGWORKER_PASS_ENV")
	fs.StringVar(&f.then, "then", "", "enqueue each output of a completed row into `QUEUE`, the next stage (keyed by its key, in the row's batch; needs --queue, and --output-store is the next stage's --input-store)")
	fs.env("then", "PGWORKER_THEN")
	fs.StringVar(&f.runAs, "run-as", "", "run the program as this `USER` (name, uid, or UID:GID); the worker must start as root")
	fs.env("run-as", "PGWORKER_RUN_AS")
	fs.IntVar(&f.rowLogLines, "row-log-lines", 1000, "lines of the program's output logged per row; past them one line says how many more were not (0: none)")
	fs.env("row-log-lines", "PGWORKER_ROW_LOG_LINES")
	fs.IntVar(&f.rowLogBytes, "row-log-bytes", 1<<20, "bytes of the program's output logged per row (0: none)")
	fs.env("row-log-bytes", "PGWORKER_ROW_LOG_BYTES")
}

// check validates the flags that need no I/O and returns the run's
// configuration so far.
func (f *runFlags) check(fs *flagSet) (*RunConfig, error) {
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q: the command goes in --exec, quoted (see 'pgworker run --help')", fs.Arg(0))
	}
	if f.rowLogLines < 0 || f.rowLogBytes < 0 {
		return nil, usagef("--row-log-lines and --row-log-bytes must not be negative (0 logs none of the program's output)")
	}
	if f.maxOutputFiles < 0 {
		return nil, usagef("--max-output-files must not be negative (0 means no bound)")
	}
	if f.prefer && len(f.queues) < 2 {
		return nil, usagef("--prefer needs two or more --queue, in the order of preference (e.g. --queue gpu --queue cpu --prefer)")
	}
	if f.then != "" {
		switch {
		case !migrations.ValidQueueName(f.then):
			return nil, usagef("--then must have 1 to %d characters", migrations.MaxQueueNameLength)
		case len(f.queues) == 0:
			return nil, usagef("--then needs --queue: a worker of every queue would take the rows it enqueues into %q", f.then)
		case slices.Contains(f.queues, f.then):
			return nil, usagef("--then %q is one of the worker's own --queue: its outputs would come back to it, without end", f.then)
		}
	}
	cfg := &RunConfig{
		Exec: f.exec, Queues: f.queues, PreferQueues: f.prefer, Then: f.then, Timeout: f.timeout, ClaimCooldown: f.claimCooldown, Heartbeat: f.heartbeat, LeaseTimeout: f.leaseTimeout,
		DrainTimeout: f.drainTimeout, KillGrace: f.killGrace, PruneInterval: pruneEvery(f.pruneInterval),
		MetricsAddr: f.metricsAddr, WorkDir: f.workDir,
		MaxOutputFiles: noBound(f.maxOutputFiles), MaxOutputBytes: noBound(int64(f.maxOutputBytes)),
		InputStore: f.inputStore, OutputStore: f.outputStore, ListenURL: f.listenURL, Version: version(),
	}
	if err := cfg.check(f.slots); err != nil {
		return nil, err
	}
	return cfg, nil
}

// prepare checks what the flags name on this node, once the database flags
// are resolved: the listen URL, the program (cfg.Backend) and the work
// directory, which it creates when missing.
func (f *runFlags) prepare(cfg *RunConfig) error {
	if f.listenURL != "" {
		if _, err := pgx.ParseConfig(f.listenURL); err != nil {
			return usagef("--listen-url %s is not a valid database URL", RedactURL(f.listenURL))
		}
	}
	if f.leaseTimeout < 2*f.heartbeat {
		cfg.Logger.Warn("the lease timeout is shorter than two heartbeats: one late heartbeat loses the slot's row",
			"heartbeat", f.heartbeat, "lease_timeout", f.leaseTimeout)
	}
	var err error
	cfg.Backend, err = backend.New(&backend.Config{
		Command: f.exec, Timeout: f.timeout, KillGrace: f.killGrace, PassEnv: f.passEnv, Logger: cfg.Logger,
		LogLines: noneIsNegative(f.rowLogLines), LogBytes: noneIsNegative(f.rowLogBytes), RunAs: f.runAs,
	})
	var se *backend.SyntaxError
	switch {
	case errors.As(err, &se), errors.Is(err, backend.ErrEmptyCommand):
		return usagef("--exec %s: %v", clip(f.exec, 80), err)
	case errors.Is(err, backend.ErrRunAs):
		return usagef("--run-as: %v", err)
	case err != nil:
		return fmt.Errorf("--exec: %w", err)
	}
	if cfg.WorkDir, err = pipeline.MakeWorkDir(f.workDir); err != nil {
		if errors.Is(err, pipeline.ErrUnsafeWorkDir) {
			return usagef("--work-dir: %v", err)
		}
		return fmt.Errorf("--work-dir: %w", err)
	}
	if f.runAs != "" {
		// The program's user must pass through the work directory to reach
		// its job's directory: search, not listing.
		if err := pipeline.LetOthersSearch(cfg.WorkDir); err != nil {
			return fmt.Errorf("--work-dir: %w", err)
		}
	}
	if err := cfg.Backend.CheckWorkDir(cfg.WorkDir); err != nil {
		return fmt.Errorf("--run-as: %w", err)
	}
	return nil
}

// startRun connects, drains at the first SIGTERM or SIGINT and stops at the
// second, and runs the slots until they end.
func (c *CLI) startRun(ctx context.Context, inv *invocation, cfg *RunConfig) error {
	var err error
	cfg.Pool, err = inv.connect(ctx, int32(cfg.SlotsMax+4), func(pc *pgxpool.Config) {
		// No round trip to check a connection before each claim that
		// follows a quiet second.
		pc.ShouldPing = worker.ShouldPing
	})
	if err != nil {
		return err
	}
	defer cfg.Pool.Close()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, hard, stop := drainOnSignal(ctx, sigs, cfg.Logger, cfg.DrainTimeout)
	defer stop()
	cfg.HardStop = hard

	slots := strconv.Itoa(cfg.SlotsMin)
	if cfg.SlotsMax != cfg.SlotsMin {
		slots += "-" + strconv.Itoa(cfg.SlotsMax)
	}
	cfg.Logger.Info("pgworker run starting", "version", cfg.Version, "database", RedactURL(cfg.DatabaseURL),
		"exec", cfg.Exec, "program", cfg.Backend.Program(), "slots", slots, "queues", []string(cfg.Queues), "prefer", cfg.PreferQueues,
		"heartbeat", cfg.Heartbeat, "lease_timeout", cfg.LeaseTimeout, "timeout", cfg.Timeout, "claim_cooldown", cfg.ClaimCooldown)
	return c.cfg.RunWorkers(ctx, cfg)
}

// noneIsNegative maps a flag's 0 (none) to backend.Config's negative.
func noneIsNegative(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// check validates the flags that need no I/O.
func (cfg *RunConfig) check(slots string) error {
	if strings.TrimSpace(cfg.Exec) == "" {
		return usagef("missing --exec: give the program to run for each row, e.g. --exec 'convert {input} {output_dir}/out.png' (or set PGWORKER_EXEC)")
	}
	var err error
	if cfg.SlotsMin, cfg.SlotsMax, err = parseSlots(slots); err != nil {
		return err
	}
	for _, q := range cfg.Queues {
		if err := checkQueueFlag(q, "leave --queue out to serve every queue"); err != nil {
			return err
		}
	}
	switch {
	case cfg.Timeout < 0:
		return usagef("--timeout must not be negative (0 means no limit)")
	case cfg.ClaimCooldown < 0 || cfg.ClaimCooldown > time.Minute:
		return usagef("--claim-cooldown must be between 0 (claim at once) and 1m, e.g. 100ms")
	case cfg.Heartbeat <= 0:
		return usagef("--heartbeat must be positive")
	case cfg.LeaseTimeout <= cfg.Heartbeat:
		return usagef("--lease-timeout (%s) must exceed --heartbeat (%s): a slot's row is taken back after a lease without heartbeat, "+
			"so give it a few heartbeats, e.g. --lease-timeout %s", cfg.LeaseTimeout, cfg.Heartbeat, 3*cfg.Heartbeat)
	case cfg.DrainTimeout < 0:
		return usagef("--drain-timeout must not be negative")
	case cfg.KillGrace <= 0:
		return usagef("--kill-grace must be positive")
	case cfg.WorkDir == "":
		return usagef("missing --work-dir: no default could be found (no $STATE_DIRECTORY, no home or cache directory); give one, or set PGWORKER_WORK_DIR")
	}
	if cfg.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(cfg.MetricsAddr); err != nil || port == "" {
			return usagef("--metrics-addr %q: give host:port, e.g. 127.0.0.1:9090", cfg.MetricsAddr)
		}
	}
	for _, s := range []struct{ flag, url string }{{"--input-store", cfg.InputStore}, {"--output-store", cfg.OutputStore}} {
		if err := checkStoreURL(s.url); err != nil {
			return usagef("%s %q: %v", s.flag, s.url, err)
		}
	}
	return nil
}

// parseSlots parses N or MIN-MAX.
func parseSlots(s string) (int, int, error) {
	const maxSlots = 1024
	bad := usagef("--slots %q: give a number of slots, N, or a range MIN-MAX, from 1 to %d", s, maxSlots)
	lo, hi, isRange := strings.Cut(s, "-")
	minN, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return 0, 0, bad
	}
	maxN := minN
	if isRange {
		if maxN, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
			return 0, 0, bad
		}
	}
	if minN < 1 || maxN > maxSlots {
		return 0, 0, bad
	}
	if maxN < minN {
		return 0, 0, usagef("--slots %q: the range's minimum exceeds its maximum", s)
	}
	return minN, maxN, nil
}

// checkStoreURL accepts "", s3://bucket[/prefix] and file:///dir.
func checkStoreURL(s string) error {
	if s == "" {
		return nil
	}
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return errors.New("give s3://bucket/prefix or file:///dir")
	case scheme == "s3":
		if bucket, _, _ := strings.Cut(rest, "/"); bucket == "" {
			return errors.New("the bucket is missing: s3://bucket/prefix")
		}
	case scheme == "file":
		if !strings.HasPrefix(rest, "/") {
			return errors.New("give an absolute directory: file:///srv/data")
		}
	default:
		return fmt.Errorf("unknown scheme %q: give s3://bucket/prefix or file:///dir", scheme)
	}
	return nil
}

// drainOnSignal returns a context that the first signal on sigs cancels
// (drain), and a channel that the second closes (stop now). After the
// second, sigs is released so that a third signal kills the process the
// default way. stop ends the watch.
func drainOnSignal(parent context.Context, sigs chan os.Signal, logger *slog.Logger, drain time.Duration) (context.Context, <-chan struct{}, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	hard := make(chan struct{})
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			logger.Info("draining: running rows finish, no new rows are claimed; send the signal again to stop at once",
				"signal", sig.String(), "drain_timeout", drain)
			cancel(fmt.Errorf("received %v: draining", sig))
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			logger.Warn("stopping at once: running programs are killed and their rows handed back", "signal", sig.String())
			signal.Stop(sigs)
			close(hard)
		case <-done:
		}
	}()
	return ctx, hard, func() {
		close(done)
		cancel(nil)
	}
}

// noBound maps a bound flag's 0 (no bound) to the pipeline's -1.
func noBound[T int | int64](n T) T {
	if n == 0 {
		return -1
	}
	return n
}

// pruneEvery maps --prune-interval to worker.Config.PruneInterval, where 0
// is the default and a negative value is never.
func pruneEvery(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
