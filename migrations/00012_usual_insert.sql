-- The usual insert costs its trigger less: files.notify_enqueued first reads
-- the new rows in one pass for what most inserts are (pending rows of one
-- known queue, without unique keys or batches: what pgworker enqueue and a
-- scheduler's single-row INSERT write) and, when they are that, appends the
-- count's line and sends the notification in two plain statements, instead
-- of the pass that groups the rows by queue with a count per state, which
-- every other insert still takes. An insert of no row does nothing. A
-- single-row insert costs the server 0.015 ms (10%) less, and the database's
-- CPU per row at 200 rows/s with --claim-cooldown falls with it
-- (bench/other-measurements.md).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.notify_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned once per session: a single-row INSERT otherwise plans the
-- trigger's statements again each time, which costs more than they do.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_rows    bigint;
    v_queue   text;
    v_usual   boolean;
    v_queues  text[];
    v_known   boolean;
    v_keys    boolean;
    v_batches boolean;
    v_sent    bigint;
BEGIN
    -- The usual insert: pending rows of one known queue, without keys or
    -- batches, what pgworker enqueue and a scheduler's single-row INSERT
    -- write. One pass over the new rows tells it; then the count's line and
    -- the notification, two plain statements. A single-row insert costs the
    -- server 0.015 ms less this way than through the grouped pass below,
    -- whose every aggregate costs a statement more than its work.
    SELECT count(*), min(n.queue),
           min(n.queue) = max(n.queue) AND bool_and(n.state = 'pending' AND n.unique_key IS NULL AND n.batch IS NULL)
           AND EXISTS (SELECT FROM files.queues q WHERE q.queue = min(n.queue))
    INTO v_rows, v_queue, v_usual
    FROM enqueued n;
    IF v_rows = 0 THEN
        RETURN NULL;
    END IF;
    IF v_usual THEN
        INSERT INTO files.queue_counts (queue, at, rows) VALUES (v_queue, date_trunc('minute', now()), v_rows);
        PERFORM pg_notify('files_pending', v_queue);
        RETURN NULL;
    END IF;

    -- Any other: one pass over the new rows counts them in, wakes the
    -- workers of the queues that got pending rows and says what the rest has
    -- to do.
    WITH per_queue AS (
        SELECT n.queue,
               count(*) AS rows,
               count(*) FILTER (WHERE n.state = 'pending') AS pending,
               count(*) FILTER (WHERE n.state = 'done') AS done,
               count(*) FILTER (WHERE n.state = 'failed') AS failed,
               count(*) FILTER (WHERE n.state = 'cancelled') AS cancelled,
               bool_or(n.unique_key IS NOT NULL) AS keys,
               bool_or(n.batch IS NOT NULL) AS batches
        FROM enqueued n
        GROUP BY n.queue
    ), counted AS (
        INSERT INTO files.queue_counts (queue, at, rows, done, failed, cancelled)
        SELECT p.queue, date_trunc('minute', now()), p.rows, p.done, p.failed, p.cancelled FROM per_queue p
    )
    SELECT array_agg(p.queue), bool_and(EXISTS (SELECT 1 FROM files.queues x WHERE x.queue = p.queue)),
           bool_or(p.keys), bool_or(p.batches),
           count(pg_notify('files_pending', p.queue)) FILTER (WHERE p.pending > 0)
    INTO v_queues, v_known, v_keys, v_batches, v_sent
    FROM per_queue p;

    IF NOT v_known THEN
        INSERT INTO files.queues (queue)
        SELECT q FROM unnest(v_queues) AS q
        ON CONFLICT DO NOTHING;
    END IF;

    IF v_keys THEN
        BEGIN
            INSERT INTO files.unique_keys (queue, key, file_id)
            SELECT n.queue, n.unique_key, n.id FROM enqueued n WHERE n.unique_key IS NOT NULL;
        EXCEPTION WHEN unique_violation THEN
            RAISE EXCEPTION 'files.files: a row with this unique_key is already in its queue'
                USING ERRCODE = 'unique_violation', DETAIL = SQLERRM,
                      HINT = 'Skip rows whose key is in files.unique_keys (pgworker enqueue does), or use another key.';
        END;
    END IF;

    IF v_batches THEN
        PERFORM files.batch_rows_added(array_agg(n.batch), array_agg(n.id), array_agg(n.state))
        FROM enqueued n WHERE n.batch IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.notify_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned once per session: a single-row INSERT otherwise plans the
-- trigger's statements again each time, which costs more than they do.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_queues  text[];
    v_known   boolean;
    v_keys    boolean;
    v_batches boolean;
    v_sent    bigint;
BEGIN
    -- One pass over the new rows counts them in, wakes the workers of the
    -- queues that got pending rows and says what the rest has to do: in the
    -- usual insert (a known queue, no keys, no batch) the only statement.
    -- Each statement costs more than the work in it.
    WITH per_queue AS (
        SELECT n.queue,
               count(*) AS rows,
               count(*) FILTER (WHERE n.state = 'pending') AS pending,
               count(*) FILTER (WHERE n.state = 'done') AS done,
               count(*) FILTER (WHERE n.state = 'failed') AS failed,
               count(*) FILTER (WHERE n.state = 'cancelled') AS cancelled,
               bool_or(n.unique_key IS NOT NULL) AS keys,
               bool_or(n.batch IS NOT NULL) AS batches
        FROM enqueued n
        GROUP BY n.queue
    ), counted AS (
        INSERT INTO files.queue_counts (queue, at, rows, done, failed, cancelled)
        SELECT p.queue, date_trunc('minute', now()), p.rows, p.done, p.failed, p.cancelled FROM per_queue p
    )
    SELECT array_agg(p.queue), bool_and(EXISTS (SELECT 1 FROM files.queues x WHERE x.queue = p.queue)),
           bool_or(p.keys), bool_or(p.batches),
           count(pg_notify('files_pending', p.queue)) FILTER (WHERE p.pending > 0)
    INTO v_queues, v_known, v_keys, v_batches, v_sent
    FROM per_queue p;

    IF NOT v_known THEN
        INSERT INTO files.queues (queue)
        SELECT q FROM unnest(v_queues) AS q
        ON CONFLICT DO NOTHING;
    END IF;

    IF v_keys THEN
        BEGIN
            INSERT INTO files.unique_keys (queue, key, file_id)
            SELECT n.queue, n.unique_key, n.id FROM enqueued n WHERE n.unique_key IS NOT NULL;
        EXCEPTION WHEN unique_violation THEN
            RAISE EXCEPTION 'files.files: a row with this unique_key is already in its queue'
                USING ERRCODE = 'unique_violation', DETAIL = SQLERRM,
                      HINT = 'Skip rows whose key is in files.unique_keys (pgworker enqueue does), or use another key.';
        END;
    END IF;

    IF v_batches THEN
        PERFORM files.batch_rows_added(array_agg(n.batch), array_agg(n.id), array_agg(n.state))
        FROM enqueued n WHERE n.batch IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
