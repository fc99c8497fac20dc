-- Hookline's SQL, one statement per "-- name:" block, loaded by hookline.core.db.query(name).

-- name: upsert_provider
-- `hookline providers apply`: rows a WebhookProvider resource owns are never
-- touched (no row back; upsert() then explains who owns the name). Rows from
-- before ownership was recorded (managed_by NULL) become the CLI's.
-- $4 is a fresh destination secret, used only when the provider has none yet.
INSERT INTO hookline.providers AS p (name, spec, secrets, destination_secret, managed_by)
VALUES ($1, $2, $3, $4, 'cli')
ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec, secrets = EXCLUDED.secrets, updated_at = now(), managed_by = 'cli',
        destination_secret = coalesce(p.destination_secret, EXCLUDED.destination_secret)
    WHERE p.owner_uid IS NULL
RETURNING destination_secret = $4 AS secret_is_new;

-- name: delete_provider
-- `hookline providers delete`: only rows no WebhookProvider resource owns.
DELETE FROM hookline.providers WHERE name = $1 AND owner_uid IS NULL RETURNING true;

-- name: get_provider_owner
SELECT managed_by, owner_namespace, owner_name, owner_uid FROM hookline.providers WHERE name = $1;

-- name: list_providers
SELECT name, spec, secrets, destination_secret, updated_at, managed_by, owner_namespace, owner_name
FROM hookline.providers ORDER BY name;

-- name: list_provider_specs
-- What a worker needs: everything but the signing secrets, which it never uses and a tenant's
-- worker role may not read (migration 0025).
SELECT name, spec, destination_secret, updated_at, managed_by, owner_namespace, owner_name
FROM hookline.providers ORDER BY name;

-- name: list_provider_specs_without_secrets
-- A tenant's workers (operator-made, their destination secret mounted as a file: no key for
-- secrets at rest): no secret column, which their role may not read (migrations 0025, 0026).
SELECT name, spec FROM hookline.providers ORDER BY name;

-- name: providers_fingerprint
-- Changes whenever a provider row is written or removed (every write sets updated_at): the
-- registry re-reads the providers on NOTIFY only when this differs from its last read.
SELECT md5(coalesce(string_agg(name || '/' || updated_at::text, ',' ORDER BY name), ''))
FROM hookline.providers;

-- name: get_provider_secrets
SELECT secrets FROM hookline.providers WHERE name = $1;

-- name: get_provider_claim_secrets
-- What the operator's claim needs to know before it writes (reconcile.claim_row): the sealed
-- secrets as stored (kept where unchanged), and whether they prove a row from before ownership ours.
SELECT secrets, managed_by FROM hookline.providers WHERE name = $1;

-- name: claim_provider
-- The operator's claim and sync in one statement: the first resource to claim a
-- name owns it. The row is written only when it is free, already ours ($7 is the
-- resource's uid), held by an owner the caller proved deleted ($9), or written
-- before ownership was recorded and proven ours by its secret ($8, $10: see below) or,
-- without a secret (scheme none), by its spec (migration 0005).
-- An unchanged row is not rewritten: no new row version, no notification.
-- The result is one row saying who owns the name: written = true when this call
-- wrote it; otherwise the row as it was (ours and unchanged, or someone else's).
-- No row at all means another transaction changed the name meanwhile: try again.
-- Taking over from a proven-deleted owner archives that owner's events in this
-- statement (trigger providers_owner_replaced, migration 0015).
WITH claimed AS (
    INSERT INTO hookline.providers AS p
        (name, spec, secrets, destination_secret, managed_by, owner_namespace, owner_name, owner_uid)
    VALUES ($1, $2, $3, $4, 'operator', $5, $6, $7)
    ON CONFLICT (name) DO UPDATE
        SET spec = EXCLUDED.spec, secrets = EXCLUDED.secrets, updated_at = now(), managed_by = 'operator',
            owner_namespace = EXCLUDED.owner_namespace, owner_name = EXCLUDED.owner_name,
            owner_uid = EXCLUDED.owner_uid,
            -- A name taken over from another resource gets a destination secret of its own: the
            -- previous owner's destination may still trust the old one (operator/tenancy.py
            -- writes it into the new owner's namespace).
            destination_secret = CASE WHEN p.owner_uid <> EXCLUDED.owner_uid THEN EXCLUDED.destination_secret
                                      ELSE coalesce(p.destination_secret, EXCLUDED.destination_secret) END
        WHERE (p.owner_uid = EXCLUDED.owner_uid
               OR p.owner_uid = $9::text
               OR (p.managed_by IS NULL
                   -- Secrets are sealed, each with a random data key (core/secrets_at_rest.py): the
                   -- operator opened the stored ones and found its current secret there ($8: it
                   -- has one), and $10 is the column as it read it (NULL: not found). $3 keeps the
                   -- stored ciphertext of every unchanged secret, so an unchanged row compares equal.
                   AND CASE WHEN $8::boolean THEN p.secrets = $10::jsonb ELSE p.spec = EXCLUDED.spec END))
          AND (p.spec, p.secrets, p.managed_by, p.owner_namespace, p.owner_name, p.owner_uid,
               p.destination_secret IS NULL)
              IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.secrets, 'operator', EXCLUDED.owner_namespace,
                                EXCLUDED.owner_name, EXCLUDED.owner_uid, false)
    RETURNING p.managed_by, p.owner_namespace, p.owner_name, p.owner_uid
)
SELECT true AS written, managed_by, owner_namespace, owner_name, owner_uid FROM claimed
UNION ALL
SELECT false, managed_by, owner_namespace, owner_name, owner_uid FROM hookline.providers
WHERE name = $1 AND NOT EXISTS (SELECT FROM claimed);

-- name: release_provider
-- A deleted resource removes only a row it owns, and its annotation tokens; its events,
-- dedup keys and entity states are archived under name@uid in this statement (trigger
-- providers_owner_released, migration 0015), so the next owner starts empty.
WITH released AS (
    DELETE FROM hookline.providers WHERE name = $1 AND owner_uid = $2 RETURNING name
), forgotten AS (
    DELETE FROM hookline.operator_tokens WHERE provider = $1 AND resource_uid = $2
)
SELECT count(*) > 0 AS released FROM released;

-- name: record_operator_token
-- A one-shot annotation token (replay-dlq, rotate-secret) of one resource; true
-- when it is new. Recorded in the transaction that acts on it.
INSERT INTO hookline.operator_tokens (provider, resource_uid, kind, token) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING
RETURNING true;

-- name: set_operator_token_result
UPDATE hookline.operator_tokens SET result = $5
WHERE provider = $1 AND resource_uid = $2 AND kind = $3 AND token = $4;

-- name: get_operator_token_result
SELECT result FROM hookline.operator_tokens
WHERE provider = $1 AND resource_uid = $2 AND kind = $3 AND token = $4;

-- name: lock_owned_provider
-- The replay-dlq annotation's ownership check: true while the resource ($2, its uid)
-- owns the name, and the row stays locked FOR SHARE until the transaction ends, so a
-- concurrent release cannot slip in before Queue.replay_dead requeues the events.
SELECT true FROM hookline.providers WHERE name = $1 AND owner_uid = $2 FOR SHARE;

-- name: provider_stats
-- Every provider's queue signals in ONE statement per operator tick, not one per
-- provider. Each part reads one partial index, so the cost follows the number of
-- unfinished rows, never the size of the table (done rows are in none of them):
--   due, oldest due   inbox_claimable_idx (pending), the rows a worker could claim now
--   retrying          inbox_retrying_idx  (pending after a failed attempt), not due yet
--   deferred          inbox_deferred_idx  (pending, waiting for a predecessor)
--   in flight         inbox_leased_idx    (processing; as many as workers run at once)
--   dead              inbox_dead_idx      (dead)
--   suspects          inbox_suspect_idx   (pending rows whose last lease expired; migration 0008)
-- oldest_due_seconds is how long the longest-waiting due event has waited to be
-- claimed (since it arrived, or since its backoff ended); a future retry is not due
-- and cannot make it negative.
WITH due AS (
    SELECT provider, count(*) AS due, min(next_attempt_at) AS oldest_due_at
    FROM hookline.inbox WHERE status = 'pending' AND next_attempt_at <= now()
    GROUP BY provider
), retrying AS (
    SELECT provider, count(*) AS retrying
    FROM hookline.inbox
    WHERE status = 'pending' AND attempts > 0 AND deferred_since IS NULL AND next_attempt_at > now()
    GROUP BY provider
), deferred AS (
    SELECT provider, count(*) AS deferred
    FROM hookline.inbox WHERE status = 'pending' AND deferred_since IS NOT NULL
    GROUP BY provider
), in_flight AS (
    SELECT provider, count(*) AS in_flight, count(*) FILTER (WHERE lease_expires_at < now()) AS expired
    FROM hookline.inbox WHERE status = 'processing'
    GROUP BY provider
), dead AS (
    SELECT provider, count(*) AS dead FROM hookline.inbox WHERE status = 'dead' GROUP BY provider
), suspects AS (
    SELECT provider, count(*) AS suspects FROM hookline.inbox WHERE status = 'pending' AND suspect
    GROUP BY provider
)
SELECT provider,
       coalesce(due.due, 0) AS due,
       greatest(0, coalesce(extract(epoch FROM now() - due.oldest_due_at), 0))::float8 AS oldest_due_seconds,
       coalesce(retrying.retrying, 0) AS retrying,
       coalesce(deferred.deferred, 0) AS deferred,
       coalesce(in_flight.in_flight, 0) AS in_flight,
       coalesce(in_flight.expired, 0) AS expired_leases,
       coalesce(dead.dead, 0) AS dead,
       coalesce(suspects.suspects, 0) AS suspects
FROM due
FULL JOIN retrying USING (provider)
FULL JOIN deferred USING (provider)
FULL JOIN in_flight USING (provider)
FULL JOIN dead USING (provider)
FULL JOIN suspects USING (provider);

-- name: insert_inbox_batch
-- Group commit: one statement (one transaction, one WAL flush) stores a whole batch
-- of concurrently received events. Rows that already exist are skipped; RETURNING
-- names the rows stored now, so each request learns "accepted" or "duplicate".
-- pg_notify wakes idle workers; Postgres folds identical notifications within a
-- transaction, so this is one notification per provider per batch, not per row.
-- "Exists" means its dedup key exists (hookline.inbox_keys, migration 0011): the key
-- is claimed first and the event stored only for keys claimed now, so a duplicate
-- is recognised for as long as the key is kept, even after its payload's partition
-- was dropped, and two copies racing (in one batch, in concurrent batches, on both
-- sides of a partition boundary) meet at the key's primary key and are stored once.
--
-- replay_protected (a template section; a batch with rows of replay-protected
-- providers): $8 = sha256 of the body, $9 = window in seconds, both NULL for other
-- rows. Each body hash is claimed for the window by the first row that carries it
-- (DISTINCT ON: one claim per hash, so ON CONFLICT never meets the same key twice); a
-- hash still held by an earlier event is not re-claimed, and its row is not stored.
-- RETURNING then adds the claims made now (body_sha256 set, event_id = the claiming row)
-- to the stored rows (body_sha256 NULL).
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::bytea[], $7::text[]/* TEMPLATE_BEGIN: replay_protected */,
                         $8::bytea[], $9::float8[]/* TEMPLATE_END */) WITH ORDINALITY
        AS t(provider, event_id, event_type, entity_key, headers, body, content_type/* TEMPLATE_BEGIN: replay_protected */, body_sha256,
             window_seconds/* TEMPLATE_END */, position)
), /* TEMPLATE_BEGIN: replay_protected */claimed AS (
    INSERT INTO hookline.inbox_body_hashes AS h (provider, body_sha256, event_id, expires_at)
    SELECT DISTINCT ON (provider, body_sha256) provider, body_sha256, event_id,
           now() + make_interval(secs => window_seconds)
    FROM input WHERE body_sha256 IS NOT NULL
    ORDER BY provider, body_sha256, position
    ON CONFLICT (provider, body_sha256) DO UPDATE
        SET event_id = EXCLUDED.event_id, expires_at = EXCLUDED.expires_at
        WHERE h.expires_at <= now()
    RETURNING provider, body_sha256, event_id
), admitted AS (
    SELECT i.* FROM input i
    WHERE i.body_sha256 IS NULL
       OR EXISTS (SELECT 1 FROM claimed c WHERE c.provider = i.provider AND c.body_sha256 = i.body_sha256
                  AND c.event_id = i.event_id)
), /* TEMPLATE_END */keys AS (
    INSERT INTO hookline.inbox_keys (provider, event_id)
    SELECT provider, event_id FROM /* TEMPLATE: rows */admitted
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING provider, event_id
), stored AS (
    INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, headers, body, content_type)
    SELECT DISTINCT ON (i.provider, i.event_id)
           i.provider, i.event_id, i.event_type, i.entity_key, i.headers, i.body, i.content_type
    FROM /* TEMPLATE: rows */admitted AS i JOIN keys AS k ON k.provider = i.provider AND k.event_id = i.event_id
    ORDER BY i.provider, i.event_id, i.position
    RETURNING provider, event_id
)
SELECT provider, event_id/* TEMPLATE_BEGIN: replay_protected */, NULL::bytea AS body_sha256/* TEMPLATE_END */, pg_notify('hookline_inbox', provider) FROM stored/* TEMPLATE_BEGIN: replay_protected */
UNION ALL
SELECT provider, event_id, body_sha256, NULL FROM claimed/* TEMPLATE_END */;

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
WHERE id = $1 AND attempts = $2 AND (status = 'processing') IS TRUE AND locked_by = $3
RETURNING id;

-- name: list_dead_events
SELECT provider, event_id, event_type, attempts, processed_at, last_error FROM hookline.inbox
WHERE status = 'dead' AND ($1::text IS NULL OR provider = $1)
ORDER BY processed_at DESC NULLS LAST, id DESC
LIMIT $2;

-- name: dead_of_type
-- The dead events of one type (of one provider, or all), for a replay by type.
SELECT id FROM hookline.inbox
WHERE status = 'dead' AND ($1::text IS NULL OR provider = $1) AND event_type = $2;

-- name: take_maintenance_lease
-- Leader election for a maintenance scope (core/maintenance.py): the lease is taken when
-- nobody holds it or its holder let it run out, and renewed by its holder ($2). True when
-- $2 holds it now, for $3 seconds. An owner-only table (migration 0025): no tenant role can
-- hold the lease or lock its row, as any role could take an advisory key.
WITH taken AS (
    INSERT INTO hookline.maintenance_leaders AS l (scope, holder, expires_at)
    VALUES ($1, $2, now() + make_interval(secs => $3))
    ON CONFLICT (scope) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
    RETURNING 1
)
SELECT EXISTS (SELECT FROM taken);

-- name: resign_maintenance_lease
-- A leader that stops hands the scope over at once instead of letting its lease run out.
DELETE FROM hookline.maintenance_leaders WHERE scope = $1 AND holder = $2;

-- name: transaction_age
-- Seconds since the current transaction began (now() stands still inside it).
SELECT extract(epoch FROM clock_timestamp() - now());
