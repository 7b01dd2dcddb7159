-- The SQL API: everything a worker or an operator does to the queue goes through
-- these functions, so a worker can be written in any language.
--
-- The functions are SECURITY DEFINER with a pinned search_path: the worker role may
-- execute them without holding write privileges on the tables. A running
-- attempt is described by its files.files row alone (worker_id, attempt,
-- claimed_at); the functions that end it (complete, fail, release, reap,
-- cancel) write its files.attempts row.
--
-- Every role that can connect reads worker ids and attempts
-- (files.active_workers), so they cannot be what proves a caller's right to a
-- row or a slot:
--
-- * A claim hands its caller a secret per row (files.files.claim_token, set
--   only in the rows files.claim, files.claim_batch and
--   files.get_unprocessed_entry_by_priority return; the table keeps its
--   SHA-256). complete, fail and release are fenced by worker id, attempt
--   and that token; a wrong token is refused with an error.
-- * A slot has a key, given by its caller to files.register_worker (or
--   generated and returned by it) or to its first claim; the table keeps its
--   SHA-256. Every call naming a slot that has a key must present it: claim,
--   claim_batch, heartbeat, drain_worker, deregister_worker, register_worker.
--   A slot registered by a claim without a key can claim, but nobody can
--   heartbeat, drain or deregister it.
-- * A lease is at most 24 hours, a claim at most 10,000 rows, a payload at
--   most 1 MiB (of its text form), and an empty queue name is an error.
-- * The output manifest of the completing attempt is stored once, in
--   files.files.result; files.attempts.output keeps what failed attempts
--   reported.
--
-- files.claim and files.complete, which pgworker calls when a wake-up has one
-- idle slot or a batch one outcome, use generic plans, made once per
-- connection: these statements have one good plan, an index range scan of
-- files_claim_idx per queue and primary-key lookups, and their settings rule
-- out the others. Left to its costs, a generic plan made while files.files is
-- small hashes a scan of the whole table on every call, until the next
-- ANALYZE. JIT compilation is off: a generic plan's estimate of a claim at
-- millions of pending rows passes jit_above_cost, and compiling costs far
-- more than the claim. The batch functions keep custom plans.

-- +goose Up

-- Claiming work.

-- +goose StatementBegin
CREATE FUNCTION files.check_queues(fn text, queues text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF array_position(queues, NULL) IS NOT NULL OR '' = ANY (queues) THEN
        RAISE EXCEPTION '%: queue names must not be NULL or empty (pass NULL instead of the array for all queues)', fn
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.check_queues(text, text[]) IS
    'Raises an error naming fn when a queue list holds a NULL or empty name.';

-- +goose StatementBegin
CREATE FUNCTION files.check_then(fn text, then_queue text, queues text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF then_queue = '' OR length(then_queue) > 128 THEN
        RAISE EXCEPTION '%: then_queue must have 1 to 128 characters', fn USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF then_queue = ANY (queues) THEN
        RAISE EXCEPTION '%: then_queue % is the queue of the row itself: its outputs would loop', fn, then_queue
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.check_then(text, text, text[]) IS
    'Raises an error naming fn unless then_queue is a queue name other than each of queues (those of the rows it '
    'would follow).';

-- +goose StatementBegin
CREATE FUNCTION files.output_keys(result jsonb)
RETURNS SETOF text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o ->> 'key'
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(result -> 'outputs') = 'array' THEN result -> 'outputs' END) AS o
    WHERE jsonb_typeof(o -> 'key') = 'string' AND o ->> 'key' <> ''
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.output_keys(jsonb) IS
    'The keys of the outputs of a result manifest (result->''outputs''[i]->>''key''), in their order.';

-- The row search of the claims. A whole-range search of a queue reads
-- files_claim_idx from its start. That is the cheapest search while dead
-- entries are cleared as they appear. While a long transaction (or a
-- replica's hot_standby_feedback, or a stuck replication slot) pins the
-- xmin horizon, the entries of claimed rows stay in the index, and a search
-- from its start visits each of them: tens of milliseconds after a minute
-- at a thousand rows a second. A session whose whole-range search takes
-- longer than pgworker.claim_hint_ms (1 ms by default, and as much again
-- for every 100 rows asked for) starts keeping hints: per queue, where its
-- last claim ended, so that its next search starts there. A hint is never
-- trusted to be a bound: rows behind it are found by the whole-range search
-- that runs at least once a second and every 64th claim, and by any search
-- whose rows past the hint fall short. When that whole-range search is fast
-- again, the session drops its hints.

-- +goose StatementBegin
CREATE FUNCTION files.pick(queues text[], n integer, rooms integer[] DEFAULT NULL, prefer boolean DEFAULT false)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
-- No SET clauses: only files.claim and files.claim_batch call it, and it
-- plans and runs under their settings. Each SET clause costs every call.
AS $$
DECLARE
    v_setting text := current_setting('pgworker.claim_hints', true);
    v_state   jsonb;
    v_at      double precision;
    v_count   integer;
    v_full    boolean := true;
    v_hp      integer[];
    v_hid     bigint[];
    v_now     double precision := extract(epoch FROM clock_timestamp());
    v_ms      text;
    v_slow    double precision;
    v_rows    bigint[];
    v_names   text[];
    v_prios   integer[];
    v_hints   jsonb;
    v_hint    jsonb;
    v_set     text;
BEGIN
    -- The session's hints, if it keeps them: per queue the claim-order
    -- position (priority, id) just past the last row this session claimed,
    -- the time of its last whole-range search and the claims since. Set by
    -- anyone, they are read with care: a value that does not parse is no
    -- hint at all. Here and below, the hints are read and written in plain
    -- expressions, not statements: each statement costs more than all of
    -- them together.
    IF v_setting <> '' THEN
        BEGIN
            v_state := v_setting::jsonb;
            v_at := (v_state ->> 'at')::double precision;
            v_count := (v_state ->> 'n')::integer;
            v_hints := v_state -> 'q';
            IF jsonb_typeof(v_hints) = 'object' AND v_at IS NOT NULL AND v_count IS NOT NULL THEN
                FOR i IN 1 .. cardinality(pick.queues) LOOP
                    v_hp[i] := (v_hints -> pick.queues[i] ->> 0)::integer;
                    v_hid[i] := (v_hints -> pick.queues[i] ->> 1)::bigint;
                END LOOP;
                v_full := v_count >= 63 OR v_now - v_at >= 1 OR v_now < v_at;
            ELSE
                v_hints := NULL;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            v_hints := NULL;
            v_full := true;
        END;
    END IF;
    IF v_full THEN
        -- A whole-range search: per queue, in claim order, one range of
        -- files_claim_idx from its start.
        SELECT array_agg(b.id ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id),
               array_agg(b.name ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id),
               array_agg(b.priority ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id)
        INTO v_rows, v_names, v_prios
        FROM (
            SELECT q.name, q.ord, l.id, l.priority
            FROM unnest(pick.queues, pick.rooms) WITH ORDINALITY AS q(name, room, ord)
            CROSS JOIN LATERAL (
                SELECT f.id, f.priority FROM files.files f
                WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
                ORDER BY f.priority DESC, f.id
                LIMIT least(pick.n, q.room)
                FOR UPDATE SKIP LOCKED) l
            ORDER BY CASE WHEN pick.prefer THEN q.ord END, l.priority DESC, l.id
            LIMIT pick.n
        ) b;
    ELSE
        -- Per queue, in claim order: rows of a higher priority than the hint,
        -- rows of its priority from its id on, rows of a lower priority, and
        -- last the rows of its priority behind the hint. For a queue with no
        -- hint yet, its whole range. Each part is an index range scan of
        -- files_claim_idx, so a hinted search starts past the entries of the
        -- rows this session claimed before. The part behind the hint is read
        -- only when the others came back short, in the same statement: a
        -- short answer still means that nothing else is claimable (a worker
        -- then waits for a notification).
        WITH picked AS (
            SELECT q.name, q.ord, l.id, l.priority
            FROM unnest(pick.queues, v_hp, v_hid, pick.rooms) WITH ORDINALITY AS q(name, hp, hid, room, ord)
            CROSS JOIN LATERAL (
                SELECT a.id, a.priority FROM (
                    SELECT * FROM (
                        SELECT f.id, f.priority FROM files.files f
                        WHERE f.state = 'pending' AND f.queue = q.name AND f.priority > coalesce(q.hp, 2147483647)
                          AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT least(pick.n, q.room)
                        FOR UPDATE SKIP LOCKED) above
                    UNION ALL
                    SELECT * FROM (
                        SELECT f.id, f.priority FROM files.files f
                        -- A range, not "priority = ...": an equality makes the order
                        -- by id alone, which a generic plan may take from the
                        -- primary key, from the hint to the end of the table.
                        WHERE f.state = 'pending' AND f.queue = q.name
                          AND f.priority BETWEEN coalesce(q.hp, 2147483647) AND coalesce(q.hp, 2147483647)
                          AND f.id >= coalesce(q.hid, -9223372036854775808) AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT least(pick.n, q.room)
                        FOR UPDATE SKIP LOCKED) here
                    UNION ALL
                    SELECT * FROM (
                        SELECT f.id, f.priority FROM files.files f
                        WHERE f.state = 'pending' AND f.queue = q.name AND f.priority < coalesce(q.hp, 2147483647)
                          AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT least(pick.n, q.room)
                        FOR UPDATE SKIP LOCKED) below
                    UNION ALL
                    -- Behind the hint: read only when the parts before it
                    -- came back short (the Append stops once the limit is
                    -- reached), so a short answer still means that nothing
                    -- else is claimable. Empty without a hint.
                    SELECT * FROM (
                        SELECT f.id, f.priority FROM files.files f
                        WHERE f.state = 'pending' AND f.queue = q.name
                          AND f.priority BETWEEN coalesce(q.hp, 2147483647) AND coalesce(q.hp, 2147483647)
                          AND f.id < coalesce(q.hid, -9223372036854775808) AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT least(pick.n, q.room)
                        FOR UPDATE SKIP LOCKED) behind
                ) a
                LIMIT least(pick.n, q.room)
            ) l
        ), best AS (
            -- With prefer, a queue's rows all come before the next queue's.
            SELECT p.name, p.ord, p.id, p.priority FROM picked p
            ORDER BY CASE WHEN pick.prefer THEN p.ord END, p.priority DESC, p.id
            LIMIT pick.n
        )
        SELECT array_agg(b.id ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id),
               array_agg(b.name ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id),
               array_agg(b.priority ORDER BY CASE WHEN pick.prefer THEN b.ord END, b.priority DESC, b.id)
        INTO v_rows, v_names, v_prios
        FROM best b;
    END IF;

    -- After a whole-range search, whether it was slow: longer than
    -- pgworker.claim_hint_ms (a number of milliseconds; anything else is the
    -- default, 1), and as much again for every 100 rows asked for.
    IF v_full THEN
        v_ms := current_setting('pgworker.claim_hint_ms', true);
        v_slow := CASE WHEN v_ms ~ '^[0-9]{1,9}(\.[0-9]{1,9})?$' THEN v_ms::double precision ELSE 1 END
                  * (1 + pick.n / 100.0) / 1000;
        IF extract(epoch FROM clock_timestamp()) - v_now <= v_slow THEN
            -- Fast: no hints (or no more).
            IF v_setting <> '' THEN
                v_set := set_config('pgworker.claim_hints', '', false);
            END IF;
            RETURN v_rows;
        END IF;
        v_hints := coalesce(v_hints, '{}');
    END IF;

    -- A queue's hint moves on only, past the last row taken of it (a full
    -- search may take a row from before it). A queue's rows come in claim
    -- order, so its last one passing the test is the last row taken.
    FOR i IN 1 .. coalesce(cardinality(v_rows), 0) LOOP
        v_hint := v_hints -> v_names[i];
        IF v_rows[i] < 9223372036854775807 AND (v_hint IS NULL OR v_prios[i] < (v_hint ->> 0)::integer
           OR (v_prios[i] = (v_hint ->> 0)::integer AND v_rows[i] >= (v_hint ->> 1)::bigint)) THEN
            v_hints := v_hints || jsonb_build_object(v_names[i], jsonb_build_array(v_prios[i], v_rows[i] + 1));
        END IF;
    END LOOP;
    v_set := set_config('pgworker.claim_hints', jsonb_build_object(
        'at', CASE WHEN v_full THEN v_now ELSE v_at END,
        'n', CASE WHEN v_full THEN 0 ELSE v_count + 1 END,
        'q', v_hints)::text, false);
    RETURN v_rows;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.pick(text[], integer, integer[], boolean) IS
    'Locks (FOR UPDATE SKIP LOCKED) and returns, in claim order, the ids of up to n claimable rows of queues, at most '
    'rooms[i] of queue i (NULL: no bound), queue by queue in the given order with prefer: the row search of files.claim '
    'and files.claim_batch for queues without fair share. It searches each queue''s whole range of files_claim_idx until '
    'such a search takes longer than pgworker.claim_hint_ms (default 1 ms, and as much again per 100 rows of n); from then '
    'on it starts each queue''s search past the last row this session took (setting pgworker.claim_hints), searches '
    'whole ranges at least once a second and every 64th claim, dropping the hints when one is fast, and reads the rows '
    'behind a hint whenever those past it fall short of n. So a row that becomes claimable behind a hint (a retry, '
    'release, reap or rolled-back claim) waits at most that long while others are claimable, and a short answer means '
    'nothing else is claimable.';

-- Fleet-wide caps (files.queues.max_running) and fair share between batches
-- (files.queues.fair_share), for the claims. A claim pays for them only when
-- one of its queues has them.

-- +goose StatementBegin
CREATE FUNCTION files.cap_room(queues text[])
RETURNS integer[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_capped text[];
    v_caps   integer[];
    v_room   integer[];
BEGIN
    -- Claimers of a capped queue take turns: each locks the queue's row (in
    -- name order, so that two claimers cannot deadlock) until its transaction
    -- ends, and counts the running rows only then, in a statement of its own
    -- whose snapshot sees every claim committed before. The lock is an
    -- update: under REPEATABLE READ, a claimer whose snapshot predates
    -- another's claim fails with 40001 ("wait again") instead of counting
    -- without it. Uncapped queues take no lock.
    WITH locked AS (
        UPDATE files.queues q SET max_running = q.max_running
        FROM (SELECT x.queue FROM files.queues x
              WHERE x.queue = ANY (cap_room.queues) AND x.max_running IS NOT NULL
              ORDER BY x.queue FOR UPDATE) l
        WHERE q.queue = l.queue
        RETURNING q.queue, q.max_running
    )
    SELECT array_agg(l.queue), array_agg(l.max_running) INTO v_capped, v_caps FROM locked l;

    -- The running rows of a queue are at most the fleet's slots: a scan of
    -- files_running_idx.
    SELECT array_agg(CASE WHEN c.cap IS NOT NULL THEN
                         greatest(c.cap - (SELECT count(*) FROM files.files f
                                           WHERE f.state = 'running' AND f.queue = u.queue), 0)::integer
                     END ORDER BY u.ord)
    INTO v_room
    FROM unnest(cap_room.queues) WITH ORDINALITY AS u(queue, ord)
    LEFT JOIN unnest(v_capped, v_caps) AS c(queue, cap) ON c.queue = u.queue;
    RETURN v_room;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.cap_room(text[]) IS
    'For files.claim and files.claim_batch: locks the capped ones of queues (files.queues.max_running) until the '
    'transaction ends and returns, for each of queues in its order, how many more rows may run (NULL: no cap).';

-- +goose StatementBegin
CREATE FUNCTION files.fair_rows(queue text, n integer)
RETURNS TABLE (id bigint, priority integer, turn bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL keeps the plan of this statement for the session; a SQL
    -- function would plan it again at every claim, which costs more than
    -- running it.
    -- The batches with pending rows in the queue, at most 1,000 of them: a
    -- loose scan of files_batch_claim_idx, one probe per batch.
    RETURN QUERY
    WITH RECURSIVE named AS (
        (SELECT f.batch FROM files.files f
         WHERE f.state = 'pending' AND f.queue = fair_rows.queue AND f.batch IS NOT NULL
         ORDER BY f.batch LIMIT 1)
        UNION ALL
        SELECT (SELECT f.batch FROM files.files f
                WHERE f.state = 'pending' AND f.queue = fair_rows.queue AND f.batch > b.batch
                ORDER BY f.batch LIMIT 1)
        FROM named b WHERE b.batch IS NOT NULL
    ), running AS (
        -- The batches' running rows in the queue, so that the turns go on
        -- from one claim to the next: the batch with the fewest running rows
        -- goes first. A scan of files_running_idx: the running rows are at
        -- most the fleet's slots.
        SELECT f.batch, count(*) AS n FROM files.files f
        WHERE f.state = 'running' AND f.queue = fair_rows.queue
        GROUP BY f.batch
    ), candidates AS (
        -- Up to n claimable rows of each batch, locked; a row's rank is its
        -- place in its batch's claim order among the rows of its priority.
        SELECT c.batch, c.id, c.priority, row_number() OVER (PARTITION BY c.batch, c.priority ORDER BY c.id) AS rank
        FROM (SELECT nb.batch FROM named nb WHERE nb.batch IS NOT NULL LIMIT 1000) b
        CROSS JOIN LATERAL (
            SELECT f.batch, f.id, f.priority FROM files.files f
            WHERE f.state = 'pending' AND f.queue = fair_rows.queue AND f.batch = b.batch AND f.run_after <= now()
            ORDER BY f.priority DESC, f.id
            LIMIT fair_rows.n
            FOR UPDATE SKIP LOCKED
        ) c
        UNION ALL
        -- The rows without a batch share as one more.
        SELECT c.batch, c.id, c.priority, row_number() OVER (PARTITION BY c.priority ORDER BY c.id)
        FROM (SELECT f.batch, f.id, f.priority FROM files.files f
              WHERE f.state = 'pending' AND f.queue = fair_rows.queue AND f.batch IS NULL AND f.run_after <= now()
              ORDER BY f.priority DESC, f.id
              LIMIT fair_rows.n
              FOR UPDATE SKIP LOCKED) c
    )
    -- Larger priority first; within a priority the batches take turns: a
    -- row's turn is its batch's running rows plus its rank.
    SELECT c.id, c.priority, coalesce(r.n, 0) + c.rank
    FROM candidates c LEFT JOIN running r ON r.batch IS NOT DISTINCT FROM c.batch
    ORDER BY c.priority DESC, 3, c.id
    LIMIT fair_rows.n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fair_rows(text, integer) IS
    'For the claims of a fair-share queue (files.queues.fair_share): up to n claimable rows of queue, locked FOR UPDATE '
    'SKIP LOCKED, larger priority first and then the batches in turn: a row''s turn is its batch''s running rows plus its '
    'place among the batch''s claimable rows, so the batch with the fewest running rows goes first (rows without a batch '
    'as one more batch; at most 1,000 batches at once). Returns each row''s turn. Rows locked but not returned stay '
    'locked until the transaction ends.';

-- +goose StatementBegin
CREATE FUNCTION files.fair_pick(queues text[], fair boolean[], rooms integer[], n integer, prefer boolean)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows bigint[];
BEGIN
    -- The best rows of each queue (an index range scan of files_claim_idx, or
    -- files.fair_rows for a fair-share queue), no more than its room, then
    -- the best of those: with prefer a queue's rows all before the next
    -- queue's, otherwise larger priority first, then the batches' turns,
    -- then id.
    SELECT array_agg(p.id ORDER BY p.pref, p.priority DESC, p.turn, p.id) INTO v_rows
    FROM (
        SELECT CASE WHEN fair_pick.prefer THEN q.ord END AS pref, l.id, l.priority, l.turn
        FROM unnest(fair_pick.queues, fair_pick.fair, fair_pick.rooms) WITH ORDINALITY AS q(name, fair, room, ord)
        CROSS JOIN LATERAL (
            SELECT o.id, o.priority, 1::bigint AS turn FROM (
                SELECT f.id, f.priority FROM files.files f
                WHERE NOT q.fair AND f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
                ORDER BY f.priority DESC, f.id
                LIMIT least(fair_pick.n, q.room)
                FOR UPDATE SKIP LOCKED
            ) o
            UNION ALL
            SELECT s.id, s.priority, s.turn FROM files.fair_rows(q.name, least(fair_pick.n, q.room)) s WHERE q.fair
        ) l
        ORDER BY 1, l.priority DESC, l.turn, l.id
        LIMIT fair_pick.n
    ) p;
    RETURN v_rows;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fair_pick(text[], boolean[], integer[], integer, boolean) IS
    'The row search of files.claim and files.claim_batch when one of queues shares among its batches: locks (FOR UPDATE '
    'SKIP LOCKED) and returns, in claim order, the ids of up to n claimable rows, at most rooms[i] of queue i, through '
    'files.fair_rows for the queues whose fair[i] is true; with prefer, queue by queue in the given order.';

-- +goose StatementBegin
CREATE FUNCTION files.wake_capped(queues text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    -- A row of a capped queue ended: the queue may have room again, which no
    -- other notification announces. (PL/pgSQL keeps the plan; files.fail
    -- calls this for every queue.)
    SELECT count(pg_notify('files_pending', q.queue))::integer INTO n FROM files.queues q
    WHERE q.queue = ANY (wake_capped.queues) AND q.max_running IS NOT NULL AND NOT q.paused
      AND EXISTS (SELECT 1 FROM files.files f WHERE f.state = 'pending' AND f.queue = q.queue AND f.run_after <= now());
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.wake_capped(text[]) IS
    'Called as running rows end: sends files_pending for each of queues that has a cap (files.queues.max_running), is '
    'not paused and has claimable rows. Returns how many it sent.';

-- +goose StatementBegin
CREATE FUNCTION files.claim(worker_id text, queues text[] DEFAULT NULL, max integer DEFAULT 1, key text DEFAULT NULL,
                            prefer boolean DEFAULT false)
RETURNS SETOF files.files
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
    v_state  text;
    v_lease  interval;
    v_hash   bytea;
    v_key    bytea := sha256(convert_to(claim.key, 'UTF8'));
    v_queues text[];
    v_fair   boolean[];
    v_capped boolean;
    v_room   integer[];
    v_ids    bigint[];
    v_salt   text := gen_random_uuid()::text;
    r        files.files;
BEGIN
    IF claim.worker_id IS NULL OR claim.worker_id = '' THEN
        RAISE EXCEPTION 'files.claim: worker_id must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF claim.max IS NULL OR claim.max < 1 OR claim.max > 10000 THEN
        RAISE EXCEPTION 'files.claim: max must be between 1 and 10000 (got %)', coalesce(claim.max::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The test inline, the call (a statement of its own) only to raise.
    IF array_position(claim.queues, NULL) IS NOT NULL OR '' = ANY (claim.queues) THEN
        PERFORM files.check_queues('files.claim', claim.queues);
    END IF;

    -- The slot, and in the same statement the queues to take from, in name
    -- order, or in the caller's order when it prefers; a queue's fair share
    -- and cap as files.claim_batch reads them.
    SELECT w.state, w.lease_timeout, w.key_hash, q.queues, q.fair, q.capped
    INTO v_state, v_lease, v_hash, v_queues, v_fair, v_capped
    FROM (
        SELECT array_agg(q.queue ORDER BY CASE WHEN claim.prefer THEN array_position(claim.queues, q.queue) END, q.queue) AS queues,
               array_agg(q.fair_share ORDER BY CASE WHEN claim.prefer THEN array_position(claim.queues, q.queue) END, q.queue) AS fair,
               bool_or(q.max_running IS NOT NULL) AS capped
        FROM files.queues q
        WHERE NOT q.paused AND (claim.queues IS NULL OR q.queue = ANY (claim.queues))
    ) q
    LEFT JOIN files.workers w ON w.worker_id = claim.worker_id;
    IF v_hash IS DISTINCT FROM v_key AND v_hash IS NOT NULL THEN
        RAISE EXCEPTION 'files.claim: slot % has a key and this is not it', claim.worker_id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Pass the key given to files.register_worker or to the slot''s first claim.';
    END IF;
    IF v_state IS NULL OR v_state IN ('stopped', 'dead') OR (v_hash IS NULL AND v_key IS NOT NULL) THEN
        IF claim.key IS NOT NULL AND length(claim.key) < 16 THEN
            RAISE EXCEPTION 'files.claim: key must be at least 16 characters (for example gen_random_uuid()::text)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- First claim of an unknown slot registers it (with the key, if one is
        -- given); a claim proves a stopped or dead slot alive.
        INSERT INTO files.workers AS w (worker_id, queues, key_hash) VALUES (claim.worker_id, claim.queues, v_key)
        ON CONFLICT (worker_id) DO UPDATE
            SET state = 'active', last_heartbeat_at = now(), stopped_at = NULL,
                key_hash = coalesce(w.key_hash, EXCLUDED.key_hash)
        RETURNING w.state, w.lease_timeout INTO v_state, v_lease;
    ELSIF v_state = 'draining' THEN
        RETURN;
    END IF;

    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    IF v_capped THEN
        v_room := files.cap_room(v_queues);
    END IF;

    -- The best rows of all queues, no more than each queue's cap leaves room
    -- for: files.pick, or, when a queue shares among its batches,
    -- files.fair_pick (then without pick's hints). Each row's token is derived
    -- from a random salt of this call: only its hash is written, and the
    -- token itself goes into the returned row alone.
    IF true = ANY (v_fair) THEN
        v_ids := files.fair_pick(v_queues, v_fair, v_room, claim.max, claim.prefer);
    ELSE
        v_ids := files.pick(v_queues, claim.max, v_room, claim.prefer);
    END IF;
    FOR r IN
        WITH picked AS (
            SELECT p.id FROM unnest(v_ids) AS p(id)
        ), claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = claim.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + v_lease,
                claim_token_hash = sha256(convert_to(encode(sha256(convert_to(v_salt || f.id, 'UTF8')), 'hex'), 'UTF8'))
            FROM picked WHERE f.id = picked.id
            RETURNING f.*
        )
        -- Preferred queues first, then priority and id (a window numbering
        -- the picks costs a fifth of a one-row claim).
        SELECT c.* FROM claimed c
        ORDER BY CASE WHEN claim.prefer THEN array_position(v_queues, c.queue) END, c.priority DESC, c.id
    LOOP
        r.claim_token := encode(sha256(convert_to(v_salt || r.id, 'UTF8')), 'hex');
        RETURN NEXT r;
    END LOOP;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.claim(text, text[], integer, text, boolean) IS
    'Claims up to max (at most 10000) claimable rows (pending, run_after passed, queue not paused) for a worker slot: '
    'larger priority first, then id; FOR UPDATE SKIP LOCKED. queues NULL = all queues; with prefer, the rows of each '
    'queue come before those of the queues after it in queues (work is taken from the next queue only while the ones '
    'before have none claimable). A queue''s cap (files.queues.max_running) is never exceeded, and the batches of a '
    'fair-share queue take turns (files.queues.fair_share). An unknown worker_id is '
    'registered, with key if given; a slot that has a key requires it. Each returned row carries its claim_token, '
    'which files.complete, fail and release require. Zero rows, or SQLSTATE 40001/40P01 under stricter isolation, mean "wait again".';

-- +goose StatementBegin
CREATE FUNCTION files.get_unprocessed_entry_by_priority(worker_id text, key text DEFAULT NULL)
RETURNS SETOF files.files
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM files.claim(worker_id, NULL, 1, key);
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.get_unprocessed_entry_by_priority(text, text) IS
    'Claims zero or one row of any queue for worker_id: files.claim(worker_id, NULL, 1, key), for scripts and psql. '
    'Keep the row''s claim_token for files.complete or files.fail.';

-- The batched forms, for a process that runs many slots: one statement claims
-- a row for each idle slot, one records the outcomes of many rows. Each row
-- stays fenced exactly as with the single-row functions.

-- +goose StatementBegin
CREATE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL, key text DEFAULT NULL,
                                  prefer boolean DEFAULT false)
RETURNS SETOF files.files
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Its statements are planned once per session, not at every call (a custom
-- plan of the claiming update alone cost as much as running it), and only
-- the plans below fit every number of slots: index lookups driven by the
-- arrays, never a scan of files.workers or files.files.
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids    text[];
    v_queues text[];
    v_fair   boolean[];
    v_capped boolean;
    v_room   integer[];
    v_leases interval[];
    v_rows   bigint[];
    v_revive boolean;
    v_bad    text;
    v_key    bytea := sha256(convert_to(claim_batch.key, 'UTF8'));
    v_salt   text := gen_random_uuid()::text;
    r        files.files;
BEGIN
    IF claim_batch.worker_ids IS NULL OR cardinality(claim_batch.worker_ids) = 0
       OR array_position(claim_batch.worker_ids, NULL) IS NOT NULL OR '' = ANY (claim_batch.worker_ids) THEN
        RAISE EXCEPTION 'files.claim_batch: worker_ids must be a non-empty array of non-empty ids'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(claim_batch.worker_ids) > 10000 THEN
        RAISE EXCEPTION 'files.claim_batch: at most 10000 worker_ids (got %)', cardinality(claim_batch.worker_ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- As in files.claim.
    IF array_position(claim_batch.queues, NULL) IS NOT NULL OR '' = ANY (claim_batch.queues) THEN
        PERFORM files.check_queues('files.claim_batch', claim_batch.queues);
    END IF;

    -- The active slots, each once, in the order given; draining ones take
    -- nothing. An unknown slot is registered, a claim proves a stopped or
    -- dead slot alive, and a slot without a key takes the one given: these
    -- cost a second look, the usual claim one join. In the same statement,
    -- the queues to take from, in name order, or in the caller's order when
    -- it prefers, with whether their batches take turns and whether one has
    -- a fleet-wide cap. Queues without either cost nothing more: no lock, no
    -- count.
    SELECT s.ids, s.leases, s.revive, s.bad, q.queues, q.fair, q.capped
    INTO v_ids, v_leases, v_revive, v_bad, v_queues, v_fair, v_capped
    FROM (
        SELECT array_agg(s.id ORDER BY s.ord) FILTER (WHERE w.state IS DISTINCT FROM 'draining') AS ids,
               array_agg(w.lease_timeout ORDER BY s.ord) FILTER (WHERE w.state IS DISTINCT FROM 'draining') AS leases,
               bool_or(w.state IS DISTINCT FROM 'active' OR (w.key_hash IS NULL AND v_key IS NOT NULL))
                   FILTER (WHERE w.state IS DISTINCT FROM 'draining') AS revive,
               min(s.id) FILTER (WHERE w.key_hash IS NOT NULL AND w.key_hash IS DISTINCT FROM v_key) AS bad
        FROM (SELECT u.id, min(u.ord) AS ord
              FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
              GROUP BY u.id) s
        LEFT JOIN files.workers w ON w.worker_id = s.id
    ) s, (
        SELECT array_agg(q.queue ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS queues,
               array_agg(q.fair_share ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS fair,
               bool_or(q.max_running IS NOT NULL) AS capped
        FROM files.queues q
        WHERE NOT q.paused AND (claim_batch.queues IS NULL OR q.queue = ANY (claim_batch.queues))
    ) q;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'files.claim_batch: slot % has a key and this is not it', v_bad
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Pass the key given to files.register_worker or to the slot''s first claim.';
    END IF;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_revive THEN
        IF claim_batch.key IS NOT NULL AND length(claim_batch.key) < 16 THEN
            RAISE EXCEPTION 'files.claim_batch: key must be at least 16 characters (for example gen_random_uuid()::text)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO files.workers AS w (worker_id, queues, key_hash)
        SELECT u.id, claim_batch.queues, v_key FROM unnest(v_ids) AS u(id)
        ORDER BY u.id
        ON CONFLICT (worker_id) DO UPDATE
            SET state = 'active', last_heartbeat_at = now(), stopped_at = NULL,
                key_hash = coalesce(w.key_hash, EXCLUDED.key_hash)
            WHERE w.state IN ('stopped', 'dead') OR w.key_hash IS NULL;
        SELECT array_agg(u.id ORDER BY u.ord), array_agg(w.lease_timeout ORDER BY u.ord) INTO v_ids, v_leases
        FROM unnest(v_ids) WITH ORDINALITY AS u(id, ord)
        JOIN files.workers w ON w.worker_id = u.id
        WHERE w.state = 'active';
        IF v_ids IS NULL THEN
            RETURN;
        END IF;
    END IF;

    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    -- Room left under each queue's cap (NULL: none), the capped queues locked
    -- against other claimers until this claim commits.
    IF v_capped THEN
        v_room := files.cap_room(v_queues);
    END IF;

    -- Lock the rows to take: the best rows of each queue, no more than its
    -- cap leaves room for (files.pick, or files.fair_pick when a queue
    -- shares among its batches, as in files.claim). With prefer,
    -- a queue's rows all come before the next queue's, so the next one's
    -- fill only the slots left over ("stealing"); otherwise larger priority
    -- first, then the batches' turns, then id.
    IF true = ANY (v_fair) THEN
        v_rows := files.fair_pick(v_queues, v_fair, v_room, cardinality(v_ids), claim_batch.prefer);
    ELSE
        v_rows := files.pick(v_queues, cardinality(v_ids), v_room, claim_batch.prefer);
    END IF;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;

    -- The i-th best row goes to the i-th slot: one unnest zips the arrays and
    -- drives one primary-key lookup per row, the only plan that fits (a
    -- condition "id = ANY (v_rows)" beside the join would let a generic plan
    -- rescan the arrays for each row: quadratic). Tokens as in files.claim.
    FOR r IN
        WITH claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = p.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + p.lease_timeout,
                claim_token_hash = sha256(convert_to(encode(sha256(convert_to(v_salt || f.id, 'UTF8')), 'hex'), 'UTF8'))
            FROM unnest(v_rows, v_ids[1:cardinality(v_rows)], v_leases[1:cardinality(v_rows)])
                 AS p(id, worker_id, lease_timeout)
            WHERE f.id = p.id
            RETURNING f.*
        )
        -- Preferred queues first, then priority and id, as files.claim.
        SELECT c.* FROM claimed c
        ORDER BY CASE WHEN claim_batch.prefer THEN array_position(v_queues, c.queue) END, c.priority DESC, c.id
    LOOP
        r.claim_token := encode(sha256(convert_to(v_salt || r.id, 'UTF8')), 'hex');
        RETURN NEXT r;
    END LOOP;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.claim_batch(text[], text[], text, boolean) IS
    'Claims at most one claimable row for each active slot of worker_ids (at most 10000), in one statement (files.claim''s '
    'order, prefer, caps, fair share, paused queues and run_after apply; queues NULL = all). The slots share key: unknown slots are registered with '
    'it, a slot that has another key is refused, draining ones take nothing. Each row carries its claim_token. '
    'Zero rows, or SQLSTATE 40001/40P01 under stricter isolation, mean "wait again".';

-- Batches: their counts follow the rows that end (done, failed, cancelled)
-- and the rows that open again (retry), in the statement that changes them.

-- +goose StatementBegin
CREATE FUNCTION files.finish_batches(batches text[] DEFAULT NULL)
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

-- +goose StatementBegin
CREATE FUNCTION files.tally(queues text[], batches text[], was text[], became text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ended    text[];
    v_reopened text[];
BEGIN
    -- The queues' counts: one line appended per queue (none when queues is NULL:
    -- the triggers of files.files count their rows themselves).
    INSERT INTO files.queue_counts (queue, at, done, failed, cancelled, ended_done, ended_failed, ended_cancelled)
    SELECT x.queue, date_trunc('minute', now()),
           sum((x.became = 'done')::integer - (x.was = 'done')::integer),
           sum((x.became = 'failed')::integer - (x.was = 'failed')::integer),
           sum((x.became = 'cancelled')::integer - (x.was = 'cancelled')::integer),
           count(*) FILTER (WHERE x.became = 'done' AND x.was <> 'done'),
           count(*) FILTER (WHERE x.became = 'failed' AND x.was <> 'failed'),
           count(*) FILTER (WHERE x.became = 'cancelled' AND x.was <> 'cancelled')
    FROM unnest(tally.queues, tally.was, tally.became) AS x(queue, was, became)
    WHERE x.queue IS NOT NULL
    GROUP BY x.queue;

    IF tally.batches IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(tally.batches) AS b(batch) WHERE b.batch IS NOT NULL) THEN
        RETURN;
    END IF;
    WITH d AS (
        SELECT x.batch,
               sum((x.became = 'done')::integer - (x.was = 'done')::integer) AS done,
               sum((x.became = 'failed')::integer - (x.was = 'failed')::integer) AS failed,
               sum((x.became = 'cancelled')::integer - (x.was = 'cancelled')::integer) AS cancelled,
               count(*) FILTER (WHERE x.became IN ('done', 'failed', 'cancelled')
                                  AND x.was NOT IN ('done', 'failed', 'cancelled')) AS ended,
               count(*) FILTER (WHERE x.was IN ('done', 'failed', 'cancelled')
                                  AND x.became IN ('pending', 'running')) AS reopened
        FROM unnest(tally.batches, tally.was, tally.became) AS x(batch, was, became)
        WHERE x.batch IS NOT NULL
        GROUP BY x.batch
    ), counted AS (
        INSERT INTO files.batch_counts AS c (batch, shard, done, failed, cancelled, recent, recent_at)
        SELECT d.batch, pg_backend_pid() % 32, d.done, d.failed, d.cancelled, d.ended, now()
        FROM d ORDER BY d.batch
        ON CONFLICT (batch, shard) DO UPDATE
        SET done = c.done + EXCLUDED.done,
            failed = c.failed + EXCLUDED.failed,
            cancelled = c.cancelled + EXCLUDED.cancelled,
            recent = c.recent * exp(-greatest(extract(epoch FROM EXCLUDED.recent_at - c.recent_at), 0) / 60)
                     + EXCLUDED.recent,
            recent_at = greatest(c.recent_at, EXCLUDED.recent_at)
    )
    SELECT array_agg(d.batch) FILTER (WHERE d.ended > 0), array_agg(d.batch) FILTER (WHERE d.reopened > 0)
    INTO v_ended, v_reopened FROM d;

    IF v_reopened IS NOT NULL THEN
        UPDATE files.batches b SET finished_at = NULL
        WHERE b.batch = ANY (v_reopened) AND b.finished_at IS NOT NULL;
    END IF;
    IF v_ended IS NOT NULL THEN
        PERFORM files.finish_batches(v_ended);
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.tally(text[], text[], text[], text[]) IS
    'Counts rows that changed state in their queues and batches: element i is row i''s queue, batch (NULL: none), old '
    'state and new state (queues NULL: count in the batches only). Finishes the batches whose last row ended, and opens '
    'again the finished ones whose rows went back to pending.';

-- +goose StatementBegin
CREATE FUNCTION files.fold_counts()
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The lines appended since the last fold, and the folded minutes that fell
    -- out of the last hour, become one folded line per queue and minute (and
    -- -infinity). A line is deleted by one fold only, so folds may overlap.
    WITH gone AS (
        DELETE FROM files.queue_counts c
        WHERE NOT c.folded OR (c.at < date_trunc('minute', now()) - interval '1 hour' AND c.at > '-infinity')
        RETURNING c.*
    ), sums AS (
        SELECT g.queue, g.at < date_trunc('minute', now()) - interval '1 hour' AS old,
               CASE WHEN g.at < date_trunc('minute', now()) - interval '1 hour' THEN '-infinity' ELSE g.at END AS at,
               sum(g.rows) AS rows, sum(g.done) AS done, sum(g.failed) AS failed, sum(g.cancelled) AS cancelled,
               sum(g.ended_done) AS ended_done, sum(g.ended_failed) AS ended_failed,
               sum(g.ended_cancelled) AS ended_cancelled
        FROM gone g
        GROUP BY 1, 2, 3
    )
    INSERT INTO files.queue_counts AS c (queue, at, folded, rows, done, failed, cancelled,
                                         ended_done, ended_failed, ended_cancelled)
    SELECT s.queue, s.at, true, sum(s.rows), sum(s.done), sum(s.failed), sum(s.cancelled),
           -- Beyond the hour only the sums matter: the rates are of the last hour.
           coalesce(sum(s.ended_done) FILTER (WHERE NOT s.old), 0),
           coalesce(sum(s.ended_failed) FILTER (WHERE NOT s.old), 0),
           coalesce(sum(s.ended_cancelled) FILTER (WHERE NOT s.old), 0)
    FROM sums s
    GROUP BY s.queue, s.at
    ORDER BY s.queue, s.at
    ON CONFLICT (queue, at) WHERE folded DO UPDATE
    SET rows = c.rows + EXCLUDED.rows,
        done = c.done + EXCLUDED.done,
        failed = c.failed + EXCLUDED.failed,
        cancelled = c.cancelled + EXCLUDED.cancelled,
        ended_done = c.ended_done + EXCLUDED.ended_done,
        ended_failed = c.ended_failed + EXCLUDED.ended_failed,
        ended_cancelled = c.ended_cancelled + EXCLUDED.ended_cancelled;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fold_counts() IS
    'Folds files.queue_counts: the lines appended since the last fold become one line per queue and minute, and the '
    'minutes older than an hour one line per queue (at -infinity). Called by files.reap and files.prune; folds may overlap.';

-- +goose StatementBegin
CREATE FUNCTION files.batch_rows_added(batches text[], ids bigint[], states text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO files.batches AS b (batch, total, first_id, last_id)
    SELECT x.batch, count(*), min(x.id), max(x.id)
    FROM unnest(batch_rows_added.batches, batch_rows_added.ids) AS x(batch, id)
    GROUP BY x.batch ORDER BY x.batch
    ON CONFLICT (batch) DO UPDATE
    SET total = b.total + EXCLUDED.total,
        first_id = least(b.first_id, EXCLUDED.first_id),
        last_id = greatest(b.last_id, EXCLUDED.last_id),
        finished_at = NULL;
    -- Rows inserted already ended (by an admin's INSERT) count as ended.
    IF EXISTS (SELECT 1 FROM unnest(batch_rows_added.states) AS s(state) WHERE s.state <> 'pending') THEN
        PERFORM files.tally(NULL, array_agg(x.batch), array_agg('pending'::text), array_agg(x.state))
        FROM unnest(batch_rows_added.batches, batch_rows_added.states) AS x(batch, state)
        WHERE x.state <> 'pending';
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.batch_rows_added(text[], bigint[], text[]) IS
    'Called by the insert trigger of files.files: creates the batches that new rows name and counts the rows in.';

-- +goose StatementBegin
CREATE FUNCTION files.batch_rows_deleted(batches text[], states text[])
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
COMMENT ON FUNCTION files.batch_rows_deleted(text[], text[]) IS
    'Called by the delete trigger of files.files: counts deleted rows (element i: batch and state) out of their batches.';

-- Recording outcomes. Each is fenced: it does nothing, and returns false or
-- leaves the row out of its answer, unless the row is still held by that
-- worker_id in that attempt; and a row that is so held but named with another
-- claim token is refused with an error.

-- +goose StatementBegin
CREATE FUNCTION files.refuse_forged(fn text, ids bigint[], worker_ids text[], attempts integer[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- Called when a fenced call changed fewer rows than it named: a row still
    -- held by the named worker and attempt was refused for its token.
    SELECT f.id INTO v_id
    FROM unnest(ids, worker_ids, attempts) AS u(id, worker_id, attempt)
    JOIN files.files f ON f.id = u.id AND f.worker_id = u.worker_id AND f.attempt = u.attempt
    ORDER BY f.id LIMIT 1;
    IF v_id IS NOT NULL THEN
        RAISE EXCEPTION '%: wrong claim token for row % (only the claim that returned the row may record its outcome)', fn, v_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.refuse_forged(text, bigint[], text[], integer[]) IS
    'Raises an error naming fn if one of the rows is held by the given worker and attempt (its token was wrong).';

-- +goose StatementBegin
CREATE FUNCTION files.complete(id bigint, worker_id text, attempt integer, token text, result jsonb DEFAULT NULL,
                               report jsonb DEFAULT NULL, then_queue text DEFAULT NULL)
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
    n        integer;
    v_batch  text;
    v_queues text[];
    v_capped text[];
BEGIN
    -- As files.complete_many does for each of its rows. The result is stored
    -- once, on the row.
    WITH done AS (
        UPDATE files.files f
        SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), result = complete.result,
            claim_token_hash = NULL
        WHERE f.id = complete.id AND f.worker_id = complete.worker_id AND f.attempt = complete.attempt
          AND f.claim_token_hash = sha256(convert_to(complete.token, 'UTF8'))
        RETURNING f.id, f.claimed_at, f.batch, f.queue
    ), logged AS (
        INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome,
                                    exit_code, duration, stderr_tail)
        SELECT d.id, d.queue, complete.attempt, complete.worker_id, coalesce(d.claimed_at, now()), now(), 'done',
               (complete.report ->> 'exit_code')::integer,
               coalesce((complete.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - d.claimed_at),
               complete.report ->> 'stderr_tail'
        FROM done d
    ), counted AS (
        INSERT INTO files.queue_counts (queue, at, done, ended_done)
        SELECT d.queue, date_trunc('minute', now()), 1, 1 FROM done d
    )
    SELECT count(*), min(d.batch), array_agg(d.queue) FILTER (WHERE complete.then_queue IS NOT NULL),
           array_agg(d.queue) FILTER (WHERE EXISTS (SELECT 1 FROM files.queues q WHERE q.queue = d.queue AND q.max_running IS NOT NULL))
    INTO n, v_batch, v_queues, v_capped FROM done d;
    -- The outputs become rows of then_queue, with the row's batch, priority,
    -- payload and max_attempts; a loop undoes the whole call. A statement of
    -- its own: an INSERT runs the enqueue trigger even when it adds nothing.
    IF complete.then_queue IS NOT NULL THEN
        PERFORM files.check_then('files.complete', complete.then_queue, v_queues);
        IF n > 0 THEN
            INSERT INTO files.files (queue, priority, payload, source, unique_key, batch, max_attempts)
            SELECT complete.then_queue, f.priority, f.payload, o.key, o.key, f.batch, f.max_attempts
            FROM files.files f, files.output_keys(f.result) AS o(key)
            WHERE f.id = complete.id
              AND NOT EXISTS (SELECT 1 FROM files.unique_keys k WHERE k.queue = complete.then_queue AND k.key = o.key);
        END IF;
    END IF;
    IF n = 0 THEN
        PERFORM files.refuse_forged('files.complete', ARRAY[complete.id], ARRAY[complete.worker_id], ARRAY[complete.attempt]);
    ELSIF v_batch IS NOT NULL THEN
        PERFORM files.tally(NULL, ARRAY[v_batch], ARRAY['running'], ARRAY['done']);
    END IF;
    -- A capped queue has room again.
    IF v_capped IS NOT NULL THEN
        PERFORM files.wake_capped(v_capped);
    END IF;
    RETURN n > 0;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.complete(bigint, text, integer, text, jsonb, jsonb, text) IS
    'Fenced: marks the row done with result (stored on the row) and the worker''s report (exit_code, duration_ms, '
    'stderr_tail) on its attempt. With then_queue, each output of the result (result->''outputs''[i]->>''key'') becomes '
    'a row of that queue in the same transaction, keyed by its key, with the row''s batch, priority, payload and max_attempts. '
    'Returns false and changes nothing if the attempt no longer holds the row; raises an error if it does and token '
    'is not its claim token.';

-- +goose StatementBegin
CREATE FUNCTION files.complete_many(
    ids bigint[], worker_ids text[], attempts integer[], tokens text[], results jsonb[] DEFAULT NULL, reports jsonb[] DEFAULT NULL,
    then_queue text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_done    bigint[];
    v_batches text[];
    v_queues  text[];
    v_capped  text[];
BEGIN
    IF cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.worker_ids)
       OR cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.attempts)
       OR cardinality(complete_many.ids) IS DISTINCT FROM cardinality(complete_many.tokens)
       OR (complete_many.results IS NOT NULL AND cardinality(complete_many.results) <> cardinality(complete_many.ids))
       OR (complete_many.reports IS NOT NULL AND cardinality(complete_many.reports) <> cardinality(complete_many.ids)) THEN
        RAISE EXCEPTION 'files.complete_many: ids, worker_ids, attempts, tokens, results and reports must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- One statement for the batch, one primary-key lookup per element, in id
    -- order (as files.heartbeat locks, so that the two cannot deadlock). The
    -- fence is worker_id, attempt and claim token: a row has a worker_id only
    -- while it runs (files_worker_iff_running). Nothing here lets the planner
    -- prefer a scan of the running rows or a join that rescans the arrays,
    -- with fresh statistics or stale ones, in custom or generic plans. An id
    -- given twice is recorded once.
    WITH done AS (
        UPDATE files.files f
        SET state = 'done', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), result = u.result,
            claim_token_hash = NULL
        FROM (SELECT x.* FROM unnest(complete_many.ids, complete_many.worker_ids, complete_many.attempts,
                                     complete_many.tokens, complete_many.results, complete_many.reports)
                              AS x(id, worker_id, attempt, token, result, report)
              ORDER BY x.id) u
        WHERE f.id = u.id AND f.worker_id = u.worker_id AND f.attempt = u.attempt
          AND f.claim_token_hash = sha256(convert_to(u.token, 'UTF8'))
        RETURNING f.id, u.worker_id, u.attempt, f.claimed_at, u.report, f.batch, f.queue
    ), logged AS (
        INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome,
                                    exit_code, duration, stderr_tail)
        SELECT d.id, d.queue, d.attempt, d.worker_id, coalesce(d.claimed_at, now()), now(), 'done',
               (d.report ->> 'exit_code')::integer,
               coalesce((d.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - d.claimed_at),
               d.report ->> 'stderr_tail'
        FROM done d
    ), counted AS (
        INSERT INTO files.queue_counts (queue, at, done, ended_done)
        SELECT d.queue, date_trunc('minute', now()), count(*), count(*) FROM done d GROUP BY d.queue
    )
    SELECT array_agg(d.id), array_agg(d.batch) FILTER (WHERE d.batch IS NOT NULL),
           array_agg(d.queue) FILTER (WHERE complete_many.then_queue IS NOT NULL),
           array_agg(DISTINCT d.queue) FILTER (WHERE EXISTS (SELECT 1 FROM files.queues q WHERE q.queue = d.queue AND q.max_running IS NOT NULL))
    INTO v_done, v_batches, v_queues, v_capped FROM done d;
    -- As in files.complete: the outputs of the rows marked, in id order, in a
    -- statement of their own; a loop undoes the whole call.
    IF complete_many.then_queue IS NOT NULL THEN
        PERFORM files.check_then('files.complete_many', complete_many.then_queue, v_queues);
        IF v_done IS NOT NULL THEN
            INSERT INTO files.files (queue, priority, payload, source, unique_key, batch, max_attempts)
            SELECT complete_many.then_queue, f.priority, f.payload, o.key, o.key, f.batch, f.max_attempts
            FROM (SELECT f.* FROM unnest(v_done) AS d(id) JOIN files.files f ON f.id = d.id ORDER BY f.id) f,
                 files.output_keys(f.result) AS o(key)
            WHERE NOT EXISTS (SELECT 1 FROM files.unique_keys k WHERE k.queue = complete_many.then_queue AND k.key = o.key);
        END IF;
    END IF;
    IF coalesce(cardinality(v_done), 0) < cardinality(complete_many.ids) THEN
        PERFORM files.refuse_forged('files.complete_many', complete_many.ids, complete_many.worker_ids, complete_many.attempts);
    END IF;
    IF v_batches IS NOT NULL THEN
        PERFORM files.tally(NULL, v_batches, array_fill('running'::text, ARRAY[cardinality(v_batches)]),
                            array_fill('done'::text, ARRAY[cardinality(v_batches)]));
    END IF;
    -- A capped queue has room again.
    IF v_capped IS NOT NULL THEN
        PERFORM files.wake_capped(v_capped);
    END IF;
    RETURN QUERY SELECT u.id FROM unnest(v_done) AS u(id);
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.complete_many(bigint[], text[], integer[], text[], jsonb[], jsonb[], text) IS
    'Fenced, batched files.complete: element i of each array describes one row. Marks done each row still held by its '
    'worker_id in its attempt, in one statement, and returns the ids it marked; the others are left unchanged. A row '
    'held by its worker_id and attempt under another claim token raises an error (and records nothing). then_queue as '
    'in files.complete, for every row it marks.';

-- +goose StatementBegin
CREATE FUNCTION files.fail(id bigint, worker_id text, attempt integer, token text, error text,
                           retryable boolean DEFAULT true, report jsonb DEFAULT NULL)
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
    IF r.claim_token_hash IS DISTINCT FROM sha256(convert_to(fail.token, 'UTF8')) THEN
        PERFORM files.refuse_forged('files.fail', ARRAY[fail.id], ARRAY[fail.worker_id], ARRAY[fail.attempt]);
    END IF;

    IF NOT coalesce(fail.retryable, true) OR r.attempt >= r.max_attempts THEN
        UPDATE files.files f
        SET state = 'failed', worker_id = NULL, lease_expires_at = NULL, finished_at = now(), last_error = v_error,
            claim_token_hash = NULL
        WHERE f.id = r.id;
        PERFORM files.tally(ARRAY[r.queue], ARRAY[r.batch], ARRAY['running'], ARRAY['failed']);
    ELSE
        SELECT q.backoff_base, q.backoff_max INTO v_base, v_max FROM files.queues q WHERE q.queue = r.queue;
        v_base := coalesce(v_base, interval '1 second');
        v_max := coalesce(v_max, interval '1 hour');
        -- Exponential backoff with "equal jitter": between half and all of base * 2^(attempt-1).
        v_delay := least(v_max, v_base * power(2, least(r.attempt - 1, 30)));
        v_delay := v_delay * (0.5 + random() * 0.5);
        UPDATE files.files f
        SET state = 'pending', worker_id = NULL, lease_expires_at = NULL, run_after = now() + v_delay, last_error = v_error,
            claim_token_hash = NULL
        WHERE f.id = r.id;
    END IF;

    INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, error,
                                exit_code, duration, output, stderr_tail)
    VALUES (r.id, r.queue, r.attempt, r.worker_id, coalesce(r.claimed_at, now()), now(), 'failed', v_error,
            (fail.report ->> 'exit_code')::integer,
            coalesce((fail.report ->> 'duration_ms')::numeric * interval '1 millisecond', now() - r.claimed_at),
            fail.report -> 'output', fail.report ->> 'stderr_tail');
    -- A capped queue has room again.
    PERFORM files.wake_capped(ARRAY[r.queue]);
    RETURN true;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fail(bigint, text, integer, text, text, boolean, jsonb) IS
    'Fenced: records a failed attempt. The row is retried after an exponential backoff with jitter (files.queues.backoff_base, backoff_max) '
    'until max_attempts, or at once ends failed when retryable is false. Returns false and changes nothing if the attempt no longer holds the row; '
    'raises an error if it does and token is not its claim token.';

-- +goose StatementBegin
CREATE FUNCTION files.fail_many(
    ids bigint[], worker_ids text[], attempts integer[], tokens text[], errors text[],
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
       OR cardinality(fail_many.ids) IS DISTINCT FROM cardinality(fail_many.tokens)
       OR cardinality(fail_many.ids) IS DISTINCT FROM cardinality(fail_many.errors)
       OR (fail_many.retryable IS NOT NULL AND cardinality(fail_many.retryable) <> cardinality(fail_many.ids))
       OR (fail_many.reports IS NOT NULL AND cardinality(fail_many.reports) <> cardinality(fail_many.ids)) THEN
        RAISE EXCEPTION 'files.fail_many: ids, worker_ids, attempts, tokens, errors, retryable and reports must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- In id order, as files.heartbeat locks, so that the two cannot deadlock.
    FOR i IN SELECT u.n FROM unnest(fail_many.ids) WITH ORDINALITY AS u(id, n) ORDER BY u.id, u.n LOOP
        IF files.fail(fail_many.ids[i], fail_many.worker_ids[i], fail_many.attempts[i], fail_many.tokens[i],
                      fail_many.errors[i], coalesce(fail_many.retryable[i], true), fail_many.reports[i]) THEN
            RETURN QUERY SELECT f.id, f.state, f.run_after FROM files.files f WHERE f.id = fail_many.ids[i];
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fail_many(bigint[], text[], integer[], text[], text[], boolean[], jsonb[]) IS
    'Fenced, batched files.fail: element i of each array describes one row (retryable defaults to true). Returns, for each '
    'row it recorded, its new state and run_after: pending rows are retried at run_after, so a worker knows when to look again.';

-- +goose StatementBegin
CREATE FUNCTION files.release(id bigint, worker_id text, attempt integer, token text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue   text;
    v_claimed timestamptz;
    v_token   bytea := sha256(convert_to(release.token, 'UTF8'));
BEGIN
    -- The claim token, or the key of the slot that holds the row (a row whose
    -- claim's answer never reached its worker).
    UPDATE files.files f
    SET state = 'pending', worker_id = NULL, lease_expires_at = NULL, attempt = f.attempt - 1, run_after = now(),
        claim_token_hash = NULL
    WHERE f.id = release.id AND f.state = 'running'
      AND f.worker_id = release.worker_id AND f.attempt = release.attempt
      AND (f.claim_token_hash = v_token
           OR EXISTS (SELECT 1 FROM files.workers w WHERE w.worker_id = release.worker_id AND w.key_hash = v_token))
    RETURNING f.queue, f.claimed_at INTO v_queue, v_claimed;
    IF NOT FOUND THEN
        PERFORM files.refuse_forged('files.release', ARRAY[release.id], ARRAY[release.worker_id], ARRAY[release.attempt]);
        RETURN false;
    END IF;

    INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, error, duration)
    VALUES (release.id, v_queue, release.attempt, release.worker_id, coalesce(v_claimed, now()), now(), 'released',
            coalesce(release.reason, 'released'), now() - coalesce(v_claimed, now()));
    PERFORM pg_notify('files_pending', v_queue);
    RETURN true;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.release(bigint, text, integer, text, text) IS
    'Fenced: hands a running row back to the queue without spending an attempt (shutdown, drain). token is the row''s '
    'claim token or the key of the slot holding it. Returns false if the attempt no longer holds the row; raises an error '
    'if it does and token is neither.';

-- Worker slots: registration, liveness, draining, and the reaping of silent ones.

-- +goose StatementBegin
CREATE FUNCTION files.register_worker(
    worker_id text, node text DEFAULT NULL, pid integer DEFAULT NULL, slot integer DEFAULT NULL,
    version text DEFAULT NULL, queues text[] DEFAULT NULL, lease_timeout interval DEFAULT '15 seconds',
    key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key   text := coalesce(register_worker.key, encode(sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'hex'));
    v_lease interval := coalesce(register_worker.lease_timeout, interval '15 seconds');
    v_hash  bytea;
BEGIN
    IF register_worker.worker_id IS NULL OR register_worker.worker_id = '' THEN
        RAISE EXCEPTION 'files.register_worker: worker_id must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_lease <= interval '0' OR v_lease > interval '24 hours' THEN
        RAISE EXCEPTION 'files.register_worker: lease_timeout must be above 0 and at most 24 hours (got %)', v_lease
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Work that runs longer keeps its lease by heartbeating.';
    END IF;
    IF length(v_key) < 16 THEN
        RAISE EXCEPTION 'files.register_worker: key must be at least 16 characters (for example gen_random_uuid()::text)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM files.check_queues('files.register_worker', register_worker.queues);
    SELECT w.key_hash INTO v_hash FROM files.workers w WHERE w.worker_id = register_worker.worker_id FOR UPDATE;
    IF v_hash IS DISTINCT FROM sha256(convert_to(v_key, 'UTF8')) AND v_hash IS NOT NULL THEN
        RAISE EXCEPTION 'files.register_worker: slot % has a key and this is not it', register_worker.worker_id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Choose a worker id of your own, or pass the key the slot was registered with.';
    END IF;
    PERFORM files.fleet_heard();
    INSERT INTO files.workers AS w (worker_id, node, pid, slot, version, queues, lease_timeout, key_hash)
    VALUES (register_worker.worker_id, register_worker.node, register_worker.pid, register_worker.slot,
            register_worker.version, register_worker.queues, v_lease, sha256(convert_to(v_key, 'UTF8')))
    ON CONFLICT (worker_id) DO UPDATE
    SET node = EXCLUDED.node, pid = EXCLUDED.pid, slot = EXCLUDED.slot, version = EXCLUDED.version,
        queues = EXCLUDED.queues, lease_timeout = EXCLUDED.lease_timeout, key_hash = EXCLUDED.key_hash,
        state = 'active', started_at = now(), last_heartbeat_at = now(), stopped_at = NULL;
    RETURN v_key;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.register_worker(text, text, integer, integer, text, text[], interval, text) IS
    'Registers (or re-registers) a worker slot as active, with its node, pid, slot number, version, queues and lease timeout '
    '(above 0, at most 24 hours). Returns the slot''s key: key if given (at least 16 characters), else a new random one. '
    'A slot that already has a key is re-registered only with it.';

-- +goose StatementBegin
CREATE FUNCTION files.own_slots(fn text, key text, worker_ids text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad text;
BEGIN
    -- Lock the slots in a fixed order, as files.reap does, so that the two
    -- cannot deadlock, and refuse the call if one of them is not the caller's.
    SELECT min(l.worker_id) FILTER (WHERE l.key_hash IS DISTINCT FROM sha256(convert_to(own_slots.key, 'UTF8')))
    INTO v_bad
    FROM (SELECT x.worker_id, x.key_hash FROM files.workers x
          WHERE x.worker_id = ANY (own_slots.worker_ids)
          ORDER BY x.worker_id FOR UPDATE) l;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '%: slot % is not the caller''s (key missing or wrong)', fn, v_bad
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Pass the key given to files.register_worker or to the slot''s first claim; a slot registered '
                         'by a claim without a key cannot be heartbeated, drained or deregistered.';
    END IF;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.own_slots(text, text, text[]) IS
    'Locks the named slots and raises an error naming fn unless each has the given key.';

-- +goose StatementBegin
CREATE FUNCTION files.heartbeat(key text, VARIADIC worker_ids text[])
RETURNS TABLE (worker_id text, file_id bigint, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM files.own_slots('files.heartbeat', heartbeat.key, heartbeat.worker_ids);
    PERFORM files.fleet_heard();
    UPDATE files.workers w
    SET last_heartbeat_at = now(),
        state = CASE WHEN w.state = 'dead' THEN 'active' ELSE w.state END,
        stopped_at = CASE WHEN w.state = 'dead' THEN NULL ELSE w.stopped_at END
    WHERE w.worker_id = ANY (heartbeat.worker_ids);

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
COMMENT ON FUNCTION files.heartbeat(text, text[]) IS
    'One call per process and interval, with the slots'' key: marks the slots alive, extends the leases of their running rows, '
    'and returns the rows (worker_id, file_id, attempt) they still hold. A row missing from the answer was lost (or '
    'cancelled): stop working on it. A slot without that key is refused with an error.';

-- +goose StatementBegin
CREATE FUNCTION files.drain_worker(key text, VARIADIC worker_ids text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    PERFORM files.own_slots('files.drain_worker', drain_worker.key, drain_worker.worker_ids);
    UPDATE files.workers w SET state = 'draining'
    WHERE w.worker_id = ANY (drain_worker.worker_ids) AND w.state = 'active';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.drain_worker(text, text[]) IS
    'Marks active slots draining: they finish the rows they hold and claim no more. Requires the slots'' key. '
    'Returns the number of slots marked.';

-- +goose StatementBegin
CREATE FUNCTION files.deregister_worker(worker_id text, key text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := 0;
    r record;
BEGIN
    PERFORM files.own_slots('files.deregister_worker', deregister_worker.key, ARRAY[deregister_worker.worker_id]);
    FOR r IN SELECT f.id, f.attempt FROM files.files f
             WHERE f.state = 'running' AND f.worker_id = deregister_worker.worker_id ORDER BY f.id
    LOOP
        IF files.release(r.id, deregister_worker.worker_id, r.attempt, deregister_worker.key, 'worker deregistered') THEN
            n := n + 1;
        END IF;
    END LOOP;
    UPDATE files.workers w SET state = 'stopped', stopped_at = now()
    WHERE w.worker_id = deregister_worker.worker_id;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.deregister_worker(text, text) IS
    'Marks a slot stopped and releases the rows it still holds (without spending attempts). Requires the slot''s key. '
    'Returns how many rows were released.';

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

-- A silence of the whole fleet (every live slot silent past its lease timeout)
-- is an outage of the database or of the network between them (a restart, a
-- failover, a PgBouncer outage), not of the workers: the first sign of life
-- after it is noted, and a slot's silence counts from then at the earliest. A
-- worker that really died meanwhile is reaped one lease timeout later.

-- +goose StatementBegin
CREATE FUNCTION files.fleet_heard()
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_silent boolean;
    v_since  timestamptz;
BEGIN
    -- If even the live slot heard from last has been silent past its lease,
    -- the whole fleet was: the caller is the first sign of life since. One
    -- index entry of workers_live_idx is read; the row is written once per
    -- outage.
    SELECT w.last_heartbeat_at < now() - w.lease_timeout INTO v_silent
    FROM files.workers w
    WHERE w.state IN ('active', 'draining')
    ORDER BY w.last_heartbeat_at DESC LIMIT 1;
    IF v_silent THEN
        -- Many first signs of life at once (every node reconnects): the others
        -- wait for the first to commit, then leave its time in place.
        UPDATE files.reap_state s SET fleet_resumed_at = now()
        WHERE s.fleet_resumed_at < now() - interval '1 second';
    END IF;
    SELECT greatest(s.fleet_resumed_at, pg_postmaster_start_time()) INTO v_since FROM files.reap_state s;
    RETURN coalesce(v_since, pg_postmaster_start_time());
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.fleet_heard() IS
    'Called by files.heartbeat, files.register_worker and files.reap: notes the end of a silence of the whole fleet '
    '(files.reap_state) and returns the time from which a slot''s silence counts: the server''s start or the end of '
    'the fleet''s last silence, whichever is later.';

-- +goose StatementBegin
CREATE FUNCTION files.reap()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         integer;
    v_queues  text[];
    v_since   timestamptz;
    v_failed  text[];
    v_batches text[];
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
        RETURNING f.id, f.queue, f.state, f.last_error, f.batch, e.worker_id, e.attempt, e.claimed_at
    ), logged AS (
        INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, error, duration)
        SELECT r.id, r.queue, r.attempt, r.worker_id, coalesce(r.claimed_at, now()), now(), 'lost', r.last_error,
               now() - coalesce(r.claimed_at, now())
        FROM returned r
    )
    SELECT count(*), array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'pending'),
           array_agg(r.queue) FILTER (WHERE r.state = 'failed'), array_agg(r.batch) FILTER (WHERE r.state = 'failed')
    INTO n, v_queues, v_failed, v_batches FROM returned r;

    IF v_failed IS NOT NULL THEN
        PERFORM files.tally(v_failed, v_batches, array_fill('running'::text, ARRAY[cardinality(v_failed)]),
                            array_fill('failed'::text, ARRAY[cardinality(v_failed)]));
    END IF;
    -- Batches whose last rows ended in concurrent transactions.
    PERFORM files.finish_batches(NULL);
    PERFORM files.fold_counts();
    PERFORM pg_notify('files_pending', q) FROM unnest(v_queues) AS q;
    -- Rows that ended failed leave room in a capped queue.
    IF v_failed IS NOT NULL THEN
        PERFORM files.wake_capped(v_failed);
    END IF;
    RETURN n;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.reap() IS
    'Declares slots silent past their lease timeout dead and returns rows whose lease expired to the queue '
    '(attempt outcome lost; failed once max_attempts is spent). Silence counts from the server''s start and from the end '
    'of the last silence of the whole fleet (a database or network outage) at the earliest. Safe to call from every node '
    'at once. Also finishes the batches whose last rows ended in concurrent transactions (files.finish_batches) and '
    'folds the queues'' counts (files.fold_counts). Returns the number of rows returned.';

-- Operators: cancel, retry, pause and resume.

-- +goose StatementBegin
CREATE FUNCTION files.cancel(VARIADIC ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         integer;
    v_told    text[];
    v_queues  text[];
    v_batches text[];
    v_was     text[];
    v_freed   text[];
BEGIN
    WITH target AS (
        SELECT x.id, x.state, x.worker_id, x.attempt, x.claimed_at, x.queue, x.batch FROM files.files x
        WHERE x.id = ANY (cancel.ids) AND x.state IN ('pending', 'running')
        ORDER BY x.id FOR UPDATE
    ), cancelled AS (
        UPDATE files.files f
        SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL, finished_at = now()
        FROM target t WHERE f.id = t.id
        RETURNING f.id
    ), logged AS (
        INSERT INTO files.attempts (file_id, queue, attempt, worker_id, started_at, finished_at, outcome, error, duration)
        SELECT t.id, t.queue, t.attempt, t.worker_id, coalesce(t.claimed_at, now()), now(), 'cancelled', 'cancelled',
               now() - coalesce(t.claimed_at, now())
        FROM target t WHERE t.state = 'running'
    )
    SELECT count(*),
           array_agg(json_build_object('op', 'cancel', 'file_id', t.id, 'worker_id', t.worker_id)::text)
               FILTER (WHERE t.state = 'running'),
           array_agg(t.queue), array_agg(t.batch), array_agg(t.state),
           array_agg(DISTINCT t.queue) FILTER (WHERE t.state = 'running')
    INTO n, v_told, v_queues, v_batches, v_was, v_freed FROM target t;

    IF n > 0 THEN
        PERFORM files.tally(v_queues, v_batches, v_was, array_fill('cancelled'::text, ARRAY[n]));
    END IF;

    -- Running rows: tell their workers to stop the work; a capped queue has
    -- room again.
    PERFORM pg_notify('files_control', m) FROM unnest(v_told) AS m;
    IF v_freed IS NOT NULL THEN
        PERFORM files.wake_capped(v_freed);
    END IF;
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
    n         integer;
    v_queues  text[];
    v_rows    text[];
    v_batches text[];
    v_was     text[];
BEGIN
    IF retry.queue = '' THEN
        RAISE EXCEPTION 'files.retry: queue must not be empty (pass NULL for every queue)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH target AS (
        SELECT x.id, x.state, x.queue, x.batch FROM files.files x
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
    SELECT (SELECT count(*) FROM retried), (SELECT array_agg(DISTINCT r.queue) FROM retried r),
           array_agg(t.queue), array_agg(t.batch), array_agg(t.state)
    INTO n, v_queues, v_rows, v_batches, v_was FROM target t;

    IF n > 0 THEN
        PERFORM files.tally(v_rows, v_batches, v_was, array_fill('pending'::text, ARRAY[n]));
    END IF;

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
    IF pause_queue.queue IS NULL OR pause_queue.queue = '' THEN
        RAISE EXCEPTION 'files.pause_queue: queue must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
    IF resume_queue.queue IS NULL OR resume_queue.queue = '' THEN
        RAISE EXCEPTION 'files.resume_queue: queue must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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

-- +goose StatementBegin
CREATE FUNCTION files.set_max_running(queue text, max_running integer)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF set_max_running.queue IS NULL OR set_max_running.queue = '' THEN
        RAISE EXCEPTION 'files.set_max_running: queue must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_max_running.max_running < 0 THEN
        RAISE EXCEPTION 'files.set_max_running: max_running must be 0 or more, or NULL for no cap (got %)',
            set_max_running.max_running
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Waits for the claims that hold the queue's row (files.cap_room).
    INSERT INTO files.queues AS q (queue, max_running) VALUES (set_max_running.queue, set_max_running.max_running)
    ON CONFLICT (queue) DO UPDATE SET max_running = EXCLUDED.max_running;
    -- A cap raised or lifted leaves room.
    PERFORM pg_notify('files_pending', set_max_running.queue);
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.set_max_running(text, integer) IS
    'Sets the fleet-wide cap on a queue''s running rows (files.queues.max_running; NULL: no cap) and wakes the idle '
    'workers. Rows running above a lowered cap go on; claims take none until the queue is below it. Creates the queue '
    'if it does not exist yet.';

-- +goose StatementBegin
CREATE FUNCTION files.set_fair_share(queue text, fair_share boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF set_fair_share.queue IS NULL OR set_fair_share.queue = '' OR set_fair_share.fair_share IS NULL THEN
        RAISE EXCEPTION 'files.set_fair_share: queue must not be NULL or empty, nor fair_share NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO files.queues AS q (queue, fair_share) VALUES (set_fair_share.queue, set_fair_share.fair_share)
    ON CONFLICT (queue) DO UPDATE SET fair_share = EXCLUDED.fair_share;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.set_fair_share(text, boolean) IS
    'Turns fair share between the batches of a queue on or off (files.queues.fair_share). Creates the queue if it does '
    'not exist yet.';

-- +goose Down
DROP FUNCTION files.set_fair_share(text, boolean);
DROP FUNCTION files.set_max_running(text, integer);
DROP FUNCTION files.resume_queue(text);
DROP FUNCTION files.pause_queue(text);
DROP FUNCTION files.retry(bigint[], text);
DROP FUNCTION files.cancel(bigint[]);
DROP FUNCTION files.reap();
DROP FUNCTION files.fleet_heard();
DROP FUNCTION files.backlog(text[], integer);
DROP FUNCTION files.deregister_worker(text, text);
DROP FUNCTION files.drain_worker(text, text[]);
DROP FUNCTION files.heartbeat(text, text[]);
DROP FUNCTION files.own_slots(text, text, text[]);
DROP FUNCTION files.register_worker(text, text, integer, integer, text, text[], interval, text);
DROP FUNCTION files.release(bigint, text, integer, text, text);
DROP FUNCTION files.fail_many(bigint[], text[], integer[], text[], text[], boolean[], jsonb[]);
DROP FUNCTION files.fail(bigint, text, integer, text, text, boolean, jsonb);
DROP FUNCTION files.complete_many(bigint[], text[], integer[], text[], jsonb[], jsonb[], text);
DROP FUNCTION files.complete(bigint, text, integer, text, jsonb, jsonb, text);
DROP FUNCTION files.refuse_forged(text, bigint[], text[], integer[]);
DROP FUNCTION files.claim_batch(text[], text[], text, boolean);
DROP FUNCTION files.get_unprocessed_entry_by_priority(text, text);
DROP FUNCTION files.claim(text, text[], integer, text, boolean);
DROP FUNCTION files.wake_capped(text[]);
DROP FUNCTION files.fair_pick(text[], boolean[], integer[], integer, boolean);
DROP FUNCTION files.fair_rows(text, integer);
DROP FUNCTION files.cap_room(text[]);
DROP FUNCTION files.pick(text[], integer, integer[], boolean);
DROP FUNCTION files.batch_rows_deleted(text[], text[]);
DROP FUNCTION files.batch_rows_added(text[], bigint[], text[]);
DROP FUNCTION files.fold_counts();
DROP FUNCTION files.tally(text[], text[], text[], text[]);
DROP FUNCTION files.finish_batches(text[]);
DROP FUNCTION files.output_keys(jsonb);
DROP FUNCTION files.check_then(text, text, text[]);
DROP FUNCTION files.check_queues(text, text[]);
