-- A one-row claim and its complete are planned once per connection instead
-- of once per call. PostgreSQL plans a PL/pgSQL statement with the call's
-- values (a custom plan) until a generic plan looks as cheap, and for these
-- statements it never does. Planning was then half of the database's time for
-- a one-row claim and its complete: what a worker whose slots free up one at
-- a time pays on every row. pgworker calls files.claim and files.complete
-- when a wake-up has one idle slot or a batch one outcome, and the batch
-- functions otherwise (their planning is shared by the batch; under generic
-- plans they ran slower at thousands of slots).
--
-- files.claim and files.complete now use generic plans. A generic plan is
-- made once and kept, so it must be right at any size of the table: these
-- statements have one good plan, an index range scan of files_claim_idx per
-- queue and primary-key lookups, and the settings below rule out the others.
-- Left to its costs, a generic plan made while files.files is small (a few
-- thousand rows, as after a TRUNCATE) hashes a scan of the whole table on
-- every call, and keeps doing so as the table grows until the next ANALYZE.
-- JIT compilation is off: a generic plan's estimate of a claim at millions of
-- pending rows is above jit_above_cost, and compiling took 20 ms for a claim
-- that runs in a tenth of a millisecond. files.complete records its row
-- itself instead of through files.complete_many, whose plans stay custom.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.complete(id bigint, worker_id text, attempt integer, result jsonb DEFAULT NULL, report jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    n integer;
BEGIN
    -- As files.complete_many does for each of its rows.
    WITH done AS (
        UPDATE files.files f
        SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), result = complete.result
        WHERE f.id = complete.id AND f.worker_id = complete.worker_id AND f.attempt = complete.attempt
        RETURNING f.id, f.claimed_at
    ), logged AS (
        INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome,
                                    exit_code, duration, output, stderr_tail)
        SELECT d.id, complete.attempt, complete.worker_id, coalesce(d.claimed_at, now()), now(), 'done',
               (complete.report ->> 'exit_code')::integer,
               coalesce((complete.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - d.claimed_at),
               complete.result, complete.report ->> 'stderr_tail'
        FROM done d
    )
    SELECT count(*) INTO n FROM done;
    RETURN n > 0;
END
$$;
-- +goose StatementEnd

ALTER FUNCTION files.claim(text, text[], integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION files.claim(text, text[], integer) SET jit = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_seqscan = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_bitmapscan = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_hashjoin = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_mergejoin = off;

-- +goose Down
-- files.complete as migration 00008 left it (its settings go with it).
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

ALTER FUNCTION files.claim(text, text[], integer) RESET plan_cache_mode;
ALTER FUNCTION files.claim(text, text[], integer) RESET jit;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_seqscan;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_bitmapscan;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_hashjoin;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_mergejoin;
