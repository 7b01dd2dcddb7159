-- Autoscaling signals: how many worker nodes would finish the outstanding work
-- within a target time, computed from the backlog, the recent time per attempt
-- and the slots per node. The settings live in a one-row table that a DBA
-- updates; the function takes them as arguments too, for what-if questions.

-- +goose Up
CREATE TABLE files.scaling_settings (
    singleton       boolean  PRIMARY KEY DEFAULT true,
    target_drain    interval NOT NULL DEFAULT '15 minutes',
    min_nodes       integer  NOT NULL DEFAULT 0,
    max_nodes       integer  NOT NULL DEFAULT 20,
    slots_per_node  integer,
    sample_window   interval NOT NULL DEFAULT '15 minutes',
    CONSTRAINT scaling_settings_one_row CHECK (singleton),
    CONSTRAINT scaling_settings_target_drain_positive CHECK (target_drain > '0'),
    CONSTRAINT scaling_settings_nodes_valid CHECK (min_nodes >= 0 AND max_nodes >= min_nodes),
    CONSTRAINT scaling_settings_slots_positive CHECK (slots_per_node >= 1),
    CONSTRAINT scaling_settings_sample_window_positive CHECK (sample_window > '0')
);
INSERT INTO files.scaling_settings DEFAULT VALUES;
COMMENT ON TABLE files.scaling_settings IS
    'The settings of files.scaling_hint: one row, to UPDATE (pgworker_admin may). '
    'Example: UPDATE files.scaling_settings SET target_drain = ''30 minutes'', min_nodes = 1, max_nodes = 50;';
COMMENT ON COLUMN files.scaling_settings.singleton IS 'Always true: keeps the table at one row.';
COMMENT ON COLUMN files.scaling_settings.target_drain IS
    'How long the outstanding rows (pending and running) may take to finish: the hint asks for the nodes that finish them within this time.';
COMMENT ON COLUMN files.scaling_settings.min_nodes IS 'The hint never asks for fewer nodes (0 lets an idle fleet scale to zero).';
COMMENT ON COLUMN files.scaling_settings.max_nodes IS 'The hint never asks for more nodes: keep it at the autoscaling group''s maximum.';
COMMENT ON COLUMN files.scaling_settings.slots_per_node IS
    'Slots of one node. NULL: measured from the live workers (active slots per process), else taken from the most recently started process, else 1.';
COMMENT ON COLUMN files.scaling_settings.sample_window IS
    'Attempts that ended (done or failed) within this window, among the newest 50 per live slot of the fleet (at most '
    '5,000), give the mean attempt time.';

-- +goose StatementBegin
CREATE FUNCTION files.scaling_hint(target_drain interval DEFAULT NULL, min_nodes integer DEFAULT NULL, max_nodes integer DEFAULT NULL)
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
-- Pending and running rows per queue, from the counts the SQL API keeps
-- (files.queue_summary): the cost follows neither the backlog nor the
-- table's history.
backlog AS (
    SELECT s.queue, s.pending, s.scheduled, s.running, now() - s.oldest_pending_age AS oldest
    FROM files.queue_summary s
),
-- Attempts carried to an outcome within the window, among the newest 50 per
-- slot that can have recorded them. files.attempts is written at the outcome,
-- so its primary key follows finished_at and its highest ids are the recent
-- history: one range of the primary key, of at most 5,000 attempts however
-- large and busy the fleet and however long its history. Time per attempt is
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
        SELECT coalesce(x.queue, (SELECT f.queue FROM files.files f WHERE f.id = x.file_id)) AS queue,
               extract(epoch FROM x.finished_at - x.started_at) AS busy_s
        FROM (SELECT y.file_id, y.queue, y.started_at, y.finished_at, y.outcome FROM files.attempts y ORDER BY y.id DESC LIMIT least(50 * w.slots, 5000)) x
        WHERE x.finished_at > now() - s.sample_window AND x.outcome IN ('done', 'failed')
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
           coalesce(b.running, 0) AS running,
           now() - b.oldest AS oldest_pending_age,
           coalesce(a.attempts, 0) AS recent_attempts,
           a.busy_s / nullif(a.attempts, 0) AS own_mean_s,
           sl.slots,
           sl.nodes,
           -- What still needs a slot: pending rows (none of a paused queue) and running ones.
           CASE WHEN q.paused THEN 0 ELSE coalesce(b.pending, 0) END + coalesce(b.running, 0) AS outstanding
    FROM files.queues q
    LEFT JOIN backlog b ON b.queue = q.queue
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
COMMENT ON FUNCTION files.scaling_hint(interval, integer, integer) IS
    'How many worker nodes the outstanding work needs: one line per queue and one for the whole fleet (queue NULL). '
    'Arguments left NULL come from files.scaling_settings. '
    'needed_nodes = ceil((pending + running) x mean_attempt_time / target_drain / slots_per_node); desired_nodes clamps it to [min_nodes, max_nodes]. '
    'Example: SELECT * FROM files.scaling_hint(target_drain => ''5 minutes'', max_nodes => 40);';

CREATE VIEW files.scaling_hint AS
SELECT * FROM files.scaling_hint();
COMMENT ON VIEW files.scaling_hint IS
    'files.scaling_hint() with the settings of files.scaling_settings: one line per queue, the last (queue NULL) for the whole fleet. '
    'Cheap enough to poll: it reads the pending and running rows, the live slots and the attempts of the sample window, not the whole history.';
COMMENT ON COLUMN files.scaling_hint.queue IS 'Queue name; NULL on the line for the whole fleet (paused queues'' pending rows left out).';
COMMENT ON COLUMN files.scaling_hint.paused IS 'Whether the queue is paused (its pending rows then need no node).';
COMMENT ON COLUMN files.scaling_hint.pending IS 'Pending rows, those waiting for a retry included.';
COMMENT ON COLUMN files.scaling_hint.scheduled IS 'Of the pending rows, those waiting for run_after (retry backoff).';
COMMENT ON COLUMN files.scaling_hint.running IS 'Rows being worked on.';
COMMENT ON COLUMN files.scaling_hint.oldest_pending_age IS 'Age of the oldest pending row.';
COMMENT ON COLUMN files.scaling_hint.recent_attempts IS
    'Attempts that ended done or failed within the sample window (among the newest 50 per live slot of the fleet, at most 5,000).';
COMMENT ON COLUMN files.scaling_hint.mean_attempt_time IS
    'Mean time from claim to outcome of those attempts (the fleet''s when the queue has none); NULL when nothing ended within the window.';
COMMENT ON COLUMN files.scaling_hint.nodes IS 'Worker processes (one per node) with an active slot serving the queue.';
COMMENT ON COLUMN files.scaling_hint.slots IS 'Active slots serving the queue.';
COMMENT ON COLUMN files.scaling_hint.slots_per_node IS 'Slots of one node: files.scaling_settings.slots_per_node, else measured.';
COMMENT ON COLUMN files.scaling_hint.needed_nodes IS
    'ceil((pending + running) x mean_attempt_time / target_drain / slots_per_node); without a mean attempt time, the nodes there are (at least 1) while rows are outstanding.';
COMMENT ON COLUMN files.scaling_hint.desired_nodes IS 'needed_nodes within [min_nodes, max_nodes]: what to set the autoscaling group''s desired capacity to.';
COMMENT ON COLUMN files.scaling_hint.backlog_per_instance IS
    '(pending + running) / nodes (/ 1 with no node): the custom metric for a target-tracking scaling policy.';
COMMENT ON COLUMN files.scaling_hint.target_backlog_per_instance IS
    'The target value for backlog_per_instance: target_drain / mean_attempt_time x slots_per_node; NULL without a mean attempt time.';

REVOKE ALL ON files.scaling_settings, files.scaling_hint FROM PUBLIC;
REVOKE ALL ON FUNCTION files.scaling_hint(interval, integer, integer) FROM PUBLIC;
GRANT SELECT ON files.scaling_settings, files.scaling_hint TO pgworker_worker, pgworker_reader;
GRANT EXECUTE ON FUNCTION files.scaling_hint(interval, integer, integer) TO pgworker_worker, pgworker_reader;
GRANT UPDATE (target_drain, min_nodes, max_nodes, slots_per_node, sample_window) ON files.scaling_settings TO pgworker_admin;

-- +goose Down
DROP VIEW files.scaling_hint;
DROP FUNCTION files.scaling_hint(interval, integer, integer);
DROP TABLE files.scaling_settings;
