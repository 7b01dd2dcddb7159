-- Claims and completes are planned once per connection instead of once per
-- call. PostgreSQL plans a PL/pgSQL statement with the call's values (a custom
-- plan) until a generic plan looks as cheap; for statements over array
-- arguments (claim_batch, complete_many) it never does, because it guesses ten
-- elements where a custom plan sees one. Planning was then half the database's
-- time for a one-row claim and its complete: what a worker whose slots free
-- up one at a time pays on every row.
--
-- The functions on the way of every row (claim, claim_batch, complete and
-- complete_many) now use generic plans. A generic plan is made once and kept,
-- so it must be right at any size of the table: these statements have one
-- good plan, an index range scan of files_claim_idx per queue and a
-- primary-key lookup per row or slot, and the settings below rule out the
-- others. Left to its costs, a generic plan made while files.files is small
-- (a few thousand rows, as after a TRUNCATE) hashes a scan of the whole table
-- for every claim and complete, and keeps doing so as the table grows until
-- the next ANALYZE. JIT compilation is off: a generic plan's estimate of a
-- claim at millions of pending rows is above jit_above_cost, and compiling
-- took 20 ms for a claim that runs in a tenth of a millisecond.

-- +goose Up
ALTER FUNCTION files.claim(text, text[], integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION files.claim(text, text[], integer) SET jit = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_seqscan = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_bitmapscan = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_hashjoin = off;
ALTER FUNCTION files.claim(text, text[], integer) SET enable_mergejoin = off;

ALTER FUNCTION files.claim_batch(text[], text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION files.claim_batch(text[], text[]) SET jit = off;
ALTER FUNCTION files.claim_batch(text[], text[]) SET enable_seqscan = off;
ALTER FUNCTION files.claim_batch(text[], text[]) SET enable_bitmapscan = off;
ALTER FUNCTION files.claim_batch(text[], text[]) SET enable_hashjoin = off;
ALTER FUNCTION files.claim_batch(text[], text[]) SET enable_mergejoin = off;

ALTER FUNCTION files.complete(bigint, text, integer, jsonb, jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION files.complete(bigint, text, integer, jsonb, jsonb) SET jit = off;

ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET jit = off;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET enable_seqscan = off;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET enable_bitmapscan = off;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET enable_hashjoin = off;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) SET enable_mergejoin = off;

-- +goose Down
ALTER FUNCTION files.claim(text, text[], integer) RESET plan_cache_mode;
ALTER FUNCTION files.claim(text, text[], integer) RESET jit;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_seqscan;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_bitmapscan;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_hashjoin;
ALTER FUNCTION files.claim(text, text[], integer) RESET enable_mergejoin;

ALTER FUNCTION files.claim_batch(text[], text[]) RESET plan_cache_mode;
ALTER FUNCTION files.claim_batch(text[], text[]) RESET jit;
ALTER FUNCTION files.claim_batch(text[], text[]) RESET enable_seqscan;
ALTER FUNCTION files.claim_batch(text[], text[]) RESET enable_bitmapscan;
ALTER FUNCTION files.claim_batch(text[], text[]) RESET enable_hashjoin;
ALTER FUNCTION files.claim_batch(text[], text[]) RESET enable_mergejoin;

ALTER FUNCTION files.complete(bigint, text, integer, jsonb, jsonb) RESET plan_cache_mode;
ALTER FUNCTION files.complete(bigint, text, integer, jsonb, jsonb) RESET jit;

ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET plan_cache_mode;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET jit;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET enable_seqscan;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET enable_bitmapscan;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET enable_hashjoin;
ALTER FUNCTION files.complete_many(bigint[], text[], integer[], jsonb[], jsonb[]) RESET enable_mergejoin;
