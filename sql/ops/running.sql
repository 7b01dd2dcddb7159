-- What is running where and since when, longest first, and slots that have gone
-- silent (heartbeat older than their lease timeout: about to be reaped).
--   psql "$DATABASE_URL" -f sql/ops/running.sql
\pset null '-'
SELECT worker_id, node, pid, slot, state, file_id, queue, source, attempt,
       date_trunc('second', running_for) AS running_for,
       date_trunc('second', heartbeat_age) AS heartbeat_age
FROM files.active_workers
ORDER BY running_for DESC NULLS LAST, worker_id;

\echo 'Silent slots (no heartbeat within their lease timeout):'
SELECT w.worker_id, w.node, w.pid, w.state,
       date_trunc('second', now() - w.last_heartbeat_at) AS silent_for, w.lease_timeout,
       (SELECT count(*) FROM files.files f WHERE f.worker_id = w.worker_id AND f.state = 'running') AS rows_held
FROM files.workers w
WHERE w.state IN ('active', 'draining') AND w.last_heartbeat_at < now() - w.lease_timeout
ORDER BY w.last_heartbeat_at;
