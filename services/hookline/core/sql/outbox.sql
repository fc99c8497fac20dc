-- The outbox's own SQL (endpoints, delivery bookkeeping), loaded by
-- hookline.outbox.query(name). Claiming, leases, retries, dead letters and
-- replay are the shared queue mechanics in queue.sql (hookline.core.queue.OUTBOX);
-- retention is the partition manager's (hookline.expire_outbox, partitions.sql).

-- name: publish
-- hookline.outbox.publish: the event as JSON text, cast here, so that it works
-- with or without a jsonb codec on the caller's connection.
-- $6 is the publisher's traceparent (or NULL), set for the rest of the transaction
-- before publish runs (the FROM item is evaluated first); publish stores it.
-- $7 the namespace (NULL: the login's own, or install-wide; migration 0030).
SELECT hookline.publish($1, $2::text::jsonb, $3, $4, $5, $7)
FROM (SELECT set_config('hookline.traceparent', coalesce($6::text, ''), true)) AS traced;

-- name: insert_endpoint
INSERT INTO hookline.endpoints (name, url, event_types, ordered, secrets, max_attempts, initial_delay_seconds,
                                max_delay_seconds, timeout_seconds, retention_done_hours, retention_dead_days)
-- secrets arrive as JSON text and are cast here, with or without a jsonb codec on the connection.
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, $9, $10, $11)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: list_endpoints
SELECT * FROM hookline.endpoints ORDER BY name;

-- name: set_endpoint_retention
-- Hours its delivered events and days its dead letters are kept (NULL: the install's
-- default); hookline.expire_outbox applies them.
UPDATE hookline.endpoints SET retention_done_hours = $2, retention_dead_days = $3 WHERE name = $1
RETURNING name;

-- name: endpoint_namespace
SELECT namespace FROM hookline.endpoints WHERE name = $1;

-- name: set_endpoint_paused
-- Paused deliveries stay pending, unclaimed (the relays skip the endpoint; the
-- endpoints_changed trigger tells them); resuming sends them in their order.
UPDATE hookline.endpoints SET paused = $2 WHERE name = $1 RETURNING name;

-- name: endpoint_egress_for_update
-- The stored egress (as text: with or without a jsonb codec), locked until set_egress commits.
SELECT egress::text AS egress FROM hookline.endpoints WHERE name = $1 FOR UPDATE;

-- name: set_endpoint_egress
-- set_egress runs it only when the value changed: the endpoints_changed trigger makes every relay re-read.
UPDATE hookline.endpoints SET egress = $2::text::jsonb WHERE name = $1;

-- name: delete_endpoint
-- Its deliveries go with it (ON DELETE CASCADE); the events stay for the others.
DELETE FROM hookline.endpoints WHERE name = $1 RETURNING name;

-- name: enable_endpoint
-- Re-enabling unparks what the endpoint missed while disabled, oldest first.
WITH e AS (
    UPDATE hookline.endpoints
    SET enabled = true, disabled_at = NULL, disabled_reason = NULL, consecutive_failures = 0, circuit_openings = 0,
        circuit_open_until = NULL, circuit_state = 'closed', circuit_changed_at = now(), window_started_at = NULL,
        window_successes = 0, window_failures = 0, previous_successes = 0, previous_failures = 0
    WHERE name = $1
    RETURNING name
), unparked AS (
    UPDATE hookline.deliveries AS d SET status = 'pending', next_attempt_at = now()
    FROM e WHERE d.endpoint = e.name AND d.status = 'parked'
    RETURNING d.id
)
SELECT (SELECT count(*) FROM e) AS found, (SELECT count(*) FROM unparked) AS unparked,
       pg_notify('hookline_outbox', '');

-- name: disable_endpoint
-- A 410 Gone: disable the endpoint and park its undelivered deliveries (the one
-- that got the 410 included: it was not delivered). Parked is not lost:
-- `hookline endpoints enable` puts them back. Deliveries other relays hold right
-- now park themselves when they finish (see park_delivery). The attempt that got
-- the 410 is logged with its answer (hookline.log_attempts, migration 0016; a
-- materialized CTE runs once); the others were not attempted. One row per parked delivery.
WITH e AS (
    UPDATE hookline.endpoints SET enabled = false, disabled_at = now(), disabled_reason = $2
    WHERE name = $1 RETURNING name
), parked AS (
    UPDATE hookline.deliveries AS d
    SET status = 'parked', lease_expires_at = NULL, locked_by = NULL,
        last_error = CASE WHEN d.id = $3 THEN $2 ELSE d.last_error END,
        last_status = CASE WHEN d.id = $3 THEN $6 ELSE d.last_status END,
        last_response = CASE WHEN d.id = $3 THEN $7 ELSE d.last_response END,
        last_latency_ms = CASE WHEN d.id = $3 THEN $8 ELSE d.last_latency_ms END
    FROM e
    WHERE d.endpoint = e.name
      AND (d.status = 'pending' OR (d.id = $3 AND d.attempts = $4 AND d.status = 'processing' AND d.locked_by = $5))
    RETURNING d.id, d.endpoint, d.attempts, d.last_error, d.last_status, d.last_latency_ms
), logged AS MATERIALIZED (
    SELECT hookline.log_attempts('deliveries', array_agg(id), array_agg(endpoint), array_agg(attempts),
                                 array_agg($5::text), array_agg('parked'::text), array_agg(last_error),
                                 array_agg(last_status), array_agg(last_latency_ms))
    FROM parked WHERE id = $3
)
SELECT parked.id FROM parked LEFT JOIN logged ON true;

-- name: park_delivery
-- A delivery that failed after its endpoint was disabled waits with the others.
-- Runs in the transaction that just put it back to pending (attempts pins that attempt).
UPDATE hookline.deliveries AS d
SET status = 'parked'
FROM hookline.endpoints AS e
WHERE d.id = $1 AND d.attempts = $2 AND d.status = 'pending'
  AND e.name = d.endpoint AND NOT e.enabled
RETURNING d.id;

-- name: claimed_events
-- The events behind claimed deliveries (a suspect's: claim_suspect returns delivery rows; the
-- relay's ordinary claim gets them in the same statement, claimed_with_events below),
-- with the endpoint's secrets as of now: a rotation committed before the claim
-- signs every delivery of that claim, however stale the relay's endpoint cache.
-- The payload as JSON text: the relay splices it into the envelope as it is, and the
-- envelope's RFC 3339 timestamp (UTC, microseconds) formatted here. The secrets as text:
-- the same on every row, so the relay decodes them once per claim, not once per row.
SELECT o.id, o.event_id, o.event_type, o.payload::text AS payload,
       to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS timestamp, o.traceparent,
       e.secrets::text AS secrets
FROM hookline.outbox AS o, hookline.endpoints AS e
WHERE o.id = ANY($1::bigint[]) AND e.name = $2;

-- name: claimed_with_events
-- The relay's claim in one round trip: queue.sql's claim of the outbox (claim or claim_ordered,
-- as rendered for deliveries) takes the place of the stand-in below (Queue.claim_within,
-- relay/service.py CLAIMS_WITH_EVENTS), and each claimed delivery comes back with its event, as claimed_events
-- gives it, in only the columns the relay uses. Two statements per claim, and decoding every
-- column of the claimed rows (four timestamps each), cost the relay more CPU per delivery
-- than the claim's own work. A delivery's created_at is its event's (migration 0018).
WITH claimed AS (
    SELECT * FROM hookline.deliveries WHERE false
)
SELECT c.id, c.attempts, c.next_attempt_at, o.event_id, o.event_type, o.payload::text AS payload,
       to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS timestamp, o.traceparent,
       e.secrets::text AS secrets
FROM claimed AS c
JOIN hookline.outbox AS o ON o.id = c.outbox_id AND o.created_at = c.created_at
JOIN hookline.endpoints AS e ON e.name = c.endpoint
-- The events through each partition's key, as the claim's UPDATE finds its rows: joined to
-- the CTE alone, whose size the planner cannot tell, it may hash-join the whole outbox.
WHERE o.id = ANY (ARRAY(SELECT outbox_id FROM claimed))
ORDER BY c.id;

-- name: complete_deliveries
-- The relay's completions with their answers, in one statement (no transaction of its own
-- needed, one round trip per batch): queue.sql's complete for the deliveries (an (id, attempts)
-- pair whose lease was lost is skipped) that also stores each answer ($4 status, $5 body,
-- $6 HTTP latency in ms) on the delivery and in the attempt it logs. Returns the ids done (NULL: none).
WITH answers AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[], $4::integer[], $5::text[], $6::float8[])
        AS a(id, attempts, status, body, latency_ms)
), done AS (
    UPDATE hookline.deliveries AS t
    SET status = 'done', processed_at = now(), lease_expires_at = NULL, locked_by = NULL, last_error = NULL,
        suspect = false, last_status = a.status, last_response = a.body, last_latency_ms = a.latency_ms
    FROM answers AS a
    WHERE t.id = a.id AND t.attempts = a.attempts AND (t.status = 'processing') IS TRUE AND t.locked_by = $3
    RETURNING t.id, t.endpoint, t.attempts, a.status, a.latency_ms
)
SELECT array_agg(id) AS ids,
       hookline.log_attempts('deliveries', array_agg(id), array_agg(endpoint), array_agg(attempts),
                             array_agg($3::text), array_agg('done'::text), NULL, array_agg(status),
                             array_agg(latency_ms)) AS logged
FROM done;

-- name: record_responses
-- The last answer of each delivery (called in the transaction that retries or buries it),
-- also written into the attempt the booking statement just logged (queue.sql; for
-- deliveries it logs no latency of its own, so the HTTP call's is filled in here).
WITH answers AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::float8[]) AS r(id, status, body, latency_ms)
), recorded AS (
    UPDATE hookline.deliveries AS d
    SET last_status = r.status, last_response = r.body, last_latency_ms = r.latency_ms
    FROM answers AS r
    WHERE d.id = r.id
    RETURNING d.id, d.attempts
)
UPDATE hookline.attempts AS a SET http_status = r.status, latency_ms = r.latency_ms
FROM answers AS r JOIN recorded USING (id)
WHERE a.queue = 'deliveries' AND a.row_id = r.id AND a.attempt = recorded.attempts AND a.latency_ms IS NULL
  -- Logged earlier in this transaction, so not before it began: only the newest
  -- partitions of the log are searched (migration 0017).
  AND a.at >= now();

-- name: lock_circuits
-- The circuit breaker columns of endpoints $1 (sorted by the caller: relays lock
-- rows in the same order), locked until the caller's transaction commits, with
-- the database's clock: hookline/relay/breaker.py decides, store_circuits writes.
-- NO KEY UPDATE, not UPDATE: the key does not change, and FOR UPDATE would also
-- conflict with the KEY SHARE that foreign key checks of deliveries take on this
-- row (publishes inserting deliveries; a transaction updating a delivery twice),
-- which blocks publishers and deadlocks two transactions that both hold KEY SHARE.
SELECT name, circuit_state, circuit_changed_at, circuit_open_until, window_started_at, window_successes,
       window_failures, previous_successes, previous_failures, probe_successes, probe_failures,
       consecutive_failures, circuit_openings, now() AS now
FROM hookline.endpoints
WHERE name = ANY($1::text[])
ORDER BY name
FOR NO KEY UPDATE;

-- name: store_circuits
UPDATE hookline.endpoints AS e
SET circuit_state = c.state, circuit_changed_at = c.changed_at, circuit_open_until = c.probe_not_before,
    window_started_at = c.window_started_at, window_successes = c.successes, window_failures = c.failures,
    previous_successes = c.previous_successes, previous_failures = c.previous_failures,
    probe_successes = c.probe_successes, probe_failures = c.probe_failures,
    consecutive_failures = c.consecutive_failures, circuit_openings = c.openings
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[], $6::integer[],
            $7::integer[], $8::integer[], $9::integer[], $10::integer[], $11::integer[], $12::integer[],
            $13::integer[])
    AS c(name, state, changed_at, probe_not_before, window_started_at, successes, failures, previous_successes,
         previous_failures, probe_successes, probe_failures, consecutive_failures, openings)
WHERE e.name = c.name;

-- name: circuits_changed
-- A circuit changed state: every relay re-reads its endpoints before its next
-- claim (instead of at its next poll), so they all stop or resume at once.
SELECT pg_notify('hookline_endpoints', 'circuit');

-- name: release_probe
-- A probe that found nothing due to send: the next delivery may probe at once.
UPDATE hookline.endpoints SET circuit_open_until = NULL WHERE name = $1 AND circuit_state = 'half_open';

-- name: undelivered_age
-- Age of the oldest event each endpoint has not received yet (pending, in flight or parked),
-- and how many are parked: per endpoint, the first entry of deliveries_undelivered_idx of each
-- partition and a count of deliveries_parked_idx, never the delivered history.
SELECT e.name AS endpoint, extract(epoch FROM now() - u.oldest) AS seconds, p.parked
FROM hookline.endpoints AS e
CROSS JOIN LATERAL (
    SELECT min(d.created_at) AS oldest FROM hookline.deliveries AS d
    WHERE d.endpoint = e.name AND d.status IN ('pending', 'processing', 'parked')
) AS u
CROSS JOIN LATERAL (
    SELECT count(*) AS parked FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'parked'
) AS p
WHERE u.oldest IS NOT NULL;

-- name: list_dead_deliveries
SELECT d.id, d.endpoint, o.event_id, o.event_type, d.attempts, d.processed_at, d.last_status, d.last_error
FROM hookline.deliveries AS d JOIN hookline.outbox AS o ON o.id = d.outbox_id
WHERE d.status = 'dead'
  AND ($1::text IS NULL OR d.endpoint = $1)
  AND ($2::timestamptz IS NULL OR d.processed_at >= $2)
  AND ($3::timestamptz IS NULL OR d.processed_at < $3)
ORDER BY d.endpoint, d.id
LIMIT $4;

-- name: rotate_endpoint_secret
-- The new secret ($2) signs from now on; the secrets valid so far keep signing
-- until $3 (the overlap), so receivers can switch at their own pace. Secrets that
-- have already expired are dropped.
UPDATE hookline.endpoints AS e
SET secrets = jsonb_build_array(jsonb_build_object('value', $2::text, 'notAfter', NULL)) || coalesce((
        SELECT jsonb_agg(jsonb_build_object('value', s->>'value', 'notAfter',
                         coalesce(least((s->>'notAfter')::timestamptz, $3::timestamptz), $3::timestamptz)))
        FROM jsonb_array_elements(e.secrets) AS s
        WHERE s->>'notAfter' IS NULL OR (s->>'notAfter')::timestamptz > now()), '[]'::jsonb)
WHERE name = $1
RETURNING name;

-- name: update_endpoint
-- `hookline endpoints update`: each NULL keeps its column; deliveries, secrets and the
-- circuit stay. sane: the merged retry delays still make sense (the caller rolls back
-- otherwise). The endpoints_changed trigger tells the relays.
UPDATE hookline.endpoints
SET url = coalesce($2, url), event_types = coalesce($3, event_types), ordered = coalesce($4, ordered),
    max_attempts = coalesce($5, max_attempts), initial_delay_seconds = coalesce($6, initial_delay_seconds),
    max_delay_seconds = coalesce($7, max_delay_seconds), timeout_seconds = coalesce($8, timeout_seconds)
WHERE name = $1
RETURNING initial_delay_seconds <= max_delay_seconds AS sane;

-- name: lock_endpoint
-- A rate-limited endpoint's row, locked until the claim's transaction commits: the relays' claims
-- of one limited endpoint take turns. Its own statement, before take_tokens: a statement's snapshot
-- is taken when it starts, so take_tokens, started once the lock is held, counts as in flight
-- every delivery claimed by the relay that held it before. (Counted in the statement that waited
-- for the lock, they would be missing: a row lock's wait rereads the locked row, nothing else.)
SELECT FROM hookline.endpoints WHERE name = $1 FOR NO KEY UPDATE;

-- name: take_tokens
-- A rate-limited endpoint's share of the next claim ($1 the endpoint, $2 how many the relay
-- would claim), in the claim's own transaction, after lock_endpoint. By statement_timestamp(),
-- not now(): the transaction's start was before its wait for the lock, and a bucket refilled up
-- to a moment its previous holder had passed would be refilled twice for the time between.
-- granted: at most the whole tokens in the bucket (refilled at rate_per_second times the
-- throttle factor since it was last taken, up to rate_burst) and the room max_in_flight leaves;
-- wait: seconds until a claim may be granted something (the next token, the end of a 429's
-- Retry-After; 0.1 when only max_in_flight holds it back: a completion frees room, unannounced).
WITH e AS MATERIALIZED (
    SELECT name, rate_per_second * hookline.throttle_factor(throttled_factor, throttled_until, statement_timestamp()) AS rate,
           rate_burst, throttled_until, rate_per_second IS NOT NULL AS metered,
           CASE WHEN rate_per_second IS NULL THEN NULL
                ELSE least(rate_burst::float8, coalesce(rate_tokens, rate_burst::float8)
                           + rate_per_second * hookline.throttle_factor(throttled_factor, throttled_until, statement_timestamp())
                             * greatest(0.0, extract(epoch FROM statement_timestamp() - greatest(coalesce(rate_updated_at, statement_timestamp()),
                                                                               coalesce(throttled_until, '-infinity'))))) END
               AS tokens,
           max_in_flight - (SELECT count(*) FROM hookline.deliveries AS d
                            WHERE d.endpoint = $1 AND d.status = 'processing') AS room
    FROM hookline.endpoints WHERE name = $1
), g AS (
    SELECT e.*, CASE WHEN throttled_until > statement_timestamp() THEN 0
                     ELSE greatest(0, least($2::integer, coalesce(floor(tokens)::integer, $2::integer),
                                            coalesce(room::integer, $2::integer))) END AS granted
    FROM e
)
UPDATE hookline.endpoints AS t
SET rate_tokens = CASE WHEN g.metered AND (g.throttled_until IS NULL OR g.throttled_until <= statement_timestamp())
                       THEN g.tokens - g.granted ELSE t.rate_tokens END,
    rate_updated_at = CASE WHEN g.throttled_until > statement_timestamp() THEN t.rate_updated_at
                           ELSE greatest(t.rate_updated_at, statement_timestamp()) END
FROM g WHERE t.name = g.name
RETURNING g.granted,
    CASE WHEN g.throttled_until > statement_timestamp() THEN extract(epoch FROM g.throttled_until - statement_timestamp())
         WHEN g.granted > 0 THEN 0.0
         WHEN g.room IS NOT NULL AND g.room <= 0 THEN 0.1
         WHEN g.metered THEN greatest(0.0, (1.0 - (g.tokens - g.granted)) / g.rate)
         ELSE 0.0 END::float8 AS wait;

-- name: return_tokens
-- Tokens granted for a claim that found fewer deliveries (in the same transaction).
UPDATE hookline.endpoints SET rate_tokens = least(rate_burst::float8, rate_tokens + $2)
WHERE name = $1 AND rate_per_second IS NOT NULL;

-- name: throttle_endpoint
-- A 429 with Retry-After $2 seconds: the bucket stops until then, and the rate it gets after is
-- halved (down to a tenth) and grows back over a minute (hookline.throttle_factor). One at a time:
-- answers to several deliveries sent before the first 429 count once per Retry-After.
UPDATE hookline.endpoints
SET throttled_factor = CASE WHEN throttled_until > now() THEN throttled_factor
                            ELSE greatest(0.1, hookline.throttle_factor(throttled_factor, throttled_until, now()) / 2) END,
    throttled_at = now(),
    throttled_until = greatest(coalesce(throttled_until, now()), now() + make_interval(secs => $2)),
    rate_tokens = 0
WHERE name = $1
RETURNING name;

-- name: set_rate_limit
UPDATE hookline.endpoints
SET rate_per_second = $2, rate_burst = $3, max_in_flight = $4, rate_tokens = NULL, rate_updated_at = NULL
WHERE name = $1
RETURNING name;

-- --- WebhookEndpoint resources (operator/hookline_operator/endpoints.py) ---------------------------

-- name: owned_endpoint
-- The row of WebhookEndpoint $1 (NAMESPACE/NAME), as the operator compares it with the resource.
SELECT * FROM hookline.endpoints WHERE name = $1;

-- name: sync_endpoint
-- Store WebhookEndpoint $1 (NAMESPACE/NAME: $2 and $3) of resource uid $4 as its spec says; the
-- operator calls it only when the row differs, since the endpoints_changed trigger makes every relay
-- re-read its endpoints. A row of the same NAMESPACE/NAME left by a deleted resource (its finalizer
-- removed by hand) is taken over: only that namespace can hold the name. The bucket starts again
-- when the rate changes; deliveries, circuit and disabled state stay.
INSERT INTO hookline.endpoints AS e (name, namespace, resource_name, owner_uid, url, event_types, ordered, secrets,
                                     max_attempts, initial_delay_seconds, max_delay_seconds, timeout_seconds,
                                     retention_done_hours, retention_dead_days, paused, rate_per_second, rate_burst,
                                     max_in_flight)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
ON CONFLICT (name) DO UPDATE
SET owner_uid = EXCLUDED.owner_uid, url = EXCLUDED.url, event_types = EXCLUDED.event_types,
    ordered = EXCLUDED.ordered, secrets = EXCLUDED.secrets, max_attempts = EXCLUDED.max_attempts,
    initial_delay_seconds = EXCLUDED.initial_delay_seconds, max_delay_seconds = EXCLUDED.max_delay_seconds,
    timeout_seconds = EXCLUDED.timeout_seconds, retention_done_hours = EXCLUDED.retention_done_hours,
    retention_dead_days = EXCLUDED.retention_dead_days, paused = EXCLUDED.paused,
    rate_per_second = EXCLUDED.rate_per_second, rate_burst = EXCLUDED.rate_burst,
    max_in_flight = EXCLUDED.max_in_flight,
    rate_tokens = CASE WHEN (e.rate_per_second, e.rate_burst) IS NOT DISTINCT FROM
                             (EXCLUDED.rate_per_second, EXCLUDED.rate_burst) THEN e.rate_tokens END,
    rate_updated_at = CASE WHEN (e.rate_per_second, e.rate_burst) IS NOT DISTINCT FROM
                                 (EXCLUDED.rate_per_second, EXCLUDED.rate_burst) THEN e.rate_updated_at END
WHERE e.namespace = EXCLUDED.namespace
RETURNING name;

-- name: release_endpoint
-- A deleted WebhookEndpoint's row, only while resource $2 owns it; its deliveries go with it.
DELETE FROM hookline.endpoints WHERE name = $1 AND owner_uid = $2 RETURNING name;

-- name: lock_owned_endpoint
-- In a replay's transaction: the row stays this resource's until the commit.
SELECT true FROM hookline.endpoints WHERE name = $1 AND owner_uid = $2 FOR SHARE;

-- name: endpoint_status
-- A WebhookEndpoint's numbers for its status: what waits (through the partial indexes), the
-- attempts of the last hour (attempts_part_at_idx) and the newest failure's error among them.
SELECT e.circuit_state, e.enabled, e.disabled_reason,
       (SELECT count(*) FROM hookline.deliveries AS d
        WHERE d.endpoint = e.name AND d.status IN ('pending', 'processing')) AS pending,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'parked') AS parked,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'dead') AS dead,
       recent.done, recent.failed,
       (SELECT left(a.error, 500) FROM hookline.attempts AS a
        WHERE a.queue = 'deliveries' AND a.part = e.name AND a.at > now() - interval '1 hour' AND a.outcome <> 'done'
        ORDER BY a.at DESC LIMIT 1) AS last_error
FROM hookline.endpoints AS e
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.outcome = 'done') AS done,
           count(*) FILTER (WHERE a.outcome IN ('retry', 'dead')) AS failed
    FROM hookline.attempts AS a
    WHERE a.queue = 'deliveries' AND a.part = e.name AND a.at > now() - interval '1 hour'
) AS recent
WHERE e.name = $1 AND e.owner_uid = $2;
