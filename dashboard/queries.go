package dashboard

// The statements the dashboard sends. Each is bounded: it reads a view of
// the SQL API (files.queue_stats and files.batch_progress read the counts
// the SQL API keeps), an index, or a LIMIT of rows, and never counts over
// files.files.
const (
	// One line per queue and state (files.queue_stats), with when the
	// queue was paused.
	sqlQueues = `
SELECT s.queue, s.paused, q.paused_at, s.state, s.files, s.scheduled, s.oldest_pending_age,
       s.finished_last_minute, s.finished_last_hour
FROM files.queue_stats s
JOIN files.queues q ON q.queue = s.queue
ORDER BY s.queue`

	// The open batches and the newest finished ones (files.batch_progress
	// reads the counts the SQL API keeps, not files.files); at most $1.
	sqlBatches = `
SELECT b.batch, b.total, b.pending, b.running, b.done, b.failed, b.cancelled, b.rate, b.eta, b.created_at, b.finished_at
FROM files.batch_progress b
ORDER BY b.finished_at IS NOT NULL, b.finished_at DESC, b.created_at DESC, b.batch
LIMIT $1`

	// Live slots with the row each holds, and the slots that died in the
	// last hour; at most $1 lines.
	sqlWorkers = `
SELECT w.worker_id, w.node, w.pid, w.slot, w.state, w.version, w.started_at,
       now() - w.last_heartbeat_at AS heartbeat_age, w.lease_timeout, w.stopped_at,
       f.id, f.queue, left(f.source, $2), f.attempt, now() - f.claimed_at AS running_for
FROM files.workers w
LEFT JOIN files.files f ON f.worker_id = w.worker_id AND f.state = 'running'
WHERE w.state IN ('active', 'draining')
   OR (w.state = 'dead' AND w.stopped_at > now() - interval '1 hour')
ORDER BY w.node NULLS LAST, w.pid NULLS LAST, w.slot NULLS LAST, w.worker_id, f.id
LIMIT $1`

	// The newest $3 failed rows grouped by the first line of their error;
	// at most $1 groups, the largest first. The newest, read backwards
	// along the primary key: the cost follows $3 and how rare failures
	// are, not the table's size.
	sqlFailureGroups = `
SELECT left(split_part(coalesce(f.last_error, ''), E'\n', 1), $2) AS error,
       count(*) AS files, max(f.id) AS newest, max(f.finished_at) AS last_failed,
       (array_agg(DISTINCT f.queue))[1:5] AS queues
FROM (SELECT x.id, x.queue, x.last_error, x.finished_at FROM files.files x
      WHERE x.state = 'failed' ORDER BY x.id DESC LIMIT $3) f
GROUP BY 1
ORDER BY count(*) DESC, 1
LIMIT $1`

	// One page of the failed rows of a group, newest first, below the id
	// $2 (NULL: from the newest).
	sqlFailureRows = `
SELECT f.id, f.queue, left(f.source, $4), f.attempt, f.max_attempts, f.finished_at, left(f.last_error, $5)
FROM files.files f
WHERE f.state = 'failed'
  AND left(split_part(coalesce(f.last_error, ''), E'\n', 1), $1) = $6
  AND ($2::bigint IS NULL OR f.id < $2)
ORDER BY f.id DESC
LIMIT $3`

	// Attempts ended done or failed per minute over the last hour, from
	// the newest $1 attempts (files.attempts is written at the outcome, so
	// its primary key follows finished_at).
	sqlChart = `
SELECT extract(epoch FROM date_trunc('minute', a.finished_at))::bigint AS minute,
       count(*) FILTER (WHERE a.outcome = 'done') AS done,
       count(*) FILTER (WHERE a.outcome = 'failed') AS failed
FROM (SELECT x.finished_at, x.outcome FROM files.attempts x ORDER BY x.id DESC LIMIT $1) a
WHERE a.finished_at > now() - interval '1 hour'
GROUP BY 1
ORDER BY 1`

	// One row of files.files, long texts cut.
	sqlRow = `
SELECT f.id, f.queue, f.priority, left(f.source, $2), octet_length(f.source), f.state, f.worker_id, f.attempt,
       f.max_attempts, f.run_after, f.lease_expires_at, f.created_at, f.claimed_at, f.finished_at,
       left(f.last_error, $3), left(f.payload::text, $4), octet_length(f.payload::text),
       left(f.result::text, $5), octet_length(f.result::text), f.batch
FROM files.files f
WHERE f.id = $1`

	// The ended attempts of rows, newest first per row; at most $2.
	sqlAttempts = `
SELECT a.file_id, a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome, left(a.error, $3),
       a.exit_code, a.duration, right(a.stderr_tail, $4)
FROM files.attempts a
WHERE a.file_id = ANY ($1::bigint[])
ORDER BY a.file_id DESC, a.attempt DESC, a.id DESC
LIMIT $2`

	// For the pages whose queries stop at their first matches.
	sqlNoParallel = `SET LOCAL max_parallel_workers_per_gather = 0`

	// The result of a row, for its outputs.
	sqlResult = `SELECT f.result FROM files.files f WHERE f.id = $1`
)

// Bounds on what is read and shown.
const (
	maxWorkers      = 5000    // slots read
	listedSlots     = 200     // beyond, the Workers page sums up each node
	maxNodeName     = 256     // of a node= parameter
	maxBatches      = 50      // batches on the Overview
	maxGroups       = 100     // failure groups
	groupedFailures = 10_000  // newest failed rows grouped
	groupKeyChars   = 200     // characters of an error that name its group
	failurePage     = 50      // rows per page of a failure group
	chartAttempts   = 100_000 // newest attempts read for the chart
	maxSourceChars  = 2000    // of a source
	maxErrorChars   = 8000    // of an error
	maxStderrChars  = 8000    // of a stderr tail
	maxPayloadChars = 8000    // of a payload
	maxResultChars  = 1 << 20 // of a result (the manifest)
	maxAttempts     = 200     // attempts listed for one row
	maxOutputs      = 1000    // outputs listed for one row
	showChars       = 300     // of a text in a table cell
)
