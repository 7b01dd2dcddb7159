-- Views for operators and DBAs: what runs where, how each queue drains, how each
-- worker slot performs.

-- +goose Up
CREATE VIEW files.active_workers AS
SELECT w.worker_id,
       w.node,
       w.pid,
       w.slot,
       w.state,
       w.version,
       w.started_at,
       w.last_heartbeat_at,
       now() - w.last_heartbeat_at AS heartbeat_age,
       f.id AS file_id,
       f.queue,
       f.source,
       f.attempt,
       f.claimed_at AS running_since,
       now() - f.claimed_at AS running_for,
       f.lease_expires_at
FROM files.workers w
LEFT JOIN files.files f ON f.worker_id = w.worker_id AND f.state = 'running'
WHERE w.state IN ('active', 'draining');
COMMENT ON VIEW files.active_workers IS
    'Live worker slots (active or draining), one line per row each holds (file_id NULL when idle), with heartbeat age.';
COMMENT ON COLUMN files.active_workers.worker_id IS 'Slot identity.';
COMMENT ON COLUMN files.active_workers.node IS 'Host name of the worker node.';
COMMENT ON COLUMN files.active_workers.pid IS 'Process id on the node.';
COMMENT ON COLUMN files.active_workers.slot IS 'Slot number within the process.';
COMMENT ON COLUMN files.active_workers.state IS 'active or draining.';
COMMENT ON COLUMN files.active_workers.version IS 'Worker software version.';
COMMENT ON COLUMN files.active_workers.started_at IS 'When the slot registered.';
COMMENT ON COLUMN files.active_workers.last_heartbeat_at IS 'Last sign of life.';
COMMENT ON COLUMN files.active_workers.heartbeat_age IS 'Time since the last sign of life; above the lease timeout the slot is about to be reaped.';
COMMENT ON COLUMN files.active_workers.file_id IS 'The row the slot is working on, NULL when idle.';
COMMENT ON COLUMN files.active_workers.queue IS 'Queue of that row.';
COMMENT ON COLUMN files.active_workers.source IS 'Input object of that row.';
COMMENT ON COLUMN files.active_workers.attempt IS 'Attempt number of that row.';
COMMENT ON COLUMN files.active_workers.running_since IS 'When the slot claimed that row.';
COMMENT ON COLUMN files.active_workers.running_for IS 'How long the slot has been working on that row.';
COMMENT ON COLUMN files.active_workers.lease_expires_at IS 'When the row returns to the queue unless the slot heartbeats.';

-- Per queue, from the counts kept as rows change (files.queue_counts) and three
-- bounded reads of files.files: the running rows (files_running_idx, as many
-- as there are slots), the rows waiting for a retry (files_moved_idx) and the
-- first pending row of each priority (files_claim_idx). No line costs a read
-- of the table's history or of its backlog.
CREATE VIEW files.queue_summary AS
WITH clock AS (
    SELECT date_trunc('minute', now()) AS minute,
           1 - extract(epoch FROM now() - date_trunc('minute', now()))::double precision / 60 AS rest
),
counts AS (
    -- The rates of the last minute and hour count the minute that began
    -- before the window by the part of it inside the window.
    SELECT c.queue,
           sum(c.rows)::bigint AS rows, sum(c.done)::bigint AS done, sum(c.failed)::bigint AS failed,
           sum(c.cancelled)::bigint AS cancelled,
           round(sum(c.ended_done * w.minute))::bigint AS done_last_minute,
           round(sum(c.ended_failed * w.minute))::bigint AS failed_last_minute,
           round(sum(c.ended_cancelled * w.minute))::bigint AS cancelled_last_minute,
           round(sum(c.ended_done * w.hour))::bigint AS done_last_hour,
           round(sum(c.ended_failed * w.hour))::bigint AS failed_last_hour,
           round(sum(c.ended_cancelled * w.hour))::bigint AS cancelled_last_hour
    FROM files.queue_counts c
    CROSS JOIN clock k
    CROSS JOIN LATERAL (
        SELECT CASE WHEN c.at = k.minute THEN 1 WHEN c.at = k.minute - interval '1 minute' THEN k.rest ELSE 0 END AS minute,
               CASE WHEN c.at > k.minute - interval '1 hour' THEN 1 WHEN c.at = k.minute - interval '1 hour' THEN k.rest ELSE 0 END
                   AS hour
    ) w
    GROUP BY c.queue
),
running AS (
    SELECT f.queue, count(*) AS running
    FROM files.files f
    WHERE f.state = 'running'
    GROUP BY f.queue
),
scheduled AS (
    SELECT f.queue, count(*) AS scheduled
    FROM files.files f
    WHERE f.state = 'pending' AND f.run_after > f.created_at AND f.run_after > now()
    GROUP BY f.queue
)
SELECT q.queue,
       q.paused,
       q.max_running,
       q.fair_share,
       coalesce(c.rows, 0) - coalesce(r.running, 0) - coalesce(c.done, 0) - coalesce(c.failed, 0)
           - coalesce(c.cancelled, 0) AS pending,
       coalesce(r.running, 0) AS running,
       coalesce(c.done, 0) AS done,
       coalesce(c.failed, 0) AS failed,
       coalesce(c.cancelled, 0) AS cancelled,
       coalesce(s.scheduled, 0) AS scheduled,
       now() - o.created_at AS oldest_pending_age,
       coalesce(c.done_last_minute, 0) AS done_last_minute,
       coalesce(c.failed_last_minute, 0) AS failed_last_minute,
       coalesce(c.cancelled_last_minute, 0) AS cancelled_last_minute,
       coalesce(c.done_last_hour, 0) AS done_last_hour,
       coalesce(c.failed_last_hour, 0) AS failed_last_hour,
       coalesce(c.cancelled_last_hour, 0) AS cancelled_last_hour
FROM files.queues q
LEFT JOIN counts c ON c.queue = q.queue
LEFT JOIN running r ON r.queue = q.queue
LEFT JOIN scheduled s ON s.queue = q.queue
-- The oldest pending row: the first of each priority in files_claim_idx (a
-- skip from priority to priority), the one of those enqueued first.
LEFT JOIN LATERAL (
    WITH RECURSIVE heads (priority, created_at) AS (
        (SELECT f.priority, f.created_at FROM files.files f
         WHERE f.queue = q.queue AND f.state = 'pending'
         ORDER BY f.priority DESC, f.id LIMIT 1)
        UNION ALL
        SELECT n.priority, n.created_at
        FROM heads h
        CROSS JOIN LATERAL (
            SELECT f.priority, f.created_at FROM files.files f
            WHERE f.queue = q.queue AND f.state = 'pending' AND f.priority < h.priority
            ORDER BY f.priority DESC, f.id LIMIT 1
        ) n
    )
    SELECT min(h.created_at) AS created_at FROM heads h
) o ON true;
COMMENT ON VIEW files.queue_summary IS
    'One line per queue: its rows by state, those waiting for a retry, the oldest pending age, and how many rows ended in '
    'the last minute and hour. Reads the counts the SQL API keeps (files.queue_counts) and bounded parts of files.files, '
    'never the whole table.';
COMMENT ON COLUMN files.queue_summary.queue IS 'Queue name.';
COMMENT ON COLUMN files.queue_summary.paused IS 'Whether the queue is paused.';
COMMENT ON COLUMN files.queue_summary.max_running IS 'The fleet-wide cap on the queue''s running rows; NULL for none.';
COMMENT ON COLUMN files.queue_summary.fair_share IS 'Whether claims share the queue''s slots among its batches.';
COMMENT ON COLUMN files.queue_summary.pending IS 'Rows waiting to run, retries waiting for run_after among them.';
COMMENT ON COLUMN files.queue_summary.running IS 'Rows held by worker slots now.';
COMMENT ON COLUMN files.queue_summary.done IS 'Rows done.';
COMMENT ON COLUMN files.queue_summary.failed IS 'Rows failed for good.';
COMMENT ON COLUMN files.queue_summary.cancelled IS 'Rows cancelled.';
COMMENT ON COLUMN files.queue_summary.scheduled IS 'Of the pending rows, those waiting for run_after (retry backoff, a later start).';
COMMENT ON COLUMN files.queue_summary.oldest_pending_age IS
    'Age of the oldest pending row (of the first row of each priority in claim order, the one enqueued first).';
COMMENT ON COLUMN files.queue_summary.done_last_minute IS
    'Rows that became done in the last minute, from per-minute counts (the minute the window cuts is counted pro rata).';
COMMENT ON COLUMN files.queue_summary.failed_last_minute IS 'Rows that became failed in the last minute, as done_last_minute.';
COMMENT ON COLUMN files.queue_summary.cancelled_last_minute IS 'Rows that became cancelled in the last minute, as done_last_minute.';
COMMENT ON COLUMN files.queue_summary.done_last_hour IS 'Rows that became done in the last hour, as done_last_minute.';
COMMENT ON COLUMN files.queue_summary.failed_last_hour IS 'Rows that became failed in the last hour, as done_last_minute.';
COMMENT ON COLUMN files.queue_summary.cancelled_last_hour IS 'Rows that became cancelled in the last hour, as done_last_minute.';

CREATE VIEW files.queue_stats AS
SELECT s.queue,
       s.paused,
       s.max_running,
       s.fair_share,
       x.state,
       x.files,
       CASE WHEN x.state = 'pending' THEN s.scheduled ELSE 0 END AS scheduled,
       CASE WHEN x.state = 'pending' THEN s.oldest_pending_age END AS oldest_pending_age,
       x.finished_last_minute,
       x.finished_last_hour
FROM files.queue_summary s
CROSS JOIN LATERAL (VALUES
    (1, 'pending', s.pending, 0::bigint, 0::bigint),
    (2, 'running', s.running, 0, 0),
    (3, 'done', s.done, s.done_last_minute, s.done_last_hour),
    (4, 'failed', s.failed, s.failed_last_minute, s.failed_last_hour),
    (5, 'cancelled', s.cancelled, s.cancelled_last_minute, s.cancelled_last_hour)
) AS x (ord, state, files, finished_last_minute, finished_last_hour)
ORDER BY s.queue, x.ord;
COMMENT ON VIEW files.queue_stats IS
    'One line per queue and state: how many rows, how many wait for a retry, the oldest pending age, and how many finished '
    'in the last minute and hour. files.queue_summary side by side; as cheap as it.';
COMMENT ON COLUMN files.queue_stats.queue IS 'Queue name.';
COMMENT ON COLUMN files.queue_stats.paused IS 'Whether the queue is paused.';
COMMENT ON COLUMN files.queue_stats.max_running IS 'The queue''s fleet-wide cap on running rows; NULL for none.';
COMMENT ON COLUMN files.queue_stats.fair_share IS 'Whether the queue''s batches take turns (files.queues.fair_share).';
COMMENT ON COLUMN files.queue_stats.state IS 'pending, running, done, failed or cancelled.';
COMMENT ON COLUMN files.queue_stats.files IS 'Rows of the queue in this state.';
COMMENT ON COLUMN files.queue_stats.scheduled IS 'Of the pending rows, those waiting for run_after (retry backoff).';
COMMENT ON COLUMN files.queue_stats.oldest_pending_age IS 'Age of the oldest pending row (pending line only).';
COMMENT ON COLUMN files.queue_stats.finished_last_minute IS
    'Rows that reached this terminal state in the last minute (from per-minute counts, see files.queue_summary).';
COMMENT ON COLUMN files.queue_stats.finished_last_hour IS 'Rows that reached this terminal state in the last hour.';

-- Over the recent history only: the attempts of the last hour among the
-- newest 10,000, one range of files.attempts' primary key (attempts are
-- written at their outcome), summed per slot before they meet files.workers.
-- Its cost is bounded however long the history and however large the fleet;
-- slots that stopped more than an hour ago, with nothing in the window, are
-- left out.
CREATE VIEW files.worker_metrics AS
WITH recent AS (
    SELECT a.worker_id COLLATE "C" AS worker_id,
           count(*) FILTER (WHERE a.outcome IN ('done', 'failed')) AS processed,
           count(*) FILTER (WHERE a.outcome = 'done') AS done,
           count(*) FILTER (WHERE a.outcome = 'failed') AS failed,
           count(*) FILTER (WHERE a.outcome = 'lost') AS lost,
           avg(a.duration) FILTER (WHERE a.outcome IN ('done', 'failed')) AS mean_duration,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration)
               FILTER (WHERE a.outcome IN ('done', 'failed')) AS p95_duration
    FROM (SELECT x.worker_id, x.outcome, x.duration, x.finished_at FROM files.attempts x ORDER BY x.id DESC LIMIT 10000) a
    WHERE a.finished_at > now() - interval '1 hour'
    GROUP BY 1
)
SELECT w.worker_id,
       w.node,
       w.pid,
       w.slot,
       w.state,
       coalesce(r.processed, 0) AS processed,
       coalesce(r.done, 0) AS done,
       coalesce(r.failed, 0) AS failed,
       coalesce(r.lost, 0) AS lost,
       round(r.failed::numeric / nullif(r.processed, 0), 4) AS failure_rate,
       r.mean_duration,
       r.p95_duration,
       w.last_heartbeat_at AS last_seen
FROM files.workers w
LEFT JOIN recent r ON r.worker_id = w.worker_id COLLATE "C"
WHERE w.state IN ('active', 'draining') OR greatest(w.last_heartbeat_at, w.stopped_at) > now() - interval '1 hour';
COMMENT ON VIEW files.worker_metrics IS
    'Per live worker slot, and per slot that stopped within the hour, over its attempts of the last hour (among the '
    'fleet''s newest 10,000): attempts carried to an '
    'outcome (processed = done + failed), lost attempts, failure rate, mean and p95 processing time, last seen.';
COMMENT ON COLUMN files.worker_metrics.worker_id IS 'Slot identity.';
COMMENT ON COLUMN files.worker_metrics.node IS 'Host name of the worker node.';
COMMENT ON COLUMN files.worker_metrics.pid IS 'Process id on the node.';
COMMENT ON COLUMN files.worker_metrics.slot IS 'Slot number within the process.';
COMMENT ON COLUMN files.worker_metrics.state IS 'active, draining, stopped or dead.';
COMMENT ON COLUMN files.worker_metrics.processed IS 'Attempts that ended done or failed (in the last hour, as the view).';
COMMENT ON COLUMN files.worker_metrics.done IS 'Attempts that ended done.';
COMMENT ON COLUMN files.worker_metrics.failed IS 'Attempts that ended failed.';
COMMENT ON COLUMN files.worker_metrics.lost IS 'Attempts lost because the slot went silent.';
COMMENT ON COLUMN files.worker_metrics.failure_rate IS 'failed / processed.';
COMMENT ON COLUMN files.worker_metrics.mean_duration IS 'Mean processing time of done and failed attempts.';
COMMENT ON COLUMN files.worker_metrics.p95_duration IS '95th percentile processing time of done and failed attempts.';
COMMENT ON COLUMN files.worker_metrics.last_seen IS 'Last heartbeat of the slot.';

CREATE VIEW files.batch_progress AS
WITH running AS (
    SELECT f.batch, count(*) AS running
    FROM files.files f
    WHERE f.state = 'running' AND f.batch IS NOT NULL
    GROUP BY f.batch
)
SELECT b.batch,
       b.labels,
       b.total,
       b.total - c.done - c.failed - c.cancelled - coalesce(r.running, 0) AS pending,
       coalesce(r.running, 0) AS running,
       c.done,
       c.failed,
       c.cancelled,
       round(100.0 * (c.done + c.failed + c.cancelled) / nullif(b.total, 0), 1) AS percent,
       round(c.rate::numeric, 3) AS rate,
       CASE WHEN b.finished_at IS NULL AND c.rate > 0.001
            THEN make_interval(secs => round((b.total - c.done - c.failed - c.cancelled) / c.rate))
       END AS eta,
       b.created_at,
       b.finished_at
FROM files.batches b
CROSS JOIN LATERAL (
    SELECT coalesce(sum(x.done), 0) AS done,
           coalesce(sum(x.failed), 0) AS failed,
           coalesce(sum(x.cancelled), 0) AS cancelled,
           coalesce(sum(x.recent * exp(-greatest(extract(epoch FROM now() - x.recent_at), 0)::double precision / 60)), 0)
               / 60 AS rate
    FROM files.batch_counts x
    WHERE x.batch = b.batch
) c
LEFT JOIN running r ON r.batch = b.batch;
COMMENT ON VIEW files.batch_progress IS
    'One line per batch: its rows by state, percent ended, the recent rate and an ETA. Reads the counts that the SQL API '
    'keeps and the running rows, never the whole of files.files.';
COMMENT ON COLUMN files.batch_progress.batch IS 'Batch name.';
COMMENT ON COLUMN files.batch_progress.labels IS 'The batch''s labels.';
COMMENT ON COLUMN files.batch_progress.total IS 'Rows of the batch.';
COMMENT ON COLUMN files.batch_progress.pending IS 'Rows waiting to run (including retries waiting for run_after).';
COMMENT ON COLUMN files.batch_progress.running IS 'Rows held by worker slots now.';
COMMENT ON COLUMN files.batch_progress.done IS 'Rows done.';
COMMENT ON COLUMN files.batch_progress.failed IS 'Rows failed for good.';
COMMENT ON COLUMN files.batch_progress.cancelled IS 'Rows cancelled.';
COMMENT ON COLUMN files.batch_progress.percent IS 'Ended rows (done, failed, cancelled) as a percentage of total.';
COMMENT ON COLUMN files.batch_progress.rate IS 'Rows ended per second, averaged over about the last minute.';
COMMENT ON COLUMN files.batch_progress.eta IS 'Time left at the recent rate; NULL when finished or when nothing ended lately.';
COMMENT ON COLUMN files.batch_progress.created_at IS 'When the batch was created.';
COMMENT ON COLUMN files.batch_progress.finished_at IS 'When its last row ended; NULL while rows are open.';

-- +goose Down
DROP VIEW files.batch_progress;
DROP VIEW files.worker_metrics;
DROP VIEW files.queue_stats;
DROP VIEW files.queue_summary;
DROP VIEW files.active_workers;
