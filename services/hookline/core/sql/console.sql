-- `hookline console` (hookline.console.store): what the console reads, always inside
-- Store.scoped's transaction, as the console role (migration 0029), so row-level security limits
-- every statement to the request's providers whatever it says. Every list is bounded by a limit
-- and a keyset cursor, every statement by the transaction's statement_timeout.

-- name: scope
-- Read as this database's console role from here on (console_role_name() is evaluated first,
-- as the owner, and raises rather than leave the transaction reading as the owner), with the
-- request's Access for the policies: $1 a JSON array of provider names or '*', $2 'on' when the
-- whole outbox may be read; $3 the statement timeout (e.g. '5s'); $4 and $5 JSON arrays of the
-- WebhookEndpoints it may read and of their namespaces (migration 0033). All end with the transaction.
SELECT set_config('role', hookline.console_role_name(), true),
       set_config('hookline.console_providers', $1, true),
       set_config('hookline.console_install_wide', $2, true),
       set_config('statement_timeout', $3, true),
       set_config('hookline.console_endpoints', $4, true),
       set_config('hookline.console_namespaces', $5, true);

-- name: providers
-- The providers the request may read ($1: only these names, or NULL).
SELECT name, managed_by, owner_namespace, owner_name, updated_at,
       spec -> 'signature' ->> 'scheme' AS signature_scheme, spec ->> 'handler' AS handler
FROM hookline.providers
WHERE $1::text[] IS NULL OR name = ANY ($1::text[])
ORDER BY name;

-- name: events_page
-- The newest events first, of the providers $1, one keyset page: each provider's range of
-- inbox_console_idx (provider, received_at, id), or of inbox_console_dead_idx for the dead
-- letters, read backwards from the cursor ($8, $9) and merged. Filters: status $2, event type $3,
-- entity key $4, received in [$5, $6), $7 a substring of the event id. $10 rows at most.
SELECT e.id, e.provider, e.event_id, e.event_type, e.entity_key, e.status, e.attempts, e.received_at,
       e.processed_at, e.last_error
FROM unnest($1::text[]) AS p(name)
CROSS JOIN LATERAL (
    SELECT i.id, i.provider, i.event_id, i.event_type, i.entity_key, i.status, i.attempts, i.received_at,
           i.processed_at, left(i.last_error, 300) AS last_error
    FROM hookline.inbox AS i
    WHERE i.provider = p.name
      /* TEMPLATE_BEGIN: dead */AND i.status = 'dead'/* TEMPLATE_END */
      AND ($2::text IS NULL OR i.status = $2::text)
      AND ($3::text IS NULL OR i.event_type = $3::text)
      AND ($4::text IS NULL OR i.entity_key = $4::text)
      AND ($5::timestamptz IS NULL OR i.received_at >= $5::timestamptz)
      AND ($6::timestamptz IS NULL OR i.received_at < $6::timestamptz)
      AND ($7::text IS NULL OR strpos(i.event_id, $7::text) > 0)
      AND ($8::timestamptz IS NULL OR (i.received_at, i.id) < ($8::timestamptz, $9::bigint))
    ORDER BY i.received_at DESC, i.id DESC
    LIMIT $10
) AS e
ORDER BY e.received_at DESC, e.id DESC
LIMIT $10;

-- name: event
-- One event (inbox_event_idx), its first $3 bytes of body and the body's length.
SELECT id, provider, event_id, event_type, entity_key, status, attempts, received_at, next_attempt_at,
       processed_at, locked_by, lease_expires_at, last_error, deferred_since, suspect, headers, content_type,
       length(body) AS body_bytes, substring(body FROM 1 FOR $3) AS body
FROM hookline.inbox
WHERE provider = $1 AND event_id = $2;

-- name: attempts
-- Every logged attempt of one inbox event, oldest first (attempts_row_idx); $3 its received_at,
-- before which it has none (prunes the older partitions of the log).
SELECT at, attempt, worker, outcome, error, http_status, latency_ms FROM hookline.attempts
WHERE queue = $1 AND row_id = $2 AND at >= $3::timestamptz
ORDER BY at, attempt
LIMIT 200;

-- name: dead_to_replay
-- The dead events of the providers $1 a replay names: the ids $2, or those matching the filters
-- (event type $3, entity $4, received in [$5, $6), event id containing $7); $8 rows at most
-- (inbox_console_dead_idx per provider).
SELECT e.id, e.provider
FROM unnest($1::text[]) AS p(name)
CROSS JOIN LATERAL (
    SELECT i.id, i.provider, i.received_at FROM hookline.inbox AS i
    WHERE i.provider = p.name AND i.status = 'dead'
      AND ($2::bigint[] IS NULL OR i.id = ANY ($2::bigint[]))
      AND ($3::text IS NULL OR i.event_type = $3::text)
      AND ($4::text IS NULL OR i.entity_key = $4::text)
      AND ($5::timestamptz IS NULL OR i.received_at >= $5::timestamptz)
      AND ($6::timestamptz IS NULL OR i.received_at < $6::timestamptz)
      AND ($7::text IS NULL OR strpos(i.event_id, $7::text) > 0)
    ORDER BY i.received_at DESC, i.id DESC
    LIMIT $8
) AS e
LIMIT $8;

-- name: event_ids
-- The ids of events named by (provider, event_id) pairs (inbox_event_idx).
SELECT i.id, i.provider, i.event_id, i.status
FROM unnest($1::text[], $2::text[]) AS n(provider, event_id)
JOIN hookline.inbox AS i ON i.provider = n.provider AND i.event_id = n.event_id;

-- name: record_replays
-- A replay in the attempt log (migration 0029): who in `worker`, attempt 0. Written as the owner.
INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome)
SELECT $1::text, r.id, r.part, 0, $4::text, 'replayed'
FROM unnest($2::bigint[], $3::text[]) AS r(id, part);

-- name: endpoints
-- Every endpoint with its circuit and what waits for it (as status.sql's endpoint_status), plus
-- the deliveries done and failed in the last $1 seconds (attempts_part_at_idx).
SELECT e.name, e.namespace, e.url, e.event_types, e.enabled, e.disabled_reason, e.circuit_state,
       e.circuit_changed_at, e.consecutive_failures, e.paused, e.rate_per_second, e.rate_burst, e.max_in_flight,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'pending')
           AS pending,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'parked')
           AS parked,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'dead') AS dead,
       recent.done AS recent_done, recent.failed AS recent_failed
FROM hookline.endpoints AS e
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.outcome = 'done') AS done, count(*) FILTER (WHERE a.outcome <> 'done') AS failed
    FROM hookline.attempts AS a
    WHERE a.queue = 'deliveries' AND a.part = e.name AND a.at > now() - make_interval(secs => $1)
) AS recent
ORDER BY e.name;

-- name: endpoint_exists
SELECT name, enabled FROM hookline.endpoints WHERE name = $1;

-- name: deliveries_page
-- The newest deliveries first, one keyset page down the deliveries' primary key from the
-- cursor id $5: endpoint $1, status $2, event type $3, outbox event id containing $4; $6 rows.
SELECT d.id, d.endpoint, d.status, d.attempts, d.created_at, d.processed_at, d.last_status,
       left(d.last_error, 300) AS last_error, o.event_id, o.event_type
FROM hookline.deliveries AS d JOIN hookline.outbox AS o ON o.id = d.outbox_id AND o.created_at = d.created_at
WHERE ($1::text IS NULL OR d.endpoint = $1::text)
  AND ($2::text IS NULL OR d.status = $2::text)
  AND ($3::text IS NULL OR o.event_type = $3::text)
  AND ($4::text IS NULL OR strpos(o.event_id, $4::text) > 0)
  AND ($5::bigint IS NULL OR d.id < $5::bigint)
ORDER BY d.id DESC
LIMIT $6;

-- name: delivery
-- One delivery (one probe of each partition's primary key) with its outbox event: its payload as
-- text, the first $2 characters and its length in bytes; the partner's last answer, its first 2,000.
SELECT d.id, d.endpoint, d.status, d.attempts, d.created_at, d.next_attempt_at, d.processed_at, d.locked_by,
       d.lease_expires_at, d.last_status, left(d.last_response, 2000) AS last_response, d.last_latency_ms,
       d.last_error, d.suspect, o.event_id, o.event_type, o.aggregate_type, o.aggregate_id,
       octet_length(p.text) AS body_bytes, left(p.text, $2) AS payload
FROM hookline.deliveries AS d
JOIN hookline.outbox AS o ON o.id = d.outbox_id AND o.created_at = d.created_at
CROSS JOIN LATERAL (SELECT o.payload::text AS text) AS p
WHERE d.id = $1;

-- name: dead_deliveries_to_replay
-- Dead deliveries to replay: the ids $1, or those of endpoint $2 (deliveries_dead_idx); $3 at most;
-- of the endpoints $4 only (NULL: any the Access reads).
SELECT d.id, d.endpoint FROM hookline.deliveries AS d
WHERE d.status = 'dead'
  AND ($1::bigint[] IS NULL OR d.id = ANY ($1::bigint[]))
  AND ($2::text IS NULL OR d.endpoint = $2::text)
  AND ($4::text[] IS NULL OR d.endpoint = ANY ($4::text[]))
ORDER BY d.id DESC
LIMIT $3;

-- name: endpoint_owners
-- Every endpoint a WebhookEndpoint is (NAMESPACE/NAME), for the Kubernetes authorizer, as the owner.
SELECT name, namespace, resource_name, owner_uid FROM hookline.endpoints WHERE namespace IS NOT NULL ORDER BY name;

-- name: provider_owners
-- Every provider with the WebhookProvider that owns it (none for CLI-applied ones): what the
-- Kubernetes authorizer asks SubjectAccessReviews about. Read as the owner, before any Access exists;
-- names and owners only, never a spec or a secret.
SELECT name, owner_namespace, owner_name, owner_uid FROM hookline.providers ORDER BY name;
