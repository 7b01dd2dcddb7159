-- A batch finishes when its last row ends, also when its last rows end in
-- concurrent transactions. Each outcome counts its rows into its own shard of
-- files.batch_counts, so that outcomes do not wait on each other; but then two
-- transactions ending a batch's last two rows each saw the other's row still
-- open, neither finished the batch, and files.reap did it up to one reap
-- interval (the lease timeout) later, with files.batches.finished_at and the
-- files_batch notification as late.
--
-- Now a transaction that has ended rows of a batch locks the batch's row of
-- files.batch_end_locks before it looks whether the batch has finished, and
-- holds it until it commits: the ends of one batch look in turn, each in a
-- snapshot taken after the previous one committed, so the last of them sees
-- every end and finishes the batch. The lock is a row of a table of its own
-- that no role but the owner may lock (an advisory lock could be taken, and
-- held, by any role that can connect), keyed by a hash of the batch's name
-- into 1,024 rows; enqueueing into a batch takes none of it, so an enqueue in
-- a long transaction still holds nothing that an outcome needs. The row of
-- files.batches is locked with SKIP LOCKED: a session that holds it (an
-- enqueue, a delete) finishes or reopens the batch itself.
--
-- files.reap still finishes what a transaction at REPEATABLE READ or
-- SERIALIZABLE misses (its snapshot is its first statement's), and a batch
-- whose last end skipped its row while an admin held it (files.keep_batch)
-- or an enqueue that then rolled back did.

-- +goose Up
CREATE TABLE files.batch_end_locks (
    bucket smallint PRIMARY KEY,
    CONSTRAINT batch_end_locks_bucket_valid CHECK (bucket BETWEEN 0 AND 1023)
);
COMMENT ON TABLE files.batch_end_locks IS
    'One row per bucket of batch names (hashtext(batch) & 1023). A transaction that ends rows of a batch locks its '
    'bucket''s row until it commits, before it looks whether the batch has finished (files.finish_batches): the ends '
    'of a batch look in turn, so the last one sees all the others. No data; only the owner locks it.';
COMMENT ON COLUMN files.batch_end_locks.bucket IS 'hashtext(batch) & 1023 of the batches this row serves.';
INSERT INTO files.batch_end_locks (bucket) SELECT g FROM generate_series(0, 1023) g;
REVOKE ALL ON files.batch_end_locks FROM PUBLIC;
GRANT SELECT ON files.batch_end_locks TO pgworker_reader;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.finish_batches(batches text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    -- The ends of a batch look in turn: the bucket's lock is held until this
    -- transaction commits, and the next statement's snapshot comes after the
    -- commit of the previous holder, whose rows it therefore sees ended.
    IF finish_batches.batches IS NOT NULL THEN
        PERFORM 1 FROM files.batch_end_locks l
        WHERE l.bucket = ANY (ARRAY(SELECT hashtext(b.batch) & 1023 FROM unnest(finish_batches.batches) AS b(batch)))
        ORDER BY l.bucket FOR UPDATE;
    END IF;
    -- The row lock and the re-check of finished_at and total make this once
    -- per finish. A batch row that another session holds is skipped: an
    -- enqueue adds open rows, and a delete looks again before it commits.
    WITH candidate AS (
        SELECT b.batch FROM files.batches b
        WHERE (finish_batches.batches IS NULL OR b.batch = ANY (finish_batches.batches))
          AND b.finished_at IS NULL AND b.total > 0
          AND b.total = (SELECT coalesce(sum(c.done + c.failed + c.cancelled), 0)
                         FROM files.batch_counts c WHERE c.batch = b.batch)
        ORDER BY b.batch FOR UPDATE SKIP LOCKED
    ), finished AS (
        UPDATE files.batches b SET finished_at = now()
        FROM candidate c WHERE b.batch = c.batch
        RETURNING b.batch
    )
    SELECT count(pg_notify('files_batch', f.batch)) INTO n FROM finished f;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.finish_batches(text[]) IS
    'Sets finished_at of the given batches (NULL: every open batch) whose rows have all ended, and sends one files_batch '
    'notification with the name of each. Called by files.tally as rows end, after it locks the batches'' rows of '
    'files.batch_end_locks until commit, so that the last of concurrent ends finishes the batch; and by files.reap for '
    'what a transaction at REPEATABLE READ or SERIALIZABLE missed.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.batch_rows_deleted(batches text[], states text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE files.batches b SET total = b.total - d.n
    FROM (SELECT x.batch, count(*) AS n FROM unnest(batch_rows_deleted.batches) AS x(batch)
          GROUP BY x.batch ORDER BY x.batch) d
    WHERE b.batch = d.batch;
    PERFORM files.tally(NULL, batch_rows_deleted.batches, batch_rows_deleted.states,
                        array_fill('deleted'::text, ARRAY[cardinality(batch_rows_deleted.batches)]));
    -- A delete may end its batches: when it takes their last open rows, and
    -- when their last open rows end meanwhile in a transaction that skipped
    -- the batch's row this one holds.
    PERFORM files.finish_batches(array_agg(DISTINCT x.batch))
    FROM unnest(batch_rows_deleted.batches) AS x(batch);
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION files.reap() IS
    'Declares slots silent past their lease timeout dead and returns rows whose lease expired to the queue '
    '(attempt outcome lost; failed once max_attempts is spent). Silence counts from the server''s start and from the end '
    'of the last silence of the whole fleet (a database or network outage) at the earliest. Safe to call from every node '
    'at once. Also finishes the batches whose last end went unmarked (in a transaction at REPEATABLE READ or '
    'SERIALIZABLE, or while another session held the batch''s row: files.finish_batches) and folds the queues'' counts '
    '(files.fold_counts). Returns the number of rows returned.';

-- +goose Down
COMMENT ON FUNCTION files.reap() IS
    'Declares slots silent past their lease timeout dead and returns rows whose lease expired to the queue '
    '(attempt outcome lost; failed once max_attempts is spent). Silence counts from the server''s start and from the end '
    'of the last silence of the whole fleet (a database or network outage) at the earliest. Safe to call from every node '
    'at once. Also finishes the batches whose last rows ended in concurrent transactions (files.finish_batches) and '
    'folds the queues'' counts (files.fold_counts). Returns the number of rows returned.';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.batch_rows_deleted(batches text[], states text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE files.batches b SET total = b.total - d.n
    FROM (SELECT x.batch, count(*) AS n FROM unnest(batch_rows_deleted.batches) AS x(batch)
          GROUP BY x.batch ORDER BY x.batch) d
    WHERE b.batch = d.batch;
    PERFORM files.tally(NULL, batch_rows_deleted.batches, batch_rows_deleted.states,
                        array_fill('deleted'::text, ARRAY[cardinality(batch_rows_deleted.batches)]));
    -- Deleting a batch's last open rows ends it.
    PERFORM files.finish_batches(array_agg(DISTINCT x.batch))
    FROM unnest(batch_rows_deleted.batches, batch_rows_deleted.states) AS x(batch, state)
    WHERE x.state IN ('pending', 'running');
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.finish_batches(batches text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    -- The row lock and the re-check of finished_at and total make this once
    -- per finish, whoever calls it at the same moment.
    WITH candidate AS (
        SELECT b.batch FROM files.batches b
        WHERE (finish_batches.batches IS NULL OR b.batch = ANY (finish_batches.batches))
          AND b.finished_at IS NULL AND b.total > 0
          AND b.total = (SELECT coalesce(sum(c.done + c.failed + c.cancelled), 0)
                         FROM files.batch_counts c WHERE c.batch = b.batch)
        ORDER BY b.batch FOR UPDATE
    ), finished AS (
        UPDATE files.batches b SET finished_at = now()
        FROM candidate c WHERE b.batch = c.batch
        RETURNING b.batch
    )
    SELECT count(pg_notify('files_batch', f.batch)) INTO n FROM finished f;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.finish_batches(text[]) IS
    'Sets finished_at of the given batches (NULL: every open batch) whose rows have all ended, and sends one files_batch '
    'notification with the name of each. Called by files.tally as rows end, and by files.reap for batches whose last rows '
    'ended in concurrent transactions (each of which saw the other''s rows still open).';
DROP TABLE files.batch_end_locks;
