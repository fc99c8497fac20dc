-- Event history (hookline.core.history): `hookline events list/show`,
-- `hookline deliveries show` and the attempt log (hookline.attempts, migration 0013).

-- name: list_events
-- The newest events first, filtered by provider ($1), status ($2) and received
-- since ($3); all optional. Walks the primary key backwards and stops at $4 rows.
SELECT id, provider, event_id, event_type, status, attempts, received_at, processed_at, last_error
FROM hookline.inbox
WHERE ($1::text IS NULL OR provider = $1)
  AND ($2::text IS NULL OR status = $2)
  AND ($3::timestamptz IS NULL OR received_at >= $3)
ORDER BY id DESC
LIMIT $4;

-- name: find_event
-- One event by (provider, event_id) (inbox_provider_event_id_key) or by id $3
-- (the primary key); a bitmap OR of the two index probes. $4: bytes of body shown.
SELECT id, provider, event_id, event_type, entity_key, status, attempts, received_at, next_attempt_at,
       processed_at, locked_by, lease_expires_at, last_error, deferred_since, suspect, headers, content_type,
       length(body) AS body_bytes, substring(body FROM 1 FOR $4) AS body_preview
FROM hookline.inbox
WHERE (provider = $1 AND event_id = $2) OR id = $3::bigint;

-- name: attempts_of
-- Every logged attempt of one row of one queue (attempts_row_idx), oldest first. $3
-- is when the row was created (an event's received_at, a delivery's created_at): no
-- attempt is older, so the partitions of the log before it are pruned (migration 0017).
SELECT at, attempt, worker, outcome, error, http_status, latency_ms FROM hookline.attempts
WHERE queue = $1 AND row_id = $2 AND at >= $3::timestamptz
ORDER BY at, attempt;

-- name: find_deliveries
-- One delivery by id ($1), or every delivery of the outbox event $2 (msg_...):
-- the outbox's event_id key, then the deliveries' (outbox_id, endpoint) key.
SELECT d.id, d.endpoint, d.status, d.attempts, d.next_attempt_at, d.processed_at, d.locked_by,
       d.lease_expires_at, d.last_error, d.last_status, d.last_response, d.last_latency_ms, d.created_at,
       o.event_id, o.event_type, o.aggregate_type, o.aggregate_id, left(o.payload::text, $3) AS payload_preview
FROM hookline.deliveries AS d JOIN hookline.outbox AS o ON o.id = d.outbox_id
WHERE d.id = $1::bigint OR d.outbox_id = (SELECT id FROM hookline.outbox WHERE event_id = $2::text)
ORDER BY d.id;

-- name: list_deliveries
-- The newest deliveries first, filtered by endpoint ($1) and status ($2), both
-- optional. Walks the deliveries' primary key backwards and stops at $3 rows.
SELECT d.id, d.endpoint, d.status, d.attempts, d.created_at, d.last_status, d.last_error,
       o.event_id, o.event_type
FROM hookline.deliveries AS d JOIN hookline.outbox AS o ON o.id = d.outbox_id
WHERE ($1::text IS NULL OR d.endpoint = $1)
  AND ($2::text IS NULL OR d.status = $2)
ORDER BY d.id DESC
LIMIT $3;
