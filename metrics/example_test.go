package metrics_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/metrics"
	"github.com/pgworker/pgworker/worker"
)

// A worker process that serves /metrics, /healthz and /readyz on port 9090
// until Ctrl-C.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	m := metrics.New(pool, &metrics.Config{Logger: slog.Default()})
	w, err := worker.New(pool, &worker.Config{
		Slots:    8,
		Observer: m, // counts the rows per queue and times them
		Handler: worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (*worker.Result, error) {
			return &worker.Result{Output: map[string]any{"source": job.Source}}, nil
		}),
	})
	if err != nil {
		panic(err)
	}
	m.Watch(w) // its Stats on each scrape, its listener in /readyz

	srv := metrics.NewServer(m.Handler(), &metrics.ServerConfig{Addr: ":9090"})
	if err := srv.Start(ctx); err != nil {
		panic(err) // the port is taken
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}

	interrupt, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	<-interrupt.Done()
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_ = w.Stop(stopCtx)
	_ = srv.Stop(stopCtx) // last, so that the drain can be watched
}
