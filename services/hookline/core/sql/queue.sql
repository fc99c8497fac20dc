-- The queue mechanics shared by the inbox (partition column: provider) and the
-- outbox deliveries (partition column: endpoint). {table} and {partition} are
-- filled in once per queue by hookline.core.queue; parameters stay parameters.
--
-- Lifecycle: pending -> processing (claimed, leased, attempts + 1) -> done | pending
-- (retry, deferral, released lease) | dead. Attempts are counted at claim time, so
-- an attempt whose worker dies still counts when its lease expires.
--
-- Suspects: a row whose lease expired (its consumer died, was killed or stalled)
-- may be what killed its consumer. The sweep marks it `suspect`; normal claims
-- skip suspects and `claim_suspect` takes them one at a time, for a consumer
-- that has nothing else in flight. "done" clears the mark.

-- name: claim
-- One statement claims a batch: the CTE picks the oldest due rows of one
-- partition through the partial "claimable" index, skipping rows another worker
-- has locked this instant, and the UPDATE leases them to this worker.
-- Ordered queues add the ordered_claim_filter below to the WHERE clause.
-- Suspects are left to claim_suspect: they must run alone.
WITH picked AS (
    SELECT c.id FROM {table} AS c
    WHERE c.status = 'pending' AND c.{partition} = $1 AND c.next_attempt_at <= now() AND NOT c.suspect
      {claim_filter}
    ORDER BY c.next_attempt_at, c.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS t
SET status = 'processing',
    attempts = t.attempts + 1,
    locked_by = $3,
    lease_expires_at = now() + make_interval(secs => $4)
FROM picked
WHERE t.id = picked.id
RETURNING t.*;

-- name: ordered_claim_filter
-- For queues delivered in order per key (ordered outbox endpoints, key =
-- aggregate): a row is claimable only while no older row of the same partition
-- and key is unfinished, so row n+1 is never sent before row n is done or dead,
-- and other keys are not held up. Rows without a key are unordered. Two claimers
-- racing see at worst the older row still unfinished (a snapshot can be behind,
-- never ahead), so the check can only make a claim wait, not reorder. The NOT
-- EXISTS is one probe into a partial index per candidate.
AND (c.{order_key} IS NULL OR NOT EXISTS (
    SELECT 1 FROM {table} AS older
    WHERE older.{partition} = c.{partition} AND older.{order_key} = c.{order_key} AND older.id < c.id
      AND older.status IN ('pending', 'processing', 'parked')))

-- name: claim_suspect
-- One due suspect of any of the partitions $1 (with their lease lengths $2), for
-- a consumer that has nothing else in flight and will claim nothing else until
-- this one ends: if it crashes its consumer again, it costs no other row an
-- attempt. No ordered filter is needed: a suspect was the oldest unfinished row
-- of its key when it was claimed, and while it is pending the ordered filter
-- holds every newer row of that key back.
WITH lease AS (
    SELECT * FROM unnest($1::text[], $2::float8[]) AS l(part, seconds)
), picked AS (
    SELECT c.id, lease.seconds FROM {table} AS c JOIN lease ON c.{partition} = lease.part
    WHERE c.status = 'pending' AND c.suspect AND c.next_attempt_at <= now()
    ORDER BY c.next_attempt_at, c.id
    LIMIT 1
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE {table} AS t
SET status = 'processing',
    attempts = t.attempts + 1,
    locked_by = $3,
    lease_expires_at = now() + make_interval(secs => picked.seconds)
FROM picked
WHERE t.id = picked.id
RETURNING t.*;

-- name: suspects_due
-- Whether a suspect of the partitions $1 is due: a busy consumer asks this now
-- and then, and drains (claims nothing new) until it can run the suspect alone.
SELECT EXISTS (
    SELECT 1 FROM {table}
    WHERE status = 'pending' AND suspect AND {partition} = ANY($1::text[]) AND next_attempt_at <= now());

-- name: extend_leases
-- Heartbeat: extend this worker's leases and return the ids it has LOST (taken
-- back by the sweeper, re-claimed by another worker, or buried). Rows locked at
-- this instant (a completion being written) are skipped, not lost; rows already
-- done are finished, not lost.
WITH mine AS (
    SELECT id FROM {table}
    WHERE id = ANY($1::bigint[]) AND status = 'processing' AND locked_by = $2
    FOR UPDATE SKIP LOCKED
), extended AS (
    UPDATE {table} AS t SET lease_expires_at = now() + make_interval(secs => $3)
    FROM mine WHERE t.id = mine.id
    RETURNING t.id
)
SELECT t.id FROM {table} AS t
WHERE t.id = ANY($1::bigint[]) AND t.status <> 'done'
  AND NOT (t.status = 'processing' AND t.locked_by = $2);

-- name: complete
-- Batched completions: (id, attempts) pairs; a pair whose lease was lost is skipped.
-- Inside a handler's transaction this is also the proof that the lease is still
-- ours: no row back means another worker owns the event now, and we roll back.
UPDATE {table} AS t
SET status = 'done', processed_at = now(), lease_expires_at = NULL, locked_by = NULL,
    last_error = NULL, deferred_since = NULL, suspect = false
FROM unnest($1::bigint[], $2::integer[]) AS c(id, attempts)
WHERE t.id = c.id AND t.attempts = c.attempts AND t.status = 'processing' AND t.locked_by = $3
RETURNING t.id;

-- name: retry
UPDATE {table}
SET status = 'pending', next_attempt_at = now() + make_interval(secs => $4), lease_expires_at = NULL,
    locked_by = NULL, last_error = $5
WHERE id = $1 AND attempts = $2 AND status = 'processing' AND locked_by = $3
RETURNING id;

-- name: bury
UPDATE {table}
SET status = 'dead', processed_at = now(), lease_expires_at = NULL, locked_by = NULL, last_error = $4
WHERE id = $1 AND attempts = $2 AND status = 'processing' AND locked_by = $3
RETURNING id;

-- name: release
-- Give leases back without counting the attempt (shutdown before the work began,
-- or a deferral: waiting for a predecessor is not a failure).
UPDATE {table} AS t
SET status = 'pending', attempts = t.attempts - 1, lease_expires_at = NULL, locked_by = NULL,
    next_attempt_at = now() + make_interval(secs => $3)
FROM unnest($1::bigint[]) AS r(id)
WHERE t.id = r.id AND t.status = 'processing' AND t.locked_by = $2
RETURNING t.id;

-- name: sweep_expired
-- The rescuer: leases that ran out go back to pending — or to dead once the
-- partition's maxAttempts is used up — with the attempt counted, and the same
-- backoff as a failed attempt. Policies come in as arrays (partition,
-- max_attempts, initial_delay, max_delay); unknown partitions get the defaults
-- $5..$7; $9 limits the sweep to one partition. Locked rows are skipped: a worker still holding its row lock is still
-- working on it. Every row taken back becomes a suspect (see claim_suspect), and
-- each gets its own random delay in the backoff window (random() is drawn per
-- row), so rows that were claimed together are not due together again. The old
-- holder is returned so that crashes can be counted per consumer.
WITH policy AS (
    SELECT * FROM unnest($1::text[], $2::integer[], $3::float8[], $4::float8[])
        AS p(name, max_attempts, initial_delay, max_delay)
), expired AS (
    SELECT e.id, e.locked_by, e.attempts >= coalesce(p.max_attempts, $5) AS exhausted,
           coalesce(p.initial_delay, $6) AS initial_delay, coalesce(p.max_delay, $7) AS max_delay
    FROM (
        SELECT id, {partition} AS part, attempts, locked_by FROM {table}
        WHERE status = 'processing' AND lease_expires_at < now()
          AND ($9::text IS NULL OR {partition} = $9)
        ORDER BY lease_expires_at
        LIMIT $8
        FOR UPDATE SKIP LOCKED
    ) AS e
    LEFT JOIN policy AS p ON p.name = e.part
)
UPDATE {table} AS t
SET status = CASE WHEN x.exhausted THEN 'dead' ELSE 'pending' END,
    processed_at = CASE WHEN x.exhausted THEN now() END,
    next_attempt_at = now() + make_interval(secs => x.initial_delay + random() * greatest(0,
        least(x.max_delay, x.initial_delay * 2 ^ least(t.attempts - 1, 30)) - x.initial_delay)),
    last_error = format('lease expired during attempt %s (worker %s died or stalled)', t.attempts, t.locked_by),
    lease_expires_at = NULL,
    locked_by = NULL,
    suspect = true
FROM expired AS x
WHERE t.id = x.id
RETURNING t.id, t.{partition} AS partition, t.status, x.locked_by AS holder;

-- name: replay_dead
-- Requeue dead rows (all, or one partition), optionally only those that died
-- within [since, until). Attempts restart so the retry policy applies afresh.
-- Suspects stay suspects: a replayed event that killed its consumers runs alone.
UPDATE {table}
SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL, processed_at = NULL,
    deferred_since = NULL
WHERE status = 'dead'
  AND ($1::text IS NULL OR {partition} = $1)
  AND ($2::timestamptz IS NULL OR processed_at >= $2)
  AND ($3::timestamptz IS NULL OR processed_at < $3)
RETURNING id, {partition} AS partition;

-- name: stats
-- Backlog per partition for metrics, status and autoscaling. Both filters match
-- partial indexes (claimable, dead), so this reads indexes, not the table.
SELECT {partition} AS partition,
       count(*) FILTER (WHERE status = 'pending') AS backlog,
       coalesce(extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE status = 'pending')), 0)
           AS oldest_pending_seconds,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'pending' AND suspect) AS suspects
FROM {table}
WHERE status IN ('pending', 'dead')
GROUP BY {partition};

-- name: in_flight
SELECT {partition} AS partition, count(*) AS processing FROM {table}
WHERE status = 'processing' GROUP BY {partition};
