package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pgworker/pgworker/internal/human"
	"github.com/pgworker/pgworker/queue"
)

var pruneCommand = &command{
	name:    "prune",
	args:    "[flags]",
	summary: "delete finished rows past their retention",
	help: `
Deletes what its retention no longer keeps (files.prune): done and cancelled
rows without a batch older than their queue's keep-done (default 7d), failed
ones older than its keep-failed (default 30d), the rows of a finished batch
(and the batch) once its keep has passed, and worker slots stopped for a week.
A row's attempts go with it. It never deletes a pending or running row, nor a
row of a batch that has not finished: a batch is kept until its keep is set
(pgworker retention --batch, or prune --batch here).

Every pgworker run prunes by itself (--prune-interval), one node at a time;
this command does it now, waiting for a prune in progress elsewhere to end.
It deletes in transactions of --max-rows rows, so that claims and outcomes
never wait for it. --batch NAME lets a finished batch go now: it sets the
batch's keep to zero, then prunes; an unfinished one goes when it finishes.`,
	examples: `
pgworker prune --dry-run
pgworker prune
pgworker prune --batch nightly-2026-11-30`,
}

var retentionCommand = &command{
	name:    "retention",
	args:    "[flags]",
	summary: "show or set how long finished rows are kept",
	help: `
Without flags, lists how long each queue keeps its finished rows that belong
to no batch (done and cancelled: keep-done; failed: keep-failed) and how long
each batch is kept after it finished.

--queue Q with --done and/or --failed sets a queue's retention
(files.keep_queue); --batch NAME with --keep sets a batch's
(files.keep_batch). A DURATION is 90m, 36h, 7d, 1d12h, or "forever". A new
queue keeps done rows 7d and failed ones 30d; a batch is kept, whatever its
queue says, until its keep is set, so that pgworker results can read it.`,
	examples: `
pgworker retention
pgworker retention --queue thumbs --done 2d --failed 14d
pgworker retention --queue audit --done forever --failed forever
pgworker retention --batch nightly-2026-11-30 --keep 30d`,
}

func (c *CLI) prune(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(pruneCommand)
	var (
		dryRun, asJSON bool
		batch          string
		maxRows        int
	)
	inv.fs.BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	inv.fs.StringVar(&batch, "batch", "", "let the finished `BATCH` and its rows go now (sets its keep to 0)")
	inv.fs.IntVar(&maxRows, "max-rows", queue.DefaultPruneRows, "rows deleted per transaction")
	inv.fs.BoolVar(&asJSON, "json", false, "print what was deleted as JSON")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	if maxRows < 1 || maxRows > 100000 {
		return usagef("--max-rows must be between 1 and 100000")
	}
	if inv.fs.given("batch") {
		if dryRun {
			return usagef("--batch changes the batch's retention: leave out --dry-run (a dry run without --batch shows what a prune deletes)")
		}
		if err := checkBatchFlag(batch); err != nil {
			return err
		}
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	if batch != "" {
		zero := time.Duration(0)
		finished, total, err := keepBatch(ctx, q, batch, &zero)
		if err != nil {
			return err
		}
		if !finished {
			fmt.Fprintf(e.stdout, "batch %q has not finished: it and its %s %s will be deleted by the first prune after it does\n",
				printable(batch), human.Int(total), plural(total, "row", "rows"))
			return nil
		}
	}
	lines, err := q.Prune(ctx, &queue.PruneOpts{MaxRows: maxRows, DryRun: dryRun, Wait: true})
	if err != nil {
		return explain(err)
	}
	if asJSON {
		if lines == nil {
			lines = []queue.Pruned{}
		}
		return writeJSON(e.stdout, lines)
	}
	return printPruned(e.stdout, lines, dryRun)
}

func printPruned(w io.Writer, lines []queue.Pruned, dryRun bool) error {
	var rows, slots int64
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(lines) > 0 {
		fmt.Fprintln(tw, "QUEUE\tBATCH\tSTATE\tROWS")
	}
	for _, l := range lines {
		name := printable(l.Queue)
		if l.Slots {
			name, slots = "(worker slots)", slots+l.Rows
		} else {
			rows += l.Rows
		}
		batch := "-"
		if l.Batch != "" {
			batch = printable(l.Batch)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, batch, l.State, human.Int(l.Rows))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verb := "deleted"
	if dryRun {
		verb = "would delete"
	}
	_, err := fmt.Fprintf(w, "%s %s finished %s and %s worker %s\n", verb,
		human.Int(rows), plural(rows, "row", "rows"), human.Int(slots), plural(slots, "slot", "slots"))
	return err
}

// keepFlag is a retention on the command line: a duration (with days) or
// "forever".
type keepFlag struct {
	d   *time.Duration
	set bool
}

func (k *keepFlag) String() string {
	switch {
	case !k.set:
		return ""
	case k.d == nil:
		return "forever"
	}
	return human.Duration(*k.d)
}

func (k *keepFlag) Set(s string) error {
	k.set = true
	if s == "forever" {
		k.d = nil
		return nil
	}
	d, err := human.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("a retention cannot be negative")
	}
	k.d = &d
	return nil
}

func keepText(d *time.Duration) string {
	if d == nil {
		return "forever"
	}
	return human.Duration(*d)
}

func (c *CLI) retention(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(retentionCommand)
	var (
		queueName, batch     string
		keepDone, keepFailed keepFlag
		keep                 keepFlag
		asJSON               bool
	)
	inv.fs.StringVar(&queueName, "queue", "", "set the retention of `QUEUE`")
	inv.fs.Var(&keepDone, "done", "with --queue: how long done and cancelled rows are kept (`DURATION` or forever)")
	inv.fs.Var(&keepFailed, "failed", "with --queue: how long failed rows are kept (`DURATION` or forever)")
	inv.fs.StringVar(&batch, "batch", "", "set the retention of `BATCH`")
	inv.fs.Var(&keep, "keep", "with --batch: how long the batch is kept after it finished (`DURATION` or forever)")
	inv.fs.BoolVar(&asJSON, "json", false, "print the list as JSON")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	setQueue, setBatch := inv.fs.given("queue"), inv.fs.given("batch")
	switch {
	case setQueue && setBatch:
		return usagef("give --queue or --batch, not both")
	case (keepDone.set || keepFailed.set) && !setQueue:
		return usagef("--done and --failed set a queue's retention: name it with --queue")
	case keep.set && !setBatch:
		return usagef("--keep sets a batch's retention: name it with --batch")
	case setQueue && !keepDone.set && !keepFailed.set:
		return usagef("say what queue %q keeps: --done DURATION and/or --failed DURATION", queueName)
	case setBatch && !keep.set:
		return usagef("say how long batch %q is kept after it finished: --keep DURATION (or forever)", batch)
	}
	if setQueue {
		if err := checkQueueFlag(queueName, "name the queue whose retention to set"); err != nil {
			return err
		}
	}
	if setBatch {
		if err := checkBatchFlag(batch); err != nil {
			return err
		}
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()

	list, err := q.Retentions(ctx)
	if err != nil {
		return explain(err)
	}
	switch {
	case setQueue:
		// What is not given stays as it is; a new queue starts from the defaults.
		week, month := 7*24*time.Hour, 30*24*time.Hour
		cur := queue.Retention{Queue: queueName, Done: &week, Failed: &month}
		for _, r := range list {
			if r.Queue == queueName {
				cur = r
			}
		}
		if keepDone.set {
			cur.Done = keepDone.d
		}
		if keepFailed.set {
			cur.Failed = keepFailed.d
		}
		if err := q.KeepQueue(ctx, queueName, cur.Done, cur.Failed); err != nil {
			return explain(err)
		}
		fmt.Fprintf(e.stdout, "queue %q keeps done and cancelled rows %s and failed rows %s after they finished (rows of a batch: as their batch)\n",
			printable(queueName), keepText(cur.Done), keepText(cur.Failed))
		return nil
	case setBatch:
		finished, _, err := keepBatch(ctx, q, batch, keep.d)
		if err != nil {
			return err
		}
		when := "after it finishes"
		if finished {
			when = "after it finished"
		}
		fmt.Fprintf(e.stdout, "batch %q and its rows are kept %s %s\n", printable(batch), keepText(keep.d), when)
		return nil
	}
	if asJSON {
		if list == nil {
			list = []queue.Retention{}
		}
		return writeJSON(e.stdout, list)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tKEEP DONE\tKEEP FAILED")
	var batches []queue.Retention
	for _, r := range list {
		if r.Batch != "" {
			batches = append(batches, r)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", printable(r.Queue), keepText(r.Done), keepText(r.Failed))
	}
	if len(batches) > 0 {
		fmt.Fprintln(tw, "\nBATCH\tKEEP\tFINISHED")
		for _, r := range batches {
			keep := keepText(r.Keep)
			if r.Keep == nil {
				keep = "until set"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", printable(r.Batch), keep, yesNo(r.Finished))
		}
	}
	return tw.Flush()
}

// keepBatch sets a batch's retention, with the command line's errors.
func keepBatch(ctx context.Context, q *queue.Client, batch string, keep *time.Duration) (finished bool, total int64, err error) {
	finished, total, err = q.KeepBatch(ctx, batch, keep)
	if errors.Is(err, queue.ErrNoBatch) {
		return false, 0, fmt.Errorf("no batch named %q (pgworker status lists the batches)", batch)
	}
	if err != nil {
		return false, 0, explain(err)
	}
	return finished, total, nil
}
