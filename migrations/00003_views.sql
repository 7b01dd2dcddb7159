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

CREATE VIEW files.queue_stats AS
WITH counts AS (
    SELECT f.queue,
           f.state,
           count(*) AS files,
           count(*) FILTER (WHERE f.state = 'pending' AND f.run_after > now()) AS scheduled,
           min(f.created_at) FILTER (WHERE f.state = 'pending') AS oldest_pending,
           count(*) FILTER (WHERE f.finished_at > now() - interval '1 minute') AS finished_last_minute,
           count(*) FILTER (WHERE f.finished_at > now() - interval '1 hour') AS finished_last_hour
    FROM files.files f
    GROUP BY f.queue, f.state
)
SELECT q.queue,
       q.paused,
       q.max_running,
       q.fair_share,
       s.state,
       coalesce(c.files, 0) AS files,
       coalesce(c.scheduled, 0) AS scheduled,
       now() - c.oldest_pending AS oldest_pending_age,
       coalesce(c.finished_last_minute, 0) AS finished_last_minute,
       coalesce(c.finished_last_hour, 0) AS finished_last_hour
FROM files.queues q
CROSS JOIN (VALUES (1, 'pending'), (2, 'running'), (3, 'done'), (4, 'failed'), (5, 'cancelled')) AS s (ord, state)
LEFT JOIN counts c ON c.queue = q.queue AND c.state = s.state
ORDER BY q.queue, s.ord;
COMMENT ON VIEW files.queue_stats IS
    'One line per queue and state: how many rows, how many wait for a retry, the oldest pending age, and how many finished in the last minute and hour.';
COMMENT ON COLUMN files.queue_stats.queue IS 'Queue name.';
COMMENT ON COLUMN files.queue_stats.paused IS 'Whether the queue is paused.';
COMMENT ON COLUMN files.queue_stats.max_running IS 'The queue''s fleet-wide cap on running rows; NULL for none.';
COMMENT ON COLUMN files.queue_stats.fair_share IS 'Whether the queue''s batches take turns (files.queues.fair_share).';
COMMENT ON COLUMN files.queue_stats.state IS 'pending, running, done, failed or cancelled.';
COMMENT ON COLUMN files.queue_stats.files IS 'Rows of the queue in this state.';
COMMENT ON COLUMN files.queue_stats.scheduled IS 'Of the pending rows, those waiting for run_after (retry backoff).';
COMMENT ON COLUMN files.queue_stats.oldest_pending_age IS 'Age of the oldest pending row (pending line only).';
COMMENT ON COLUMN files.queue_stats.finished_last_minute IS 'Rows that reached this terminal state in the last minute.';
COMMENT ON COLUMN files.queue_stats.finished_last_hour IS 'Rows that reached this terminal state in the last hour.';

CREATE VIEW files.worker_metrics AS
SELECT w.worker_id,
       w.node,
       w.pid,
       w.slot,
       w.state,
       count(a.id) FILTER (WHERE a.outcome IN ('done', 'failed')) AS processed,
       count(a.id) FILTER (WHERE a.outcome = 'done') AS done,
       count(a.id) FILTER (WHERE a.outcome = 'failed') AS failed,
       count(a.id) FILTER (WHERE a.outcome = 'lost') AS lost,
       round(count(a.id) FILTER (WHERE a.outcome = 'failed')::numeric
             / nullif(count(a.id) FILTER (WHERE a.outcome IN ('done', 'failed')), 0), 4) AS failure_rate,
       avg(a.duration) FILTER (WHERE a.outcome IN ('done', 'failed')) AS mean_duration,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration)
           FILTER (WHERE a.outcome IN ('done', 'failed')) AS p95_duration,
       w.last_heartbeat_at AS last_seen
FROM files.workers w
LEFT JOIN files.attempts a ON a.worker_id = w.worker_id
GROUP BY w.worker_id;
COMMENT ON VIEW files.worker_metrics IS
    'Per worker slot: attempts carried to an outcome (processed = done + failed), lost attempts, failure rate, mean and p95 processing time, last seen.';
COMMENT ON COLUMN files.worker_metrics.worker_id IS 'Slot identity.';
COMMENT ON COLUMN files.worker_metrics.node IS 'Host name of the worker node.';
COMMENT ON COLUMN files.worker_metrics.pid IS 'Process id on the node.';
COMMENT ON COLUMN files.worker_metrics.slot IS 'Slot number within the process.';
COMMENT ON COLUMN files.worker_metrics.state IS 'active, draining, stopped or dead.';
COMMENT ON COLUMN files.worker_metrics.processed IS 'Attempts that ended done or failed.';
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
DROP VIEW files.active_workers;
