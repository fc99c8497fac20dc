-- What `hookline migrate` runs around the migrations themselves (hookline.core.migrations),
-- all in one transaction.

-- name: pin_search_path
-- Migrations bind names as the owner: nothing another role created in schema public (or
-- anywhere else on a search path) may stand in for a built-in function or operator.
SET LOCAL search_path = pg_catalog, pg_temp;

-- name: schema_migrations_exists
SELECT to_regclass('hookline.schema_migrations') IS NOT NULL;

-- name: lock_bootstrap
-- A database without Hookline's schema yet: processes migrating it at once meet here, as
-- CREATE SCHEMA IF NOT EXISTS does not wait for a concurrent one. It has no tenants yet, so
-- no tenant can hold this key; every later run locks hookline.schema_migrations instead.
SELECT pg_advisory_xact_lock($1);

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS hookline;

-- name: create_schema_migrations
CREATE TABLE IF NOT EXISTS hookline.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: lock_migrations
-- One migrating process at a time: the others wait here, then find nothing left to do. A
-- table lock, not an advisory key: a role without privileges on the table cannot take it.
LOCK TABLE hookline.schema_migrations IN SHARE ROW EXCLUSIVE MODE;

-- name: applied_migrations
SELECT version FROM hookline.schema_migrations;

-- name: record_migration
INSERT INTO hookline.schema_migrations (version, name) VALUES ($1, $2);

-- name: public_schema_creatable
-- Whether every role may create objects in schema public (PostgreSQL 14 and older, and
-- clusters upgraded from them): a role could then plant functions there that shadow a
-- built-in one for a caller whose search path includes public.
SELECT n.nspname IS NOT NULL AND has_schema_privilege('public', n.oid, 'CREATE')
FROM (SELECT 1) AS one LEFT JOIN pg_namespace AS n ON n.nspname = 'public';

-- name: server_facts
SELECT current_setting('server_version_num')::int AS version_num, current_setting('server_version') AS version,
       pg_catalog.pg_is_in_recovery() AS standby;

-- name: console_role_setup
-- Migration 0029's function, again at each `hookline migrate`: NULL when the console can run.
SELECT hookline.console_role_setup();
