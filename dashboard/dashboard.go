// Package dashboard is pgworker's web dashboard: an http.Handler that shows
// the queues, the worker slots, the failures and each row, live, from one
// PostgreSQL database.
//
//	d, err := dashboard.New(pool, &dashboard.Config{Logger: logger})
//	if err != nil {
//		return err
//	}
//	if err := d.Start(ctx); err != nil {
//		return err
//	}
//	defer d.Stop(context.Background())
//	http.ListenAndServe("127.0.0.1:8080", d)
//
// The dashboard holds one LISTEN connection (package listener) and one
// refresh loop for every browser: pages and the server-sent events that keep
// them current are rendered from the loop's latest snapshot, so fifty open
// browsers cost the database the same queries as one. The loop refreshes
// when a notification arrives and every Config.Interval while somebody
// watches, never more often than Config.MinInterval.
//
// It is read-only by default and then needs only the pgworker_reader role.
// Config.AllowActions with a Config.Token turns on retry, cancel, pause and
// resume (the database user then needs pgworker_admin): POST only, with the
// token as a bearer header or a basic auth password, and a CSRF token.
package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/listener"
)

// Config configures a Dashboard. A nil Config works: read-only, no
// downloads.
type Config struct {
	// Logger receives the actions taken (who, what) and outages. Defaults to
	// discarding.
	Logger *slog.Logger

	// Listener is the LISTEN connection to share, already listening.
	// Defaults to a listener of the dashboard's own on the pool's
	// connection settings (or ListenURL), run between Start and Stop.
	Listener *listener.Listener
	// ListenURL is the database URL for LISTEN when the pool goes through a
	// transaction-pooling PgBouncer. Defaults to the pool's settings.
	ListenURL string

	// AllowActions turns on retry, cancel, pause and resume. It needs
	// Token. Defaults to false: read-only.
	AllowActions bool
	// Token authenticates the actions: sent as "Authorization: Bearer
	// TOKEN" or as the password of basic auth (whose user name is logged).
	// At least 16 characters.
	Token string

	// OutputStore is the store that `pgworker run --output-store` writes
	// to: outputs inside it can be downloaded through the dashboard.
	// Defaults to none (outputs are listed, not served).
	OutputStore blob.Store

	// Interval is how often the snapshot is refreshed while a page or a
	// stream is open, notifications aside. Defaults to 2s.
	Interval time.Duration
	// MinInterval is the least time between two refreshes, however many
	// notifications arrive. Defaults to 1s.
	MinInterval time.Duration
	// SlowInterval is how often the failure groups and the chart are read,
	// which cost more. Defaults to 10s.
	SlowInterval time.Duration
	// QueryTimeout bounds each refresh and each page's queries. Defaults
	// to 10s.
	QueryTimeout time.Duration

	// Version is shown in the footer. Defaults to "dev".
	Version string
}

// Errors that callers branch on.
var (
	// ErrNoToken is AllowActions without a Token of at least 16 characters.
	ErrNoToken = errors.New("dashboard: actions need a token of at least 16 characters")
	// ErrStarted is Start called twice.
	ErrStarted = errors.New("dashboard: already started")
)

// Dashboard serves the pages. Create it with New, run its refresh loop with
// Start, end it with Stop.
type Dashboard struct {
	pool   *pgxpool.Pool
	cfg    Config
	logger *slog.Logger
	mux    *http.ServeMux
	hub    *hub

	ownListener bool
	lis         *listener.Listener

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// New returns a dashboard of the database behind pool. It makes no query
// until Start.
func New(pool *pgxpool.Pool, cfg *Config) (*Dashboard, error) {
	d := &Dashboard{pool: pool}
	if cfg != nil {
		d.cfg = *cfg
	}
	c := &d.cfg
	c.Interval = orDefault(c.Interval, 2*time.Second)
	c.MinInterval = orDefault(c.MinInterval, time.Second)
	c.SlowInterval = orDefault(c.SlowInterval, 10*time.Second)
	c.QueryTimeout = orDefault(c.QueryTimeout, 10*time.Second)
	if c.Version == "" {
		c.Version = "dev"
	}
	d.logger = c.Logger
	if d.logger == nil {
		d.logger = slog.New(slog.DiscardHandler)
	}
	if c.AllowActions && len(c.Token) < 16 {
		return nil, ErrNoToken
	}
	d.lis = c.Listener
	if d.lis == nil {
		lcfg := &listener.Config{URL: c.ListenURL, Logger: d.logger}
		if c.ListenURL == "" {
			lcfg.ConnConfig = &pool.Config().ConnConfig.Config
		}
		var err error
		if d.lis, err = listener.New(lcfg); err != nil {
			return nil, fmt.Errorf("dashboard: %w", err)
		}
		d.ownListener = true
	}
	d.hub = newHub(d)
	d.mux = d.routes()
	return d, nil
}

func orDefault(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// Start starts the refresh loop (and the dashboard's own listener) in the
// background; they run until Stop or until ctx ends.
func (d *Dashboard) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started {
		return ErrStarted
	}
	d.started = true
	ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	d.done = make(chan struct{})
	var wg sync.WaitGroup
	if d.ownListener {
		wg.Go(func() { _ = d.lis.Listen(ctx) })
	}
	wg.Go(func() { d.hub.run(ctx) })
	go func() {
		wg.Wait()
		close(d.done)
	}()
	return nil
}

// Stop ends the refresh loop and every open event stream, so that an
// http.Server's Shutdown does not wait for them, and waits until ctx ends
// for the loop to return.
func (d *Dashboard) Stop(ctx context.Context) error {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	d.hub.closeStreams()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Refresh has the loop read the database now, all of it, and returns once what it
// read is what the pages and streams show: after writes of one's own, or
// in tests. It returns the refresh's error, nil when the database
// answered.
func (d *Dashboard) Refresh(ctx context.Context) error {
	s, err := d.hub.since(ctx, time.Now())
	if err != nil {
		return err
	}
	return s.err
}

// Stats are the dashboard's counters since New.
type Stats struct {
	// Refreshes is how many times the loop read the database.
	Refreshes uint64
	// RefreshTime is the time the refreshes took, in all.
	RefreshTime time.Duration
	// Queries is how many statements the loop sent.
	Queries uint64
	// PageQueries is how many statements the pages that read rows
	// directly (Row, a failure group) and the actions sent.
	PageQueries uint64
	// Streams is the number of event streams open now.
	Streams int
	// Generation numbers the snapshots; it grows by one per refresh.
	Generation uint64
}

// Stats returns the dashboard's counters.
func (d *Dashboard) Stats() Stats {
	return d.hub.stats()
}

// ServeHTTP serves the pages, the event streams, the assets and the
// actions, with security headers on every answer.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	d.mux.ServeHTTP(w, r)
}

func (d *Dashboard) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", d.page(d.overview))
	m.HandleFunc("GET /workers", d.page(d.workers))
	m.HandleFunc("GET /failures", d.page(d.failures))
	m.HandleFunc("GET /queues", d.page(d.queues))
	m.HandleFunc("GET /rows/{id}", d.page(d.row))
	m.HandleFunc("GET /rows", d.page(d.findRow))
	m.HandleFunc("GET /rows/{id}/outputs/{n}", d.download)
	m.HandleFunc("GET /events", d.events)
	m.HandleFunc("GET /login", d.login)
	m.Handle("GET /static/", staticHandler())
	m.HandleFunc("POST /actions/{action}", d.action)
	return m
}
