-- Batched forms of the worker API, for a process that runs many slots: one
-- statement claims a row for each idle slot, one records the outcomes of many
-- rows, one marks slots draining, and a bounded backlog count lets a busy
-- process scale its slots. Each row stays fenced exactly as with the
-- single-row functions.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL)
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
COMMENT ON FUNCTION files.claim_batch(text[], text[]) IS
    'Claims at most one claimable row for each active slot of worker_ids, in one statement (files.claim''s order, '
    'paused queues and run_after apply; queues NULL = all). Unknown slots are registered, draining ones take nothing. '
    'Zero rows, or SQLSTATE 40001/40P01 under stricter isolation, mean "wait again".';

-- +goose StatementBegin
CREATE FUNCTION files.complete_many(
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
COMMENT ON FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) IS
    'Fenced, batched files.complete: element i of each array describes one row. Marks done each row still held by its '
    'worker_id in its attempt and returns the ids it marked; the others are left unchanged.';

-- +goose StatementBegin
CREATE FUNCTION files.fail_many(
    ids bigint[], worker_ids text[], attempts integer[], errors text[],
    retryable boolean[] DEFAULT NULL, reports jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, state text, run_after timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    i integer;
BEGIN
    IF cardinality(fail_many.ids) IS DISTINCT FROM cardinality(fail_many.worker_ids)
       OR cardinality(fail_many.ids) IS DISTINCT FROM cardinality(fail_many.attempts)
       OR cardinality(fail_many.ids) IS DISTINCT FROM cardinality(fail_many.errors)
       OR (fail_many.retryable IS NOT NULL AND cardinality(fail_many.retryable) <> cardinality(fail_many.ids))
       OR (fail_many.reports IS NOT NULL AND cardinality(fail_many.reports) <> cardinality(fail_many.ids)) THEN
        RAISE EXCEPTION 'files.fail_many: ids, worker_ids, attempts, errors, retryable and reports must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- In id order, as files.heartbeat locks, so that the two cannot deadlock.
    FOR i IN SELECT u.n FROM unnest(fail_many.ids) WITH ORDINALITY AS u(id, n) ORDER BY u.id, u.n LOOP
        IF files.fail(fail_many.ids[i], fail_many.worker_ids[i], fail_many.attempts[i], fail_many.errors[i],
                      coalesce(fail_many.retryable[i], true), fail_many.reports[i]) THEN
            RETURN QUERY SELECT f.id, f.state, f.run_after FROM files.files f WHERE f.id = fail_many.ids[i];
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fail_many(bigint[], text[], integer[], text[], boolean[], jsonb[]) IS
    'Fenced, batched files.fail: element i of each array describes one row (retryable defaults to true). Returns, for each '
    'row it recorded, its new state and run_after: pending rows are retried at run_after, so a worker knows when to look again.';

-- +goose StatementBegin
CREATE FUNCTION files.drain_worker(VARIADIC worker_ids text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE files.workers w SET state = 'draining'
    FROM (SELECT x.worker_id FROM files.workers x
          WHERE x.worker_id = ANY (drain_worker.worker_ids) AND x.state = 'active'
          ORDER BY x.worker_id FOR UPDATE) l
    WHERE w.worker_id = l.worker_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.drain_worker(text[]) IS
    'Marks active slots draining: they finish the rows they hold and claim no more. Returns the number of slots marked.';

-- +goose StatementBegin
CREATE FUNCTION files.backlog(queues text[] DEFAULT NULL, cap integer DEFAULT 10000)
RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FROM (
        SELECT 1 FROM files.files f
        JOIN files.queues q ON q.queue = f.queue AND NOT q.paused
        WHERE f.state = 'pending' AND f.run_after <= now()
          AND (backlog.queues IS NULL OR f.queue = ANY (backlog.queues))
        LIMIT greatest(backlog.cap, 0)
    ) b;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.backlog(text[], integer) IS
    'Rows claimable now in queues (NULL = all), counted up to cap so that a large backlog costs no more than cap index entries. '
    'Workers that scale their slots read it while busy.';

REVOKE ALL ON FUNCTION
    files.backlog(text[], integer),
    files.claim_batch(text[], text[]),
    files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]),
    files.fail_many(bigint[], text[], integer[], text[], boolean[], jsonb[]),
    files.drain_worker(text[])
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    files.backlog(text[], integer),
    files.claim_batch(text[], text[]),
    files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]),
    files.fail_many(bigint[], text[], integer[], text[], boolean[], jsonb[]),
    files.drain_worker(text[])
TO pgworker_worker;

-- +goose Down
DROP FUNCTION files.backlog(text[], integer);
DROP FUNCTION files.drain_worker(text[]);
DROP FUNCTION files.fail_many(bigint[], text[], integer[], text[], boolean[], jsonb[]);
DROP FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]);
DROP FUNCTION files.claim_batch(text[], text[]);
