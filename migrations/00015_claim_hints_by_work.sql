-- The claims' hints start when a whole-range search reads many pages of
-- files_claim_idx, not when it takes long. The hints exist for the dead
-- entries a held snapshot keeps at the front of the index (files.pick); a
-- bound on time also tripped whenever the machine's cores were busy, and a
-- session's next claims then took the hinted statements, which cost the
-- server more: at 2,000 slots on two cores most claims ran longer than the
-- bound, and a lone row's claim that a busy moment slowed past 1 ms handed
-- the next one to the three statements of files.pick, which lengthened the
-- pickup's tail. The search now counts the pages of the index it read (the
-- session's statistics of files_claim_idx, before and after it) against
-- pgworker.claim_hint_pages: 50 by default, and one more for every 100 rows
-- asked for. Pages rather than entries, because after the snapshot is
-- let go the entries marked dead are skipped without being returned while
-- their pages are still read until vacuum clears them.
-- pgworker.claim_hint_ms is no longer read.

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
    'whole ranges at least once a second and every 64th claim, dropping the hints when one is fast, and reads the rows '
    'behind a hint whenever those past it fall short of n. So a row that becomes claimable behind a hint (a retry, '
    'release, reap or rolled-back claim) waits at most that long while others are claimable, and a short answer means '
    'nothing else is claimable.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL, key text DEFAULT NULL,
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
    v_token  text := gen_random_uuid()::text;
    v_read   bigint;
    v_bound  text;
    v_set    text;
    v_one    record;
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

    -- The usual claim, in one statement: every slot named is active and has
    -- this key (or none, and none is given), no queue is capped or shared
    -- among its batches, and the session keeps no hints (files.pick). The
    -- statement reads the slots and the queues, searches each queue's whole
    -- range of files_claim_idx as files.pick does, and claims, the i-th best
    -- row for the i-th slot; beside the rows it returns whether the claim was
    -- usual, so that a lost race (no rows) costs no second statement. Each
    -- statement of a call costs a cold server more than its plan's work:
    -- this one answers a lone row 0.05-0.1 ms sooner than the three below.
    -- A claim that is not usual locks nothing here and goes on below; when
    -- only its queues made it so, without reading the slots again.
    --
    -- A claim of one queue, what pgworker run --queue sends, takes the same
    -- statement written for one queue: one lookup of the queue instead of
    -- a list of queues built, ordered and unnested. Each node of a plan
    -- costs a cold server more than the work in it.
    IF coalesce(current_setting('pgworker.claim_hints', true), '') = '' THEN
        v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass);
        IF cardinality(claim_batch.queues) = 1 THEN
            FOR v_one IN
                WITH slots AS (
                    SELECT array_agg(s.id ORDER BY s.ord) AS ids, array_agg(w.lease_timeout ORDER BY s.ord) AS leases,
                           bool_and(coalesce(w.state = 'active' AND w.key_hash IS NOT DISTINCT FROM v_key, false)) AS usual
                    FROM (SELECT u.id, min(u.ord) AS ord
                          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
                          GROUP BY u.id) s
                    LEFT JOIN files.workers w ON w.worker_id = s.id
                ), go AS (
                    SELECT s.usual AND NOT coalesce(q.fair_share OR q.max_running IS NOT NULL, false) AS usual,
                           s.usual AND coalesce(q.fair_share OR q.max_running IS NOT NULL, false) AS queues_only,
                           cardinality(s.ids) AS n, s.ids, s.leases, q.queue, q.fair_share, q.max_running IS NOT NULL AS capped
                    FROM slots s
                    LEFT JOIN files.queues q ON q.queue = claim_batch.queues[1] AND NOT q.paused
                ), picked AS (
                    SELECT array_agg(l.id ORDER BY l.priority DESC, l.id) AS ids
                    FROM go
                    CROSS JOIN LATERAL (
                        SELECT f.id, f.priority FROM files.files f
                        WHERE f.state = 'pending' AND f.queue = go.queue AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT go.n
                        FOR UPDATE SKIP LOCKED) l
                    WHERE go.usual
                ), claimed AS (
                    UPDATE files.files f
                    SET state = 'running', worker_id = z.worker_id, attempt = f.attempt + 1,
                        claimed_at = now(), lease_expires_at = now() + z.lease_timeout,
                        claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
                    FROM go, picked, unnest(picked.ids, go.ids, go.leases) AS z(id, worker_id, lease_timeout)
                    WHERE f.id = ANY (ARRAY[z.id])
                    RETURNING f
                )
                SELECT go.usual, c.f,
                       CASE WHEN go.queues_only THEN go.ids END AS ids,
                       CASE WHEN go.queues_only THEN go.leases END AS leases,
                       CASE WHEN go.queues_only THEN ARRAY[go.queue] END AS queues,
                       CASE WHEN go.queues_only THEN ARRAY[go.fair_share] END AS fair,
                       CASE WHEN go.queues_only THEN go.capped END AS capped
                FROM go
                LEFT JOIN claimed c ON true
                ORDER BY (c.f).priority DESC, (c.f).id
            LOOP
                EXIT WHEN v_one.usual IS NOT TRUE OR v_one.f IS NULL;
                r := v_one.f;
                r.claim_token := v_token;
                RETURN NEXT r;
            END LOOP;
        ELSE
            FOR v_one IN
                WITH slots AS (
                    SELECT array_agg(s.id ORDER BY s.ord) AS ids, array_agg(w.lease_timeout ORDER BY s.ord) AS leases,
                           bool_and(coalesce(w.state = 'active' AND w.key_hash IS NOT DISTINCT FROM v_key, false)) AS usual
                    FROM (SELECT u.id, min(u.ord) AS ord
                          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
                          GROUP BY u.id) s
                    LEFT JOIN files.workers w ON w.worker_id = s.id
                ), go AS (
                    SELECT s.usual AND NOT coalesce(q.special, false) AS usual, s.usual AND coalesce(q.special, false) AS queues_only,
                           cardinality(s.ids) AS n, s.ids, s.leases, q.queues, q.fair, q.capped
                    FROM slots s, (
                        SELECT array_agg(q.queue ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS queues,
                               array_agg(q.fair_share ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS fair,
                               bool_or(q.max_running IS NOT NULL) AS capped,
                               bool_or(q.fair_share OR q.max_running IS NOT NULL) AS special
                        FROM files.queues q
                        WHERE NOT q.paused AND (claim_batch.queues IS NULL OR q.queue = ANY (claim_batch.queues))
                    ) q
                ), picked AS (
                    SELECT array_agg(b.id ORDER BY b.pref, b.priority DESC, b.id) AS ids
                    FROM (
                        SELECT CASE WHEN claim_batch.prefer THEN q.ord END AS pref, l.id, l.priority
                        FROM go
                        CROSS JOIN LATERAL unnest(go.queues) WITH ORDINALITY AS q(name, ord)
                        CROSS JOIN LATERAL (
                            SELECT f.id, f.priority FROM files.files f
                            WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
                            ORDER BY f.priority DESC, f.id
                            LIMIT go.n
                            FOR UPDATE SKIP LOCKED) l
                        WHERE go.usual
                        ORDER BY 1, l.priority DESC, l.id
                        LIMIT (SELECT go.n FROM go)
                    ) b
                ), claimed AS (
                    UPDATE files.files f
                    SET state = 'running', worker_id = z.worker_id, attempt = f.attempt + 1,
                        claimed_at = now(), lease_expires_at = now() + z.lease_timeout,
                        claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
                    FROM go, picked, unnest(picked.ids, go.ids, go.leases) AS z(id, worker_id, lease_timeout)
                    WHERE f.id = ANY (ARRAY[z.id])
                    RETURNING f
                )
                -- When only the queues make the claim unusual, what the three
                -- statements would read first: the slots and the queues.
                SELECT go.usual, c.f,
                       CASE WHEN go.queues_only THEN go.ids END AS ids,
                       CASE WHEN go.queues_only THEN go.leases END AS leases,
                       CASE WHEN go.queues_only THEN go.queues END AS queues,
                       CASE WHEN go.queues_only THEN go.fair END AS fair,
                       CASE WHEN go.queues_only THEN go.capped END AS capped
                FROM go
                LEFT JOIN claimed c ON true
                ORDER BY CASE WHEN claim_batch.prefer THEN array_position(go.queues, (c.f).queue) END, (c.f).priority DESC, (c.f).id
            LOOP
                EXIT WHEN v_one.usual IS NOT TRUE OR v_one.f IS NULL;
                r := v_one.f;
                r.claim_token := v_token;
                RETURN NEXT r;
            END LOOP;
        END IF;
        IF v_one.usual THEN
            -- A search that read as many pages of files_claim_idx as
            -- files.pick's bound (the statement's only reads of that index)
            -- hands the session's next claim to files.pick, which counts its
            -- whole-range search again and keeps hints from then on if that
            -- is slow too. The setting is parsed only when set: the regular
            -- expression costs a cold server 0.01 ms.
            v_read := pg_stat_get_xact_blocks_fetched('files.files_claim_idx'::regclass) - v_read;
            v_bound := current_setting('pgworker.claim_hint_pages', true);
            IF v_read * 100 >= cardinality(claim_batch.worker_ids)
                   + 100 * (CASE WHEN v_bound IS NULL OR v_bound = '' THEN 50
                                 WHEN v_bound ~ '^[0-9]{1,9}$' THEN v_bound::bigint ELSE 50 END) THEN
                v_set := set_config('pgworker.claim_hints', jsonb_build_object(
                    'at', extract(epoch FROM clock_timestamp())::double precision, 'n', 63, 'q', '{}'::jsonb)::text, false);
            END IF;
            RETURN;
        END IF;
        -- Every slot active with this key: the claim is unusual for its
        -- queues alone, and the statement read what the next one would.
        v_ids := v_one.ids;
        v_leases := v_one.leases;
        v_queues := v_one.queues;
        v_fair := v_one.fair;
        v_capped := v_one.capped;
    END IF;

    IF v_ids IS NULL THEN
        -- The active slots, each once, in the order given; draining ones
        -- take nothing. An unknown slot is registered, a claim proves a
        -- stopped or dead slot alive, and a slot without a key takes the one
        -- given: these cost a second look. In the same statement, the queues
        -- to take from, in name order, or in the caller's order when it
        -- prefers, with whether their batches take turns and whether one has
        -- a fleet-wide cap. Queues without either cost nothing more: no
        -- lock, no count.
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
    -- rescan the arrays for each row: quadratic). The lookup is written
    -- "id = ANY (ARRAY[p.id])", not "id = p.id": an equality join also lets
    -- a plan made on a table of a few rows read the primary key whole, which
    -- the session would keep as the table grows; a one-element ANY can only
    -- be an index condition. Tokens as in files.claim.
    FOR r IN
        WITH claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = p.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + p.lease_timeout,
                claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
            FROM unnest(v_rows, v_ids[1:cardinality(v_rows)], v_leases[1:cardinality(v_rows)])
                 AS p(id, worker_id, lease_timeout)
            WHERE f.id = ANY (ARRAY[p.id])
            RETURNING f.*
        )
        -- Preferred queues first, then priority and id, as files.claim.
        SELECT c.* FROM claimed c
        ORDER BY CASE WHEN claim_batch.prefer THEN array_position(v_queues, c.queue) END, c.priority DESC, c.id
    LOOP
        r.claim_token := v_token;
        RETURN NEXT r;
    END LOOP;
END
$$;
-- +goose StatementEnd

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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION files.claim_batch(worker_ids text[], queues text[] DEFAULT NULL, key text DEFAULT NULL,
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
    v_token  text := gen_random_uuid()::text;
    v_start  timestamptz;
    v_ms     text;
    v_set    text;
    v_one    record;
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

    -- The usual claim, in one statement: every slot named is active and has
    -- this key (or none, and none is given), no queue is capped or shared
    -- among its batches, and the session keeps no hints (files.pick). The
    -- statement reads the slots and the queues, searches each queue's whole
    -- range of files_claim_idx as files.pick does, and claims, the i-th best
    -- row for the i-th slot; beside the rows it returns whether the claim was
    -- usual, so that a lost race (no rows) costs no second statement. Each
    -- statement of a call costs a cold server more than its plan's work:
    -- this one answers a lone row 0.05-0.1 ms sooner than the three below.
    -- A claim that is not usual locks nothing here and goes on below; when
    -- only its queues made it so, without reading the slots again.
    --
    -- A claim of one queue, what pgworker run --queue sends, takes the same
    -- statement written for one queue: one lookup of the queue instead of
    -- a list of queues built, ordered and unnested. Each node of a plan
    -- costs a cold server more than the work in it.
    IF coalesce(current_setting('pgworker.claim_hints', true), '') = '' THEN
        v_start := clock_timestamp();
        IF cardinality(claim_batch.queues) = 1 THEN
            FOR v_one IN
                WITH slots AS (
                    SELECT array_agg(s.id ORDER BY s.ord) AS ids, array_agg(w.lease_timeout ORDER BY s.ord) AS leases,
                           bool_and(coalesce(w.state = 'active' AND w.key_hash IS NOT DISTINCT FROM v_key, false)) AS usual
                    FROM (SELECT u.id, min(u.ord) AS ord
                          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
                          GROUP BY u.id) s
                    LEFT JOIN files.workers w ON w.worker_id = s.id
                ), go AS (
                    SELECT s.usual AND NOT coalesce(q.fair_share OR q.max_running IS NOT NULL, false) AS usual,
                           s.usual AND coalesce(q.fair_share OR q.max_running IS NOT NULL, false) AS queues_only,
                           cardinality(s.ids) AS n, s.ids, s.leases, q.queue, q.fair_share, q.max_running IS NOT NULL AS capped
                    FROM slots s
                    LEFT JOIN files.queues q ON q.queue = claim_batch.queues[1] AND NOT q.paused
                ), picked AS (
                    SELECT array_agg(l.id ORDER BY l.priority DESC, l.id) AS ids
                    FROM go
                    CROSS JOIN LATERAL (
                        SELECT f.id, f.priority FROM files.files f
                        WHERE f.state = 'pending' AND f.queue = go.queue AND f.run_after <= now()
                        ORDER BY f.priority DESC, f.id
                        LIMIT go.n
                        FOR UPDATE SKIP LOCKED) l
                    WHERE go.usual
                ), claimed AS (
                    UPDATE files.files f
                    SET state = 'running', worker_id = z.worker_id, attempt = f.attempt + 1,
                        claimed_at = now(), lease_expires_at = now() + z.lease_timeout,
                        claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
                    FROM go, picked, unnest(picked.ids, go.ids, go.leases) AS z(id, worker_id, lease_timeout)
                    WHERE f.id = ANY (ARRAY[z.id])
                    RETURNING f
                )
                SELECT go.usual, c.f,
                       CASE WHEN go.queues_only THEN go.ids END AS ids,
                       CASE WHEN go.queues_only THEN go.leases END AS leases,
                       CASE WHEN go.queues_only THEN ARRAY[go.queue] END AS queues,
                       CASE WHEN go.queues_only THEN ARRAY[go.fair_share] END AS fair,
                       CASE WHEN go.queues_only THEN go.capped END AS capped
                FROM go
                LEFT JOIN claimed c ON true
                ORDER BY (c.f).priority DESC, (c.f).id
            LOOP
                EXIT WHEN v_one.usual IS NOT TRUE OR v_one.f IS NULL;
                r := v_one.f;
                r.claim_token := v_token;
                RETURN NEXT r;
            END LOOP;
        ELSE
            FOR v_one IN
                WITH slots AS (
                    SELECT array_agg(s.id ORDER BY s.ord) AS ids, array_agg(w.lease_timeout ORDER BY s.ord) AS leases,
                           bool_and(coalesce(w.state = 'active' AND w.key_hash IS NOT DISTINCT FROM v_key, false)) AS usual
                    FROM (SELECT u.id, min(u.ord) AS ord
                          FROM unnest(claim_batch.worker_ids) WITH ORDINALITY AS u(id, ord)
                          GROUP BY u.id) s
                    LEFT JOIN files.workers w ON w.worker_id = s.id
                ), go AS (
                    SELECT s.usual AND NOT coalesce(q.special, false) AS usual, s.usual AND coalesce(q.special, false) AS queues_only,
                           cardinality(s.ids) AS n, s.ids, s.leases, q.queues, q.fair, q.capped
                    FROM slots s, (
                        SELECT array_agg(q.queue ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS queues,
                               array_agg(q.fair_share ORDER BY CASE WHEN claim_batch.prefer THEN array_position(claim_batch.queues, q.queue) END, q.queue) AS fair,
                               bool_or(q.max_running IS NOT NULL) AS capped,
                               bool_or(q.fair_share OR q.max_running IS NOT NULL) AS special
                        FROM files.queues q
                        WHERE NOT q.paused AND (claim_batch.queues IS NULL OR q.queue = ANY (claim_batch.queues))
                    ) q
                ), picked AS (
                    SELECT array_agg(b.id ORDER BY b.pref, b.priority DESC, b.id) AS ids
                    FROM (
                        SELECT CASE WHEN claim_batch.prefer THEN q.ord END AS pref, l.id, l.priority
                        FROM go
                        CROSS JOIN LATERAL unnest(go.queues) WITH ORDINALITY AS q(name, ord)
                        CROSS JOIN LATERAL (
                            SELECT f.id, f.priority FROM files.files f
                            WHERE f.state = 'pending' AND f.queue = q.name AND f.run_after <= now()
                            ORDER BY f.priority DESC, f.id
                            LIMIT go.n
                            FOR UPDATE SKIP LOCKED) l
                        WHERE go.usual
                        ORDER BY 1, l.priority DESC, l.id
                        LIMIT (SELECT go.n FROM go)
                    ) b
                ), claimed AS (
                    UPDATE files.files f
                    SET state = 'running', worker_id = z.worker_id, attempt = f.attempt + 1,
                        claimed_at = now(), lease_expires_at = now() + z.lease_timeout,
                        claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
                    FROM go, picked, unnest(picked.ids, go.ids, go.leases) AS z(id, worker_id, lease_timeout)
                    WHERE f.id = ANY (ARRAY[z.id])
                    RETURNING f
                )
                -- When only the queues make the claim unusual, what the three
                -- statements would read first: the slots and the queues.
                SELECT go.usual, c.f,
                       CASE WHEN go.queues_only THEN go.ids END AS ids,
                       CASE WHEN go.queues_only THEN go.leases END AS leases,
                       CASE WHEN go.queues_only THEN go.queues END AS queues,
                       CASE WHEN go.queues_only THEN go.fair END AS fair,
                       CASE WHEN go.queues_only THEN go.capped END AS capped
                FROM go
                LEFT JOIN claimed c ON true
                ORDER BY CASE WHEN claim_batch.prefer THEN array_position(go.queues, (c.f).queue) END, (c.f).priority DESC, (c.f).id
            LOOP
                EXIT WHEN v_one.usual IS NOT TRUE OR v_one.f IS NULL;
                r := v_one.f;
                r.claim_token := v_token;
                RETURN NEXT r;
            END LOOP;
        END IF;
        IF v_one.usual THEN
            -- A statement slower than files.pick's bound (its search, the
            -- slots' check and the update together) hands the session's next
            -- claim to files.pick, which times its whole-range search alone
            -- and keeps hints from then on if that is slow too. The clock
            -- in timestamps and intervals, the setting parsed only when set:
            -- the regular expression and the epoch's numeric cost a cold
            -- server 0.01 ms.
            v_ms := current_setting('pgworker.claim_hint_ms', true);
            IF clock_timestamp() - v_start > interval '1 ms' * (1 + cardinality(claim_batch.worker_ids) / 100.0::double precision)
                   * (CASE WHEN v_ms IS NULL OR v_ms = '' THEN 1
                           WHEN v_ms ~ '^[0-9]{1,9}(\.[0-9]{1,9})?$' THEN v_ms::double precision ELSE 1 END) THEN
                v_set := set_config('pgworker.claim_hints', jsonb_build_object(
                    'at', extract(epoch FROM v_start)::double precision, 'n', 63, 'q', '{}'::jsonb)::text, false);
            END IF;
            RETURN;
        END IF;
        -- Every slot active with this key: the claim is unusual for its
        -- queues alone, and the statement read what the next one would.
        v_ids := v_one.ids;
        v_leases := v_one.leases;
        v_queues := v_one.queues;
        v_fair := v_one.fair;
        v_capped := v_one.capped;
    END IF;

    IF v_ids IS NULL THEN
        -- The active slots, each once, in the order given; draining ones
        -- take nothing. An unknown slot is registered, a claim proves a
        -- stopped or dead slot alive, and a slot without a key takes the one
        -- given: these cost a second look. In the same statement, the queues
        -- to take from, in name order, or in the caller's order when it
        -- prefers, with whether their batches take turns and whether one has
        -- a fleet-wide cap. Queues without either cost nothing more: no
        -- lock, no count.
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
    -- rescan the arrays for each row: quadratic). The lookup is written
    -- "id = ANY (ARRAY[p.id])", not "id = p.id": an equality join also lets
    -- a plan made on a table of a few rows read the primary key whole, which
    -- the session would keep as the table grows; a one-element ANY can only
    -- be an index condition. Tokens as in files.claim.
    FOR r IN
        WITH claimed AS (
            UPDATE files.files f
            SET state = 'running', worker_id = p.worker_id, attempt = f.attempt + 1,
                claimed_at = now(), lease_expires_at = now() + p.lease_timeout,
                claim_token_hash = (SELECT sha256(convert_to(v_token, 'UTF8')))
            FROM unnest(v_rows, v_ids[1:cardinality(v_rows)], v_leases[1:cardinality(v_rows)])
                 AS p(id, worker_id, lease_timeout)
            WHERE f.id = ANY (ARRAY[p.id])
            RETURNING f.*
        )
        -- Preferred queues first, then priority and id, as files.claim.
        SELECT c.* FROM claimed c
        ORDER BY CASE WHEN claim_batch.prefer THEN array_position(v_queues, c.queue) END, c.priority DESC, c.id
    LOOP
        r.claim_token := v_token;
        RETURN NEXT r;
    END LOOP;
END
$$;
-- +goose StatementEnd
