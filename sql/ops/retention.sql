-- Retention: how long each queue keeps its finished rows without a batch, how
-- old the oldest of them is (the first entry of files_finished_idx: cheap at
-- any table size), and each finished batch with when it may go. A dry run of
-- the pruner says how many rows it would delete: pgworker prune --dry-run.
--   psql "$DATABASE_URL" -f sql/ops/retention.sql
\pset null '-'
SELECT q.queue,
       coalesce(q.keep_done::text, 'forever') AS keep_done,
       coalesce(q.keep_failed::text, 'forever') AS keep_failed,
       date_trunc('second', now() - (SELECT min(f.finished_at) FROM files.files f
                                     WHERE f.queue = q.queue AND f.state = 'done' AND f.batch IS NULL)) AS oldest_done,
       date_trunc('second', now() - (SELECT min(f.finished_at) FROM files.files f
                                     WHERE f.queue = q.queue AND f.state = 'failed' AND f.batch IS NULL)) AS oldest_failed
FROM files.queues q
ORDER BY q.queue;

SELECT b.batch, b.total,
       date_trunc('second', b.finished_at) AS finished,
       coalesce(b.keep::text, 'until set') AS keep,
       CASE WHEN b.keep IS NULL THEN 'when a keep is set'
            WHEN b.finished_at + b.keep <= now() THEN 'at the next prune'
            ELSE 'in ' || date_trunc('minute', b.finished_at + b.keep - now())::text END AS goes
FROM files.batches b
WHERE b.finished_at IS NOT NULL
ORDER BY b.finished_at, b.batch;
