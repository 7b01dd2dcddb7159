package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/metrics"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// runWorkers runs the slots until ctx is cancelled, then drains them within
// cfg.DrainTimeout: running backends may finish, what is still held then is
// released without spending an attempt. cfg.HardStop skips the wait.
func runWorkers(ctx context.Context, cfg *RunConfig) error {
	input, output, err := openStores(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if input != nil {
			input.Close()
		}
		output.Close()
	}()

	handler, err := pipeline.New(&pipeline.Config{
		Resolver:       blob.NewResolver(input),
		Output:         output,
		Runner:         cfg.Backend,
		WorkDir:        cfg.WorkDir,
		MaxOutputFiles: cfg.MaxOutputFiles,
		MaxOutputBytes: cfg.MaxOutputBytes,
		Logger:         cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	var m *metrics.Metrics
	observer := rowLogger(cfg.Logger)
	if cfg.MetricsAddr != "" {
		m = metrics.New(cfg.Pool, &metrics.Config{Logger: cfg.Logger})
		m.AddReadyCheck(handler.Ready)
		observer = worker.Observers(m, observer)
	}
	w, err := worker.New(cfg.Pool, &worker.Config{
		Handler:           handler,
		Queues:            cfg.Queues,
		PreferQueues:      cfg.PreferQueues,
		Then:              cfg.Then,
		Slots:             cfg.SlotsMin,
		MaxSlots:          cfg.SlotsMax,
		HeartbeatInterval: cfg.Heartbeat,
		LeaseTimeout:      cfg.LeaseTimeout,
		ClaimCooldown:     cfg.ClaimCooldown,
		PruneInterval:     cfg.PruneInterval,
		ListenURL:         cfg.ListenURL,
		Version:           cfg.Version,
		Observer:          observer,
		Gate:              handler.Gate(),
		Logger:            cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if m != nil {
		srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: cfg.MetricsAddr, Logger: cfg.Logger})
		if err := srv.Start(ctx); err != nil {
			return fmt.Errorf("run: --metrics-addr: %w", err)
		}
		cfg.Logger.Info("serving metrics", "addr", srv.Addr(), "paths", []string{"/metrics", "/healthz", "/readyz"})
		defer func() {
			// Last, so that the drain can be watched to its end.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Stop(sctx); err != nil {
				cfg.Logger.Debug("metrics server stop", "error", err)
			}
		}()
	}
	if err := w.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if m != nil {
		// Once started: until then /readyz says that no worker has started.
		m.Watch(w)
	}
	<-ctx.Done()
	return drain(w, cfg)
}

// openStores opens the input store (nil when there is none) and the output
// store of pgworker run.
func openStores(ctx context.Context, cfg *RunConfig) (input, output blob.Store, err error) {
	if cfg.OutputStore == "" {
		return nil, nil, usagef("run: missing output store (set --output-store or PGWORKER_OUTPUT_STORE to s3://bucket/prefix or file:///dir)")
	}
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return nil, nil, usagef("run: %v", err)
	}
	opts.Logger = cfg.Logger
	// A worker rides out an object store's restart or failover in place: the
	// slot keeps its row (heartbeats go on) while each request retries for
	// 40 to 75 seconds, rather than the few seconds a one-off command wants.
	// Past that, the row goes back to the queue without spending an attempt.
	opts.Retry = workerRetry
	if cfg.InputStore != "" {
		if input, err = blob.Open(ctx, cfg.InputStore, &opts); err != nil {
			return nil, nil, fmt.Errorf("run: input store: %w", err)
		}
	}
	if output, err = blob.Open(ctx, cfg.OutputStore, &opts); err != nil {
		if input != nil {
			input.Close()
		}
		return nil, nil, fmt.Errorf("run: output store: %w", err)
	}
	return input, output, nil
}

// drain stops the worker within cfg.DrainTimeout, or at once on
// cfg.HardStop: running rows may finish, what is still held then is
// released without spending an attempt.
func drain(w *worker.Worker, cfg *RunConfig) error {
	cfg.Logger.Info("draining: no more claims; running rows may finish", "drain_timeout", cfg.DrainTimeout)
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	go func() {
		select {
		case <-cfg.HardStop:
			cfg.Logger.Info("second signal: stopping running rows now")
			cancel()
		case <-drainCtx.Done():
		}
	}()
	err := w.Stop(drainCtx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// The drain ran out: the worker released what was still running.
		cfg.Logger.Info("stopped; unfinished rows were released")
		return nil
	}
	if err != nil {
		return fmt.Errorf("run: stop: %w", err)
	}
	cfg.Logger.Info("stopped after a clean drain")
	return nil
}

// workerRetry bounds the retries of one object store request of pgworker
// run: waits from 200ms doubling to 5s, 19 of them.
var workerRetry = blob.Retry{Attempts: 20, Backoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second}

// openStoreLister lists a blob store for `pgworker enqueue --from`. Each
// object is enqueued by its full URL, so that any worker resolves it the
// same way whatever its --input-store.
func openStoreLister(ctx context.Context, uri string) (Lister, error) {
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return nil, err
	}
	st, err := blob.Open(ctx, uri, &opts)
	if err != nil {
		return nil, err
	}
	return ListerFunc(func(ctx context.Context, fn func(string) error) error {
		defer st.Close()
		base := st.Location().String()
		for info, err := range st.List(ctx, "") {
			if err != nil {
				return err
			}
			if err := fn(base + "/" + info.Key); err != nil {
				return err
			}
		}
		return nil
	}), nil
}

// rowLogger logs one line when a row starts and one when it ends, with its
// id, queue, attempt, slot, outcome and duration, at Info level.
func rowLogger(logger *slog.Logger) worker.Observer {
	return worker.ObserverFunc(func(e worker.Event) {
		j := e.Job
		if e.Kind == worker.RowStarted {
			logger.Info("row started", "id", j.ID, "queue", j.Queue, "attempt", j.Attempt, "worker_id", j.WorkerID,
				"source", j.Source)
			return
		}
		args := []any{"id", j.ID, "queue", j.Queue, "attempt", j.Attempt, "worker_id", j.WorkerID,
			"outcome", e.Kind.String(), "duration", e.Elapsed.Round(time.Millisecond)}
		if e.Err != nil {
			args = append(args, "error", e.Err.Error())
		}
		if e.Kind == worker.RowFailed {
			if e.RetryAt.IsZero() {
				args = append(args, "final", true)
			} else {
				args = append(args, "final", false, "retry_in", time.Until(e.RetryAt).Round(time.Millisecond))
			}
		}
		logger.Info("row finished", args...)
	})
}
