-- The database's outages are not the workers' silence. files.reap declared
-- slots dead once they had been silent past their lease timeout, counting from
-- the server's start at the earliest, so that a restart was not held against
-- them; but a failover (the promoted standby started long ago), a crash of one
-- backend (the postmaster does not restart) or a network or PgBouncer outage
-- between the whole fleet and the database left that count running, and the
-- first reap after such an outage took the rows of every live worker.
--
-- Now the first sign of life after a silence of the whole fleet (every live
-- slot silent past its lease timeout) is noted, whoever gives it (a heartbeat,
-- a registration or a reap), and silence counts from then at the earliest.
-- A worker that really died during the outage is reaped one lease timeout
-- after the fleet is heard from again.

-- +goose Up
CREATE TABLE files.reap_state (
    singleton        boolean     PRIMARY KEY DEFAULT true,
    fleet_resumed_at timestamptz NOT NULL DEFAULT '-infinity',
    CONSTRAINT reap_state_one_row CHECK (singleton)
);
INSERT INTO files.reap_state DEFAULT VALUES;
COMMENT ON TABLE files.reap_state IS
    'One row of bookkeeping for files.reap, kept by the SQL API.';
COMMENT ON COLUMN files.reap_state.singleton IS 'Always true: keeps the table at one row.';
COMMENT ON COLUMN files.reap_state.fleet_resumed_at IS
    'When the fleet was last heard from again after every live slot had been silent past its lease timeout (the database '
    'restarted or failed over, or the network or PgBouncer was down). files.reap counts silence from then at the earliest.';

-- +goose StatementBegin
CREATE FUNCTION files.fleet_heard()
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_silent boolean;
    v_since  timestamptz;
BEGIN
    -- If even the live slot heard from last has been silent past its lease,
    -- the whole fleet was: the caller is the first sign of life since. One
    -- index entry of workers_live_idx is read; the row is written once per
    -- outage.
    SELECT w.last_heartbeat_at < now() - w.lease_timeout INTO v_silent
    FROM files.workers w
    WHERE w.state IN ('active', 'draining')
    ORDER BY w.last_heartbeat_at DESC LIMIT 1;
    IF v_silent THEN
        -- Many first signs of life at once (every node reconnects): the others
        -- wait for the first to commit, then leave its time in place.
        UPDATE files.reap_state s SET fleet_resumed_at = now()
        WHERE s.fleet_resumed_at < now() - interval '1 second';
    END IF;
    SELECT greatest(s.fleet_resumed_at, pg_postmaster_start_time()) INTO v_since FROM files.reap_state s;
    RETURN coalesce(v_since, pg_postmaster_start_time());
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fleet_heard() IS
    'Called by files.heartbeat, files.register_worker and files.reap: notes the end of a silence of the whole fleet '
    '(files.reap_state) and returns the time from which a slot''s silence counts: the server''s start or the end of '
    'the fleet''s last silence, whichever is later.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.register_worker(
    worker_id text, node text DEFAULT NULL, pid integer DEFAULT NULL, slot integer DEFAULT NULL,
    version text DEFAULT NULL, queues text[] DEFAULT NULL, lease_timeout interval DEFAULT '15 seconds')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF register_worker.worker_id IS NULL OR register_worker.worker_id = '' THEN
        RAISE EXCEPTION 'files.register_worker: worker_id must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM files.fleet_heard();
    INSERT INTO files.workers AS w (worker_id, node, pid, slot, version, queues, lease_timeout)
    VALUES (register_worker.worker_id, register_worker.node, register_worker.pid, register_worker.slot,
            register_worker.version, register_worker.queues, coalesce(register_worker.lease_timeout, interval '15 seconds'))
    ON CONFLICT (worker_id) DO UPDATE
    SET node = EXCLUDED.node, pid = EXCLUDED.pid, slot = EXCLUDED.slot, version = EXCLUDED.version,
        queues = EXCLUDED.queues, lease_timeout = EXCLUDED.lease_timeout,
        state = 'active', started_at = now(), last_heartbeat_at = now(), stopped_at = NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.heartbeat(VARIADIC worker_ids text[])
RETURNS TABLE (worker_id text, file_id bigint, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM files.fleet_heard();
    -- Lock in a fixed order, as files.reap does, so that the two cannot deadlock.
    UPDATE files.workers w
    SET last_heartbeat_at = now(),
        state = CASE WHEN w.state = 'dead' THEN 'active' ELSE w.state END,
        stopped_at = CASE WHEN w.state = 'dead' THEN NULL ELSE w.stopped_at END
    FROM (SELECT x.worker_id FROM files.workers x
          WHERE x.worker_id = ANY (heartbeat.worker_ids)
          ORDER BY x.worker_id FOR UPDATE) l
    WHERE w.worker_id = l.worker_id;

    RETURN QUERY
    UPDATE files.files f
    SET lease_expires_at = now() + w.lease_timeout
    FROM (SELECT x.id FROM files.files x
          WHERE x.state = 'running' AND x.worker_id = ANY (heartbeat.worker_ids)
          ORDER BY x.id FOR UPDATE) l,
         files.workers w
    WHERE f.id = l.id AND w.worker_id = f.worker_id
    RETURNING f.worker_id, f.id, f.attempt;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.reap()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n        integer;
    v_queues text[];
    v_since  timestamptz;
BEGIN
    -- Every node may call reap at once: one does the work, the others return at once.
    IF NOT pg_try_advisory_xact_lock(hashtext('files.reap')) THEN
        RETURN 0;
    END IF;
    -- While the server was down, failing over, or out of the fleet's reach,
    -- nobody could heartbeat: a slot's silence counts from the server's start,
    -- and from the end of the fleet's last silence, at the earliest.
    v_since := files.fleet_heard();
    UPDATE files.workers w SET state = 'dead', stopped_at = now()
    FROM (SELECT x.worker_id FROM files.workers x
          WHERE x.state IN ('active', 'draining')
            AND greatest(x.last_heartbeat_at, v_since) < now() - x.lease_timeout
          ORDER BY x.worker_id FOR UPDATE SKIP LOCKED) l
    WHERE w.worker_id = l.worker_id;

    WITH expired AS (
        SELECT x.id, x.worker_id, x.attempt FROM files.files x
        LEFT JOIN files.workers w ON w.worker_id = x.worker_id
        WHERE x.state = 'running' AND x.lease_expires_at < now()
          AND v_since < now() - coalesce(w.lease_timeout, interval '15 seconds')
        ORDER BY x.id FOR UPDATE OF x SKIP LOCKED
    ), returned AS (
        UPDATE files.files f
        SET state = CASE WHEN f.attempt >= f.max_attempts THEN 'failed' ELSE 'pending' END,
            finished_at = CASE WHEN f.attempt >= f.max_attempts THEN now() END,
            worker_id = NULL, lease_expires_at = NULL, run_after = now(),
            last_error = format('lost: worker %s stopped heartbeating', e.worker_id)
        FROM expired e WHERE f.id = e.id
        RETURNING f.id, f.queue, f.state, f.last_error, e.worker_id, e.attempt
    ), logged AS (
        UPDATE files.attempts a
        SET outcome = 'lost', finished_at = now(), duration = now() - a.started_at, error = r.last_error
        FROM returned r
        WHERE a.file_id = r.id AND a.attempt = r.attempt AND a.worker_id = r.worker_id AND a.outcome IS NULL
    )
    SELECT count(*), array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'pending')
    INTO n, v_queues FROM returned r;

    PERFORM pg_notify('files_pending', q) FROM unnest(v_queues) AS q;
    RETURN n;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION files.reap() IS
    'Declares slots silent past their lease timeout dead and returns rows whose lease expired to the queue '
    '(attempt outcome lost; failed once max_attempts is spent). Silence counts from the server''s start and from the end '
    'of the last silence of the whole fleet (a database or network outage) at the earliest. Safe to call from every node '
    'at once. Returns the number of rows returned.';

REVOKE ALL ON files.reap_state FROM PUBLIC;
REVOKE ALL ON FUNCTION files.fleet_heard() FROM PUBLIC;
GRANT SELECT ON files.reap_state TO pgworker_worker, pgworker_reader;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.register_worker(
    worker_id text, node text DEFAULT NULL, pid integer DEFAULT NULL, slot integer DEFAULT NULL,
    version text DEFAULT NULL, queues text[] DEFAULT NULL, lease_timeout interval DEFAULT '15 seconds')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF register_worker.worker_id IS NULL OR register_worker.worker_id = '' THEN
        RAISE EXCEPTION 'files.register_worker: worker_id must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO files.workers AS w (worker_id, node, pid, slot, version, queues, lease_timeout)
    VALUES (register_worker.worker_id, register_worker.node, register_worker.pid, register_worker.slot,
            register_worker.version, register_worker.queues, coalesce(register_worker.lease_timeout, interval '15 seconds'))
    ON CONFLICT (worker_id) DO UPDATE
    SET node = EXCLUDED.node, pid = EXCLUDED.pid, slot = EXCLUDED.slot, version = EXCLUDED.version,
        queues = EXCLUDED.queues, lease_timeout = EXCLUDED.lease_timeout,
        state = 'active', started_at = now(), last_heartbeat_at = now(), stopped_at = NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.heartbeat(VARIADIC worker_ids text[])
RETURNS TABLE (worker_id text, file_id bigint, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- Lock in a fixed order, as files.reap does, so that the two cannot deadlock.
    UPDATE files.workers w
    SET last_heartbeat_at = now(),
        state = CASE WHEN w.state = 'dead' THEN 'active' ELSE w.state END,
        stopped_at = CASE WHEN w.state = 'dead' THEN NULL ELSE w.stopped_at END
    FROM (SELECT x.worker_id FROM files.workers x
          WHERE x.worker_id = ANY (heartbeat.worker_ids)
          ORDER BY x.worker_id FOR UPDATE) l
    WHERE w.worker_id = l.worker_id;

    RETURN QUERY
    UPDATE files.files f
    SET lease_expires_at = now() + w.lease_timeout
    FROM (SELECT x.id FROM files.files x
          WHERE x.state = 'running' AND x.worker_id = ANY (heartbeat.worker_ids)
          ORDER BY x.id FOR UPDATE) l,
         files.workers w
    WHERE f.id = l.id AND w.worker_id = f.worker_id
    RETURNING f.worker_id, f.id, f.attempt;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.reap()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n        integer;
    v_queues text[];
BEGIN
    -- Every node may call reap at once: one does the work, the others return at once.
    IF NOT pg_try_advisory_xact_lock(hashtext('files.reap')) THEN
        RETURN 0;
    END IF;
    -- While the server was down nobody could heartbeat: a slot's silence counts
    -- from the server's start at the earliest.
    UPDATE files.workers w SET state = 'dead', stopped_at = now()
    FROM (SELECT x.worker_id FROM files.workers x
          WHERE x.state IN ('active', 'draining')
            AND greatest(x.last_heartbeat_at, pg_postmaster_start_time()) < now() - x.lease_timeout
          ORDER BY x.worker_id FOR UPDATE SKIP LOCKED) l
    WHERE w.worker_id = l.worker_id;

    WITH expired AS (
        SELECT x.id, x.worker_id, x.attempt FROM files.files x
        LEFT JOIN files.workers w ON w.worker_id = x.worker_id
        WHERE x.state = 'running' AND x.lease_expires_at < now()
          AND pg_postmaster_start_time() < now() - coalesce(w.lease_timeout, interval '15 seconds')
        ORDER BY x.id FOR UPDATE OF x SKIP LOCKED
    ), returned AS (
        UPDATE files.files f
        SET state = CASE WHEN f.attempt >= f.max_attempts THEN 'failed' ELSE 'pending' END,
            finished_at = CASE WHEN f.attempt >= f.max_attempts THEN now() END,
            worker_id = NULL, lease_expires_at = NULL, run_after = now(),
            last_error = format('lost: worker %s stopped heartbeating', e.worker_id)
        FROM expired e WHERE f.id = e.id
        RETURNING f.id, f.queue, f.state, f.last_error, e.worker_id, e.attempt
    ), logged AS (
        UPDATE files.attempts a
        SET outcome = 'lost', finished_at = now(), duration = now() - a.started_at, error = r.last_error
        FROM returned r
        WHERE a.file_id = r.id AND a.attempt = r.attempt AND a.worker_id = r.worker_id AND a.outcome IS NULL
    )
    SELECT count(*), array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'pending')
    INTO n, v_queues FROM returned r;

    PERFORM pg_notify('files_pending', q) FROM unnest(v_queues) AS q;
    RETURN n;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION files.reap() IS
    'Declares slots silent past their lease timeout dead and returns rows whose lease expired to the queue '
    '(attempt outcome lost; failed once max_attempts is spent). Safe to call from every node at once. Returns the number of rows returned.';

DROP FUNCTION files.fleet_heard();
DROP TABLE files.reap_state;
