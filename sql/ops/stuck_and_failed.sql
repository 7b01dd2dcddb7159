-- Rows that need a person: failed rows with their errors, rows running past their
-- lease (their worker is silent), and rows that keep failing.
--   psql "$DATABASE_URL" -v queue=default -f sql/ops/stuck_and_failed.sql
\if :{?queue}
\else
\set queue ''
\endif
\pset null '-'
\echo 'Failed rows, most recent first:'
SELECT id, queue, source, attempt, date_trunc('second', finished_at) AS failed_at, left(last_error, 120) AS last_error
FROM files.files
WHERE state = 'failed' AND (:'queue' = '' OR queue = :'queue')
ORDER BY finished_at DESC
LIMIT 50;

\echo 'Failed rows by error (first line):'
SELECT queue, split_part(last_error, E'\n', 1) AS error, count(*) AS rows
FROM files.files
WHERE state = 'failed' AND (:'queue' = '' OR queue = :'queue')
GROUP BY 1, 2
ORDER BY rows DESC
LIMIT 20;

\echo 'Running rows whose lease has expired (files.reap will return them):'
SELECT id, queue, source, worker_id, attempt, date_trunc('second', now() - lease_expires_at) AS expired_for
FROM files.files
WHERE state = 'running' AND lease_expires_at < now() AND (:'queue' = '' OR queue = :'queue')
ORDER BY lease_expires_at;

\echo 'Pending rows that already failed more than once:'
SELECT id, queue, source, attempt, max_attempts, date_trunc('second', run_after - now()) AS retry_in, left(last_error, 80) AS last_error
FROM files.files
WHERE state = 'pending' AND attempt > 1 AND (:'queue' = '' OR queue = :'queue')
ORDER BY attempt DESC, id
LIMIT 50;
