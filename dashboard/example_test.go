package dashboard_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/dashboard"
)

// A read-only dashboard on 127.0.0.1:8080, for a pgworker_reader login.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	d, err := dashboard.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: d, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != http.ErrServerClosed {
			log.Print(err)
		}
	}()
	// ... until it is time to stop: the event streams end first, so that
	// Shutdown need not wait for them.
	_ = d.Stop(ctx)
	_ = srv.Shutdown(ctx)
}

// Actions (retry, cancel, pause, resume) for whoever has the token. The
// database login then needs pgworker_admin.
func ExampleNew_actions() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGWORKER_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	d, err := dashboard.New(pool, &dashboard.Config{
		AllowActions: true,
		Token:        os.Getenv("PGWORKER_DASHBOARD_TOKEN"), // at least 16 characters
	})
	if err != nil {
		log.Fatal(err) // dashboard.ErrNoToken without a token
	}
	_ = d
}
