package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pgworker/pgworker/queue"
)

var scaleHintCommand = &command{
	name:    "scale-hint",
	args:    "[flags]",
	summary: "how many worker nodes the backlog needs (for an autoscaler)",
	help: `
Prints the scaling hint (files.scaling_hint): for each queue and for the whole
fleet, the outstanding rows (pending and running), the mean time of the recent
attempts (claim to outcome), the live nodes and their slots, and

  needed_nodes  = ceil((pending + running) x mean attempt time
                       / target drain time / slots per node)
  desired_nodes = needed_nodes within [min, max]

that is, the nodes that would finish the outstanding rows within the target
drain time. Paused queues' pending rows need no node. Without a recent
attempt to measure, the hint keeps the nodes there are (at least one while
rows are outstanding) rather than guess.

For a target-tracking policy, publish backlog_per_instance ((pending +
running) / nodes) as the custom metric, with target_backlog_per_instance
(target drain / mean attempt time x slots per node) as its target value.

The target drain time, min and max come from the table
files.scaling_settings (UPDATE it to change them for everyone); the flags
override them for this command only.

With --json it prints one JSON object (see ScaleHint in the queue package):

  {"generated_at": time, "target_drain_seconds", "min_nodes", "max_nodes",
   "fleet": LINE, "queues": [LINE]}

where a LINE has "queue" (null for the fleet), "paused", "pending",
"scheduled", "running", "oldest_pending_seconds", "recent_attempts",
"mean_attempt_seconds", "nodes", "slots", "slots_per_node", "needed_nodes",
"desired_nodes", "backlog_per_instance" and "target_backlog_per_instance";
unknown values are null.`,
	examples: `
pgworker scale-hint
pgworker scale-hint --target-drain 30m --min 1 --max 40
pgworker scale-hint --json | jq .fleet.desired_nodes`,
}

func (c *CLI) scaleHint(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(scaleHintCommand)
	var (
		asJSON             bool
		targetDrain        time.Duration
		minNodes, maxNodes int
	)
	inv.fs.BoolVar(&asJSON, "json", false, "print JSON (fields documented above) instead of a table")
	inv.fs.DurationVar(&targetDrain, "target-drain", 0, "finish the outstanding rows within this `DURATION` (default: files.scaling_settings)")
	inv.fs.IntVar(&minNodes, "min", 0, "ask for at least `N` nodes (default: files.scaling_settings)")
	inv.fs.IntVar(&maxNodes, "max", 0, "ask for at most `N` nodes (default: files.scaling_settings)")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	opts, err := scaleHintOpts(inv.fs, targetDrain, minNodes, maxNodes)
	if err != nil {
		return err
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	hint, err := q.ScaleHint(ctx, opts)
	if err != nil {
		return explain(err)
	}
	if asJSON {
		return writeJSON(e.stdout, hint)
	}
	return printScaleHint(e.stdout, hint)
}

// scaleHintOpts checks the overrides of files.scaling_settings given on the
// command line.
func scaleHintOpts(fs *flagSet, targetDrain time.Duration, minNodes, maxNodes int) (*queue.ScaleHintOpts, error) {
	opts := &queue.ScaleHintOpts{}
	if fs.given("target-drain") {
		if targetDrain <= 0 {
			return nil, usagef("--target-drain must be positive, e.g. 15m")
		}
		opts.TargetDrain = targetDrain
	}
	if fs.given("min") {
		if minNodes < 0 {
			return nil, usagef("--min must not be negative")
		}
		opts.MinNodes = &minNodes
	}
	if fs.given("max") {
		if maxNodes < 0 {
			return nil, usagef("--max must not be negative")
		}
		if fs.given("min") && maxNodes < minNodes {
			return nil, usagef("--max (%d) must not be below --min (%d)", maxNodes, minNodes)
		}
		opts.MaxNodes = &maxNodes
	}
	return opts, nil
}

func printScaleHint(w io.Writer, h *queue.ScaleHint) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPENDING\tRUNNING\tOLDEST PENDING\tMEAN ATTEMPT\tNODES\tSLOTS/NODE\tNEEDED\tDESIRED\tBACKLOG/INSTANCE\tTARGET")
	line := func(name string, l queue.ScaleHintLine) {
		pending := strconv.FormatInt(l.Pending, 10)
		if l.Scheduled > 0 {
			pending += fmt.Sprintf(" (%d retrying)", l.Scheduled)
		}
		target := "-"
		if l.TargetBacklogPerInstance != nil {
			target = strconv.FormatFloat(*l.TargetBacklogPerInstance, 'f', -1, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", name, pending, l.Running,
			secondsText(l.OldestPendingSeconds), secondsText(l.MeanAttemptSeconds), l.Nodes,
			strconv.FormatFloat(l.SlotsPerNode, 'f', -1, 64), l.NeededNodes, l.DesiredNodes,
			strconv.FormatFloat(l.BacklogPerInstance, 'f', -1, 64), target)
	}
	for _, q := range h.Queues {
		name := printable(*q.Queue)
		if q.Paused != nil && *q.Paused {
			name += " (paused)"
		}
		line(name, q)
	}
	line("all queues", h.Fleet)
	if err := tw.Flush(); err != nil {
		return err
	}
	drain := h.TargetDrainSeconds
	fmt.Fprintf(w, "\nDesired nodes: %d (target drain %s, between %d and %d nodes).\n",
		h.Fleet.DesiredNodes, secondsText(&drain), h.MinNodes, h.MaxNodes)
	if h.Fleet.MeanAttemptSeconds == nil && h.Fleet.Pending+h.Fleet.Running > 0 {
		fmt.Fprintln(w, "No attempt ended within the sample window yet: the hint keeps the nodes there are (at least one) until one does.")
	}
	return nil
}
