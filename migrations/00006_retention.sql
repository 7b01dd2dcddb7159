-- Retention: how long finished rows are kept, per queue and per batch, and the
-- pruner that deletes them (files.prune), which every worker runs and one runs
-- at a time. Rows that are not finished, and rows of a batch that is not
-- finished, are never deleted; a row's attempts go with it.

-- +goose Up
ALTER TABLE files.queues
    ADD COLUMN keep_done   interval DEFAULT '7 days',
    ADD COLUMN keep_failed interval DEFAULT '30 days',
    ADD CONSTRAINT queues_keep_valid CHECK (keep_done >= '0' AND keep_failed >= '0');
COMMENT ON COLUMN files.queues.keep_done IS
    'How long done and cancelled rows without a batch are kept after they finished (then files.prune deletes them); '
    'NULL keeps them for good. Set with files.keep_queue.';
COMMENT ON COLUMN files.queues.keep_failed IS
    'How long failed rows without a batch are kept after they failed; NULL keeps them for good. Set with files.keep_queue.';

ALTER TABLE files.batches
    ADD COLUMN keep interval,
    ADD CONSTRAINT batches_keep_valid CHECK (keep >= '0');
COMMENT ON COLUMN files.batches.keep IS
    'How long the batch and its rows are kept after it finished (then files.prune deletes them); NULL, the default, keeps '
    'them until this is set, so that pgworker results can read them. Set with files.keep_batch.';

-- Finished rows without a batch, by queue, state and age: what files.prune
-- deletes, oldest first, without reading the rows it keeps. A batch's rows are
-- found through its id range instead (files.batches.first_id, last_id).
CREATE INDEX files_finished_idx ON files.files (queue, state, finished_at)
    WHERE state IN ('done', 'failed', 'cancelled') AND batch IS NULL;
COMMENT ON INDEX files.files_finished_idx IS
    'Finished rows without a batch by queue, state and finished_at: the rows files.prune may delete, oldest first.';

-- +goose StatementBegin
CREATE FUNCTION files.prune(max_rows integer DEFAULT 1000, dry_run boolean DEFAULT false, wait boolean DEFAULT false,
                            keep_workers interval DEFAULT '7 days')
RETURNS TABLE (queue text, batch text, state text, rows bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_left integer := prune.max_rows;
    q      record;
    b      record;
    s      record;
    n      bigint;
BEGIN
    IF prune.max_rows IS NULL OR prune.max_rows < 1 OR prune.max_rows > 100000 THEN
        RAISE EXCEPTION 'files.prune: max_rows must be between 1 and 100000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One pruner at a time: the others return at once, or wait with wait.
    IF prune.wait THEN
        PERFORM pg_advisory_xact_lock(hashtext('files.prune'));
    ELSIF NOT pg_try_advisory_xact_lock(hashtext('files.prune')) THEN
        RETURN;
    END IF;
    PERFORM files.fold_counts();

    -- Rows without a batch, by their queue's settings, oldest first. Each
    -- statement locks what it deletes and skips what another holds (a retry
    -- of the row, say), so a claim or an outcome never waits for it.
    FOR q IN
        SELECT x.queue, s.state, s.keep
        FROM files.queues x
        CROSS JOIN LATERAL (VALUES ('done', x.keep_done), ('cancelled', x.keep_done), ('failed', x.keep_failed)) AS s (state, keep)
        WHERE s.keep IS NOT NULL
        ORDER BY x.queue, s.state
    LOOP
        IF prune.dry_run THEN
            SELECT count(*) INTO n FROM files.files f
            WHERE f.queue = q.queue AND f.state = q.state AND f.state IN ('done', 'failed', 'cancelled')
              AND f.batch IS NULL AND f.finished_at < now() - q.keep;
        ELSE
            EXIT WHEN v_left <= 0;
            WITH gone AS (
                DELETE FROM files.files f
                WHERE f.id IN (SELECT x.id FROM files.files x
                               WHERE x.queue = q.queue AND x.state = q.state AND x.state IN ('done', 'failed', 'cancelled')
                                 AND x.batch IS NULL AND x.finished_at < now() - q.keep
                               ORDER BY x.finished_at LIMIT v_left
                               FOR UPDATE SKIP LOCKED)
                RETURNING f.id
            )
            SELECT count(*) INTO n FROM gone;
            v_left := v_left - n;
        END IF;
        IF n > 0 THEN
            RETURN QUERY SELECT q.queue, NULL::text, q.state, n;
        END IF;
    END LOOP;

    -- Batches finished longer ago than their keep: their rows, and the batch
    -- once the last is gone. The batch's row is locked first, so that no row
    -- joins it and no retry opens it again meanwhile.
    FOR b IN
        SELECT x.batch FROM files.batches x
        WHERE x.finished_at IS NOT NULL AND x.keep IS NOT NULL AND x.finished_at < now() - x.keep
        ORDER BY x.finished_at, x.batch
    LOOP
        EXIT WHEN v_left <= 0 AND NOT prune.dry_run;
        IF prune.dry_run THEN
            RETURN QUERY
            SELECT f.queue, f.batch, f.state, count(*)
            FROM files.batches x JOIN files.files f ON f.id BETWEEN x.first_id AND x.last_id AND f.batch = x.batch
            WHERE x.batch = b.batch AND f.state IN ('done', 'failed', 'cancelled')
            GROUP BY f.queue, f.batch, f.state ORDER BY f.queue, f.state;
            CONTINUE;
        END IF;
        PERFORM 1 FROM files.batches x
        WHERE x.batch = b.batch AND x.finished_at IS NOT NULL AND x.keep IS NOT NULL AND x.finished_at < now() - x.keep
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        FOR s IN
            WITH gone AS (
                DELETE FROM files.files f
                WHERE f.id IN (SELECT y.id FROM files.batches x
                               JOIN files.files y ON y.id BETWEEN x.first_id AND x.last_id AND y.batch = x.batch
                               WHERE x.batch = b.batch AND y.state IN ('done', 'failed', 'cancelled')
                               ORDER BY y.id LIMIT v_left
                               FOR UPDATE OF y SKIP LOCKED)
                RETURNING f.queue, f.state
            )
            SELECT g.queue, g.state, count(*) AS n FROM gone g GROUP BY g.queue, g.state ORDER BY g.queue, g.state
        LOOP
            v_left := v_left - s.n;
            RETURN QUERY SELECT s.queue, b.batch, s.state, s.n;
        END LOOP;
        -- The delete trigger counted the rows out: an empty batch goes.
        WITH emptied AS (
            DELETE FROM files.batches x WHERE x.batch = b.batch AND x.total = 0 RETURNING x.batch
        )
        DELETE FROM files.batch_counts c USING emptied e WHERE c.batch = e.batch;
    END LOOP;

    -- Worker slots stopped or declared dead long ago (their attempts stay).
    IF prune.keep_workers IS NOT NULL THEN
        FOR s IN
            WITH old AS (
                SELECT w.worker_id FROM files.workers w
                WHERE w.state IN ('stopped', 'dead') AND w.stopped_at < now() - prune.keep_workers
                  AND NOT EXISTS (SELECT 1 FROM files.files f WHERE f.worker_id = w.worker_id AND f.state = 'running')
                ORDER BY w.stopped_at
                LIMIT CASE WHEN prune.dry_run THEN NULL ELSE greatest(v_left, 0) END
                FOR UPDATE SKIP LOCKED
            ), gone AS (
                DELETE FROM files.workers w USING old o
                WHERE w.worker_id = o.worker_id AND NOT prune.dry_run
                RETURNING w.state
            )
            SELECT x.state, count(*) AS n
            FROM (SELECT w.state FROM files.workers w JOIN old o USING (worker_id) WHERE prune.dry_run
                  UNION ALL SELECT g.state FROM gone g) x
            GROUP BY x.state ORDER BY x.state
        LOOP
            RETURN QUERY SELECT NULL::text, NULL::text, s.state, s.n;
        END LOOP;
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.prune(integer, boolean, boolean, interval) IS
    'Deletes finished rows past their retention: rows without a batch by their queue''s keep_done (done, cancelled) and '
    'keep_failed (failed), a finished batch''s rows and then the batch by its keep, and worker slots stopped or dead '
    'longer than keep_workers. Never a pending or running row, nor a row of a batch that is not finished; a row''s '
    'attempts go with it. At most max_rows rows (and slots) per call, oldest first, skipping rows another transaction '
    'holds; call it again while it deletes that many. One pruner at a time: another call returns nothing at once '
    '(or waits, with wait). dry_run counts what would go, without limit, and deletes nothing. Returns one line per '
    'queue, batch and state deleted; lines with queue NULL count worker slots by state.';

-- +goose StatementBegin
CREATE FUNCTION files.keep_queue(queue text, keep_done interval, keep_failed interval)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF keep_queue.queue IS NULL OR keep_queue.queue = '' THEN
        RAISE EXCEPTION 'files.keep_queue: queue must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO files.queues AS x (queue, keep_done, keep_failed)
    VALUES (keep_queue.queue, keep_queue.keep_done, keep_queue.keep_failed)
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET keep_done = EXCLUDED.keep_done, keep_failed = EXCLUDED.keep_failed;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.keep_queue(text, interval, interval) IS
    'Sets how long the finished rows of a queue (without a batch) are kept: done and cancelled rows keep_done, failed '
    'rows keep_failed, after they finished; NULL keeps them for good. Creates the queue if it is new.';

-- +goose StatementBegin
CREATE FUNCTION files.keep_batch(batch text, keep interval)
RETURNS files.batches
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r files.batches;
BEGIN
    UPDATE files.batches x SET keep = keep_batch.keep WHERE x.batch = keep_batch.batch RETURNING x.* INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'files.keep_batch: no batch %', quote_literal(keep_batch.batch)
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN r;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.keep_batch(text, interval) IS
    'Sets how long a batch and its rows are kept after it finished (NULL: until this is set again); 0 lets the next '
    'files.prune delete them once the batch has finished. Returns the batch.';

-- +goose StatementBegin
CREATE FUNCTION files.recount()
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Rows stand still while they are counted: claims and outcomes wait.
    LOCK TABLE files.files IN SHARE MODE;
    DELETE FROM files.queue_counts;
    INSERT INTO files.queue_counts (queue, at, folded, rows, done, failed, cancelled)
    SELECT f.queue, '-infinity', true, count(*), count(*) FILTER (WHERE f.state = 'done'),
           count(*) FILTER (WHERE f.state = 'failed'), count(*) FILTER (WHERE f.state = 'cancelled')
    FROM files.files f
    GROUP BY f.queue;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.recount() IS
    'Counts the rows of every queue again from files.files (a read of the whole table, with writes to it waiting '
    'meanwhile), for when rows were changed other than through the SQL API. The rates of the last hour start from zero.';

REVOKE ALL ON FUNCTION files.prune(integer, boolean, boolean, interval), files.keep_queue(text, interval, interval),
    files.keep_batch(text, interval), files.recount() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION files.prune(integer, boolean, boolean, interval) TO pgworker_worker;
GRANT EXECUTE ON FUNCTION files.keep_queue(text, interval, interval), files.keep_batch(text, interval), files.recount()
    TO pgworker_admin;

-- +goose Down
DROP FUNCTION files.recount();
DROP FUNCTION files.keep_batch(text, interval);
DROP FUNCTION files.keep_queue(text, interval, interval);
DROP FUNCTION files.prune(integer, boolean, boolean, interval);
DROP INDEX files.files_finished_idx;
ALTER TABLE files.batches DROP CONSTRAINT batches_keep_valid, DROP COLUMN keep;
ALTER TABLE files.queues DROP CONSTRAINT queues_keep_valid, DROP COLUMN keep_done, DROP COLUMN keep_failed;
