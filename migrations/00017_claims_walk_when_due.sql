-- A claim whose session keeps hints (files.pick) searches the whole range
-- only when its session's next whole-range search is due: a second after
-- the last one, or a hundred times as long as the last one took, whichever
-- is later. No longer at every 64th claim, nor whenever nothing is found
-- past the hints: in a fleet, each notification wakes every idle process
-- and all but one find nothing, so each of them walked the entries the held
-- snapshot keeps (four processes at 1,000 rows/s: about 350 walks a second,
-- pickup p99 86 ms against 10 for one process). A session now spends at
-- most about 1% of its time walking, however long the snapshot is held. An
-- answer, empty or short, of a session that keeps hints means that nothing
-- more is claimable past them; pgworker run claims once more after such an
-- answer if nothing else claims meanwhile, a second later and then at
-- doubling intervals (bench/other-measurements.md).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.pick(queues text[], n integer, rooms integer[] DEFAULT NULL, prefer boolean DEFAULT false)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
-- No SET clauses: only files.claim and files.claim_batch call it, and it
-- plans and runs under their settings. Each SET clause costs every call.
AS $$
DECLARE
    v_setting text := current_setting('pgworker.claim_hints', true);
    v_state   jsonb;
    v_at      double precision;
    v_next    double precision;
    v_full    boolean := true;
    v_hp      integer[];
    v_hid     bigint[];
    v_now     double precision := extract(epoch FROM clock_timestamp());
    v_read    bigint;
    v_took    double precision;
    v_bound   text;
    v_rows    bigint[];
    v_names   text[];
    v_prios   integer[];
    v_hints   jsonb;
    v_hint    jsonb;
    v_set     text;
BEGIN
    -- The session's hints, if it keeps them: per queue the claim-order
    -- position (priority, id) just past the last row this session claimed,
    -- the time of its last whole-range search and the earliest time of its
    -- next one. A state without the latter is due at once if it counts 63
    -- claims, as files.claim_batch's hand-off to this search writes it, else
    -- a second after (one written before 00017). Set by
    -- anyone, they are read with care: a value that does not parse is no
    -- hint at all. Here and below, the hints are read and written in plain
    -- expressions, not statements: each statement costs more than all of
    -- them together.
    IF v_setting <> '' THEN
        BEGIN
            v_state := v_setting::jsonb;
            v_at := (v_state ->> 'at')::double precision;
            v_next := coalesce((v_state ->> 'next')::double precision,
                               CASE WHEN (v_state ->> 'n')::integer >= 63 THEN v_at ELSE v_at + 1 END);
            v_hints := v_state -> 'q';
            IF jsonb_typeof(v_hints) = 'object' AND v_at IS NOT NULL THEN
                FOR i IN 1 .. cardinality(pick.queues) LOOP
                    v_hp[i] := (v_hints -> pick.queues[i] ->> 0)::integer;
                    v_hid[i] := (v_hints -> pick.queues[i] ->> 1)::bigint;
                END LOOP;
                -- A whole-range search when the next one is due, and five
                -- minutes after the last at the latest (the setting is any
                -- client's to write), or when the clock went back.
                v_full := v_now >= least(v_next, v_at + 300) OR v_now < v_at;
            ELSE
                v_hints := NULL;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            v_hints := NULL;
            v_full := true;
        END;
    END IF;
    IF NOT v_full THEN
        -- Per queue, in claim order: rows of a higher priority than the hint,
        -- rows of its priority from its id on, and rows of a lower priority.
        -- For a queue with no hint yet, its whole range. Each part is an
        -- index range scan of files_claim_idx, so a hinted search starts
        -- past the entries of the rows this session claimed before. The rows
        -- of the hint's priority behind it are not read here: their entries
        -- are what the hints are for (every row claimed while the snapshot
        -- is held), and reading them whenever the rows past the hint fell
        -- short cost most claims of a worker that keeps up as much as a
        -- whole-range search, more with each minute the snapshot is held.
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
        -- An answer, empty or short, means that nothing more is claimable
        -- past the hints. A row behind one (a retry, release, reap or
        -- rolled-back claim, or an insert that committed after rows of
        -- larger ids) waits for the session's next whole-range search: the
        -- first claim once it is due. Searching the whole range whenever
        -- nothing was found past the hints, as 00016 did, made every idle
        -- process of a fleet walk the held snapshot's entries at every
        -- notification that another process answered first.
    END IF;
    IF v_full THEN
        -- A whole-range search: per queue, in claim order, one range of
        -- files_claim_idx from its start. The pages it reads are counted
        -- by the server's statistics of this session.
        v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass);
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
    END IF;

    -- After a whole-range search, whether it was slow: whether it read at
    -- least pgworker.claim_hint_pages pages of files_claim_idx (a whole
    -- number; anything else is the default, 50), and one more for every
    -- 100 rows asked for. A clean search reads a few: the way down the tree
    -- and a leaf page for every 200 entries or so. Walking pages costs the
    -- same whatever the claim asks for, and so does a hint.
    IF v_full THEN
        v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass) - v_read;
        v_took := extract(epoch FROM clock_timestamp()) - v_now;
        v_bound := current_setting('pgworker.claim_hint_pages', true);
        IF v_read * 100 < (CASE WHEN v_bound ~ '^[0-9]{1,9}$' THEN v_bound::bigint ELSE 50 END) * 100 + pick.n THEN
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
    -- The next whole-range search is due a second after this one, or a
    -- hundred times as long as this one took, whichever is later: a session
    -- spends at most about 1% of its time on them, however long the held
    -- snapshot has kept the entries they walk.
    v_set := set_config('pgworker.claim_hints', jsonb_build_object(
        'at', CASE WHEN v_full THEN v_now ELSE v_at END,
        'next', CASE WHEN v_full THEN v_now + greatest(1, 100 * v_took) ELSE v_next END,
        'q', v_hints)::text, false);
    RETURN v_rows;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION files.pick(text[], integer, integer[], boolean) IS
    'Locks (FOR UPDATE SKIP LOCKED) and returns, in claim order, the ids of up to n claimable rows of queues, at most '
    'rooms[i] of queue i (NULL: no bound), queue by queue in the given order with prefer: the row search of files.claim '
    'and files.claim_batch for queues without fair share. It searches each queue''s whole range of files_claim_idx until '
    'such a search reads pgworker.claim_hint_pages pages of the index or more (default 50, and one more per 100 rows of '
    'n); from then on it starts each queue''s search past the last row this session took (setting '
    'pgworker.claim_hints), and searches whole ranges again when due: a second after the last such search, or a '
    'hundred times as long as it took, whichever is later, and five minutes at most; it drops the hints when one is '
    'fast. So without hints an '
    'empty answer means nothing is claimable; with hints kept, an answer, empty or short, means nothing more is '
    'claimable past them: a row that becomes claimable behind a hint (a retry, release, reap, rolled-back claim or '
    'late-committing insert) waits for the next whole-range search, and a caller whose session keeps hints should claim '
    'once more after such an answer if it has not claimed again within a second.';

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.pick(queues text[], n integer, rooms integer[] DEFAULT NULL, prefer boolean DEFAULT false)
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
    v_read    bigint;
    v_bound   text;
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
    IF NOT v_full THEN
        -- Per queue, in claim order: rows of a higher priority than the hint,
        -- rows of its priority from its id on, and rows of a lower priority.
        -- For a queue with no hint yet, its whole range. Each part is an
        -- index range scan of files_claim_idx, so a hinted search starts
        -- past the entries of the rows this session claimed before. The rows
        -- of the hint's priority behind it are not read here: their entries
        -- are what the hints are for (every row claimed while the snapshot
        -- is held), and reading them whenever the rows past the hint fell
        -- short cost most claims of a worker that keeps up as much as a
        -- whole-range search, more with each minute the snapshot is held.
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
        -- Nothing past the hints: a whole-range search, which reads the
        -- rows behind them too. So an empty answer still means that nothing
        -- is claimable (a worker then waits for a notification). An answer
        -- with rows but fewer than n means that nothing more is claimable
        -- past the hints; a row behind one (a retry, release, reap or
        -- rolled-back claim, or an insert that committed after rows of
        -- larger ids) waits for the next whole-range search: the session's
        -- next claim a second after its last one, or its 64th, or one that
        -- finds nothing past the hints. pgworker run claims once more a
        -- second after such an answer if nothing else has claimed meanwhile.
        v_full := v_rows IS NULL;
    END IF;
    IF v_full THEN
        -- A whole-range search: per queue, in claim order, one range of
        -- files_claim_idx from its start. The pages it reads are counted
        -- by the server's statistics of this session.
        v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass);
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
    END IF;

    -- After a whole-range search, whether it was slow: whether it read at
    -- least pgworker.claim_hint_pages pages of files_claim_idx (a whole
    -- number; anything else is the default, 50), and one more for every
    -- 100 rows asked for. A clean search reads a few: the way down the tree
    -- and a leaf page for every 200 entries or so. Walking pages costs the
    -- same whatever the claim asks for, and so does a hint.
    IF v_full THEN
        v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass) - v_read;
        v_bound := current_setting('pgworker.claim_hint_pages', true);
        IF v_read * 100 < (CASE WHEN v_bound ~ '^[0-9]{1,9}$' THEN v_bound::bigint ELSE 50 END) * 100 + pick.n THEN
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
    'such a search reads pgworker.claim_hint_pages pages of the index or more (default 50, and one more per 100 rows of '
    'n); from then '
    'on it starts each queue''s search past the last row this session took (setting pgworker.claim_hints), searches '
    'whole ranges at least once a second and every 64th claim and whenever nothing past the hints is claimable, '
    'dropping the hints when one is fast. So an empty answer means nothing is claimable; a short one, while the session '
    'keeps hints, that nothing more is claimable past them: a row that becomes claimable behind a hint (a retry, '
    'release, reap, rolled-back claim or late-committing insert) waits for the next whole-range search, and a caller '
    'that got a short answer with hints kept should claim once more if it has not claimed again within a second.';

