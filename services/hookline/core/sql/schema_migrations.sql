-- What `hookline migrate` runs around the migrations themselves (hookline.core.migrations),
-- all in one transaction.

-- name: lock_migrations
-- One migrating process at a time: the others wait here, then find nothing left to do.
SELECT pg_advisory_xact_lock($1);

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS hookline;

-- name: create_schema_migrations
CREATE TABLE IF NOT EXISTS hookline.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: applied_migrations
SELECT version FROM hookline.schema_migrations;

-- name: record_migration
INSERT INTO hookline.schema_migrations (version, name) VALUES ($1, $2);
