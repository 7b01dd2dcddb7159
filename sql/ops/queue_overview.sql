-- Queue overview: rows per queue and state, the oldest pending age, throughput.
--   psql "$DATABASE_URL" -f sql/ops/queue_overview.sql
\pset null '-'
SELECT queue,
       CASE WHEN paused THEN 'paused' ELSE 'running' END AS queue_state,
       sum(files) FILTER (WHERE state = 'pending')   AS pending,
       sum(scheduled) FILTER (WHERE state = 'pending') AS waiting_retry,
       sum(files) FILTER (WHERE state = 'running')   AS running,
       sum(files) FILTER (WHERE state = 'done')      AS done,
       sum(files) FILTER (WHERE state = 'failed')    AS failed,
       sum(files) FILTER (WHERE state = 'cancelled') AS cancelled,
       date_trunc('second', max(oldest_pending_age)) AS oldest_pending,
       sum(finished_last_minute) FILTER (WHERE state = 'done') AS done_last_min,
       sum(finished_last_hour) FILTER (WHERE state = 'done')   AS done_last_hour
FROM files.queue_stats
GROUP BY queue, paused
ORDER BY queue;
