package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

var statusCommand = &command{
	name:    "status",
	args:    "[flags]",
	summary: "show queues, live workers and per-worker metrics",
	help: `
Shows, from one consistent snapshot of the views files.queue_stats,
files.active_workers and files.worker_metrics:

  - each queue: rows per state, the age of the oldest pending row, rows
    finished in the last minute and hour;
  - each live worker slot: the row it holds and for how long, its last
    heartbeat;
  - per slot: attempts processed, failed and lost, failure rate, mean and
    95th percentile processing time (slots live or seen in the last hour;
    --all for every slot ever registered).

With --json it prints one JSON object (see StatusReport in the cli package),
whose fields are stable:

  {"generated_at": time,
   "queues": [{"queue", "paused", "pending", "scheduled", "running", "done",
               "failed", "cancelled", "oldest_pending_seconds" (null when
               none), "finished_last_minute", "finished_last_hour"}],
   "active_workers": [{"worker_id", "node", "pid", "slot", "state", "version",
               "started_at", "last_heartbeat_at", "heartbeat_age_seconds",
               "file_id", "queue", "source", "attempt", "running_since",
               "running_for_seconds", "lease_expires_at"}],
   "worker_metrics": [{"worker_id", "node", "pid", "slot", "state",
               "processed", "done", "failed", "lost", "failure_rate",
               "mean_seconds", "p95_seconds", "last_seen"}]}

Times are RFC 3339; durations are seconds; unknown values are null. An idle
slot appears in active_workers with file_id null.`,
	examples: `
pgworker status
pgworker status --json | jq '.queues[] | {queue, pending}'
watch -n 5 pgworker status`,
}

// StatusReport is what `pgworker status --json` prints.
type StatusReport struct {
	GeneratedAt   time.Time       `json:"generated_at"`
	Queues        []QueueStatus   `json:"queues"`
	ActiveWorkers []ActiveWorker  `json:"active_workers"`
	WorkerMetrics []WorkerMetrics `json:"worker_metrics"`
}

// QueueStatus is one queue of files.queue_stats, its states side by side.
type QueueStatus struct {
	Queue     string `json:"queue"`
	Paused    bool   `json:"paused"`
	Pending   int64  `json:"pending"`
	Scheduled int64  `json:"scheduled"` // of the pending rows, those waiting for a retry (run_after)
	Running   int64  `json:"running"`
	Done      int64  `json:"done"`
	Failed    int64  `json:"failed"`
	Cancelled int64  `json:"cancelled"`
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

func (c *CLI) status(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(statusCommand)
	var (
		db      dbFlags
		logs    logFlags
		asJSON  bool
		allSeen bool
	)
	db.add(fs)
	logs.add(fs)
	fs.BoolVar(&asJSON, "json", false, "print JSON (fields documented above) instead of tables")
	fs.BoolVar(&allSeen, "all", false, "list the metrics of every worker slot ever registered")
	if help, err := e.parseFlags(fs, args); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (see 'pgworker status --help')", fs.Arg(0))
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

	var rep *StatusReport
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		rep, err = readStatus(ctx, tx, allSeen)
		return err
	})
	if err != nil {
		return fmt.Errorf("read status: %w", explain(err))
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printStatus(e.stdout, rep, allSeen)
}

func readStatus(ctx context.Context, tx pgx.Tx, allSeen bool) (*StatusReport, error) {
	rep := &StatusReport{
		GeneratedAt:   time.Now().UTC(),
		Queues:        []QueueStatus{},
		ActiveWorkers: []ActiveWorker{},
		WorkerMetrics: []WorkerMetrics{},
	}
	rows, err := tx.Query(ctx, sqlQueueStats)
	if err != nil {
		return nil, err
	}
	byQueue := map[string]int{}
	for rows.Next() {
		var (
			queue, state     string
			paused           bool
			n, sched, m1, h1 int64
			oldest           pgtype.Interval
		)
		if err := rows.Scan(&queue, &paused, &state, &n, &sched, &oldest, &m1, &h1); err != nil {
			return nil, err
		}
		i, ok := byQueue[queue]
		if !ok {
			i = len(rep.Queues)
			byQueue[queue] = i
			rep.Queues = append(rep.Queues, QueueStatus{Queue: queue, Paused: paused})
		}
		q := &rep.Queues[i]
		switch state {
		case "pending":
			q.Pending, q.Scheduled = n, sched
			q.OldestPendingSeconds = seconds(oldest)
		case "running":
			q.Running = n
		case "done":
			q.Done = n
		case "failed":
			q.Failed = n
		case "cancelled":
			q.Cancelled = n
		}
		if state != "pending" && state != "running" {
			q.FinishedLastMinute += m1
			q.FinishedLastHour += h1
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = tx.Query(ctx, sqlActiveWorkers)
	if err != nil {
		return nil, err
	}
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
		rep.ActiveWorkers = append(rep.ActiveWorkers, w)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = tx.Query(ctx, sqlWorkerMetrics, allSeen)
	if err != nil {
		return nil, err
	}
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
		rep.WorkerMetrics = append(rep.WorkerMetrics, m)
	}
	return rep, rows.Err()
}

// seconds converts an interval; months count as 30 days.
func seconds(iv pgtype.Interval) *float64 {
	if !iv.Valid {
		return nil
	}
	s := float64(iv.Microseconds)/1e6 + float64(iv.Days)*86400 + float64(iv.Months)*30*86400
	return &s
}

func printStatus(w io.Writer, rep *StatusReport, allSeen bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Queues) == 0 {
		fmt.Fprintln(tw, "No queues yet: add work with pgworker enqueue.")
	} else {
		fmt.Fprintln(tw, "QUEUE\tPAUSED\tPENDING\tSCHEDULED\tRUNNING\tDONE\tFAILED\tCANCELLED\tOLDEST PENDING\tFINISHED 1M\tFINISHED 1H")
		for _, q := range rep.Queues {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\n", q.Queue, yesNo(q.Paused), q.Pending, q.Scheduled,
				q.Running, q.Done, q.Failed, q.Cancelled, secondsText(q.OldestPendingSeconds), q.FinishedLastMinute, q.FinishedLastHour)
		}
	}
	fmt.Fprintln(tw)
	if len(rep.ActiveWorkers) == 0 {
		fmt.Fprintln(tw, "No live workers.")
	} else {
		fmt.Fprintln(tw, "WORKER\tSTATE\tHEARTBEAT\tFILE\tQUEUE\tATTEMPT\tRUNNING FOR\tSOURCE")
		for _, a := range rep.ActiveWorkers {
			file, queue, attempt, source := "-", "-", "-", "-"
			if a.FileID != nil {
				file = strconv.FormatInt(*a.FileID, 10)
				queue, source = deref(a.Queue), clipText(deref(a.Source), 60)
				if a.Attempt != nil {
					attempt = strconv.Itoa(int(*a.Attempt))
				}
			}
			hb := a.HeartbeatAgeSeconds
			fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%s\t%s\t%s\t%s\n", a.WorkerID, a.State, secondsText(&hb), file, queue, attempt,
				secondsText(a.RunningForSeconds), source)
		}
	}
	fmt.Fprintln(tw)
	if len(rep.WorkerMetrics) == 0 {
		if allSeen {
			fmt.Fprintln(tw, "No worker has registered yet.")
		} else {
			fmt.Fprintln(tw, "No worker seen in the last hour (--all lists every worker).")
		}
	} else {
		fmt.Fprintln(tw, "WORKER\tSTATE\tPROCESSED\tDONE\tFAILED\tLOST\tFAILURE RATE\tMEAN\tP95\tLAST SEEN")
		for _, m := range rep.WorkerMetrics {
			rate := "-"
			if m.FailureRate != nil {
				rate = fmt.Sprintf("%.1f%%", *m.FailureRate*100)
			}
			ago := rep.GeneratedAt.Sub(m.LastSeen).Seconds()
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s ago\n", m.WorkerID, m.State, m.Processed, m.Done, m.Failed, m.Lost,
				rate, secondsText(m.MeanSeconds), secondsText(m.P95Seconds), secondsText(&ago))
		}
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// secondsText shows a duration the way a person reads it: 850ms, 4.2s, 3m12s, 2h5m, 3d4h.
func secondsText(s *float64) string {
	if s == nil {
		return "-"
	}
	d := time.Duration(*s * float64(time.Second))
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		text := d.Round(time.Second).String()
		if strings.HasSuffix(text, "m0s") {
			text = strings.TrimSuffix(text, "0s")
		}
		return text
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	days := int(d / (24 * time.Hour))
	return fmt.Sprintf("%dd%dh", days, int((d-time.Duration(days)*24*time.Hour)/time.Hour))
}

// clipText shortens s to n characters for a table.
func clipText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
