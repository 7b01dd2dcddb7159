package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/pgworker/pgworker/queue"
)

var statusCommand = &command{
	name:    "status",
	args:    "[flags]",
	summary: "show queues, live workers and per-worker metrics",
	help: `
Shows, from one consistent snapshot of the views files.queue_stats,
files.batch_progress, files.active_workers and files.worker_metrics:

  - each queue: rows per state, the age of the oldest pending row, rows
    finished in the last minute and hour, its fleet-wide cap on running rows
    and whether its batches share fairly (pgworker queue set);
  - each batch that is open or ended in the last hour: a progress bar, rows
    per state, the recent rate and the time left at that rate;
  - each live worker slot: the row it holds and for how long, its last
    heartbeat;
  - per slot: attempts processed, failed and lost, failure rate, mean and
    95th percentile processing time (slots live or seen in the last hour;
    --all for every slot ever registered).

With --json it prints one JSON object (see Status in the queue package),
whose fields are stable:

  {"generated_at": time,
   "queues": [{"queue", "paused", "max_running" (null when none),
               "fair_share", "pending", "scheduled", "running", "done",
               "failed", "cancelled", "oldest_pending_seconds" (null when
               none), "finished_last_minute", "finished_last_hour"}],
   "active_workers": [{"worker_id", "node", "pid", "slot", "state", "version",
               "started_at", "last_heartbeat_at", "heartbeat_age_seconds",
               "file_id", "queue", "source", "attempt", "running_since",
               "running_for_seconds", "lease_expires_at"}],
   "worker_metrics": [{"worker_id", "node", "pid", "slot", "state",
               "processed", "done", "failed", "lost", "failure_rate",
               "mean_seconds", "p95_seconds", "last_seen"}],
   "batches": [{"batch", "labels", "total", "pending", "running", "done",
               "failed", "cancelled", "percent", "rate", "eta_seconds",
               "created_at", "finished_at"}]}

Times are RFC 3339; durations are seconds; unknown values are null. An idle
slot appears in active_workers with file_id null.`,
	examples: `
pgworker status
pgworker status --json | jq '.queues[] | {queue, pending}'
watch -n 5 pgworker status`,
}

func (c *CLI) status(ctx context.Context, e *env, args []string) error {
	inv := e.invocation(statusCommand)
	var asJSON, allSeen bool
	inv.fs.BoolVar(&asJSON, "json", false, "print JSON (fields documented above) instead of tables")
	inv.fs.BoolVar(&allSeen, "all", false, "list the metrics of every worker slot ever registered")
	if help, err := inv.parse(args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	q, done, err := inv.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := q.Status(ctx, &queue.StatusOpts{AllWorkers: allSeen})
	if err != nil {
		return explain(err)
	}
	if asJSON {
		return writeJSON(e.stdout, st)
	}
	return printStatus(e.stdout, st, allSeen)
}

// printStatus writes the three tables. Every string from the database goes
// through printable.
func printStatus(w io.Writer, st *queue.Status, allSeen bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	printQueues(tw, st.Queues)
	fmt.Fprintln(tw)
	if len(st.Batches) > 0 {
		printBatches(tw, st.Batches)
		fmt.Fprintln(tw)
	}
	printActiveWorkers(tw, st.ActiveWorkers)
	fmt.Fprintln(tw)
	printWorkerMetrics(tw, st, allSeen)
	return tw.Flush()
}

func printQueues(w io.Writer, queues []queue.QueueStatus) {
	if len(queues) == 0 {
		fmt.Fprintln(w, "No queues yet: add work with pgworker enqueue.")
		return
	}
	fmt.Fprintln(w, "QUEUE\tPAUSED\tPENDING\tSCHEDULED\tRUNNING\tDONE\tFAILED\tCANCELLED\tOLDEST PENDING\tFINISHED 1M\tFINISHED 1H\tMAX RUNNING\tFAIR SHARE")
	for _, q := range queues {
		maxRunning := "-"
		if q.MaxRunning != nil {
			maxRunning = strconv.Itoa(int(*q.MaxRunning))
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\n", printable(q.Queue), yesNo(q.Paused), q.Pending, q.Scheduled,
			q.Running, q.Done, q.Failed, q.Cancelled, secondsText(q.OldestPendingSeconds), q.FinishedLastMinute, q.FinishedLastHour,
			maxRunning, yesNo(q.FairShare))
	}
}

func printBatches(w io.Writer, batches []queue.BatchProgress) {
	fmt.Fprintln(w, "BATCH\tPROGRESS\tDONE\tFAILED\tCANCELLED\tRUNNING\tPENDING\tRATE\tETA")
	for i := range batches {
		b := &batches[i]
		rate, eta := "-", "-"
		if b.Rate > 0 && !b.Finished() {
			rate = fmt.Sprintf("%.1f/s", b.Rate)
		}
		switch {
		case b.FinishedAt != nil:
			eta = "ended"
		case b.ETASeconds != nil:
			eta = secondsText(b.ETASeconds)
		}
		fmt.Fprintf(w, "%s\t%s %5.1f%%\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", printable(b.Batch), bar(b.Percent, 20), b.Percent,
			b.Done, b.Failed, b.Cancelled, b.Running, b.Pending, rate, eta)
	}
}

func printActiveWorkers(w io.Writer, workers []queue.ActiveWorker) {
	if len(workers) == 0 {
		fmt.Fprintln(w, "No live workers.")
		return
	}
	fmt.Fprintln(w, "WORKER\tSTATE\tHEARTBEAT\tFILE\tQUEUE\tATTEMPT\tRUNNING FOR\tSOURCE")
	for _, a := range workers {
		file, queueName, attempt, source := "-", "-", "-", "-"
		if a.FileID != nil {
			file = strconv.FormatInt(*a.FileID, 10)
			queueName, source = printable(deref(a.Queue)), clipText(printable(deref(a.Source)), 60)
			if a.Attempt != nil {
				attempt = strconv.Itoa(int(*a.Attempt))
			}
		}
		hb := a.HeartbeatAgeSeconds
		fmt.Fprintf(w, "%s\t%s\t%s ago\t%s\t%s\t%s\t%s\t%s\n", printable(a.WorkerID), printable(a.State), secondsText(&hb),
			file, queueName, attempt, secondsText(a.RunningForSeconds), source)
	}
}

func printWorkerMetrics(w io.Writer, st *queue.Status, allSeen bool) {
	switch {
	case len(st.WorkerMetrics) == 0 && allSeen:
		fmt.Fprintln(w, "No worker has registered yet.")
		return
	case len(st.WorkerMetrics) == 0:
		fmt.Fprintln(w, "No worker seen in the last hour (--all lists every worker).")
		return
	}
	fmt.Fprintln(w, "WORKER\tSTATE\tPROCESSED\tDONE\tFAILED\tLOST\tFAILURE RATE\tMEAN\tP95\tLAST SEEN")
	for _, m := range st.WorkerMetrics {
		rate := "-"
		if m.FailureRate != nil {
			rate = fmt.Sprintf("%.1f%%", *m.FailureRate*100)
		}
		ago := st.GeneratedAt.Sub(m.LastSeen).Seconds()
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s ago\n", printable(m.WorkerID), printable(m.State), m.Processed,
			m.Done, m.Failed, m.Lost, rate, secondsText(m.MeanSeconds), secondsText(m.P95Seconds), secondsText(&ago))
	}
}
