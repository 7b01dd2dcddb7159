-- The SQL API: everything a worker or an operator does to the queue goes through
-- these functions, so a worker can be written in any language.
--
-- The functions are SECURITY DEFINER with a pinned search_path: the worker role may
-- execute them without holding write privileges on the tables.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION files.notify_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO files.queues (queue)
    SELECT DISTINCT n.queue FROM enqueued n
    WHERE NOT EXISTS (SELECT 1 FROM files.queues q WHERE q.queue = n.queue)
    ON CONFLICT DO NOTHING;

    PERFORM pg_notify('files_pending', d.queue)
    FROM (SELECT DISTINCT n.queue FROM enqueued n WHERE n.state = 'pending') d;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.notify_enqueued() IS
    'Statement trigger on INSERT and COPY: registers new queues and sends one files_pending notification per queue and statement.';

CREATE TRIGGER files_enqueued
    AFTER INSERT ON files.files
    REFERENCING NEW TABLE AS enqueued
    FOR EACH STATEMENT EXECUTE FUNCTION files.notify_enqueued();
COMMENT ON TRIGGER files_enqueued ON files.files IS
    'Wakes idle workers: NOTIFY files_pending with the queue name, once per statement and queue.';

-- +goose StatementBegin
CREATE FUNCTION files.claim(worker_id text, queues text[] DEFAULT NULL, max integer DEFAULT 1)
RETURNS SETOF files.files
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_state  text;
    v_lease  interval;
    v_queues text[];
BEGIN
    IF claim.worker_id IS NULL OR claim.worker_id = '' THEN
        RAISE EXCEPTION 'files.claim: worker_id must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF claim.max IS NULL OR claim.max < 1 THEN
        RAISE EXCEPTION 'files.claim: max must be at least 1 (got %)', coalesce(claim.max::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT w.state, w.lease_timeout INTO v_state, v_lease
    FROM files.workers w WHERE w.worker_id = claim.worker_id;
    IF v_state IS NULL OR v_state IN ('stopped', 'dead') THEN
        -- First claim of an unknown slot registers it; a claim proves a stopped or dead slot alive.
        INSERT INTO files.workers AS w (worker_id, queues) VALUES (claim.worker_id, claim.queues)
        ON CONFLICT (worker_id) DO UPDATE
            SET state = 'active', last_heartbeat_at = now(), stopped_at = NULL
        RETURNING w.state, w.lease_timeout INTO v_state, v_lease;
    ELSIF v_state = 'draining' THEN
        RETURN;
    END IF;

    SELECT array_agg(q.queue ORDER BY q.queue) INTO v_queues
    FROM files.queues q
    WHERE NOT q.paused AND (claim.queues IS NULL OR q.queue = ANY (claim.queues));
    IF v_queues IS NULL THEN
        RETURN;
    END IF;

    IF cardinality(v_queues) = 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT f.id FROM files.files f
            WHERE f.state = 'pending' AND f.queue = v_queues[1] AND f.run_after <= now()
            ORDER BY f.priority DESC, f.id
            LIMIT claim.max
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = claim.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + v_lease
            FROM picked WHERE f.id = picked.id
            RETURNING f.*
        ), logged AS (
            INSERT INTO files.attempts (file_id, attempt, worker_id)
            SELECT c.id, c.attempt, claim.worker_id FROM claimed c
        )
        SELECT c.* FROM claimed c ORDER BY c.priority DESC, c.id;
    ELSE
        -- Several queues: the best rows of each queue, then the best of those. Each
        -- queue's part is an index range scan of files_claim_idx.
        RETURN QUERY
        WITH picked AS (
            SELECT p.id FROM unnest(v_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT f.id, f.priority FROM files.files f
                WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
                ORDER BY f.priority DESC, f.id
                LIMIT claim.max
                FOR UPDATE SKIP LOCKED
            ) p
            ORDER BY p.priority DESC, p.id
            LIMIT claim.max
        ), claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = claim.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + v_lease
            FROM picked WHERE f.id = picked.id
            RETURNING f.*
        ), logged AS (
            INSERT INTO files.attempts (file_id, attempt, worker_id)
            SELECT c.id, c.attempt, claim.worker_id FROM claimed c
        )
        SELECT c.* FROM claimed c ORDER BY c.priority DESC, c.id;
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.claim(text, text[], integer) IS
    'Claims up to max claimable rows (pending, run_after passed, queue not paused) for a worker slot: '
    'larger priority first, then id; FOR UPDATE SKIP LOCKED. queues NULL = all queues. '
    'An unknown worker_id is registered. Zero rows, or SQLSTATE 40001/40P01 under stricter isolation, mean "wait again".';

-- +goose StatementBegin
CREATE FUNCTION files.get_unprocessed_entry_by_priority(worker_id text)
RETURNS SETOF files.files
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM files.claim(worker_id, NULL, 1);
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.get_unprocessed_entry_by_priority(text) IS
    'Claims zero or one row of any queue for worker_id: files.claim(worker_id, NULL, 1), for scripts and psql.';

-- +goose StatementBegin
CREATE FUNCTION files.complete(id bigint, worker_id text, attempt integer, result jsonb DEFAULT NULL, report jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE files.files f
    SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), result = complete.result
    WHERE f.id = complete.id AND f.state = 'running'
      AND f.worker_id = complete.worker_id AND f.attempt = complete.attempt;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    UPDATE files.attempts a
    SET outcome = 'done', finished_at = now(), output = complete.result,
        exit_code = (complete.report ->> 'exit_code')::integer,
        duration = coalesce((complete.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - a.started_at),
        stderr_tail = complete.report ->> 'stderr_tail'
    WHERE a.file_id = complete.id AND a.attempt = complete.attempt
      AND a.worker_id = complete.worker_id AND a.outcome IS NULL;
    RETURN true;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.complete(bigint, text, integer, jsonb, jsonb) IS
    'Fenced: marks the row done with result if worker_id still holds it in this attempt; otherwise returns false and changes nothing. '
    'report may carry exit_code, duration_ms and stderr_tail for files.attempts.';

-- +goose StatementBegin
CREATE FUNCTION files.fail(id bigint, worker_id text, attempt integer, error text, retryable boolean DEFAULT true, report jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r       files.files;
    v_base  interval;
    v_max   interval;
    v_delay interval;
    v_error text := coalesce(nullif(fail.error, ''), 'failed without an error message');
BEGIN
    SELECT f.* INTO r FROM files.files f
    WHERE f.id = fail.id AND f.state = 'running'
      AND f.worker_id = fail.worker_id AND f.attempt = fail.attempt
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    IF NOT coalesce(fail.retryable, true) OR r.attempt >= r.max_attempts THEN
        UPDATE files.files f
        SET state = 'failed', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), last_error = v_error
        WHERE f.id = r.id;
    ELSE
        SELECT q.backoff_base, q.backoff_max INTO v_base, v_max FROM files.queues q WHERE q.queue = r.queue;
        v_base := coalesce(v_base, interval '1 second');
        v_max := coalesce(v_max, interval '1 hour');
        -- Exponential backoff with "equal jitter": between half and all of base * 2^(attempt-1).
        v_delay := least(v_max, v_base * power(2, least(r.attempt - 1, 30)));
        v_delay := v_delay * (0.5 + random() * 0.5);
        UPDATE files.files f
        SET state = 'pending', worker_id = NULL, lease_expires_at = NULL, run_after = now() + v_delay, last_error = v_error
        WHERE f.id = r.id;
    END IF;

    UPDATE files.attempts a
    SET outcome = 'failed', finished_at = now(), error = v_error,
        exit_code = (fail.report ->> 'exit_code')::integer,
        duration = coalesce((fail.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - a.started_at),
        output = fail.report -> 'output',
        stderr_tail = fail.report ->> 'stderr_tail'
    WHERE a.file_id = r.id AND a.attempt = r.attempt AND a.worker_id = r.worker_id AND a.outcome IS NULL;
    RETURN true;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fail(bigint, text, integer, text, boolean, jsonb) IS
    'Fenced: records a failed attempt. The row is retried after an exponential backoff with jitter (files.queues.backoff_base, backoff_max) '
    'until max_attempts, or at once ends failed when retryable is false. Returns false and changes nothing if the attempt no longer holds the row.';

-- +goose StatementBegin
CREATE FUNCTION files.release(id bigint, worker_id text, attempt integer, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue text;
BEGIN
    UPDATE files.files f
    SET state = 'pending', worker_id = NULL, lease_expires_at = NULL, attempt = f.attempt - 1, run_after = now()
    WHERE f.id = release.id AND f.state = 'running'
      AND f.worker_id = release.worker_id AND f.attempt = release.attempt
    RETURNING f.queue INTO v_queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    UPDATE files.attempts a
    SET outcome = 'released', finished_at = now(), duration = now() - a.started_at,
        error = coalesce(release.reason, 'released')
    WHERE a.file_id = release.id AND a.attempt = release.attempt
      AND a.worker_id = release.worker_id AND a.outcome IS NULL;
    PERFORM pg_notify('files_pending', v_queue);
    RETURN true;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.release(bigint, text, integer, text) IS
    'Fenced: hands a running row back to the queue without spending an attempt (shutdown, drain). Returns false if the attempt no longer holds it.';

-- +goose StatementBegin
CREATE FUNCTION files.register_worker(
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
COMMENT ON FUNCTION files.register_worker(text, text, integer, integer, text, text[], interval) IS
    'Registers (or re-registers) a worker slot as active, with its node, pid, slot number, version, queues and lease timeout.';

-- +goose StatementBegin
CREATE FUNCTION files.heartbeat(VARIADIC worker_ids text[])
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
COMMENT ON FUNCTION files.heartbeat(text[]) IS
    'One call per process and interval: marks the slots alive, extends the leases of their running rows, and returns '
    'the rows (worker_id, file_id, attempt) they still hold. A row missing from the answer was lost: stop working on it.';

-- +goose StatementBegin
CREATE FUNCTION files.deregister_worker(worker_id text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := 0;
    r record;
BEGIN
    FOR r IN SELECT f.id, f.attempt FROM files.files f
             WHERE f.state = 'running' AND f.worker_id = deregister_worker.worker_id ORDER BY f.id
    LOOP
        IF files.release(r.id, deregister_worker.worker_id, r.attempt, 'worker deregistered') THEN
            n := n + 1;
        END IF;
    END LOOP;
    UPDATE files.workers w SET state = 'stopped', stopped_at = now()
    WHERE w.worker_id = deregister_worker.worker_id;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.deregister_worker(text) IS
    'Marks a slot stopped and releases the rows it still holds (without spending attempts). Returns how many rows were released.';

-- +goose StatementBegin
CREATE FUNCTION files.reap()
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

-- +goose StatementBegin
CREATE FUNCTION files.cancel(VARIADIC ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n      integer;
    v_told text[];
BEGIN
    WITH target AS (
        SELECT x.id, x.state, x.worker_id, x.attempt FROM files.files x
        WHERE x.id = ANY (cancel.ids) AND x.state IN ('pending', 'running')
        ORDER BY x.id FOR UPDATE
    ), cancelled AS (
        UPDATE files.files f
        SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL, finished_at = now()
        FROM target t WHERE f.id = t.id
        RETURNING f.id
    ), logged AS (
        UPDATE files.attempts a
        SET outcome = 'cancelled', finished_at = now(), duration = now() - a.started_at, error = 'cancelled'
        FROM target t
        WHERE t.state = 'running' AND a.file_id = t.id AND a.attempt = t.attempt
          AND a.worker_id = t.worker_id AND a.outcome IS NULL
    )
    SELECT count(*),
           array_agg(json_build_object('op', 'cancel', 'file_id', t.id, 'worker_id', t.worker_id)::text)
               FILTER (WHERE t.state = 'running')
    INTO n, v_told FROM target t;

    -- Running rows: tell their workers to stop the work.
    PERFORM pg_notify('files_control', m) FROM unnest(v_told) AS m;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.cancel(bigint[]) IS
    'Cancels pending or running rows (terminal state cancelled). The worker of a running row is told on channel files_control '
    'and its late outcome is refused by fencing. Returns the number of rows cancelled.';

-- +goose StatementBegin
CREATE FUNCTION files.retry(ids bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n        integer;
    v_queues text[];
BEGIN
    WITH target AS (
        SELECT x.id FROM files.files x
        WHERE (retry.queue IS NULL OR x.queue = retry.queue)
          AND CASE WHEN retry.ids IS NULL THEN x.state = 'failed'
                   ELSE x.id = ANY (retry.ids) AND x.state IN ('failed', 'cancelled', 'done') END
        ORDER BY x.id FOR UPDATE
    ), retried AS (
        UPDATE files.files f
        SET state = 'pending', attempt = 0, run_after = now(), finished_at = NULL, result = NULL
        FROM target t WHERE f.id = t.id
        RETURNING f.queue
    )
    SELECT count(*), array_agg(DISTINCT r.queue) INTO n, v_queues FROM retried r;

    PERFORM pg_notify('files_pending', q) FROM unnest(v_queues) AS q;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.retry(bigint[], text) IS
    'Puts rows back to pending with a fresh attempt budget. ids NULL: every failed row (of queue, if given); '
    'otherwise the given failed, cancelled or done rows. Returns the number of rows requeued.';

-- +goose StatementBegin
CREATE FUNCTION files.pause_queue(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO files.queues AS q (queue, paused, paused_at) VALUES (pause_queue.queue, true, now())
    ON CONFLICT (queue) DO UPDATE SET paused = true, paused_at = coalesce(q.paused_at, now());
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.pause_queue(text) IS
    'Stops handing out rows of a queue (running rows go on). Creates the queue if it does not exist yet.';

-- +goose StatementBegin
CREATE FUNCTION files.resume_queue(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE files.queues q SET paused = false, paused_at = NULL WHERE q.queue = resume_queue.queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'files.resume_queue: no queue named %', resume_queue.queue
            USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM pg_notify('files_pending', resume_queue.queue);
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.resume_queue(text) IS 'Hands out rows of a paused queue again and wakes the idle workers.';

-- +goose Down
DROP FUNCTION files.resume_queue(text);
DROP FUNCTION files.pause_queue(text);
DROP FUNCTION files.retry(bigint[], text);
DROP FUNCTION files.cancel(bigint[]);
DROP FUNCTION files.reap();
DROP FUNCTION files.deregister_worker(text);
DROP FUNCTION files.heartbeat(text[]);
DROP FUNCTION files.register_worker(text, text, integer, integer, text, text[], interval);
DROP FUNCTION files.release(bigint, text, integer, text);
DROP FUNCTION files.fail(bigint, text, integer, text, boolean, jsonb);
DROP FUNCTION files.complete(bigint, text, integer, jsonb, jsonb);
DROP FUNCTION files.get_unprocessed_entry_by_priority(text);
DROP FUNCTION files.claim(text, text[], integer);
DROP TRIGGER files_enqueued ON files.files;
DROP FUNCTION files.notify_enqueued();
