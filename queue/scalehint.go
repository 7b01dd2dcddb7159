package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ScaleHint is the scaling hint of files.scaling_hint for the fleet and
// each queue: what `pgworker scale-hint --json` prints.
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

// ErrNoScalingSettings is a files.scaling_settings without its row.
var ErrNoScalingSettings = errors.New("files.scaling_settings has no row: restore it with INSERT INTO files.scaling_settings DEFAULT VALUES")

// ScaleHintOpts override files.scaling_settings for one hint. A nil
// ScaleHintOpts takes the table's settings.
type ScaleHintOpts struct {
	// TargetDrain is the time within which the outstanding rows should
	// finish. Defaults to the table's target_drain.
	TargetDrain time.Duration
	// MinNodes and MaxNodes bound the desired nodes. Default to the
	// table's min_nodes and max_nodes.
	MinNodes, MaxNodes *int
}

// ScaleHint reads the scaling hint (files.scaling_hint) from one snapshot.
func (c *Client) ScaleHint(ctx context.Context, opts *ScaleHintOpts) (*ScaleHint, error) {
	var drainArg *pgtype.Interval
	var minArg, maxArg *int32
	if opts != nil {
		if opts.TargetDrain < 0 {
			return nil, fmt.Errorf("target drain %s: give a positive duration", opts.TargetDrain)
		}
		if opts.TargetDrain > 0 {
			drainArg = &pgtype.Interval{Microseconds: opts.TargetDrain.Microseconds(), Valid: true}
		}
		minArg, maxArg = int32Ptr(opts.MinNodes), int32Ptr(opts.MaxNodes)
	}
	hint := &ScaleHint{GeneratedAt: time.Now().UTC(), Queues: []ScaleHintLine{}}
	err := pgx.BeginTxFunc(ctx, c.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var drain pgtype.Interval
		var lo, hi int32
		if err := tx.QueryRow(ctx, sqlScalingSettings, drainArg, minArg, maxArg).Scan(&drain, &lo, &hi); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNoScalingSettings
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
		return nil, fmt.Errorf("read the scaling hint: %w", err)
	}
	return hint, nil
}

func int32Ptr(n *int) *int32 {
	if n == nil {
		return nil
	}
	v := int32(*n)
	return &v
}
