-- Hookline's SQL, one statement per "-- name:" block, loaded by hookline.core.db.query(name).

-- name: upsert_provider
-- $4 is a fresh destination secret, used only when the provider has none yet.
INSERT INTO hookline.providers (name, spec, secrets, destination_secret)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec, secrets = EXCLUDED.secrets, updated_at = now(),
        destination_secret = coalesce(providers.destination_secret, EXCLUDED.destination_secret)
    WHERE (providers.spec, providers.secrets, providers.destination_secret)
          IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.secrets, EXCLUDED.destination_secret)
RETURNING destination_secret = $4 AS secret_is_new;

-- name: delete_provider
DELETE FROM hookline.providers WHERE name = $1 RETURNING true;

-- name: list_providers
SELECT name, spec, secrets, destination_secret, updated_at FROM hookline.providers ORDER BY name;

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

-- name: insert_inbox_batch_replay_protected
-- insert_inbox_batch for a batch with rows of replay-protected providers ($8 = sha256 of
-- the body, $9 = window in seconds; both NULL for other rows). Each body hash is claimed
-- for the window by the first row that carries it (DISTINCT ON: one claim per hash, so
-- ON CONFLICT never meets the same key twice); a hash still held by an earlier event is
-- not re-claimed, and its row is not stored. RETURNING: stored rows (body_sha256 NULL)
-- and the claims made now (body_sha256 set, event_id = the claiming row).
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::bytea[], $7::text[],
                         $8::bytea[], $9::float8[]) WITH ORDINALITY
        AS t(provider, event_id, event_type, entity_key, headers, body, content_type, body_sha256,
             window_seconds, position)
), claimed AS (
    INSERT INTO hookline.inbox_body_hashes AS h (provider, body_sha256, event_id, expires_at)
    SELECT DISTINCT ON (provider, body_sha256) provider, body_sha256, event_id,
           now() + make_interval(secs => window_seconds)
    FROM input WHERE body_sha256 IS NOT NULL
    ORDER BY provider, body_sha256, position
    ON CONFLICT (provider, body_sha256) DO UPDATE
        SET event_id = EXCLUDED.event_id, expires_at = EXCLUDED.expires_at
        WHERE h.expires_at <= now()
    RETURNING provider, body_sha256, event_id
), stored AS (
    INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, headers, body, content_type)
    SELECT i.provider, i.event_id, i.event_type, i.entity_key, i.headers, i.body, i.content_type
    FROM input i
    WHERE i.body_sha256 IS NULL
       OR EXISTS (SELECT 1 FROM claimed c WHERE c.provider = i.provider AND c.body_sha256 = i.body_sha256
                  AND c.event_id = i.event_id)
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING provider, event_id
)
SELECT provider, event_id, NULL::bytea AS body_sha256, pg_notify('hookline_inbox', provider) FROM stored
UNION ALL
SELECT provider, event_id, body_sha256, NULL FROM claimed;

-- name: find_body_hashes
-- The event that first carried each replayed body, for the duplicate answer.
SELECT provider, body_sha256, event_id FROM hookline.inbox_body_hashes
WHERE (provider, body_sha256) IN (SELECT * FROM unnest($1::text[], $2::bytea[]));

-- name: prune_body_hashes
DELETE FROM hookline.inbox_body_hashes WHERE expires_at < now();

-- name: ping
SELECT 1;

-- name: lock_entity_state
-- Serializes every event of one entity: the row is created on first sight, and
-- the no-op DO UPDATE locks it (new or not) for the rest of the transaction that
-- applies or defers an event, returning the current state in the same round trip.
INSERT INTO hookline.entity_states (provider, entity_key) VALUES ($1, $2)
ON CONFLICT (provider, entity_key) DO UPDATE SET provider = EXCLUDED.provider
RETURNING state;

-- name: set_entity_state
UPDATE hookline.entity_states SET state = $3, updated_at = now() WHERE provider = $1 AND entity_key = $2;

-- name: release_deferred
-- A predecessor applied: the entity's deferred events become claimable at once.
WITH released AS (
    UPDATE hookline.inbox SET next_attempt_at = now()
    WHERE provider = $1 AND entity_key = $2 AND status = 'pending' AND deferred_since IS NOT NULL
    RETURNING provider
)
SELECT count(*) AS released, pg_notify('hookline_inbox', $1) FROM released HAVING count(*) > 0;

-- name: defer_event
-- Not applicable yet: back to pending for $4 seconds; the attempt is not counted.
UPDATE hookline.inbox
SET status = 'pending', attempts = attempts - 1, next_attempt_at = now() + make_interval(secs => $4),
    deferred_since = coalesce(deferred_since, now()), lease_expires_at = NULL, locked_by = NULL,
    last_error = $5
WHERE id = $1 AND attempts = $2 AND status = 'processing' AND locked_by = $3
RETURNING id;

-- name: list_dead
SELECT provider, event_id, event_type, attempts, processed_at, last_error FROM hookline.inbox
WHERE status = 'dead' AND ($1::text IS NULL OR provider = $1)
ORDER BY processed_at DESC NULLS LAST, id DESC
LIMIT $2;

-- name: replay_dead_inbox
-- Requeue dead events; attempts restart so the retry policy applies afresh, and a
-- deferral clock restarts too. pg_notify wakes the workers.
UPDATE hookline.inbox
SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL, processed_at = NULL,
    deferred_since = NULL
WHERE status = 'dead'
  AND ($1::text IS NULL OR provider = $1)
  AND ($2::text IS NULL OR event_type = $2)
RETURNING provider, pg_notify('hookline_inbox', provider);
