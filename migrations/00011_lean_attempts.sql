-- Fewer writes per outcome. Each outcome inserts a row into files.attempts,
-- and two things made that insert dearer than what they served:
--
-- - attempts_worker_idx, a B-tree entry per outcome at the place of its slot
--   (at 2,000 slots, 2,000 places), read by files.scaling_hint (the last 50
--   attempts of each slot) and by files.worker_metrics. The attempts are
--   written at their outcome, so the primary key follows finished_at: the hint
--   now takes the newest attempts, 50 per slot of the fleet, from one range of
--   it, the same bound without a second index. files.worker_metrics reads the
--   whole history instead of the listed slots' (about 0.4 s per million
--   attempts); a DBA who wants it back creates the index again.
-- - The foreign key to files.files, checked by one query per inserted row.
--   Every attempt is written by the SQL API from the files row it has just
--   updated and still holds locked, so the check could not fail. Its other
--   half, ON DELETE CASCADE, is kept by statement triggers: a DELETE of files
--   deletes their attempts in one statement (the cascade ran one per row),
--   and TRUNCATE files.files empties files.attempts too.
--
-- files.scaling_hint also runs with jit = off: its estimates passed the JIT
-- thresholds on large tables, and compiling took over a second per call
-- where the query itself takes 35 ms (1,000,000 attempts, 2,000 slots).

-- +goose Up
DROP INDEX files.attempts_worker_idx;

ALTER TABLE files.attempts DROP CONSTRAINT attempts_file_id_fkey;
COMMENT ON COLUMN files.attempts.file_id IS
    'The file (files.files.id). Written by the SQL API from the row it updates; deleting files deletes their attempts '
    '(trigger files_delete_attempts, no foreign key: its check cost a query per outcome).';

-- +goose StatementBegin
CREATE FUNCTION files.delete_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        BEGIN
            TRUNCATE files.attempts;
        EXCEPTION WHEN object_in_use THEN
            -- files.attempts is open in this session: named in the same
            -- TRUNCATE (then already empty) or read by an open cursor.
            DELETE FROM files.attempts;
        END;
    ELSE
        DELETE FROM files.attempts a USING gone g WHERE a.file_id = g.id;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.delete_attempts() IS
    'Trigger of files.files: the attempts of deleted files go with them (one DELETE per statement), and TRUNCATE files.files empties files.attempts.';
REVOKE ALL ON FUNCTION files.delete_attempts() FROM PUBLIC;

CREATE TRIGGER files_delete_attempts AFTER DELETE ON files.files
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION files.delete_attempts();
COMMENT ON TRIGGER files_delete_attempts ON files.files IS 'Deletes the attempts of the deleted rows, once per statement.';
CREATE TRIGGER files_truncate_attempts AFTER TRUNCATE ON files.files
    FOR EACH STATEMENT EXECUTE FUNCTION files.delete_attempts();
COMMENT ON TRIGGER files_truncate_attempts ON files.files IS 'TRUNCATE files.files empties files.attempts too.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.scaling_hint(target_drain interval DEFAULT NULL, min_nodes integer DEFAULT NULL, max_nodes integer DEFAULT NULL)
RETURNS TABLE (
    queue                       text,
    paused                      boolean,
    pending                     bigint,
    scheduled                   bigint,
    running                     bigint,
    oldest_pending_age          interval,
    recent_attempts             bigint,
    mean_attempt_time           interval,
    nodes                       integer,
    slots                       integer,
    slots_per_node              numeric,
    needed_nodes                integer,
    desired_nodes               integer,
    backlog_per_instance        numeric,
    target_backlog_per_instance numeric
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
WITH settings AS (
    SELECT extract(epoch FROM coalesce(scaling_hint.target_drain, c.target_drain)) AS drain_s,
           coalesce(scaling_hint.min_nodes, c.min_nodes) AS min_nodes,
           greatest(coalesce(scaling_hint.max_nodes, c.max_nodes), coalesce(scaling_hint.min_nodes, c.min_nodes)) AS max_nodes,
           c.slots_per_node,
           c.sample_window
    FROM files.scaling_settings c
    LIMIT 1
),
-- Active slots (draining ones are leaving), each with the process it runs in.
live AS (
    SELECT w.worker_id, w.queues, coalesce(w.node, '') || ':' || coalesce(w.pid::text, w.worker_id) AS process
    FROM files.workers w
    WHERE w.state = 'active'
),
-- With no live slot: the slots of the most recently started process.
last_process AS (
    SELECT count(*) AS slots
    FROM files.workers w
    JOIN (SELECT x.node, x.pid FROM files.workers x ORDER BY x.started_at DESC LIMIT 1) p
      ON w.node = p.node AND w.pid = p.pid
),
-- Pending rows, through the partial index files_claim_idx: the cost follows the
-- backlog, not the table's history.
backlog AS (
    SELECT f.queue,
           count(*) AS pending,
           count(*) FILTER (WHERE f.run_after > now()) AS scheduled,
           min(f.created_at) AS oldest
    FROM files.files f
    WHERE f.state = 'pending'
    GROUP BY f.queue
),
busy AS (
    SELECT f.queue, count(*) AS running
    FROM files.files f
    WHERE f.state = 'running'
    GROUP BY f.queue
),
-- Attempts carried to an outcome within the window, among the newest 50 per
-- slot that can have recorded them. files.attempts is written at the outcome,
-- so its primary key follows finished_at and its highest ids are the recent
-- history: one range of the primary key, bounded by the number of slots
-- however busy the fleet and however long its history. Time per attempt is
-- claim to outcome: what a slot is busy with, transfers included.
recent AS (
    SELECT a.queue, count(*) AS attempts, sum(a.busy_s) AS busy_s
    FROM settings s
    CROSS JOIN LATERAL (
        SELECT count(*) AS slots FROM files.workers w
        WHERE w.state IN ('active', 'draining')
           OR greatest(w.last_heartbeat_at, w.stopped_at) > now() - s.sample_window - 2 * w.lease_timeout
    ) w
    CROSS JOIN LATERAL (
        SELECT (SELECT f.queue FROM files.files f WHERE f.id = x.file_id) AS queue,
               extract(epoch FROM x.finished_at - x.started_at) AS busy_s
        FROM files.attempts x
        WHERE x.id > (SELECT max(y.id) FROM files.attempts y) - 50 * w.slots
          AND x.finished_at > now() - s.sample_window AND x.outcome IN ('done', 'failed')
    ) a
    GROUP BY a.queue
),
fleet AS (
    SELECT (SELECT count(*) FROM live) AS slots,
           (SELECT count(DISTINCT l.process) FROM live l) AS nodes,
           (SELECT sum(r.busy_s) / nullif(sum(r.attempts), 0) FROM recent r) AS mean_s,
           (SELECT sum(r.attempts) FROM recent r) AS attempts
),
per_queue AS (
    SELECT q.queue,
           q.paused,
           coalesce(b.pending, 0) AS pending,
           coalesce(b.scheduled, 0) AS scheduled,
           coalesce(r.running, 0) AS running,
           now() - b.oldest AS oldest_pending_age,
           coalesce(a.attempts, 0) AS recent_attempts,
           a.busy_s / nullif(a.attempts, 0) AS own_mean_s,
           sl.slots,
           sl.nodes,
           -- What still needs a slot: pending rows (none of a paused queue) and running ones.
           CASE WHEN q.paused THEN 0 ELSE coalesce(b.pending, 0) END + coalesce(r.running, 0) AS outstanding
    FROM files.queues q
    LEFT JOIN backlog b ON b.queue = q.queue
    LEFT JOIN busy r ON r.queue = q.queue
    LEFT JOIN recent a ON a.queue = q.queue
    CROSS JOIN LATERAL (
        SELECT count(*) AS slots, count(DISTINCT l.process) AS nodes
        FROM live l
        WHERE l.queues IS NULL OR q.queue = ANY (l.queues)
    ) sl
),
-- One line per queue, and one for the whole fleet (queue NULL), with the
-- mean attempt time of the queue (else of the fleet) and the slots per node.
lines AS (
    SELECT p.queue, p.paused, p.pending, p.scheduled, p.running, p.oldest_pending_age, p.recent_attempts,
           coalesce(p.own_mean_s, f.mean_s) AS mean_s,
           p.nodes, p.slots, p.outstanding,
           p.outstanding * coalesce(p.own_mean_s, f.mean_s) AS work_s,
           p.outstanding > 0 AND coalesce(p.own_mean_s, f.mean_s) IS NULL AS unmeasured,
           coalesce(s.slots_per_node, p.slots::numeric / nullif(p.nodes, 0), f.slots::numeric / nullif(f.nodes, 0),
                    nullif(lp.slots, 0), 1) AS spn
    FROM per_queue p, fleet f, settings s, last_process lp
    UNION ALL
    SELECT NULL, NULL,
           sum(p.pending) FILTER (WHERE NOT p.paused), sum(p.scheduled) FILTER (WHERE NOT p.paused), sum(p.running),
           max(p.oldest_pending_age) FILTER (WHERE NOT p.paused), f.attempts, f.mean_s,
           f.nodes, f.slots, sum(p.outstanding),
           sum(p.outstanding * coalesce(p.own_mean_s, f.mean_s)),
           bool_or(p.outstanding > 0 AND coalesce(p.own_mean_s, f.mean_s) IS NULL),
           coalesce(s.slots_per_node, f.slots::numeric / nullif(f.nodes, 0), nullif(lp.slots, 0), 1)
    FROM fleet f CROSS JOIN settings s CROSS JOIN last_process lp
    LEFT JOIN per_queue p ON true
    GROUP BY f.attempts, f.mean_s, f.nodes, f.slots, s.slots_per_node, lp.slots
),
hint AS (
    SELECT l.*,
           -- Without a measured attempt time, keep the nodes there are (at least one)
           -- until attempts end and tell how long they take.
           CASE WHEN l.unmeasured THEN greatest(l.nodes, 1, ceil(coalesce(l.work_s, 0) / s.drain_s / l.spn))
                ELSE ceil(coalesce(l.work_s, 0) / s.drain_s / l.spn) END::integer AS needed
    FROM lines l, settings s
)
SELECT h.queue,
       h.paused,
       coalesce(h.pending, 0)::bigint,
       coalesce(h.scheduled, 0)::bigint,
       coalesce(h.running, 0)::bigint,
       h.oldest_pending_age,
       coalesce(h.recent_attempts, 0)::bigint,
       make_interval(secs => h.mean_s),
       h.nodes::integer,
       h.slots::integer,
       round(h.spn, 2),
       h.needed,
       least(greatest(h.needed, s.min_nodes), s.max_nodes),
       round(coalesce(h.outstanding, 0) / greatest(h.nodes, 1), 2),
       round(s.drain_s / nullif(h.mean_s, 0) * h.spn, 2)
FROM hint h, settings s
ORDER BY h.queue IS NULL, h.queue;
$$;
-- +goose StatementEnd
COMMENT ON COLUMN files.scaling_settings.sample_window IS
    'Attempts that ended (done or failed) within this window, among the newest 50 per live slot of the fleet, give the mean attempt time.';
COMMENT ON COLUMN files.scaling_hint.recent_attempts IS
    'Attempts that ended done or failed within the sample window (among the newest 50 per live slot of the fleet).';

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.scaling_hint(target_drain interval DEFAULT NULL, min_nodes integer DEFAULT NULL, max_nodes integer DEFAULT NULL)
RETURNS TABLE (
    queue                       text,
    paused                      boolean,
    pending                     bigint,
    scheduled                   bigint,
    running                     bigint,
    oldest_pending_age          interval,
    recent_attempts             bigint,
    mean_attempt_time           interval,
    nodes                       integer,
    slots                       integer,
    slots_per_node              numeric,
    needed_nodes                integer,
    desired_nodes               integer,
    backlog_per_instance        numeric,
    target_backlog_per_instance numeric
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH settings AS (
    SELECT extract(epoch FROM coalesce(scaling_hint.target_drain, c.target_drain)) AS drain_s,
           coalesce(scaling_hint.min_nodes, c.min_nodes) AS min_nodes,
           greatest(coalesce(scaling_hint.max_nodes, c.max_nodes), coalesce(scaling_hint.min_nodes, c.min_nodes)) AS max_nodes,
           c.slots_per_node,
           c.sample_window
    FROM files.scaling_settings c
    LIMIT 1
),
-- Active slots (draining ones are leaving), each with the process it runs in.
live AS (
    SELECT w.worker_id, w.queues, coalesce(w.node, '') || ':' || coalesce(w.pid::text, w.worker_id) AS process
    FROM files.workers w
    WHERE w.state = 'active'
),
-- With no live slot: the slots of the most recently started process.
last_process AS (
    SELECT count(*) AS slots
    FROM files.workers w
    JOIN (SELECT x.node, x.pid FROM files.workers x ORDER BY x.started_at DESC LIMIT 1) p
      ON w.node = p.node AND w.pid = p.pid
),
-- Pending rows, through the partial index files_claim_idx: the cost follows the
-- backlog, not the table's history.
backlog AS (
    SELECT f.queue,
           count(*) AS pending,
           count(*) FILTER (WHERE f.run_after > now()) AS scheduled,
           min(f.created_at) AS oldest
    FROM files.files f
    WHERE f.state = 'pending'
    GROUP BY f.queue
),
busy AS (
    SELECT f.queue, count(*) AS running
    FROM files.files f
    WHERE f.state = 'running'
    GROUP BY f.queue
),
-- Attempts carried to an outcome within the window, at most the last 50 of
-- each slot, found through the slots that can have recorded them (index
-- attempts_worker_idx): the cost is bounded by the number of slots, however
-- busy the fleet and however long its history. Time per attempt is claim to
-- outcome: what a slot is busy with, transfers included.
recent AS (
    SELECT a.queue, count(*) AS attempts, sum(a.busy_s) AS busy_s
    FROM settings s
    CROSS JOIN LATERAL (
        SELECT w.worker_id FROM files.workers w
        WHERE w.state IN ('active', 'draining')
           OR greatest(w.last_heartbeat_at, w.stopped_at) > now() - s.sample_window - 2 * w.lease_timeout
    ) w
    CROSS JOIN LATERAL (
        SELECT (SELECT f.queue FROM files.files f WHERE f.id = x.file_id) AS queue,
               extract(epoch FROM x.finished_at - x.started_at) AS busy_s
        FROM files.attempts x
        WHERE x.worker_id = w.worker_id AND x.finished_at > now() - s.sample_window AND x.outcome IN ('done', 'failed')
        ORDER BY x.finished_at DESC
        LIMIT 50
    ) a
    GROUP BY a.queue
),
fleet AS (
    SELECT (SELECT count(*) FROM live) AS slots,
           (SELECT count(DISTINCT l.process) FROM live l) AS nodes,
           (SELECT sum(r.busy_s) / nullif(sum(r.attempts), 0) FROM recent r) AS mean_s,
           (SELECT sum(r.attempts) FROM recent r) AS attempts
),
per_queue AS (
    SELECT q.queue,
           q.paused,
           coalesce(b.pending, 0) AS pending,
           coalesce(b.scheduled, 0) AS scheduled,
           coalesce(r.running, 0) AS running,
           now() - b.oldest AS oldest_pending_age,
           coalesce(a.attempts, 0) AS recent_attempts,
           a.busy_s / nullif(a.attempts, 0) AS own_mean_s,
           sl.slots,
           sl.nodes,
           -- What still needs a slot: pending rows (none of a paused queue) and running ones.
           CASE WHEN q.paused THEN 0 ELSE coalesce(b.pending, 0) END + coalesce(r.running, 0) AS outstanding
    FROM files.queues q
    LEFT JOIN backlog b ON b.queue = q.queue
    LEFT JOIN busy r ON r.queue = q.queue
    LEFT JOIN recent a ON a.queue = q.queue
    CROSS JOIN LATERAL (
        SELECT count(*) AS slots, count(DISTINCT l.process) AS nodes
        FROM live l
        WHERE l.queues IS NULL OR q.queue = ANY (l.queues)
    ) sl
),
-- One line per queue, and one for the whole fleet (queue NULL), with the
-- mean attempt time of the queue (else of the fleet) and the slots per node.
lines AS (
    SELECT p.queue, p.paused, p.pending, p.scheduled, p.running, p.oldest_pending_age, p.recent_attempts,
           coalesce(p.own_mean_s, f.mean_s) AS mean_s,
           p.nodes, p.slots, p.outstanding,
           p.outstanding * coalesce(p.own_mean_s, f.mean_s) AS work_s,
           p.outstanding > 0 AND coalesce(p.own_mean_s, f.mean_s) IS NULL AS unmeasured,
           coalesce(s.slots_per_node, p.slots::numeric / nullif(p.nodes, 0), f.slots::numeric / nullif(f.nodes, 0),
                    nullif(lp.slots, 0), 1) AS spn
    FROM per_queue p, fleet f, settings s, last_process lp
    UNION ALL
    SELECT NULL, NULL,
           sum(p.pending) FILTER (WHERE NOT p.paused), sum(p.scheduled) FILTER (WHERE NOT p.paused), sum(p.running),
           max(p.oldest_pending_age) FILTER (WHERE NOT p.paused), f.attempts, f.mean_s,
           f.nodes, f.slots, sum(p.outstanding),
           sum(p.outstanding * coalesce(p.own_mean_s, f.mean_s)),
           bool_or(p.outstanding > 0 AND coalesce(p.own_mean_s, f.mean_s) IS NULL),
           coalesce(s.slots_per_node, f.slots::numeric / nullif(f.nodes, 0), nullif(lp.slots, 0), 1)
    FROM fleet f CROSS JOIN settings s CROSS JOIN last_process lp
    LEFT JOIN per_queue p ON true
    GROUP BY f.attempts, f.mean_s, f.nodes, f.slots, s.slots_per_node, lp.slots
),
hint AS (
    SELECT l.*,
           -- Without a measured attempt time, keep the nodes there are (at least one)
           -- until attempts end and tell how long they take.
           CASE WHEN l.unmeasured THEN greatest(l.nodes, 1, ceil(coalesce(l.work_s, 0) / s.drain_s / l.spn))
                ELSE ceil(coalesce(l.work_s, 0) / s.drain_s / l.spn) END::integer AS needed
    FROM lines l, settings s
)
SELECT h.queue,
       h.paused,
       coalesce(h.pending, 0)::bigint,
       coalesce(h.scheduled, 0)::bigint,
       coalesce(h.running, 0)::bigint,
       h.oldest_pending_age,
       coalesce(h.recent_attempts, 0)::bigint,
       make_interval(secs => h.mean_s),
       h.nodes::integer,
       h.slots::integer,
       round(h.spn, 2),
       h.needed,
       least(greatest(h.needed, s.min_nodes), s.max_nodes),
       round(coalesce(h.outstanding, 0) / greatest(h.nodes, 1), 2),
       round(s.drain_s / nullif(h.mean_s, 0) * h.spn, 2)
FROM hint h, settings s
ORDER BY h.queue IS NULL, h.queue;
$$;
-- +goose StatementEnd
COMMENT ON COLUMN files.scaling_settings.sample_window IS
    'Attempts that ended (done or failed) within this window, at most the last 50 of each slot, give the mean attempt time.';
COMMENT ON COLUMN files.scaling_hint.recent_attempts IS 'Attempts that ended done or failed within the sample window (at most the last 50 of each slot).';

DROP TRIGGER files_truncate_attempts ON files.files;
DROP TRIGGER files_delete_attempts ON files.files;
DROP FUNCTION files.delete_attempts();
-- Attempts of files deleted in the meantime would fail the constraint.
DELETE FROM files.attempts a WHERE NOT EXISTS (SELECT 1 FROM files.files f WHERE f.id = a.file_id);
ALTER TABLE files.attempts ADD CONSTRAINT attempts_file_id_fkey
    FOREIGN KEY (file_id) REFERENCES files.files (id) ON DELETE CASCADE;
COMMENT ON COLUMN files.attempts.file_id IS 'The file (files.files.id).';

CREATE INDEX attempts_worker_idx ON files.attempts (worker_id, finished_at);
COMMENT ON INDEX files.attempts_worker_idx IS 'Attempts by slot, for files.worker_metrics.';
