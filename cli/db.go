package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connectTimeout bounds each connection attempt unless the URL sets
// connect_timeout.
const connectTimeout = 10 * time.Second

// statementModes maps --statement-mode values to pgx's query exec modes.
var statementModes = map[string]pgx.QueryExecMode{
	"prepared": pgx.QueryExecModeCacheStatement,
	"describe": pgx.QueryExecModeCacheDescribe,
	"exec":     pgx.QueryExecModeExec,
	"simple":   pgx.QueryExecModeSimpleProtocol,
}

// dbFlags are the flags of the commands that use the database.
type dbFlags struct {
	url           string
	statementMode string
	source        string // where url came from, for messages
}

func (d *dbFlags) add(fs *flagSet) {
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL `URL` of the queue database, e.g. postgres://app@db:5432/queue; "+
		"keep its password in ~/.pgpass (or PGPASSFILE, or passfile= in the URL) or set the URL in the environment: "+
		"the command line is visible to every user of the machine")
	fs.env("database-url", "PGWORKER_DATABASE_URL", "DATABASE_URL")
	fs.StringVar(&d.statementMode, "statement-mode", "",
		"how statements are sent: `MODE` is prepared, describe, exec or simple; exec or simple through a PgBouncer in "+
			"transaction mode that does not keep prepared statements (default prepared, or the URL's default_query_exec_mode)")
	fs.env("statement-mode", "PGWORKER_STATEMENT_MODE")
	fs.common["database-url"], fs.common["statement-mode"] = true, true
}

// resolve validates the flags after parsing; fs tells where the URL came from.
func (d *dbFlags) resolve(fs *flagSet, lookup func(string) (string, bool)) error {
	switch {
	case fs.given("database-url"):
		d.source = "--database-url"
	case nonEmpty(lookup, "PGWORKER_DATABASE_URL"):
		d.source = "PGWORKER_DATABASE_URL"
	case nonEmpty(lookup, "DATABASE_URL"):
		d.source = "DATABASE_URL"
	}
	if d.statementMode != "" {
		if _, ok := statementModes[d.statementMode]; !ok {
			return usagef("--statement-mode %q: use prepared, describe, exec or simple", d.statementMode)
		}
	}
	if d.url == "" {
		return usagef("missing database URL (set --database-url or PGWORKER_DATABASE_URL)")
	}
	return nil
}

func nonEmpty(lookup func(string) (string, bool), name string) bool {
	v, ok := lookup(name)
	return ok && v != ""
}

// hint says where to fix the URL.
func (d *dbFlags) hint() string {
	if d.source == "DATABASE_URL" {
		return "check DATABASE_URL, or set --database-url or PGWORKER_DATABASE_URL"
	}
	return "check --database-url or PGWORKER_DATABASE_URL"
}

// poolConfig parses the URL and applies the statement mode and the default
// connect timeout.
func (d *dbFlags) poolConfig() (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "`: "); i >= 0 {
			msg = msg[i+3:] // pgx quotes the (redacted) string; we show our own
		}
		return nil, &dbError{msg: fmt.Sprintf("invalid database URL %s: %s (%s)", RedactURL(d.url), scrub(msg, d.url), d.hint()), err: err}
	}
	if mode, ok := statementModes[d.statementMode]; ok {
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	return cfg, nil
}

// connect opens a pool and makes sure the database answers, so that a wrong
// URL is one clear line rather than a failure deep inside a command. Each
// tune, if any, adjusts the pool's configuration first.
func (d *dbFlags) connect(ctx context.Context, maxConns int32, tune ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := d.poolConfig()
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	for _, f := range tune {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, d.connectError(ctx, err, cfg.ConnConfig.ConnectTimeout)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout+5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, d.connectError(ctx, err, cfg.ConnConfig.ConnectTimeout)
	}
	return pool, nil
}

// dbError is an error about the database connection whose message is
// already one complete, redacted line.
type dbError struct {
	msg string
	err error
}

func (e *dbError) Error() string { return e.msg }
func (e *dbError) Unwrap() error { return e.err }

func (d *dbFlags) connectError(ctx context.Context, err error, timeout time.Duration) error {
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted while connecting to the database: %w", ctx.Err())
	}
	verb := "cannot reach"
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		verb = "cannot connect to"
	}
	msg := fmt.Sprintf("%s the database at %s: %s (%s)", verb, RedactURL(d.url), connectCause(err, timeout), d.hint())
	return &dbError{msg: scrub(msg, d.url), err: err}
}

// connectCause says in a few words why a connection failed.
func connectCause(err error, timeout time.Duration) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(err, syscall.ENOENT):
		return "no server socket at that path"
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return "unknown host " + dnsErr.Name
		}
		return "cannot resolve host " + dnsErr.Name + ": " + dnsErr.Err
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return fmt.Sprintf("no answer within %s", timeout)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "failed to connect to `") {
		if i := strings.Index(msg, "`:"); i >= 0 {
			msg = msg[i+2:]
		}
	}
	return strings.Join(strings.Fields(msg), " ")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
