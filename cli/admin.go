package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgworker/pgworker/queue"
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
	inv := e.invocation(retryCommand)
	var (
		queueName string
		failed    bool
	)
	inv.fs.BoolVar(&failed, "failed", false, "retry every failed row (of --queue)")
	inv.fs.StringVar(&queueName, "queue", "", "only rows of this `QUEUE`")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	ids, err := parseIDs(inv.fs.Args())
	if err != nil {
		return err
	}
	switch {
	case failed && len(ids) > 0:
		return usagef("give --failed or row ids, not both")
	case !failed && len(ids) == 0:
		return usagef("say which rows: --failed, or their ids (see 'pgworker retry --help')")
	}
	if inv.fs.given("queue") {
		if err := checkQueueFlag(queueName, "leave --queue out to retry in every queue"); err != nil {
			return err
		}
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	opts := &queue.RetryOpts{Queue: queueName}
	var n int64
	if failed {
		n, err = q.RetryFailed(ctx, opts)
	} else {
		n, err = q.Retry(ctx, ids, opts)
	}
	if err != nil {
		return explain(err)
	}
	fmt.Fprintf(e.stdout, "requeued %d %s\n", n, plural(n, "row", "rows"))
	if !failed && n < int64(len(ids)) {
		fmt.Fprintf(e.stdout, "%d of the %d rows given were not failed, cancelled or done%s, and were left alone\n",
			int64(len(ids))-n, len(ids), inQueue(queueName))
	}
	return nil
}

// checkQueueFlag refuses an empty or overlong --queue; instead says what
// to do for every queue.
func checkQueueFlag(name, instead string) error {
	if name == "" {
		return usagef("--queue is empty: give a queue name (%s)", instead)
	}
	if err := queue.CheckQueue(name); err != nil {
		return usagef("--queue: %v", err)
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
	inv := e.invocation(cancelCommand)
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	ids, err := parseIDs(inv.fs.Args())
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("give the ids of the rows to cancel (see 'pgworker cancel --help')")
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	n, err := q.Cancel(ctx, ids)
	if err != nil {
		return explain(err)
	}
	fmt.Fprintf(e.stdout, "cancelled %d %s\n", n, plural(n, "row", "rows"))
	if n < int64(len(ids)) {
		fmt.Fprintf(e.stdout, "%d of the %d rows given were not pending or running (or do not exist), and were left alone\n",
			int64(len(ids))-n, len(ids))
	}
	return nil
}

func (c *CLI) pause(ctx context.Context, e *env, args []string) error {
	q, name, done, err := queueCommand(ctx, e, args, pauseCommand)
	if q == nil {
		return err
	}
	defer done()
	known, err := q.Pause(ctx, name)
	if err != nil {
		return explain(err)
	}
	if known {
		fmt.Fprintf(e.stdout, "paused queue %q: workers take no new rows from it; running rows go on\n", name)
	} else {
		fmt.Fprintf(e.stdout, "paused queue %q, a new queue: rows enqueued to it will wait until it is resumed\n", name)
	}
	return nil
}

func (c *CLI) resume(ctx context.Context, e *env, args []string) error {
	q, name, done, err := queueCommand(ctx, e, args, resumeCommand)
	if q == nil {
		return err
	}
	defer done()
	if err := q.Resume(ctx, name); err != nil {
		if errors.Is(err, queue.ErrNoQueue) {
			return fmt.Errorf("no queue named %q (pgworker status lists the queues)", name)
		}
		return explain(err)
	}
	fmt.Fprintf(e.stdout, "resumed queue %q\n", name)
	return nil
}

// queueCommand parses the flags and the one QUEUE argument of pause and
// resume, and connects. A nil q (with a nil err after --help) means there
// is nothing more to do.
func queueCommand(ctx context.Context, e *env, args []string, cmd *command) (q *queue.Client, name string, done func(), err error) {
	inv := e.invocation(cmd)
	if help, err := inv.parse(args); help || err != nil {
		return nil, "", nil, err
	}
	if inv.fs.NArg() != 1 {
		return nil, "", nil, usagef("give exactly one queue name (see 'pgworker %s --help')", cmd.name)
	}
	name = inv.fs.Arg(0)
	if name == "" {
		return nil, "", nil, usagef("the queue name is empty: give the name of one queue (pgworker status lists them)")
	}
	if err := queue.CheckQueue(name); err != nil {
		return nil, "", nil, usagef("%v", err)
	}
	q, done, err = inv.client(ctx)
	return q, name, done, err
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
