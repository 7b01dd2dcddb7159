-- An attempt's history row is written once, when the attempt ends. Until now
-- a claim inserted an open row into files.attempts and the outcome updated it:
-- two writes and a dead tuple per attempt, with new entries in all three
-- indexes of the table each time, for a row that repeated what files.files
-- already says of a running attempt (worker_id, attempt, claimed_at). That was
-- a third of the database's work per row at high throughput.
--
-- Now files.files alone describes a running attempt, and the functions that end
-- one (complete, fail, release, reap, cancel) insert its history row, with
-- started_at = the row's claimed_at. files.complete_many records a batch in
-- one set-based statement instead of one files.complete call per row.
--
-- Open rows left by the previous functions (attempts running during the
-- upgrade) are removed: their outcome inserts a complete row. Down puts open
-- rows back for the running attempts.

-- +goose Up
DELETE FROM files.attempts WHERE outcome IS NULL;

COMMENT ON TABLE files.attempts IS
    'History: one row per ended attempt at a file, written when the attempt ends. A running attempt is described by its '
    'files.files row (worker_id, attempt, claimed_at).';
COMMENT ON COLUMN files.attempts.attempt IS
    'Attempt number of the file (a released attempt''s number is used again).';
COMMENT ON COLUMN files.attempts.started_at IS 'When the attempt was claimed (files.files.claimed_at).';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim(worker_id text, queues text[] DEFAULT NULL, max integer DEFAULT 1)
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

    -- The best rows of each queue (an index range scan of files_claim_idx
    -- each), then the best of those.
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
    )
    SELECT c.* FROM claimed c ORDER BY c.priority DESC, c.id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL)
RETURNS SETOF files.files
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids    text[];
    v_queues text[];
    v_leases interval[];
    v_rows   bigint[];
    v_revive boolean;
BEGIN
    IF claim_batch.worker_ids IS NULL OR cardinality(claim_batch.worker_ids) = 0
       OR array_position(claim_batch.worker_ids, NULL) IS NOT NULL OR '' = ANY (claim_batch.worker_ids) THEN
        RAISE EXCEPTION 'files.claim_batch: worker_ids must be a non-empty array of non-empty ids'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    -- The active slots, each once, in the order given; draining ones take
    -- nothing. An unknown slot is registered, and a claim proves a stopped or
    -- dead slot alive: both cost a second look, the usual claim one join.
    SELECT array_agg(s.id ORDER BY s.ord), array_agg(w.lease_timeout ORDER BY s.ord),
           bool_or(w.state IS DISTINCT FROM 'active')
    INTO v_ids, v_leases, v_revive
    FROM (SELECT u.id, min(u.ord) AS ord
          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
          GROUP BY u.id) s
    LEFT JOIN files.workers w ON w.worker_id = s.id
    WHERE w.state IS DISTINCT FROM 'draining';
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_revive THEN
        INSERT INTO files.workers AS w (worker_id, queues)
        SELECT u.id, claim_batch.queues FROM unnest(v_ids) AS u(id)
        ORDER BY u.id
        ON CONFLICT (worker_id) DO UPDATE
            SET state = 'active', last_heartbeat_at = now(), stopped_at = NULL
            WHERE w.state IN ('stopped', 'dead');
        SELECT array_agg(u.id ORDER BY u.ord), array_agg(w.lease_timeout ORDER BY u.ord) INTO v_ids, v_leases
        FROM unnest(v_ids) WITH ORDINALITY AS u(id, ord)
        JOIN files.workers w ON w.worker_id = u.id
        WHERE w.state = 'active';
        IF v_ids IS NULL THEN
            RETURN;
        END IF;
    END IF;

    SELECT array_agg(q.queue ORDER BY q.queue) INTO v_queues
    FROM files.queues q
    WHERE NOT q.paused AND (claim_batch.queues IS NULL OR q.queue = ANY (claim_batch.queues));
    IF v_queues IS NULL THEN
        RETURN;
    END IF;

    -- Lock the rows to take: the best rows of each queue (an index range scan
    -- of files_claim_idx each), then the best of those.
    SELECT array_agg(p.id ORDER BY p.priority DESC, p.id) INTO v_rows
    FROM (
        SELECT l.id, l.priority FROM unnest(v_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT f.id, f.priority FROM files.files f
            WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
            ORDER BY f.priority DESC, f.id
            LIMIT cardinality(v_ids)
            FOR UPDATE SKIP LOCKED
        ) l
        ORDER BY l.priority DESC, l.id
        LIMIT cardinality(v_ids)
    ) p;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;

    -- The i-th best row goes to the i-th slot: one unnest zips the arrays and
    -- drives one primary-key lookup per row, the only plan that fits (a
    -- condition "id = ANY (v_rows)" beside the join would let a generic plan
    -- rescan the arrays for each row: quadratic).
    RETURN QUERY
    WITH claimed AS (
        UPDATE files.files f
        SET state = 'running', worker_id = p.worker_id, attempt = f.attempt + 1,
            claimed_at = now(), lease_expires_at = now() + p.lease_timeout
        FROM unnest(v_rows, v_ids[1:cardinality(v_rows)], v_leases[1:cardinality(v_rows)])
             AS p(id, worker_id, lease_timeout)
        WHERE f.id = p.id
        RETURNING f.*
    )
    SELECT c.* FROM claimed c ORDER BY c.priority DESC, c.id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.complete(id bigint, worker_id text, attempt integer, result jsonb DEFAULT NULL, report jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN EXISTS (SELECT 1 FROM files.complete_many(ARRAY[complete.id], ARRAY[complete.worker_id],
                                                      ARRAY[complete.attempt], ARRAY[complete.result],
                                                      ARRAY[complete.report]));
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.complete_many(
    ids bigint[], worker_ids text[], attempts integer[], results jsonb[] DEFAULT NULL, reports jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.worker_ids)
       OR cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.attempts)
       OR (complete_many.results IS NOT NULL AND cardinality(complete_many.results) <> cardinality(complete_many.ids))
       OR (complete_many.reports IS NOT NULL AND cardinality(complete_many.reports) <> cardinality(complete_many.ids)) THEN
        RAISE EXCEPTION 'files.complete_many: ids, worker_ids, attempts, results and reports must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- One statement for the batch, one primary-key lookup per element, in id
    -- order (as files.heartbeat locks, so that the two cannot deadlock). The
    -- fence is worker_id and attempt: a row has a worker_id only while it runs
    -- (files_worker_iff_running). Nothing here lets the planner prefer a scan
    -- of the running rows or a join that rescans the arrays, with fresh
    -- statistics or stale ones, in custom or generic plans. An id given twice
    -- is recorded once.
    RETURN QUERY
    WITH done AS (
        UPDATE files.files f
        SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), result = u.result
        FROM (SELECT x.* FROM unnest(complete_many.ids, complete_many.worker_ids, complete_many.attempts,
                                     complete_many.results, complete_many.reports)
                              AS x(id, worker_id, attempt, result, report)
              ORDER BY x.id) u
        WHERE f.id = u.id AND f.worker_id = u.worker_id AND f.attempt = u.attempt
        RETURNING f.id, u.worker_id, u.attempt, f.claimed_at, u.result, u.report
    ), logged AS (
        INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome,
                                    exit_code, duration, output, stderr_tail)
        SELECT d.id, d.attempt, d.worker_id, coalesce(d.claimed_at, now()), now(), 'done',
               (d.report ->> 'exit_code')::integer,
               coalesce((d.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - d.claimed_at),
               d.result, d.report ->> 'stderr_tail'
        FROM done d
    )
    SELECT d.id FROM done d;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) IS
    'Fenced, batched files.complete: element i of each array describes one row. Marks done each row still held by its '
    'worker_id in its attempt, in one statement, and returns the ids it marked; the others are left unchanged.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.fail(id bigint, worker_id text, attempt integer, error text, retryable boolean DEFAULT true, report jsonb DEFAULT NULL)
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

    INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error,
                                exit_code, duration, output, stderr_tail)
    VALUES (r.id, r.attempt, r.worker_id, coalesce(r.claimed_at, now()), now(), 'failed', v_error,
            (fail.report ->> 'exit_code')::integer,
            coalesce((fail.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - r.claimed_at),
            fail.report -> 'output', fail.report ->> 'stderr_tail');
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.release(id bigint, worker_id text, attempt integer, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue   text;
    v_claimed timestamptz;
BEGIN
    UPDATE files.files f
    SET state = 'pending', worker_id = NULL, lease_expires_at = NULL, attempt = f.attempt - 1, run_after = now()
    WHERE f.id = release.id AND f.state = 'running'
      AND f.worker_id = release.worker_id AND f.attempt = release.attempt
    RETURNING f.queue, f.claimed_at INTO v_queue, v_claimed;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error, duration)
    VALUES (release.id, release.attempt, release.worker_id, coalesce(v_claimed, now()), now(), 'released',
            coalesce(release.reason, 'released'), now() - coalesce(v_claimed, now()));
    PERFORM pg_notify('files_pending', v_queue);
    RETURN true;
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
        SELECT x.id, x.worker_id, x.attempt, x.claimed_at FROM files.files x
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
        RETURNING f.id, f.queue, f.state, f.last_error, e.worker_id, e.attempt, e.claimed_at
    ), logged AS (
        INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error, duration)
        SELECT r.id, r.attempt, r.worker_id, coalesce(r.claimed_at, now()), now(), 'lost', r.last_error,
               now() - coalesce(r.claimed_at, now())
        FROM returned r
    )
    SELECT count(*), array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'pending')
    INTO n, v_queues FROM returned r;

    PERFORM pg_notify('files_pending', q) FROM unnest(v_queues) AS q;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.cancel(VARIADIC ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n      integer;
    v_told text[];
BEGIN
    WITH target AS (
        SELECT x.id, x.state, x.worker_id, x.attempt, x.claimed_at FROM files.files x
        WHERE x.id = ANY (cancel.ids) AND x.state IN ('pending', 'running')
        ORDER BY x.id FOR UPDATE
    ), cancelled AS (
        UPDATE files.files f
        SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL, finished_at = now()
        FROM target t WHERE f.id = t.id
        RETURNING f.id
    ), logged AS (
        INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error, duration)
        SELECT t.id, t.attempt, t.worker_id, coalesce(t.claimed_at, now()), now(), 'cancelled', 'cancelled',
               now() - coalesce(t.claimed_at, now())
        FROM target t WHERE t.state = 'running'
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

-- +goose Down
-- The functions as migrations 00002, 00005 and 00007 left them, and an open
-- history row for each running attempt, as they expect.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim(worker_id text, queues text[] DEFAULT NULL, max integer DEFAULT 1)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL)
RETURNS SETOF files.files
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids    text[];
    v_queues text[];
    v_leases interval[];
    v_rows   bigint[];
BEGIN
    IF claim_batch.worker_ids IS NULL OR cardinality(claim_batch.worker_ids) = 0
       OR array_position(claim_batch.worker_ids, NULL) IS NOT NULL OR '' = ANY (claim_batch.worker_ids) THEN
        RAISE EXCEPTION 'files.claim_batch: worker_ids must be a non-empty array of non-empty ids'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    -- As with files.claim: an unknown slot is registered, and a claim proves a
    -- stopped or dead slot alive.
    IF EXISTS (SELECT 1 FROM unnest(claim_batch.worker_ids) AS u(id)
               LEFT JOIN files.workers w ON w.worker_id = u.id
               WHERE w.worker_id IS NULL OR w.state IN ('stopped', 'dead')) THEN
        INSERT INTO files.workers AS w (worker_id, queues)
        SELECT DISTINCT u.id, claim_batch.queues FROM unnest(claim_batch.worker_ids) AS u(id)
        ORDER BY u.id
        ON CONFLICT (worker_id) DO UPDATE
            SET state = 'active', last_heartbeat_at = now(), stopped_at = NULL
            WHERE w.state IN ('stopped', 'dead');
    END IF;

    -- Draining slots take nothing; each other slot takes at most one row.
    SELECT array_agg(s.id ORDER BY s.ord), array_agg(w.lease_timeout ORDER BY s.ord) INTO v_ids, v_leases
    FROM (SELECT u.id, min(u.ord) AS ord
          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
          GROUP BY u.id) s
    JOIN files.workers w ON w.worker_id = s.id
    WHERE w.state = 'active';
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    SELECT array_agg(q.queue ORDER BY q.queue) INTO v_queues
    FROM files.queues q
    WHERE NOT q.paused AND (claim_batch.queues IS NULL OR q.queue = ANY (claim_batch.queues));
    IF v_queues IS NULL THEN
        RETURN;
    END IF;

    -- Lock the rows to take: the best rows of each queue (an index range scan
    -- of files_claim_idx each), then the best of those.
    SELECT array_agg(p.id ORDER BY p.priority DESC, p.id) INTO v_rows
    FROM (
        SELECT l.id, l.priority FROM unnest(v_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT f.id, f.priority FROM files.files f
            WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
            ORDER BY f.priority DESC, f.id
            LIMIT cardinality(v_ids)
            FOR UPDATE SKIP LOCKED
        ) l
        ORDER BY l.priority DESC, l.id
        LIMIT cardinality(v_ids)
    ) p;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;

    -- The i-th best row goes to the i-th slot: one unnest zips the arrays, so
    -- no join of estimated sizes can turn quadratic; "= ANY" keeps the plan on
    -- the primary key however many finished rows the table keeps.
    RETURN QUERY
    WITH claimed AS (
        UPDATE files.files f
        SET state = 'running', worker_id = p.worker_id, attempt = f.attempt + 1,
            claimed_at = now(), lease_expires_at = now() + p.lease_timeout
        FROM unnest(v_rows, v_ids[1:cardinality(v_rows)], v_leases[1:cardinality(v_rows)])
             AS p(id, worker_id, lease_timeout)
        WHERE f.id = p.id AND f.id = ANY (v_rows)
        RETURNING f.*
    ), logged AS (
        INSERT INTO files.attempts (file_id, attempt, worker_id)
        SELECT c.id, c.attempt, c.worker_id FROM claimed c
    )
    SELECT c.* FROM claimed c ORDER BY c.priority DESC, c.id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.complete(id bigint, worker_id text, attempt integer, result jsonb DEFAULT NULL, report jsonb DEFAULT NULL)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.complete_many(
    ids bigint[], worker_ids text[], attempts integer[], results jsonb[] DEFAULT NULL, reports jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    i integer;
BEGIN
    IF cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.worker_ids)
       OR cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.attempts)
       OR (complete_many.results IS NOT NULL AND cardinality(complete_many.results) <> cardinality(complete_many.ids))
       OR (complete_many.reports IS NOT NULL AND cardinality(complete_many.reports) <> cardinality(complete_many.ids)) THEN
        RAISE EXCEPTION 'files.complete_many: ids, worker_ids, attempts, results and reports must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- One primary-key lookup per row, whatever the table sizes and the
    -- planner's estimates; in id order, as files.heartbeat locks, so that the
    -- two cannot deadlock.
    FOR i IN SELECT u.n FROM unnest(complete_many.ids) WITH ORDINALITY AS u(id, n) ORDER BY u.id, u.n LOOP
        IF files.complete(complete_many.ids[i], complete_many.worker_ids[i], complete_many.attempts[i],
                          complete_many.results[i], complete_many.reports[i]) THEN
            RETURN NEXT complete_many.ids[i];
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.fail(id bigint, worker_id text, attempt integer, error text, retryable boolean DEFAULT true, report jsonb DEFAULT NULL)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.release(id bigint, worker_id text, attempt integer, reason text DEFAULT NULL)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.cancel(VARIADIC ids bigint[])
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

COMMENT ON TABLE files.attempts IS
    'History: one row per attempt at a file. outcome is NULL while the attempt runs.';
COMMENT ON COLUMN files.attempts.attempt IS
    'Attempt number of the file at claim time (a released attempt''s number is used again).';
COMMENT ON COLUMN files.attempts.started_at IS 'When the attempt was claimed.';
COMMENT ON FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) IS
    'Fenced, batched files.complete: element i of each array describes one row. Marks done each row still held by its '
    'worker_id in its attempt and returns the ids it marked; the others are left unchanged.';

INSERT INTO files.attempts (file_id, attempt, worker_id, started_at)
SELECT f.id, f.attempt, f.worker_id, coalesce(f.claimed_at, now()) FROM files.files f
WHERE f.state = 'running'
ORDER BY f.id;
