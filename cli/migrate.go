package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgworker/pgworker/migrations"
)

var migrateCommand = &command{
	name:    "migrate",
	args:    "up|down|status [flags]",
	summary: "create, upgrade or roll back the files schema",
	help: `
Applies the migrations built into pgworker (the same files as migrations/, which
the goose CLI can run too) to the database. Run it against the primary, not
through a transaction-pooling PgBouncer: it holds an advisory lock for the
session so that nodes migrating at once apply each migration once.

  up      apply every pending migration (--to V: only up to version V)
  down    roll back the last applied migration (--to V: every one above V;
          --to 0 removes the schema and everything in it)
  status  list the migrations and when each was applied`,
	examples: `
pgworker migrate up --database-url postgres://admin@db-primary:5432/queue   # password in ~/.pgpass
pgworker migrate status
pgworker migrate down
pgworker migrate down --to 0`,
}

var migrateSubcommands = map[string]*command{
	"up": {
		name: "migrate up", args: "[flags]",
		help:     "Applies every pending migration, or those up to --to.",
		examples: "pgworker migrate up\npgworker migrate up --to 2",
	},
	"down": {
		name: "migrate down", args: "[flags]",
		help: `
Rolls back the last applied migration, or with --to V every migration above
version V. --to 0 drops the files schema with all its rows.`,
		examples: "pgworker migrate down\npgworker migrate down --to 0",
	},
	"status": {
		name: "migrate status", args: "[flags]",
		help:     "Lists the migrations, whether each is applied, and when.",
		examples: "pgworker migrate status",
	},
}

func (c *CLI) migrate(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("say up, down or status (see 'pgworker migrate --help')")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		e.invocation(migrateCommand).fs.printHelp(e.stdout)
		return nil
	}
	sub, ok := migrateSubcommands[args[0]]
	if !ok {
		return usagef("unknown migrate command %q: say up, down or status", args[0])
	}
	inv := e.invocation(sub)
	var to int64 = -1
	if args[0] != "status" {
		inv.fs.Int64Var(&to, "to", -1, "target `version`: up applies up to it, down rolls back everything above it")
	}
	if help, err := inv.parse(args[1:]); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	if err := inv.resolve(); err != nil {
		return err
	}
	if inv.fs.given("to") && (to < 0 || args[0] == "up" && to < 1) {
		return usagef("--to %d: give a version number (migrate status lists them)", to)
	}
	p, done, err := openMigrations(ctx, inv)
	if err != nil {
		return err
	}
	defer done()
	switch args[0] {
	case "up":
		return migrateUp(ctx, e, p, to)
	case "down":
		return migrateDown(ctx, e, p, to)
	}
	return migrateStatus(ctx, e, p)
}

// openMigrations connects through database/sql, as goose needs, and
// returns the migrations built into pgworker, applied under a session
// lock; done closes the connection.
func openMigrations(ctx context.Context, inv *invocation) (p *goose.Provider, done func(), err error) {
	cfg, err := inv.db.poolConfig()
	if err != nil {
		return nil, nil, err
	}
	sqlDB := stdlib.OpenDB(*cfg.ConnConfig)
	pctx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout+5*time.Second)
	err = sqlDB.PingContext(pctx)
	cancel()
	if err != nil {
		sqlDB.Close()
		return nil, nil, inv.db.connectError(ctx, err, cfg.ConnConfig.ConnectTimeout)
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		sqlDB.Close()
		return nil, nil, fmt.Errorf("migration lock: %w", err)
	}
	logger := inv.logger()
	p, err = migrations.NewProvider(sqlDB, goose.WithSessionLocker(locker),
		goose.WithSlog(logger), goose.WithVerbose(logger.Enabled(ctx, slog.LevelDebug)))
	if err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	return p, func() { sqlDB.Close() }, nil
}

func migrateUp(ctx context.Context, e *env, p *goose.Provider, to int64) error {
	var res []*goose.MigrationResult
	var err error
	if to > 0 {
		res, err = p.UpTo(ctx, to)
	} else {
		res, err = p.Up(ctx)
	}
	printResults(e, "applied", res, err)
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if len(res) == 0 {
		v, _ := p.GetDBVersion(ctx)
		fmt.Fprintf(e.stdout, "already up to date (version %d)\n", v)
	}
	return nil
}

func migrateDown(ctx context.Context, e *env, p *goose.Provider, to int64) error {
	var res []*goose.MigrationResult
	var err error
	if to >= 0 {
		res, err = p.DownTo(ctx, to)
	} else {
		var r *goose.MigrationResult
		r, err = p.Down(ctx)
		if r != nil {
			res = append(res, r)
		}
		if errors.Is(err, goose.ErrNoNextVersion) {
			err = nil
		}
	}
	printResults(e, "rolled back", res, err)
	if err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	if len(res) == 0 {
		fmt.Fprintln(e.stdout, "nothing to roll back")
	}
	return nil
}

func migrateStatus(ctx context.Context, e *env, p *goose.Provider) error {
	st, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate status: %w", err)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tSTATE\tAPPLIED AT")
	for _, s := range st {
		applied := "-"
		if s.State == goose.StateApplied {
			applied = s.AppliedAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, path.Base(s.Source.Path), s.State, applied)
	}
	return tw.Flush()
}

// printResults prints the migrations that ran, including those applied
// before a failure.
func printResults(e *env, verb string, res []*goose.MigrationResult, err error) {
	var pe *goose.PartialError
	if errors.As(err, &pe) {
		res = pe.Applied
	}
	for _, r := range res {
		fmt.Fprintf(e.stdout, "%s %s (%s)\n", verb, path.Base(r.Source.Path), r.Duration.Round(time.Millisecond))
	}
}
