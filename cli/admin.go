package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

var retryCommand = &command{
	name:    "retry",
	args:    "[flags] --failed | ID...",
	summary: "put failed (or given) rows back in the queue",
	help: `
Puts rows back to pending with a fresh attempt budget (files.retry): with
--failed every failed row (of --queue, if given); otherwise the rows with the
given ids that are failed, cancelled or done. Rows in another state are left
alone. Prints how many rows were requeued.`,
	examples: `
pgworker retry --failed
pgworker retry --failed --queue thumbs
pgworker retry 1042 1043`,
}

var cancelCommand = &command{
	name:    "cancel",
	args:    "[flags] ID...",
	summary: "cancel pending or running rows",
	help: `
Cancels the rows with the given ids that are pending or running (files.cancel).
The worker running a cancelled row is told to stop its program, and its late
outcome is refused. Rows already finished are left alone.`,
	examples: `
pgworker cancel 1042
pgworker cancel 1042 1043 1044`,
}

var pauseCommand = &command{
	name:    "pause",
	args:    "[flags] QUEUE",
	summary: "stop handing out rows of a queue",
	help: `
Pauses a queue (files.pause_queue): workers claim no new rows from it; rows
already running go on. Pausing a queue that does not exist yet creates it
paused, so that work enqueued later waits.`,
	examples: "pgworker pause thumbs",
}

var resumeCommand = &command{
	name:     "resume",
	args:     "[flags] QUEUE",
	summary:  "resume a paused queue",
	help:     "Resumes a paused queue (files.resume_queue) and wakes the idle workers.",
	examples: "pgworker resume thumbs",
}

func (c *CLI) retry(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(retryCommand)
	var (
		db     dbFlags
		logs   logFlags
		queue  string
		failed bool
	)
	db.add(fs)
	logs.add(fs)
	fs.BoolVar(&failed, "failed", false, "retry every failed row (of --queue)")
	fs.StringVar(&queue, "queue", "", "only rows of this `QUEUE`")
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	ids, err := parseIDs(fs.Args())
	if err != nil {
		return err
	}
	switch {
	case failed && len(ids) > 0:
		return usagef("give --failed or row ids, not both")
	case !failed && len(ids) == 0:
		return usagef("say which rows: --failed, or their ids (see 'pgworker retry --help')")
	}
	if err := logs.validate(); err != nil {
		return err
	}
	if err := db.resolve(fs, e.lookup); err != nil {
		return err
	}
	pool, err := db.connect(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()

	var idArg []int64 // NULL: every failed row
	if !failed {
		idArg = ids
	}
	var queueArg *string
	if queue != "" {
		queueArg = &queue
	}
	var n int64
	if err := pool.QueryRow(ctx, sqlRetry, idArg, queueArg).Scan(&n); err != nil {
		return fmt.Errorf("retry: %w", explain(err))
	}
	fmt.Fprintf(e.stdout, "requeued %d %s\n", n, plural(n, "row", "rows"))
	if !failed && n < int64(len(ids)) {
		fmt.Fprintf(e.stdout, "%d of the %d rows given were not failed, cancelled or done%s, and were left alone\n",
			int64(len(ids))-n, len(ids), inQueue(queue))
	}
	return nil
}

func inQueue(q string) string {
	if q == "" {
		return ""
	}
	return fmt.Sprintf(" in queue %q", q)
}

func (c *CLI) cancel(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(cancelCommand)
	var (
		db   dbFlags
		logs logFlags
	)
	db.add(fs)
	logs.add(fs)
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	ids, err := parseIDs(fs.Args())
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("give the ids of the rows to cancel (see 'pgworker cancel --help')")
	}
	if err := logs.validate(); err != nil {
		return err
	}
	if err := db.resolve(fs, e.lookup); err != nil {
		return err
	}
	pool, err := db.connect(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	var n int64
	if err := pool.QueryRow(ctx, sqlCancel, ids).Scan(&n); err != nil {
		return fmt.Errorf("cancel: %w", explain(err))
	}
	fmt.Fprintf(e.stdout, "cancelled %d %s\n", n, plural(n, "row", "rows"))
	if n < int64(len(ids)) {
		fmt.Fprintf(e.stdout, "%d of the %d rows given were not pending or running (or do not exist), and were left alone\n",
			int64(len(ids))-n, len(ids))
	}
	return nil
}

func (c *CLI) pause(ctx context.Context, e *env, args []string) error {
	return c.queueCommand(ctx, e, args, pauseCommand, func(ctx context.Context, e *env, q string, db *dbFlags) error {
		pool, err := db.connect(ctx, 1)
		if err != nil {
			return err
		}
		defer pool.Close()
		var existed bool
		if err := pool.QueryRow(ctx, sqlQueueExists, q).Scan(&existed); err != nil {
			return fmt.Errorf("pause: %w", explain(err))
		}
		if _, err := pool.Exec(ctx, sqlPause, q); err != nil {
			return fmt.Errorf("pause: %w", explain(err))
		}
		if existed {
			fmt.Fprintf(e.stdout, "paused queue %q: workers take no new rows from it; running rows go on\n", q)
		} else {
			fmt.Fprintf(e.stdout, "paused queue %q, a new queue: rows enqueued to it will wait until it is resumed\n", q)
		}
		return nil
	})
}

func (c *CLI) resume(ctx context.Context, e *env, args []string) error {
	return c.queueCommand(ctx, e, args, resumeCommand, func(ctx context.Context, e *env, q string, db *dbFlags) error {
		pool, err := db.connect(ctx, 1)
		if err != nil {
			return err
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, sqlResume, q); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "P0002" {
				return fmt.Errorf("no queue named %q (pgworker status lists the queues)", q)
			}
			return fmt.Errorf("resume: %w", explain(err))
		}
		fmt.Fprintf(e.stdout, "resumed queue %q\n", q)
		return nil
	})
}

// queueCommand parses the flags and the one QUEUE argument of pause and resume.
func (c *CLI) queueCommand(ctx context.Context, e *env, args []string, cmd *command,
	do func(ctx context.Context, e *env, queue string, db *dbFlags) error) error {
	fs := newFlagSet(cmd)
	var (
		db   dbFlags
		logs logFlags
	)
	db.add(fs)
	logs.add(fs)
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		return usagef("give exactly one queue name (see 'pgworker %s --help')", cmd.name)
	}
	if err := logs.validate(); err != nil {
		return err
	}
	if err := db.resolve(fs, e.lookup); err != nil {
		return err
	}
	return do(ctx, e, fs.Arg(0), &db)
}

// parseIDs parses row ids.
func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("%q is not a row id (a positive integer)", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
