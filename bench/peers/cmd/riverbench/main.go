// Command riverbench runs River through the workloads of `pgworker bench`:
//
//	riverbench throughput --rows 20000 --slots 100 [--json]
//	riverbench latency --rows 500 --rate 50 --slots 100 [--json]
//	riverbench cpu --rate 200 --duration 10s --slots 100 [--json]
//
// By default it creates a throwaway database <db>_riverbench beside the one
// --database-url names, migrates River into it, runs, and drops it. With
// --dedicated it runs in the database of --database-url itself, which must
// hold no River jobs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/pgworker/pgworker/bench/peers/riverbench"
)

const usage = `riverbench measures River on the workloads of pgworker bench.

Usage:
  riverbench throughput [--rows N] [--slots N] [--json] [flags]
  riverbench latency [--rows N] [--rate R] [--slots N] [--json] [flags]
  riverbench cpu [--rate R (0: peak)] [--duration D] [--rows N] [--slots N] [--json] [flags]

Flags:
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "riverbench:", err)
		}
		os.Exit(2)
	}
}

type options struct {
	databaseURL       string
	rows              int
	slots             int
	rate              float64
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	tuned             bool
	maxConns          int
	dedicated         bool
	timeout           time.Duration
	json              bool
	duration          time.Duration
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("riverbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || (args[0] != "throughput" && args[0] != "latency" && args[0] != "cpu") {
		fs.Usage()
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return flag.ErrHelp
		}
		return errors.New("name a mode: throughput, latency or cpu")
	}
	mode := args[0]

	var o options
	fs.StringVar(&o.databaseURL, "database-url", firstEnv("RIVERBENCH_DATABASE_URL", "PGWORKER_DATABASE_URL", "DATABASE_URL"),
		"PostgreSQL URL (env RIVERBENCH_DATABASE_URL, then PGWORKER_DATABASE_URL, then DATABASE_URL)")
	fs.IntVar(&o.rows, "rows", 0, fmt.Sprintf("jobs to run (default %d for throughput, %d for latency)", riverbench.DefaultThroughputRows, riverbench.DefaultLatencyRows))
	fs.IntVar(&o.slots, "slots", riverbench.DefaultSlots, "River MaxWorkers on the queue")
	fs.Float64Var(&o.rate, "rate", riverbench.DefaultRate, "latency and cpu: jobs inserted per second (cpu: 0 burns --rows down at peak)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "cpu: how long to insert at --rate")
	fs.DurationVar(&o.fetchCooldown, "fetch-cooldown", 0, "River FetchCooldown (default River's, 100ms)")
	fs.DurationVar(&o.fetchPollInterval, "fetch-poll-interval", 0, "River FetchPollInterval (default River's, 1s)")
	fs.BoolVar(&o.tuned, "tuned", false, "set FetchCooldown to River's minimum (1ms) unless --fetch-cooldown is given")
	fs.IntVar(&o.maxConns, "max-conns", 10, "connections in the pool River uses")
	fs.BoolVar(&o.dedicated, "dedicated", false, "run in the database of --database-url itself instead of a throwaway <db>_riverbench")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.BoolVar(&o.json, "json", false, "print the result as one line of JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.databaseURL == "" {
		return errors.New("missing database URL (set --database-url or RIVERBENCH_DATABASE_URL)")
	}
	if o.maxConns < 1 {
		return errors.New("--max-conns must be at least 1")
	}
	if o.tuned && o.fetchCooldown == 0 {
		o.fetchCooldown = river.FetchCooldownMin
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	res, err := bench(ctx, mode, &o, stderr)
	if err != nil {
		return err
	}
	if o.json {
		return json.NewEncoder(stdout).Encode(res)
	}
	_, err = fmt.Fprintln(stdout, text(res))
	return err
}

func bench(ctx context.Context, mode string, o *options, stderr io.Writer) (any, error) {
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	cfg.MaxConns = int32(o.maxConns)
	if !o.dedicated {
		admin := cfg.ConnConfig.Copy()
		name := cfg.ConnConfig.Database + "_riverbench"
		if err := riverbench.CreateDatabase(ctx, admin, name); err != nil {
			return nil, err
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := riverbench.DropDatabase(dctx, admin, name); err != nil {
				fmt.Fprintln(stderr, "riverbench: drop throwaway database:", err)
			}
		}()
		cfg.ConnConfig.Database = name
	}

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := riverbench.Migrate(ctx, pool, logger); err != nil {
		return nil, err
	}
	if err := riverbench.CheckEmpty(ctx, pool); err != nil {
		return nil, err
	}
	if mode == "cpu" && !o.dedicated {
		// The statements' breakdown, when the server has the library loaded.
		var loaded bool
		if err := pool.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries') ~ 'pg_stat_statements'`).Scan(&loaded); err == nil && loaded {
			if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
				return nil, fmt.Errorf("create pg_stat_statements in the throwaway database: %w", err)
			}
		}
	}
	rc := &riverbench.Config{
		Rows:              o.rows,
		Slots:             o.slots,
		Rate:              o.rate,
		FetchCooldown:     o.fetchCooldown,
		FetchPollInterval: o.fetchPollInterval,
		Logger:            logger,
	}
	switch mode {
	case "throughput":
		return riverbench.Throughput(ctx, pool, rc)
	case "cpu":
		if o.rate < 0 || o.duration <= 0 {
			return nil, errors.New("cpu: --rate must be 0 (peak) or more, --duration positive")
		}
		rc.Rate = max(o.rate, 0)
		return riverbench.CPU(ctx, pool, rc, o.rate, o.duration)
	}
	return riverbench.Latency(ctx, pool, rc)
}

func text(res any) string {
	switch r := res.(type) {
	case *riverbench.ThroughputResult:
		return fmt.Sprintf("river %s throughput: %d rows, %d slots: %.0f rows/s (%.2f s; fetch cooldown %gms)",
			r.RiverVersion, r.Rows, r.Slots, r.RowsPerSec, r.ElapsedMS/1000, r.FetchCooldownMS)
	case *riverbench.CPUResult:
		rate := "at peak"
		if r.Rate > 0 {
			rate = fmt.Sprintf("at %g rows/s", r.Rate)
		}
		return fmt.Sprintf("river %s cpu: %d rows %s, %d slots (%.0f rows/s): server CPU %.3f ms per row, worker process %.3f ms, WAL %.0f bytes, %.2f transactions",
			r.RiverVersion, r.Rows, rate, r.Slots, r.RowsPerSec, r.ServerCPUMSPerRow, r.WorkerCPUMSPerRow, r.WALBytesPerRow, r.XactsPerRow)
	case *riverbench.LatencyResult:
		return fmt.Sprintf("river %s latency: %d rows at %g/s, %d slots: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms "+
			"(from commit; from send p50 %.1f ms, p99 %.1f ms; fetch cooldown %gms)",
			r.RiverVersion, r.Rows, r.Rate, r.Slots, r.P50MS, r.P90MS, r.P99MS, r.MaxMS,
			r.FromSend.P50MS, r.FromSend.P99MS, r.FetchCooldownMS)
	}
	return fmt.Sprint(res)
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}
