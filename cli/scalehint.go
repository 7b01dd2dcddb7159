package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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

With --json it prints one JSON object:

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

// ScaleHint is what `pgworker scale-hint --json` prints.
type ScaleHint struct {
	GeneratedAt        time.Time       `json:"generated_at"`
	TargetDrainSeconds float64         `json:"target_drain_seconds"`
	MinNodes           int             `json:"min_nodes"`
	MaxNodes           int             `json:"max_nodes"`
	Fleet              ScaleHintLine   `json:"fleet"`
	Queues             []ScaleHintLine `json:"queues"`
}

// ScaleHintLine is one line of files.scaling_hint: a queue, or the fleet
// (Queue nil).
type ScaleHintLine struct {
	Queue                    *string  `json:"queue"`
	Paused                   *bool    `json:"paused"`
	Pending                  int64    `json:"pending"`
	Scheduled                int64    `json:"scheduled"`
	Running                  int64    `json:"running"`
	OldestPendingSeconds     *float64 `json:"oldest_pending_seconds"`
	RecentAttempts           int64    `json:"recent_attempts"`
	MeanAttemptSeconds       *float64 `json:"mean_attempt_seconds"`
	Nodes                    int      `json:"nodes"`
	Slots                    int      `json:"slots"`
	SlotsPerNode             float64  `json:"slots_per_node"`
	NeededNodes              int      `json:"needed_nodes"`
	DesiredNodes             int      `json:"desired_nodes"`
	BacklogPerInstance       float64  `json:"backlog_per_instance"`
	TargetBacklogPerInstance *float64 `json:"target_backlog_per_instance"`
}

const (
	// The settings in force: the table's, with the command's overrides ($1-$3, NULL: none).
	sqlScalingSettings = `
SELECT coalesce($1::interval, target_drain), coalesce($2::integer, min_nodes),
       greatest(coalesce($3::integer, max_nodes), coalesce($2::integer, min_nodes))
FROM files.scaling_settings`

	sqlScalingHint = `
SELECT queue, paused, pending, scheduled, running, oldest_pending_age, recent_attempts, mean_attempt_time,
       nodes, slots, slots_per_node::float8, needed_nodes, desired_nodes, backlog_per_instance::float8,
       target_backlog_per_instance::float8
FROM files.scaling_hint($1::interval, $2::integer, $3::integer)`
)

func (c *CLI) scaleHint(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(scaleHintCommand)
	var (
		db          dbFlags
		logs        logFlags
		asJSON      bool
		targetDrain time.Duration
		minNodes    int
		maxNodes    int
	)
	db.add(fs)
	logs.add(fs)
	fs.BoolVar(&asJSON, "json", false, "print JSON (fields documented above) instead of a table")
	fs.DurationVar(&targetDrain, "target-drain", 0, "finish the outstanding rows within this `DURATION` (default: files.scaling_settings)")
	fs.IntVar(&minNodes, "min", 0, "ask for at least `N` nodes (default: files.scaling_settings)")
	fs.IntVar(&maxNodes, "max", 0, "ask for at most `N` nodes (default: files.scaling_settings)")
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (see 'pgworker scale-hint --help')", fs.Arg(0))
	}
	var drainArg *pgtype.Interval
	var minArg, maxArg *int32
	if fs.given("target-drain") {
		if targetDrain <= 0 {
			return usagef("--target-drain must be positive, e.g. 15m")
		}
		drainArg = &pgtype.Interval{Microseconds: targetDrain.Microseconds(), Valid: true}
	}
	if fs.given("min") {
		if minNodes < 0 {
			return usagef("--min must not be negative")
		}
		n := int32(minNodes)
		minArg = &n
	}
	if fs.given("max") {
		if maxNodes < 0 {
			return usagef("--max must not be negative")
		}
		if fs.given("min") && maxNodes < minNodes {
			return usagef("--max (%d) must not be below --min (%d)", maxNodes, minNodes)
		}
		n := int32(maxNodes)
		maxArg = &n
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

	hint := &ScaleHint{GeneratedAt: time.Now().UTC(), Queues: []ScaleHintLine{}}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var drain pgtype.Interval
		var lo, hi int32
		if err := tx.QueryRow(ctx, sqlScalingSettings, drainArg, minArg, maxArg).Scan(&drain, &lo, &hi); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errors.New("files.scaling_settings has no row: restore it with INSERT INTO files.scaling_settings DEFAULT VALUES")
			}
			return err
		}
		if s := seconds(drain); s != nil {
			hint.TargetDrainSeconds = *s
		}
		hint.MinNodes, hint.MaxNodes = int(lo), int(hi)
		rows, err := tx.Query(ctx, sqlScalingHint, drainArg, minArg, maxArg)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				l            ScaleHintLine
				oldest, mean pgtype.Interval
				nodes, slots int32
				needed, want int32
			)
			if err := rows.Scan(&l.Queue, &l.Paused, &l.Pending, &l.Scheduled, &l.Running, &oldest, &l.RecentAttempts, &mean,
				&nodes, &slots, &l.SlotsPerNode, &needed, &want, &l.BacklogPerInstance, &l.TargetBacklogPerInstance); err != nil {
				return err
			}
			l.OldestPendingSeconds, l.MeanAttemptSeconds = seconds(oldest), seconds(mean)
			l.Nodes, l.Slots, l.NeededNodes, l.DesiredNodes = int(nodes), int(slots), int(needed), int(want)
			if l.Queue == nil {
				hint.Fleet = l
			} else {
				hint.Queues = append(hint.Queues, l)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("read the scaling hint: %w", explain(err))
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(hint)
	}
	return printScaleHint(e.stdout, hint)
}

func printScaleHint(w io.Writer, h *ScaleHint) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPENDING\tRUNNING\tOLDEST PENDING\tMEAN ATTEMPT\tNODES\tSLOTS/NODE\tNEEDED\tDESIRED\tBACKLOG/INSTANCE\tTARGET")
	line := func(name string, l ScaleHintLine) {
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
		name := *q.Queue
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
