-- A row's payload is checked when the payload is written (INSERT, COPY, or
-- an UPDATE that sets it), not at every update of the row. As CHECK
-- constraints of files.files, files_payload_is_object and
-- files_payload_at_most_1mib ran at every claim, heartbeat and outcome:
-- PostgreSQL checks each CHECK constraint of a table at every UPDATE of a
-- row, whatever columns the UPDATE sets, and these two read the payload
-- whole (a large one fetched from its TOAST table and decompressed) and
-- wrote it out as text. With payloads of 400 kB, an update of 50 rows that
-- set no payload took 171 ms with them and 17 ms without, and a heartbeat
-- renews the lease of every row its process holds every few seconds.
--
-- The row trigger files_payload_checked tests the same two conditions on
-- the rows inserted and on those whose payload an UPDATE sets: its WHEN
-- condition is evaluated with the row, and its function runs only to refuse,
-- with the same SQLSTATE (23514) and constraint names as before, and the
-- row's id and source in the DETAIL. An AFTER trigger, as COPY writes its
-- rows in batches only when the table has no BEFORE INSERT row trigger. What
-- differs from the constraints: the refusal comes at the end of the
-- statement; a row that an ON CONFLICT clause does not insert is not checked
-- (nothing of it is stored); a row that breaks another constraint too reports
-- that one first; and, as every trigger, it does not fire in a session with
-- session_replication_role = replica (superusers, logical replication), nor
-- does files_enqueued.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION files.refuse_payload() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF jsonb_typeof(NEW.payload) <> 'object' THEN
        RAISE EXCEPTION 'files.files: a payload is a JSON object (files_payload_is_object), not %', jsonb_typeof(NEW.payload)
            USING ERRCODE = 'check_violation', SCHEMA = 'files', TABLE = 'files', COLUMN = 'payload',
                  CONSTRAINT = 'files_payload_is_object',
                  DETAIL = format('Failing row: id %s, queue %s, source %s.', NEW.id, NEW.queue, left(NEW.source, 200));
    END IF;
    RAISE EXCEPTION 'files.files: a payload is at most 1 MiB as text (files_payload_at_most_1mib), and this one is % bytes',
            octet_length(NEW.payload::text)
        USING ERRCODE = 'check_violation', SCHEMA = 'files', TABLE = 'files', COLUMN = 'payload',
              CONSTRAINT = 'files_payload_at_most_1mib',
              DETAIL = format('Failing row: id %s, queue %s, source %s.', NEW.id, NEW.queue, left(NEW.source, 200)),
              HINT = 'Store large data as an object and put its key in the payload.';
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.refuse_payload() IS
    'Trigger of files.files (files_payload_checked): refuses a payload that is not a JSON object '
    '(files_payload_is_object) or is over 1 MiB as text (files_payload_at_most_1mib), SQLSTATE 23514.';
REVOKE ALL ON FUNCTION files.refuse_payload() FROM PUBLIC;

CREATE TRIGGER files_payload_checked
    AFTER INSERT OR UPDATE OF payload ON files.files
    FOR EACH ROW
    WHEN (jsonb_typeof(NEW.payload) <> 'object' OR octet_length(NEW.payload::text) > 1048576)
    EXECUTE FUNCTION files.refuse_payload();
COMMENT ON TRIGGER files_payload_checked ON files.files IS
    'A payload is a JSON object of at most 1 MiB as text, checked when it is written (insert, COPY, UPDATE of payload), '
    'not at the claims, heartbeats and outcomes that update the row.';

ALTER TABLE files.files DROP CONSTRAINT files_payload_is_object, DROP CONSTRAINT files_payload_at_most_1mib;

-- +goose Down
-- One scan of the table checks both (under an exclusive lock, as any Down).
ALTER TABLE files.files
    ADD CONSTRAINT files_payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
    ADD CONSTRAINT files_payload_at_most_1mib CHECK (octet_length(payload::text) <= 1048576);
DROP TRIGGER files_payload_checked ON files.files;
DROP FUNCTION files.refuse_payload();
