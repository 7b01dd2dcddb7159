-- The oldest pending rows of each queue: what waits longest, and why (retry backoff
-- shows as a run_after in the future and a last_error).
--   psql "$DATABASE_URL" -v limit=20 -f sql/ops/oldest_pending.sql
\if :{?limit}
\else
\set limit 20
\endif
\pset null '-'
SELECT id, queue, priority, source, attempt, max_attempts,
       date_trunc('second', now() - created_at) AS waiting,
       CASE WHEN run_after > now() THEN date_trunc('second', run_after - now()) END AS retry_in,
       left(last_error, 80) AS last_error
FROM files.files
WHERE state = 'pending'
ORDER BY created_at, id
LIMIT :limit;
