package cli

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/queue"
)

// invocation is one run of a command that uses the database: its flags,
// among them the common ones (database and logging), and the streams it
// runs with. A command adds its own flags to fs, then calls parse, checks
// its own flags, and connects last, so that every mistake in the command
// line is reported before the database is tried.
type invocation struct {
	*env
	fs   *flagSet
	db   dbFlags
	logs logFlags

	log      *slog.Logger
	resolved bool
}

// invocation returns cmd's invocation with the common flags.
func (e *env) invocation(cmd *command) *invocation {
	inv := &invocation{env: e, fs: newFlagSet(cmd)}
	inv.db.add(inv.fs)
	inv.logs.add(inv.fs)
	return inv
}

// parse parses args and checks the logging flags; help is true when --help
// was asked for and printed.
func (inv *invocation) parse(args []string) (help bool, err error) {
	if help, err := inv.parseFlags(inv.fs, args); help || err != nil {
		return help, err
	}
	return false, inv.logs.validate()
}

// noArgs refuses arguments after the flags.
func (inv *invocation) noArgs() error {
	if inv.fs.NArg() > 0 {
		return usagef("unexpected argument %q (see 'pgworker %s --help')", inv.fs.Arg(0), inv.fs.cmd.name)
	}
	return nil
}

// logger returns the logger the logging flags ask for, writing to stderr.
func (inv *invocation) logger() *slog.Logger {
	if inv.log == nil {
		inv.log = inv.logs.logger(inv.stderr, inv.lookup)
	}
	return inv.log
}

// resolve checks the database flags, and warns when a password was given
// on the command line.
func (inv *invocation) resolve() error {
	if inv.resolved {
		return nil
	}
	if err := inv.db.resolve(inv.fs, inv.lookup); err != nil {
		return err
	}
	inv.resolved = true
	warnPasswordsInArgs(inv.fs, inv.logger())
	return nil
}

// connect resolves the database flags and opens a pool of at most maxConns
// connections on a database that answers, each tune adjusting its
// configuration.
func (inv *invocation) connect(ctx context.Context, maxConns int32, tune ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if err := inv.resolve(); err != nil {
		return nil, err
	}
	return inv.db.connect(ctx, maxConns, tune...)
}

// client connects and returns the queue API on one connection; done closes
// it.
func (inv *invocation) client(ctx context.Context) (q *queue.Client, done func(), err error) {
	pool, err := inv.connect(ctx, 1)
	if err != nil {
		return nil, nil, err
	}
	return queue.New(pool, &queue.Config{Logger: inv.logger()}), pool.Close, nil
}

// warnPasswordsInArgs warns, without printing it, about a password in a
// connection URL given as a flag: every user of the machine can read a
// process's arguments (ps, /proc/PID/cmdline).
func warnPasswordsInArgs(fs *flagSet, logger *slog.Logger) {
	for _, name := range []string{"database-url", "listen-url"} {
		fl := fs.Lookup(name)
		if fl == nil || !fs.given(name) || !hasPassword(fl.Value.String()) {
			continue
		}
		logger.Warn("--"+name+" holds a password, which every user of this machine can read in the process list; "+
			"set it in the environment (PGWORKER_DATABASE_URL, PGWORKER_LISTEN_URL) or keep it in a password file "+
			"(~/.pgpass, PGPASSFILE, or passfile= in the URL) instead",
			"flag", "--"+name)
	}
}
