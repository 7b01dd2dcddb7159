package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/dashboard"
)

// dashboardTokenEnv holds the token of the dashboard's actions: never a
// flag, which every user of the machine could read in the process list.
const dashboardTokenEnv = "PGWORKER_DASHBOARD_TOKEN"

var dashboardCommand = &command{
	name:    "dashboard",
	args:    "[flags]",
	summary: "serve the web dashboard: queues, workers, failures, rows, live",
	help: `
Serves the web dashboard on --addr (loopback by default): an Overview of each
queue (progress, counts by state, rate, ETA, oldest pending, paused), the
worker slots of each node (the row each holds, heartbeat age; silent, dead and
draining slots marked), the failed rows grouped by error with their stderr
tails and attempts, each row with its attempts and outputs, and the queue
controls. Pages update in place as rows move. The dashboard holds one LISTEN
connection and one refresh loop for every browser, so that many open pages
cost the database what one does.

It is read-only unless --allow-actions is given, and then needs only the
pgworker_reader role. With --allow-actions, retry, cancel, pause and resume
need the token in PGWORKER_DASHBOARD_TOKEN (at least 16 characters; it is
read from the environment only): browsers sign in at /login with any user
name and the token as the password (basic auth), scripts send
"Authorization: Bearer TOKEN". The database user then needs pgworker_admin.
Every action is logged with who took it.

With --output-store (the store of pgworker run --output-store), the outputs
of a row are downloaded through the dashboard, streamed.

The dashboard has no TLS of its own: to reach it from another machine, put
it behind a reverse proxy that has, or use an SSH tunnel.`,
	examples: `
pgworker dashboard
pgworker dashboard --addr 127.0.0.1:8080 --output-store s3://results
PGWORKER_DASHBOARD_TOKEN=$(cat /etc/pgworker/dashboard-token) pgworker dashboard --allow-actions`,
}

func (c *CLI) dashboard(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(dashboardCommand)
	var (
		addr, listenURL, outputStore string
		allowActions                 bool
	)
	inv.fs.StringVar(&addr, "addr", "127.0.0.1:8080", "serve the dashboard on this `HOST:PORT`")
	inv.fs.env("addr", "PGWORKER_DASHBOARD_ADDR")
	inv.fs.BoolVar(&allowActions, "allow-actions", false, "allow retry, cancel, pause and resume, for whoever has the token in "+dashboardTokenEnv)
	inv.fs.env("allow-actions", "PGWORKER_DASHBOARD_ALLOW_ACTIONS")
	inv.fs.StringVar(&listenURL, "listen-url", "", "database `URL` for LISTEN when --database-url goes through a transaction-pooling PgBouncer (default: --database-url)")
	inv.fs.env("listen-url", "PGWORKER_LISTEN_URL")
	inv.fs.StringVar(&outputStore, "output-store", "", "`URL` of the output store (s3://bucket/prefix or file:///dir), to download outputs through the dashboard")
	inv.fs.env("output-store", "PGWORKER_OUTPUT_STORE")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return usagef("--addr %q: give host:port, e.g. 127.0.0.1:8080", addr)
	}
	if err := checkStoreURL(outputStore); err != nil {
		return usagef("--output-store %q: %v", outputStore, err)
	}
	cfg := &dashboard.Config{ListenURL: listenURL, AllowActions: allowActions, Version: version(), Logger: inv.logger()}
	if allowActions {
		cfg.Token, _ = e.lookup(dashboardTokenEnv)
		if len(cfg.Token) < 16 {
			return usagef("--allow-actions needs a token of at least 16 characters in %s (from the environment only, never on the command line)", dashboardTokenEnv)
		}
	}
	pool, err := inv.connect(ctx, 8)
	if err != nil {
		return err
	}
	defer pool.Close()
	if outputStore != "" {
		store, err := openOutputStore(ctx, outputStore, cfg.Logger)
		if err != nil {
			return err
		}
		defer store.Close()
		cfg.OutputStore = store
	}
	d, err := dashboard.New(pool, cfg)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	return serveDashboard(ctx, e, d, addr, cfg.Logger, allowActions)
}

func openOutputStore(ctx context.Context, url string, logger *slog.Logger) (blob.Store, error) {
	opts, err := blob.OptionsFromEnv()
	if err != nil {
		return nil, usagef("dashboard: %v", err)
	}
	opts.Logger = logger
	store, err := blob.Open(ctx, url, &opts)
	if err != nil {
		return nil, fmt.Errorf("dashboard: output store: %w", err)
	}
	return store, nil
}

// serveDashboard serves d on addr until ctx ends.
func serveDashboard(ctx context.Context, e *env, d *dashboard.Dashboard, addr string, logger *slog.Logger, actions bool) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dashboard: listen on %s: %w", addr, err)
	}
	if err := d.Start(ctx); err != nil {
		ln.Close()
		return fmt.Errorf("dashboard: %w", err)
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		logger.Warn("the dashboard is reachable from other machines, without TLS: prefer a loopback address behind a reverse proxy or an SSH tunnel", "addr", addr)
	}
	logger.Info("serving the dashboard", "url", url, "actions", actions)
	fmt.Fprintf(e.stdout, "pgworker dashboard on %s\n", url)

	select {
	case <-ctx.Done():
	case err := <-served:
		_ = d.Stop(context.Background())
		return fmt.Errorf("dashboard: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The event streams first, so that Shutdown need not wait for them.
	_ = d.Stop(sctx)
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("dashboard: %w", err)
	}
	return nil
}
