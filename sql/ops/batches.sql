-- Data sets: each open batch, and those that ended in the last day, with
-- their progress, the recent rate and the time left at that rate. Cheap at
-- any table size: it reads the counts the SQL API keeps (files.batch_counts).
--   psql "$DATABASE_URL" -f sql/ops/batches.sql
\pset null '-'
SELECT batch, total, done, failed, cancelled, running, pending,
       percent || '%' AS ended,
       round(rate * 60) AS per_minute,
       date_trunc('second', eta) AS eta,
       date_trunc('second', created_at) AS created,
       date_trunc('second', finished_at) AS finished
FROM files.batch_progress
WHERE finished_at IS NULL OR finished_at > now() - interval '1 day'
ORDER BY created_at, batch;
