package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// runWorkers runs the slots until ctx is cancelled, then drains them within
// cfg.DrainTimeout: running backends may finish, what is still held then is
// released without spending an attempt. cfg.HardStop skips the wait.
func runWorkers(ctx context.Context, cfg *RunConfig) error {
	if cfg.OutputStore == "" {
		return usagef("run: missing output store (set --output-store or PGWORKER_OUTPUT_STORE to s3://bucket/prefix or file:///dir)")
	}
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return usagef("run: %v", err)
	}
	opts.Logger = cfg.Logger
	var input blob.Store
	if cfg.InputStore != "" {
		if input, err = blob.Open(ctx, cfg.InputStore, &opts); err != nil {
			return fmt.Errorf("run: input store: %w", err)
		}
		defer input.Close()
	}
	output, err := blob.Open(ctx, cfg.OutputStore, &opts)
	if err != nil {
		return fmt.Errorf("run: output store: %w", err)
	}
	defer output.Close()

	handler, err := pipeline.New(&pipeline.Config{
		Resolver: blob.NewResolver(input),
		Output:   output,
		Runner:   cfg.Backend,
		WorkDir:  cfg.WorkDir,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	w, err := worker.New(cfg.Pool, &worker.Config{
		Handler:           handler,
		Queues:            cfg.Queues,
		Slots:             cfg.SlotsMin,
		MaxSlots:          cfg.SlotsMax,
		HeartbeatInterval: cfg.Heartbeat,
		LeaseTimeout:      cfg.LeaseTimeout,
		ListenURL:         cfg.ListenURL,
		Version:           cfg.Version,
		Logger:            cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if err := w.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	<-ctx.Done()

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
	err = w.Stop(drainCtx)
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
