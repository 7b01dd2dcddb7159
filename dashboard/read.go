package dashboard

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// queueView is one queue of the Overview page.
type queueView struct {
	Name                               string
	Paused                             bool
	PausedAt                           *time.Time
	Pending, Scheduled, Running        int64
	Done, Failed, Cancelled            int64
	OldestPending                      *time.Duration
	FinishedLastMinute, FinishedLastHr int64
}

// Total is every row of the queue.
func (q queueView) Total() int64 { return q.Pending + q.Running + q.Done + q.Failed + q.Cancelled }

// Finished is the rows in a terminal state.
func (q queueView) Finished() int64 { return q.Done + q.Failed + q.Cancelled }

// PerMinute is the drain rate: rows finished in the last minute, else the
// last hour's mean.
func (q queueView) PerMinute() float64 {
	if q.FinishedLastMinute > 0 {
		return float64(q.FinishedLastMinute)
	}
	return float64(q.FinishedLastHr) / 60
}

// ETA is how long the pending and running rows take at PerMinute; nil when
// nothing is left or nothing drains.
func (q queueView) ETA() *time.Duration {
	left, rate := q.Pending+q.Running, q.PerMinute()
	if left == 0 || rate == 0 || q.Paused && q.Running == 0 {
		return nil
	}
	d := time.Duration(float64(left) / rate * float64(time.Minute))
	return &d
}

// batchView is one batch (files.batch_progress) of the Overview.
type batchView struct {
	Name                                             string
	Total, Pending, Running, Done, Failed, Cancelled int64
	PerSecond                                        float64
	ETA                                              *time.Duration
	CreatedAt                                        time.Time
	FinishedAt                                       *time.Time
}

// Finished is the rows in a terminal state.
func (b batchView) Finished() int64 { return b.Done + b.Failed + b.Cancelled }

// PerMinute is the recent rate.
func (b batchView) PerMinute() float64 { return b.PerSecond * 60 }

func readBatches(ctx context.Context, tx pgx.Tx) ([]batchView, error) {
	rows, err := tx.Query(ctx, sqlBatches, maxBatches)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (batchView, error) {
		var (
			b    batchView
			rate pgtype.Numeric
			eta  pgtype.Interval
		)
		err := row.Scan(&b.Name, &b.Total, &b.Pending, &b.Running, &b.Done, &b.Failed, &b.Cancelled, &rate, &eta,
			&b.CreatedAt, &b.FinishedAt)
		if f, ferr := rate.Float64Value(); ferr == nil && f.Valid {
			b.PerSecond = f.Float64
		}
		b.ETA = duration(eta)
		return b, err
	})
}

// slotView is one worker slot of the Workers page.
type slotView struct {
	WorkerID     string
	Node         string
	PID, Slot    *int32
	State        string
	Version      *string
	StartedAt    time.Time
	HeartbeatAge time.Duration
	LeaseTimeout time.Duration
	StoppedAt    *time.Time
	FileID       *int64
	Queue        *string
	Source       *string
	Attempt      *int32
	RunningFor   *time.Duration
}

// Silent is a live slot that missed heartbeats: its lease runs out soon.
func (s slotView) Silent() bool {
	return (s.State == "active" || s.State == "draining") && s.HeartbeatAge > s.LeaseTimeout/3
}

// Expired is a live slot silent past its lease: the next reap takes its rows.
func (s slotView) Expired() bool {
	return (s.State == "active" || s.State == "draining") && s.HeartbeatAge > s.LeaseTimeout
}

// nodeView is one worker node (host) and its slots.
type nodeView struct {
	Name                           string
	Slots                          []slotView
	Active, Draining, Dead, Silent int
	Busy                           int
	Versions                       []string
}

// failureGroup is the failed rows that share the first line of an error.
type failureGroup struct {
	Error      string
	Files      int64
	Newest     int64
	LastFailed *time.Time
	Queues     []string
}

// chartData is per-minute throughput over the last hour, as uPlot reads
// it: x in Unix seconds, then one series per line.
type chartData struct {
	X      []int64 `json:"x"`
	Done   []int64 `json:"done"`
	Failed []int64 `json:"failed"`
}

func readQueues(ctx context.Context, tx pgx.Tx) ([]queueView, error) {
	rows, err := tx.Query(ctx, sqlQueues)
	if err != nil {
		return nil, err
	}
	var out []queueView
	for rows.Next() {
		var (
			name, state      string
			paused           bool
			pausedAt         *time.Time
			n, sched, m1, h1 int64
			oldest           pgtype.Interval
		)
		if err := rows.Scan(&name, &paused, &pausedAt, &state, &n, &sched, &oldest, &m1, &h1); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].Name != name {
			out = append(out, queueView{Name: name, Paused: paused, PausedAt: pausedAt})
		}
		q := &out[len(out)-1]
		switch state {
		case "pending":
			q.Pending, q.Scheduled, q.OldestPending = n, sched, duration(oldest)
		case "running":
			q.Running = n
		case "done":
			q.Done = n
		case "failed":
			q.Failed = n
		case "cancelled":
			q.Cancelled = n
		}
		if state == "done" || state == "failed" || state == "cancelled" {
			q.FinishedLastMinute += m1
			q.FinishedLastHr += h1
		}
	}
	return out, rows.Err()
}

func readWorkers(ctx context.Context, tx pgx.Tx) ([]nodeView, error) {
	rows, err := tx.Query(ctx, sqlWorkers, maxWorkers, maxSourceChars)
	if err != nil {
		return nil, err
	}
	var nodes []nodeView
	for rows.Next() {
		var (
			s             slotView
			node          *string
			age, lease, r pgtype.Interval
		)
		if err := rows.Scan(&s.WorkerID, &node, &s.PID, &s.Slot, &s.State, &s.Version, &s.StartedAt, &age, &lease,
			&s.StoppedAt, &s.FileID, &s.Queue, &s.Source, &s.Attempt, &r); err != nil {
			return nil, err
		}
		s.HeartbeatAge, s.LeaseTimeout, s.RunningFor = deref(duration(age)), deref(duration(lease)), duration(r)
		if node != nil {
			s.Node = *node
		}
		if len(nodes) == 0 || nodes[len(nodes)-1].Name != s.Node {
			nodes = append(nodes, nodeView{Name: s.Node})
		}
		nodes[len(nodes)-1].add(s)
	}
	return nodes, rows.Err()
}

func (n *nodeView) add(s slotView) {
	// A slot holds more than one running row while the outcomes of its
	// last rows wait to be recorded: a line for each row, one slot.
	again := len(n.Slots) > 0 && n.Slots[len(n.Slots)-1].WorkerID == s.WorkerID
	n.Slots = append(n.Slots, s)
	if again {
		return
	}
	switch {
	case s.State == "dead":
		n.Dead++
	case s.State == "draining":
		n.Draining++
	default:
		n.Active++
	}
	if s.Silent() {
		n.Silent++
	}
	if s.FileID != nil {
		n.Busy++
	}
	if s.Version != nil && !contains(n.Versions, *s.Version) {
		n.Versions = append(n.Versions, *s.Version)
	}
}

func readFailureGroups(ctx context.Context, tx pgx.Tx) ([]failureGroup, error) {
	rows, err := tx.Query(ctx, sqlFailureGroups, maxGroups, groupKeyChars, groupedFailures)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (failureGroup, error) {
		var g failureGroup
		err := row.Scan(&g.Error, &g.Files, &g.Newest, &g.LastFailed, &g.Queues)
		return g, err
	})
}

func readChart(ctx context.Context, tx pgx.Tx, now time.Time) (chartData, error) {
	rows, err := tx.Query(ctx, sqlChart, chartAttempts)
	if err != nil {
		return chartData{}, err
	}
	byMinute := map[int64][2]int64{}
	for rows.Next() {
		var minute, done, failed int64
		if err := rows.Scan(&minute, &done, &failed); err != nil {
			return chartData{}, err
		}
		byMinute[minute] = [2]int64{done, failed}
	}
	if err := rows.Err(); err != nil {
		return chartData{}, err
	}
	last := now.Truncate(time.Minute).Unix()
	c := chartData{}
	for m := last - 59*60; m <= last; m += 60 {
		v := byMinute[m]
		c.X, c.Done, c.Failed = append(c.X, m), append(c.Done, v[0]), append(c.Failed, v[1])
	}
	return c, nil
}

// duration converts an interval; months count as 30 days. nil for NULL.
func duration(iv pgtype.Interval) *time.Duration {
	if !iv.Valid {
		return nil
	}
	d := time.Duration(iv.Microseconds)*time.Microsecond + time.Duration(iv.Days)*24*time.Hour +
		time.Duration(iv.Months)*30*24*time.Hour
	return &d
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
