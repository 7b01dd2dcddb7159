-- The sessions that claim from the same queues take turns at the whole-range
-- search of files.pick, instead of each searching a second after its own last
-- one. Beside a held snapshot every session that keeps hints walked the
-- entries the snapshot keeps once a second: a fleet of four processes of four
-- slots, a dozen pooled sessions, walked a dozen times a second, each walk
-- longer with the snapshot's age (pickup p99 23 ms at a minute and a half
-- against 12.5 for one process). Now one of them walks, the first claim once
-- the turn is due, and writes when the next is due before it walks, so the
-- sessions that the same notification woke do not walk too. The turn lives in
-- a sequence, files.claim_search_due, which sessions read and write outside
-- their transactions and which a held snapshot cannot bloat: a row updated
-- once a second would keep a version for every second the snapshot is held.
-- Only the owner writes it (the claim functions are SECURITY DEFINER). A
-- session still searches five minutes after its own last search at the
-- latest, and keeps its own spacing while the turn is another set of
-- queues' (bench/other-measurements.md).

-- +goose Up
CREATE SEQUENCE files.claim_search_due AS bigint MINVALUE 0 NO CYCLE;
COMMENT ON SEQUENCE files.claim_search_due IS
    'The turn at files.pick''s whole-range search of the sessions that keep claim hints: when the next one is due, in '
    'milliseconds since 1970, times 2^21, plus hashtext(queues::text) & 2097151 of the queues it is for. Written by '
    'the session that takes a turn (setval, outside its transaction), read at each claim of a session with hints '
    '(pg_sequence_last_value; NULL until the first turn). Only the owner writes it.';
REVOKE ALL ON SEQUENCE files.claim_search_due FROM PUBLIC;
GRANT SELECT ON SEQUENCE files.claim_search_due TO pgworker_reader;

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
    v_key     bigint;
    v_turn    bigint;
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
    --
    -- The sessions that claim from the same queues take turns at the
    -- whole-range search: files.claim_search_due holds when the next one
    -- is due and for which queues (see there). While it is for this
    -- claim's queues, that time is due for this session too, whatever its
    -- own spacing says; the first claim once it has passed takes the turn.
    -- Any other value (another set of queues, none yet, or a time more than
    -- five minutes ahead: the clock went back) leaves the session to its
    -- own spacing.
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
                -- minutes after this session's last at the latest (the
                -- setting is any client's to write, and two sets of queues
                -- may share a hash), or when the clock went back.
                v_key := hashtext(pick.queues::text) & 2097151;
                v_turn := pg_sequence_last_value('files.claim_search_due');
                v_full := v_now >= least(CASE WHEN v_turn & 2097151 = v_key AND v_turn >> 21 <= v_now * 1000 + 300000
                                              THEN (v_turn >> 21) / 1000.0 ELSE v_next END,
                                         v_at + 300)
                          OR v_now < v_at;
                IF v_full THEN
                    -- This session's turn: the next is due a second from
                    -- now, before it searches, so that the sessions woken
                    -- by the same notification do not search too.
                    v_turn := setval('files.claim_search_due', ((v_now * 1000)::bigint + 1000) << 21 | v_key);
                END IF;
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
        v_at := v_now;
        v_next := v_now + greatest(1, 100 * v_took);
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
    -- hundred times as long as this one took, whichever is later: the
    -- sessions of a set of queues spend at most about 1% of their time on
    -- them between them, however long the held snapshot has kept the
    -- entries they walk. Its turn was written before it searched, a second
    -- from then; a search that took longer than 10 ms writes it again.
    IF v_full AND v_key IS NOT NULL AND v_took > 0.01 THEN
        v_turn := setval('files.claim_search_due', ((1000 * least(v_next, v_now + 300))::bigint << 21) | v_key);
    END IF;
    v_set := set_config('pgworker.claim_hints', jsonb_build_object('at', v_at, 'next', v_next, 'q', v_hints)::text, false);
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
    'pgworker.claim_hints), and searches whole ranges again when due: the sessions that claim from the same queues take '
    'turns (files.claim_search_due), the next turn a second after the last such search, or a hundred times as long as '
    'it took, whichever is later; a session searches five minutes after its own last at the latest. It drops the hints '
    'when such a search is fast. So without hints an '
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

DROP SEQUENCE files.claim_search_due;
