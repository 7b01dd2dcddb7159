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

var queueSetCommand = &command{
	name:    "queue",
	args:    "set [flags] QUEUE",
	summary: "set a queue's fleet-wide cap on running rows and its fair share",
	help: `
Changes the settings of one queue (created if it does not exist yet):

  --max-running N     at most N rows of the queue run at once across the whole
                      fleet, however many workers claim at the same moment
                      (files.set_max_running); 0 lets none start; none lifts
                      the cap. Rows running above a lowered cap go on.
  --fair-share on     claims take the queue's rows of equal priority from its
                      batches in turn, the batch with the fewest running rows
                      first, so that a small batch enqueued while a large one
                      drains is done early; off restores id order
                      (files.set_fair_share).

It needs an admin login (pgworker_admin). pgworker status shows both.`,
	examples: `
pgworker queue set --max-running 8 licensed
pgworker queue set --max-running none licensed
pgworker queue set --fair-share on scans`,
}

func (c *CLI) queueSet(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("say set (see 'pgworker queue --help')")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		e.invocation(queueSetCommand).fs.printHelp(e.stdout)
		return nil
	case "set":
	default:
		return usagef("unknown queue command %q: say set (see 'pgworker queue --help')", args[0])
	}
	inv := e.invocation(queueSetCommand)
	args = args[1:]
	var maxRunning, fairShare string
	inv.fs.StringVar(&maxRunning, "max-running", "", "fleet-wide cap on the queue's running rows: `N` (0 or more), or none")
	inv.fs.StringVar(&fairShare, "fair-share", "", "`on` or off: the queue's batches take turns")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if inv.fs.NArg() != 1 {
		return usagef("give exactly one queue name after the flags (see 'pgworker queue --help')")
	}
	name := inv.fs.Arg(0)
	if err := queue.CheckQueue(name); err != nil {
		return usagef("%v", err)
	}
	if !inv.fs.given("max-running") && !inv.fs.given("fair-share") {
		return usagef("say what to set: --max-running N|none, --fair-share on|off")
	}
	limit := -1 // none
	if inv.fs.given("max-running") && maxRunning != "none" {
		n, err := strconv.Atoi(maxRunning)
		if err != nil || n < 0 {
			return usagef("--max-running %q: give a number of rows (0 or more), or none to lift the cap", maxRunning)
		}
		limit = n
	}
	var fair bool
	switch fairShare {
	case "on":
		fair = true
	case "off", "":
	default:
		return usagef("--fair-share %q: say on or off", fairShare)
	}

	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	if inv.fs.given("max-running") {
		if limit < 0 {
			err = q.ClearMaxRunning(ctx, name)
		} else {
			err = q.SetMaxRunning(ctx, name, limit)
		}
		if err != nil {
			return explain(err)
		}
		if limit < 0 {
			fmt.Fprintf(e.stdout, "queue %q: no cap on running rows\n", name)
		} else {
			fmt.Fprintf(e.stdout, "queue %q: at most %d running %s across the fleet\n", name, limit, plural(int64(limit), "row", "rows"))
		}
	}
	if inv.fs.given("fair-share") {
		if err := q.SetFairShare(ctx, name, fair); err != nil {
			return explain(err)
		}
		if fair {
			fmt.Fprintf(e.stdout, "queue %q: its batches take turns\n", name)
		} else {
			fmt.Fprintf(e.stdout, "queue %q: rows in priority, then id order, whatever their batch\n", name)
		}
	}
	return nil
}
