-- How each worker slot performs lately (its attempts of the last hour, among the
-- fleet's newest 10,000): processed, failed, failure rate, mean and p95 time.
--   psql "$DATABASE_URL" -f sql/ops/worker_metrics.sql
\pset null '-'
SELECT worker_id, node, state, processed, done, failed, lost, failure_rate,
       date_trunc('millisecond', mean_duration) AS mean,
       date_trunc('millisecond', p95_duration) AS p95,
       date_trunc('second', now() - last_seen) AS last_seen_ago
FROM files.worker_metrics
WHERE processed > 0 OR state IN ('active', 'draining')
ORDER BY node, worker_id;
