package worker_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/worker"
)

// A process with eight slots on queue "images" that stops gracefully on
// Ctrl-C: running handlers get a minute to finish, then their rows are
// released.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	w, err := worker.New(pool, &worker.Config{
		Queues: []string{"images"},
		Slots:  8,
		Handler: worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
			if job.Source == "" {
				return nil, worker.Permanent(os.ErrInvalid) // no retry
			}
			// ... process job.Source, honouring ctx ...
			return &worker.Result{Output: map[string]any{"thumbnail": job.Source + ".png"}}, nil
		}),
		Logger: slog.Default(),
	})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}

	interrupt, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	<-interrupt.Done()
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		slog.Warn("stopped with rows still running; they were released", "error", err)
	}
}
