package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgworker/pgworker/migrations"
)

const (
	sqlQueueStats = `
SELECT queue, paused, max_running, fair_share, state, files, scheduled, oldest_pending_age, finished_last_minute, finished_last_hour
FROM files.queue_stats`

	sqlActiveWorkers = `
SELECT worker_id, node, pid, slot, state, version, started_at, last_heartbeat_at, heartbeat_age,
       file_id, queue, source, attempt, running_since, running_for, lease_expires_at
FROM files.active_workers
ORDER BY worker_id, file_id`

	// Workers that are live or were seen in the last hour, or all ($1).
	sqlWorkerMetrics = `
SELECT worker_id, node, pid, slot, state, processed, done, failed, lost, failure_rate,
       mean_duration, p95_duration, last_seen
FROM files.worker_metrics
WHERE $1 OR state IN ('active', 'draining') OR last_seen > now() - interval '1 hour'
ORDER BY worker_id`
)

// Status is the state of the queues and workers, read from one snapshot
// of the views files.queue_stats, files.active_workers and
// files.worker_metrics: what `pgworker status --json` prints.
type Status struct {
	GeneratedAt   time.Time       `json:"generated_at"`
	Queues        []QueueStatus   `json:"queues"`
	ActiveWorkers []ActiveWorker  `json:"active_workers"`
	WorkerMetrics []WorkerMetrics `json:"worker_metrics"`
	// Batches are the open batches and those finished in the last hour.
	Batches []BatchProgress `json:"batches"`
}

// QueueStatus is one queue of files.queue_stats, its states side by side.
type QueueStatus struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// MaxRunning is the queue's fleet-wide cap on running rows; nil for
	// none.
	MaxRunning *int32 `json:"max_running"`
	// FairShare reports whether the queue's batches take turns.
	FairShare bool  `json:"fair_share"`
	Pending   int64 `json:"pending"`
	Scheduled int64 `json:"scheduled"` // of the pending rows, those waiting for a retry (run_after)
	Running   int64 `json:"running"`
	Done      int64 `json:"done"`
	Failed    int64 `json:"failed"`
	Cancelled int64 `json:"cancelled"`
	// OldestPendingSeconds is the age of the oldest pending row; nil when
	// none is pending.
	OldestPendingSeconds *float64 `json:"oldest_pending_seconds"`
	// Rows that reached done, failed or cancelled in the last minute and hour.
	FinishedLastMinute int64 `json:"finished_last_minute"`
	FinishedLastHour   int64 `json:"finished_last_hour"`
}

// ActiveWorker is one line of files.active_workers: a live slot and the row
// it holds (the row fields are nil when the slot is idle).
type ActiveWorker struct {
	WorkerID            string     `json:"worker_id"`
	Node                *string    `json:"node"`
	PID                 *int32     `json:"pid"`
	Slot                *int32     `json:"slot"`
	State               string     `json:"state"`
	Version             *string    `json:"version"`
	StartedAt           time.Time  `json:"started_at"`
	LastHeartbeatAt     time.Time  `json:"last_heartbeat_at"`
	HeartbeatAgeSeconds float64    `json:"heartbeat_age_seconds"`
	FileID              *int64     `json:"file_id"`
	Queue               *string    `json:"queue"`
	Source              *string    `json:"source"`
	Attempt             *int32     `json:"attempt"`
	RunningSince        *time.Time `json:"running_since"`
	RunningForSeconds   *float64   `json:"running_for_seconds"`
	LeaseExpiresAt      *time.Time `json:"lease_expires_at"`
}

// WorkerMetrics is one line of files.worker_metrics.
type WorkerMetrics struct {
	WorkerID    string    `json:"worker_id"`
	Node        *string   `json:"node"`
	PID         *int32    `json:"pid"`
	Slot        *int32    `json:"slot"`
	State       string    `json:"state"`
	Processed   int64     `json:"processed"` // attempts that ended done or failed
	Done        int64     `json:"done"`
	Failed      int64     `json:"failed"`
	Lost        int64     `json:"lost"`
	FailureRate *float64  `json:"failure_rate"` // failed / processed; nil before the first
	MeanSeconds *float64  `json:"mean_seconds"`
	P95Seconds  *float64  `json:"p95_seconds"`
	LastSeen    time.Time `json:"last_seen"`
}

// StatusOpts chooses what Status reads. A nil StatusOpts takes the
// defaults.
type StatusOpts struct {
	// AllWorkers lists the metrics of every worker slot ever registered.
	// Defaults to the slots that are live or were seen in the last hour.
	AllWorkers bool
}

// Status reads the queues, the live worker slots and the per-slot metrics
// from one consistent snapshot.
func (c *Client) Status(ctx context.Context, opts *StatusOpts) (*Status, error) {
	all := opts != nil && opts.AllWorkers
	var st *Status
	err := pgx.BeginTxFunc(ctx, c.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		st, err = readStatus(ctx, tx, all)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read status: %w", err)
	}
	return st, nil
}

func readStatus(ctx context.Context, tx pgx.Tx, allSeen bool) (*Status, error) {
	st := &Status{GeneratedAt: time.Now().UTC()}
	// The four reads go out together, so that the server runs each while
	// the lines of the one before are scanned: at 2,000 slots, scanning the
	// live slots and their metrics takes about as long as the views do.
	b := &pgx.Batch{}
	b.Queue(sqlQueueStats)
	b.Queue(sqlActiveWorkers)
	b.Queue(sqlWorkerMetrics, allSeen)
	b.Queue(sqlBatchesSince, st.GeneratedAt.Add(-time.Hour), statusBatches)
	br := tx.SendBatch(ctx, b)
	err := readStatusBatch(br, st)
	return st, errors.Join(err, br.Close())
}

// readStatusBatch scans the results of readStatus's batch, in its order.
func readStatusBatch(br pgx.BatchResults, st *Status) (err error) {
	if st.Queues, err = scanQueues(br.Query()); err != nil {
		return err
	}
	if st.ActiveWorkers, err = scanActiveWorkers(br.Query()); err != nil {
		return err
	}
	if st.WorkerMetrics, err = scanWorkerMetrics(br.Query()); err != nil {
		return err
	}
	st.Batches, err = scanBatches(br.Query())
	return err
}

// scanQueues scans files.queue_stats, one line per queue and state, into
// one QueueStatus per queue.
func scanQueues(rows pgx.Rows, err error) ([]QueueStatus, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []QueueStatus{}
	byQueue := map[string]int{}
	for rows.Next() {
		var (
			queue, state     string
			paused, fair     bool
			maxRunning       *int32
			n, sched, m1, h1 int64
			oldest           pgtype.Interval
		)
		if err := rows.Scan(&queue, &paused, &maxRunning, &fair, &state, &n, &sched, &oldest, &m1, &h1); err != nil {
			return nil, err
		}
		i, ok := byQueue[queue]
		if !ok {
			i = len(out)
			byQueue[queue] = i
			out = append(out, QueueStatus{Queue: queue, Paused: paused, MaxRunning: maxRunning, FairShare: fair})
		}
		q := &out[i]
		switch state {
		case migrations.StatePending:
			q.Pending, q.Scheduled = n, sched
			q.OldestPendingSeconds = seconds(oldest)
		case migrations.StateRunning:
			q.Running = n
		case migrations.StateDone:
			q.Done = n
		case migrations.StateFailed:
			q.Failed = n
		case migrations.StateCancelled:
			q.Cancelled = n
		}
		if state != migrations.StatePending && state != migrations.StateRunning {
			q.FinishedLastMinute += m1
			q.FinishedLastHour += h1
		}
	}
	return out, rows.Err()
}

func scanActiveWorkers(rows pgx.Rows, err error) ([]ActiveWorker, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []ActiveWorker{}
	for rows.Next() {
		var (
			w           ActiveWorker
			age, runFor pgtype.Interval
		)
		if err := rows.Scan(&w.WorkerID, &w.Node, &w.PID, &w.Slot, &w.State, &w.Version, &w.StartedAt, &w.LastHeartbeatAt,
			&age, &w.FileID, &w.Queue, &w.Source, &w.Attempt, &w.RunningSince, &runFor, &w.LeaseExpiresAt); err != nil {
			return nil, err
		}
		if s := seconds(age); s != nil {
			w.HeartbeatAgeSeconds = *s
		}
		w.RunningForSeconds = seconds(runFor)
		out = append(out, w)
	}
	return out, rows.Err()
}

func scanWorkerMetrics(rows pgx.Rows, err error) ([]WorkerMetrics, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []WorkerMetrics{}
	for rows.Next() {
		var (
			m         WorkerMetrics
			mean, p95 pgtype.Interval
		)
		if err := rows.Scan(&m.WorkerID, &m.Node, &m.PID, &m.Slot, &m.State, &m.Processed, &m.Done, &m.Failed, &m.Lost,
			&m.FailureRate, &mean, &p95, &m.LastSeen); err != nil {
			return nil, err
		}
		m.MeanSeconds, m.P95Seconds = seconds(mean), seconds(p95)
		out = append(out, m)
	}
	return out, rows.Err()
}

// seconds converts an interval; months count as 30 days.
func seconds(iv pgtype.Interval) *float64 {
	if !iv.Valid {
		return nil
	}
	s := float64(iv.Microseconds)/1e6 + float64(iv.Days)*86400 + float64(iv.Months)*30*86400
	return &s
}
