-- Roles: least privilege for workers, read-only for dashboards, operator functions
-- for admins. Roles are cluster-wide: they are created when missing and left in
-- place by the down migration; their privileges on this schema are revoked.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgworker_worker', 'pgworker_reader', 'pgworker_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by a concurrent migration of another database
            END;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA files FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA files FROM PUBLIC;

-- Readers see everything and change nothing.
GRANT USAGE ON SCHEMA files TO pgworker_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA files TO pgworker_reader;

-- Workers run the worker API and read the views; they write only through the API.
GRANT USAGE ON SCHEMA files TO pgworker_worker;
GRANT SELECT ON files.active_workers, files.queue_summary, files.queue_stats, files.worker_metrics, files.batch_progress,
    files.reap_state
    TO pgworker_worker;
GRANT EXECUTE ON FUNCTION
    files.claim(text, text[], integer, text, boolean),
    files.get_unprocessed_entry_by_priority(text, text),
    files.claim_batch(text[], text[], text, boolean),
    files.complete(bigint, text, integer, text, jsonb, jsonb, text),
    files.complete_many(bigint[], text[], integer[], text[], jsonb[], jsonb[], text),
    files.fail(bigint, text, integer, text, text, boolean, jsonb),
    files.fail_many(bigint[], text[], integer[], text[], text[], boolean[], jsonb[]),
    files.release(bigint, text, integer, text, text),
    files.register_worker(text, text, integer, integer, text, text[], interval, text),
    files.heartbeat(text, text[]),
    files.drain_worker(text, text[]),
    files.deregister_worker(text, text),
    files.backlog(text[], integer),
    files.reap()
TO pgworker_worker;

-- Admins: everything workers and readers may, plus enqueueing, deleting finished
-- work, queue settings and the operator functions.
GRANT USAGE ON SCHEMA files TO pgworker_admin;
GRANT pgworker_worker, pgworker_reader TO pgworker_admin;
GRANT INSERT, DELETE ON files.files TO pgworker_admin;
GRANT UPDATE (backoff_base, backoff_max) ON files.queues TO pgworker_admin;
GRANT INSERT (batch, labels), UPDATE (labels) ON files.batches TO pgworker_admin;
GRANT EXECUTE ON FUNCTION
    files.cancel(bigint[]),
    files.retry(bigint[], text),
    files.pause_queue(text),
    files.resume_queue(text),
    files.set_max_running(text, integer),
    files.set_fair_share(text, boolean)
TO pgworker_admin;

-- +goose Down
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA files FROM pgworker_worker, pgworker_reader, pgworker_admin;
REVOKE ALL ON ALL TABLES IN SCHEMA files FROM pgworker_worker, pgworker_reader, pgworker_admin;
REVOKE ALL ON SCHEMA files FROM pgworker_worker, pgworker_reader, pgworker_admin;
-- Functions are executable by PUBLIC until Up revokes it.
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA files TO PUBLIC;
