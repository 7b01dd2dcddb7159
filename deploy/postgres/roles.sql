-- Login roles for pgworker, in the group roles that the migrations create
-- (pgworker_worker, pgworker_reader, pgworker_admin). Run once, after the
-- migrations, on the primary, in the pgworker database, as a superuser or as
-- the role that ran the migrations (it may grant the roles it created):
--
--   psql -v ON_ERROR_STOP=1 --single-transaction \
--       "postgres://pgworker_owner@pg-rw.example.internal:5432/pgworker?target_session_attrs=read-write" \
--       -f deploy/postgres/roles.sql
--
-- Then give each login a password from psql, which sends only its SCRAM
-- verifier, never the password (and copy the verifiers into PgBouncer's
-- userlist.txt):
--
--   \password pgworker_node

-- Worker nodes: pgworker run. The worker API and the views; no direct writes.
CREATE ROLE pgworker_node LOGIN IN ROLE pgworker_worker;
-- Operators: pgworker enqueue, retry, cancel, pause, resume; one login each.
CREATE ROLE pgworker_ops LOGIN IN ROLE pgworker_admin;
-- Dashboards: read-only.
CREATE ROLE pgworker_dashboard LOGIN IN ROLE pgworker_reader;
-- KEDA's postgresql scaler (deploy/k8s/keda.yaml): reads files.scaling_hint.
-- A few connections at most, whatever goes wrong in the cluster.
CREATE ROLE pgworker_keda LOGIN CONNECTION LIMIT 5 IN ROLE pgworker_reader;
-- PgBouncer's console users: no PostgreSQL login, only a password whose
-- verifier goes into userlist.txt.
CREATE ROLE pgbouncer_admin NOLOGIN;
CREATE ROLE pgbouncer_stats NOLOGIN;

-- Only these roles (and superusers) may connect to the queue database.
DO $$
BEGIN
    EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO pgworker_worker, pgworker_reader, pgworker_admin',
                   current_database());
END
$$;
