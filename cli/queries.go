package cli

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// The statements the commands run: calls of the SQL API and reads of the
// operator views (migrations/00002_api.sql, 00003_views.sql).
const (
	sqlRetry  = `SELECT files.retry($1::bigint[], $2::text)`
	sqlCancel = `SELECT files.cancel(VARIADIC $1::bigint[])`
	sqlPause  = `SELECT files.pause_queue($1)`
	sqlResume = `SELECT files.resume_queue($1)`

	sqlQueueExists = `SELECT EXISTS (SELECT 1 FROM files.queue_stats WHERE queue = $1)`

	sqlQueueStats = `
SELECT queue, paused, state, files, scheduled, oldest_pending_age, finished_last_minute, finished_last_hour
FROM files.queue_stats`

	sqlActiveWorkers = `
SELECT worker_id, node, pid, slot, state, version, started_at, last_heartbeat_at, heartbeat_age,
       file_id, queue, source, attempt, running_since, running_for, lease_expires_at
FROM files.active_workers
ORDER BY worker_id, file_id`

	// Workers that are live or were seen in the last hour, or all ($1).
	sqlWorkerMetrics = `
SELECT worker_id, node, pid, slot, state, processed, done, failed, lost, failure_rate,
       mean_duration, p95_duration, last_seen
FROM files.worker_metrics
WHERE $1 OR state IN ('active', 'draining') OR last_seen > now() - interval '1 hour'
ORDER BY worker_id`
)

// explain adds what to do to the database errors that have an obvious fix.
func explain(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "3F000", "42P01", "42883": // no schema, table or function
		return fmt.Errorf("%w (is the files schema installed? run 'pgworker migrate up')", err)
	case "42501": // insufficient privilege
		return fmt.Errorf("%w (grant this database user the pgworker_admin role, or pgworker_reader for status)", err)
	}
	return err
}
