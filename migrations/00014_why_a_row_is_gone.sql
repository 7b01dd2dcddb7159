-- Why a running row is gone. A heartbeat's answer leaves out a row that its
-- slot no longer holds, without saying why: an operator cancelled it, or
-- files.reap took it back after its lease expired. A worker told the two apart
-- by the files_control hint of the cancellation, which reaches its listener
-- on its own time: when the heartbeat came first, an operator's cancel was
-- reported as a lost lease (a warning, the lease-loss counter, ErrLeaseLost
-- for the handler). files.attempt_outcomes answers from the attempt's history
-- row, which the cancel or the reap wrote in the transaction that took the
-- row, so it is known by the time a heartbeat misses the row.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION files.attempt_outcomes(key text, file_ids bigint[], worker_ids text[], attempts integer[])
RETURNS TABLE (file_id bigint, attempt integer, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned at every call (a rare one), against the size files.attempts has
-- then: a plan made while it held a few rows would scan it whole later.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(attempt_outcomes.file_ids) IS DISTINCT FROM cardinality(attempt_outcomes.worker_ids)
       OR cardinality(attempt_outcomes.file_ids) IS DISTINCT FROM cardinality(attempt_outcomes.attempts) THEN
        RAISE EXCEPTION 'files.attempt_outcomes: file_ids, worker_ids and attempts must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(attempt_outcomes.file_ids) > 10000 THEN
        RAISE EXCEPTION 'files.attempt_outcomes: at most 10000 attempts (got %)', cardinality(attempt_outcomes.file_ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM files.own_slots('files.attempt_outcomes', attempt_outcomes.key,
                            ARRAY(SELECT DISTINCT w FROM unnest(attempt_outcomes.worker_ids) AS w));
    RETURN QUERY
    SELECT a.file_id, a.attempt, a.outcome
    FROM unnest(attempt_outcomes.file_ids, attempt_outcomes.worker_ids, attempt_outcomes.attempts) AS x(file_id, worker_id, attempt)
    JOIN files.attempts a ON a.file_id = x.file_id AND a.attempt = x.attempt AND a.worker_id = x.worker_id
    WHERE a.outcome IS NOT NULL;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.attempt_outcomes(text, bigint[], text[], integer[]) IS
    'The recorded outcome (done, failed, lost, released, cancelled) of each named attempt (element i: file, slot, '
    'attempt) of the caller''s slots, proven by their key; an attempt without one is left out. For a worker whose '
    'heartbeat no longer shows a row: cancelled means an operator took it (files.cancel), lost that its lease expired.';
REVOKE ALL ON FUNCTION files.attempt_outcomes(text, bigint[], text[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION files.attempt_outcomes(text, bigint[], text[], integer[]) TO pgworker_worker;

-- +goose Down
DROP FUNCTION files.attempt_outcomes(text, bigint[], text[], integer[]);
