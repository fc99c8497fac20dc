-- Hookline's SQL, one statement per "-- name:" block, loaded by hookline.core.db.query(name).

-- name: upsert_provider
INSERT INTO hookline.providers (name, spec, secrets)
VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec, secrets = EXCLUDED.secrets, updated_at = now()
    WHERE (providers.spec, providers.secrets) IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.secrets);

-- name: delete_provider
DELETE FROM hookline.providers WHERE name = $1 RETURNING true;

-- name: list_providers
SELECT name, spec, secrets, updated_at FROM hookline.providers ORDER BY name;

-- name: get_provider_secrets
SELECT secrets FROM hookline.providers WHERE name = $1;

-- name: insert_inbox_batch
-- Group commit: one statement (one transaction, one WAL flush) stores a whole batch
-- of concurrently received events. Rows that already exist are skipped; RETURNING
-- names the rows stored now, so each request learns "accepted" or "duplicate".
-- pg_notify wakes idle workers; Postgres folds identical notifications within a
-- transaction, so this is one notification per provider per batch, not per row.
WITH stored AS (
    INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, headers, body, content_type)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::bytea[], $7::text[])
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING provider, event_id
)
SELECT provider, event_id, pg_notify('hookline_inbox', provider) FROM stored;

-- name: ping
SELECT 1;
