-- Requeue the failed rows of one queue with a fresh attempt budget.
--   psql "$DATABASE_URL" -v queue=default -f sql/ops/requeue_failed.sql
\if :{?queue}
\else
\echo 'usage: psql -v queue=QUEUE -f sql/ops/requeue_failed.sql'
\quit
\endif
SELECT files.retry(NULL, :'queue') AS requeued;
