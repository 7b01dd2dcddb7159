-- A claim of one queue, what pgworker run --queue sends, takes its usual
-- statement written for one queue: files.claim_batch looks the queue up by
-- its key instead of building the list of queues, ordering it and unnesting
-- it, with the same result (a queue that is paused, capped or shared among
-- its batches, a slot to register, revive or refuse, and a session keeping
-- hints go on as before). The usual statement's clock costs less: its start
-- is kept as a timestamp, and the bound is worked out in an interval, with
-- pgworker.claim_hint_ms parsed only when it is set. Together: a lone
-- row's claim on a cold server is answered 0.03-0.04 ms sooner, and its
-- pickup by pgworker run is 0.02 ms (4%) quicker (bench/other-measurements.md).

-- +goose Up
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

-- +goose Down
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
    v_start  double precision;
    v_ms     text;
    v_bound  double precision;
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
    IF coalesce(current_setting('pgworker.claim_hints', true), '') = '' THEN
        v_start := extract(epoch FROM clock_timestamp());
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
        IF v_one.usual THEN
            -- A statement slower than files.pick's bound (its search, the
            -- slots' check and the update together) hands the session's next
            -- claim to files.pick, which times its whole-range search alone
            -- and keeps hints from then on if that is slow too.
            v_ms := current_setting('pgworker.claim_hint_ms', true);
            v_bound := CASE WHEN v_ms ~ '^[0-9]{1,9}(\.[0-9]{1,9})?$' THEN v_ms::double precision ELSE 1 END
                       * (1 + cardinality(claim_batch.worker_ids) / 100.0) / 1000;
            IF extract(epoch FROM clock_timestamp()) - v_start > v_bound THEN
                v_set := set_config('pgworker.claim_hints', jsonb_build_object('at', v_start, 'n', 63, 'q', '{}'::jsonb)::text, false);
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
