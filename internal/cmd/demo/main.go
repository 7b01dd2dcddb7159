// Command demo runs pgworker end to end on one machine, as `make demo` does:
// a throwaway PostgreSQL cluster, MinIO when bin/minio exists (else a file://
// store), the migrations, `pgworker dashboard` (its URL printed), the sample
// data set of testdata/inputs enqueued, three `pgworker run` processes of four
// slots running testdata/backend/summarize, a live progress line, and at the
// end the per-worker metrics, the failed rows with their errors and where the
// outputs are. It cleans up after itself, also on Ctrl-C; the outputs and the
// workers' logs stay in ./demo-output.
//
//	go run ./internal/cmd/demo --pgworker bin/pgworker
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var cfg Config
	flag.StringVar(&cfg.Pgworker, "pgworker", "", "the pgworker binary to run (default: build ./cmd/pgworker into a temporary directory)")
	flag.StringVar(&cfg.Out, "out", "demo-output", "`DIR` for the outputs and the workers' logs, replaced at each run")
	flag.IntVar(&cfg.Workers, "workers", 3, "pgworker run processes")
	flag.IntVar(&cfg.Slots, "slots", 4, "slots of each process")
	flag.BoolVar(&cfg.NoMinIO, "no-minio", false, "use a file:// store even when bin/minio exists")
	flag.BoolVar(&cfg.Hold, "hold", false, "when the rows are done, keep everything running (for psql) until Ctrl-C")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := Run(ctx, &cfg, os.Stdout); err != nil {
		stop()
		if errors.Is(err, context.Canceled) {
			os.Exit(130) // Ctrl-C; Run said so
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
