-- The queue mechanics shared by the inbox (hookline.inbox, partition column
-- provider) and the outbox deliveries (hookline.deliveries, partition column
-- endpoint). The file is valid SQL as written, for the inbox: hookline.core.queue
-- renders each statement once per queue through the template comments (see
-- hookline.core.db): /* TEMPLATE: table */, /* TEMPLATE: partition */ and
-- /* TEMPLATE: order_key */ name the table and columns; the optional parts are
--   ordered         the ordered claim's filter (queues with an order key);
--   retries_first   due retries claimed before first attempts (the outbox);
--   deferrable      the deferral clock, cleared on completion (the inbox);
--   timed           claimed_at, set by the claims: an attempt's latency in the
--                   attempt log is from its claim to its outcome (the inbox; a
--                   delivery's latency is its HTTP call's, see record_responses).
-- log_queue (a quoted literal) names the queue in the attempt log: 'inbox', 'deliveries'.
-- Parameters stay parameters.
--
-- The attempt log (hookline.attempts): every statement that books the outcome of an
-- attempt (complete, fail, requeue_expired) appends it in the same statement,
-- through hookline.log_attempts (migration 0016): one call and one INSERT per batch,
-- committed with the outcome. Each returns one row: what it booked, and `logged`.
--
-- Lifecycle: pending -> processing (claimed, leased, attempts + 1) -> done | pending
-- (retry, deferral, released lease) | dead. Attempts are counted at claim time, so
-- an attempt whose worker dies still counts when its lease expires.
--
-- By id: the statements that find their rows by id test the status as `(status = 'x') IS TRUE`,
-- which no partial index's predicate matches, so they reach the rows through the primary key. As
-- `status = 'processing'` it let the planner read the leased index instead, when it expected few
-- rows there (a partition analysed empty, issue 26): that index holds a dead entry for every row
-- completed since the last vacuum, and each completion walked them all.
--
-- Suspects: a row whose lease expired (its consumer died, was killed or stalled)
-- may be what killed its consumer. The sweep marks it `suspect`; normal claims
-- skip suspects and `claim_suspect` takes them one at a time, for a consumer
-- that has nothing else in flight. "done" clears the mark.

-- name: claim
-- One statement claims a batch of partition $1: up to $2 due rows, leased to
-- worker $3 for $4 seconds. The `picked` CTE takes the oldest due rows through the
-- partial "claimable" index, skipping rows another worker has locked this
-- instant, and the UPDATE leases them. Suspects are left to claim_suspect: they
-- must run alone. The ids go to the UPDATE as an array: joined to a CTE (or a
-- union of two) the planner cannot tell its size and may hash-join the table.
--
-- $5, the claim floor (NULL: none): `picked` looks from this next_attempt_at on, or
-- from a second ago if that is earlier (the outbox's due retries, found apart, from
-- the beginning). Every row claimed leaves a dead entry in the claimable index until
-- a vacuum removes it, all of them before the oldest pending row: a claim from the
-- beginning walks past every row taken since the last vacuum (all of a drain's while
-- a snapshot is held open). Queue.fetch_claim passes where its last claim's rows
-- began. A row's next_attempt_at is its transaction's start: one that commits up to
-- a second after rows claimed since is still in sight; one that took longer (or was
-- locked by a claim that then failed) waits for a claim without a floor, which comes
-- at least once a second. Ordered claims pass none: a row held back by its
-- predecessor is behind the floor once it may go.
--
-- ordered (queues delivered in order per key; ordered outbox endpoints, key =
-- aggregate): a row is claimable only while no older row of the same partition
-- and key is unfinished, so row n+1 is never sent before row n is done or dead,
-- and other keys are not held up. Rows without a key are unordered. Two claimers
-- racing see at worst the older row still unfinished (a snapshot can be behind,
-- never ahead), so the check can only make a claim wait, not reorder. The NOT
-- EXISTS is one probe into a partial index per candidate.
--
-- retries_first (the outbox): due RETRIES go before first attempts. A delivery
-- that failed before and now succeeds is the best evidence that an endpoint
-- works: a half-open circuit's probe ($2 = 1) is a retry whenever one is due, and
-- once the circuit closes the backlog of retries goes out before the never-tried
-- deliveries. An endpoint that refuses each message's first attempt (and takes
-- the retry) then fails about half of its attempts, below the failure rate that
-- opens the circuit. Retries are found through the partial index of due retries
-- (deliveries_retry_idx); first attempts through the claimable index, only for
-- the room the retries left.
WITH /* TEMPLATE_BEGIN: retries_first */retries AS (
    SELECT c.id FROM /* TEMPLATE: table */hookline.inbox AS c
    WHERE c.status = 'pending' AND c./* TEMPLATE: partition */provider = $1 AND c.next_attempt_at <= now()
      AND c.attempts > 0 AND NOT c.suspect
      /* TEMPLATE_BEGIN: ordered */AND (c./* TEMPLATE: order_key */entity_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM /* TEMPLATE: table */hookline.inbox AS older
          WHERE older./* TEMPLATE: partition */provider = $1 AND older.id < c.id
            AND older./* TEMPLATE: order_key */entity_key = c./* TEMPLATE: order_key */entity_key
            AND older.status IN ('pending', 'processing', 'parked')))/* TEMPLATE_END */
    ORDER BY c.next_attempt_at, c.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), /* TEMPLATE_END */picked AS (
    SELECT c.id FROM /* TEMPLATE: table */hookline.inbox AS c
    WHERE c.status = 'pending' AND c./* TEMPLATE: partition */provider = $1 AND c.next_attempt_at <= now()
      AND c.next_attempt_at >= least(coalesce($5::timestamptz, '-infinity'), now() - interval '1 second')
      /* TEMPLATE_BEGIN: retries_first */AND c.attempts = 0 /* TEMPLATE_END */AND NOT c.suspect
      /* TEMPLATE_BEGIN: ordered */AND (c./* TEMPLATE: order_key */entity_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM /* TEMPLATE: table */hookline.inbox AS older
          WHERE older./* TEMPLATE: partition */provider = $1 AND older.id < c.id
            AND older./* TEMPLATE: order_key */entity_key = c./* TEMPLATE: order_key */entity_key
            AND older.status IN ('pending', 'processing', 'parked')))/* TEMPLATE_END */
    ORDER BY c.next_attempt_at, c.id
    LIMIT $2/* TEMPLATE_BEGIN: retries_first */ - (SELECT count(*) FROM retries)/* TEMPLATE_END */
    FOR UPDATE SKIP LOCKED
)
UPDATE /* TEMPLATE: table */hookline.inbox AS t
SET status = 'processing',
    attempts = t.attempts + 1,
    locked_by = $3,
    lease_expires_at = now() + make_interval(secs => $4)/* TEMPLATE_BEGIN: timed */,
    claimed_at = now()/* TEMPLATE_END */
WHERE t.id = ANY (ARRAY(/* TEMPLATE_BEGIN: retries_first */SELECT id FROM retries UNION ALL /* TEMPLATE_END */SELECT id FROM picked))
RETURNING t.*;

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
    SELECT c.id, lease.seconds FROM /* TEMPLATE: table */hookline.inbox AS c JOIN lease ON c./* TEMPLATE: partition */provider = lease.part
    WHERE c.status = 'pending' AND c.suspect AND c.next_attempt_at <= now()
    ORDER BY c.next_attempt_at, c.id
    LIMIT 1
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE /* TEMPLATE: table */hookline.inbox AS t
SET status = 'processing',
    attempts = t.attempts + 1,
    locked_by = $3,
    lease_expires_at = now() + make_interval(secs => picked.seconds)/* TEMPLATE_BEGIN: timed */,
    claimed_at = now()/* TEMPLATE_END */
FROM picked
WHERE t.id = picked.id
RETURNING t.*;

-- name: suspects_due
-- Whether a suspect of the partitions $1 is due: a busy consumer asks this now
-- and then, and drains (claims nothing new) until it can run the suspect alone.
SELECT EXISTS (
    SELECT 1 FROM /* TEMPLATE: table */hookline.inbox
    WHERE status = 'pending' AND suspect AND /* TEMPLATE: partition */provider = ANY($1::text[]) AND next_attempt_at <= now());

-- name: next_due
-- Seconds until the next pending row of the partitions $1 becomes due (NULL: none
-- waits): an idle consumer sleeps until then instead of for its whole poll
-- interval, since nothing notifies when a retry's backoff, a deferral or a swept
-- lease runs out. Rows due already are left out: one that is due and was not
-- claimed is held back (by its predecessor, or an open circuit) and its consumer
-- is notified when that changes. One probe into the claimable index per partition.
SELECT EXTRACT(EPOCH FROM min(due.at) - now())::float8
FROM unnest($1::text[]) AS p(part)
CROSS JOIN LATERAL (
    SELECT next_attempt_at AS at FROM /* TEMPLATE: table */hookline.inbox
    WHERE status = 'pending' AND /* TEMPLATE: partition */provider = p.part AND next_attempt_at > now()
    ORDER BY next_attempt_at
    LIMIT 1) AS due;

-- name: extend_leases
-- Heartbeat: extend this worker's leases and return the ids it has LOST (taken
-- back by the sweeper, re-claimed by another worker, or buried). Rows locked at
-- this instant (a completion being written) are skipped, not lost; rows already
-- done are finished, not lost.
WITH mine AS (
    SELECT id FROM /* TEMPLATE: table */hookline.inbox
    WHERE id = ANY($1::bigint[]) AND (status = 'processing') IS TRUE AND locked_by = $2
    FOR UPDATE SKIP LOCKED
), extended AS (
    UPDATE /* TEMPLATE: table */hookline.inbox AS t SET lease_expires_at = now() + make_interval(secs => $3)
    FROM mine WHERE t.id = mine.id
    RETURNING t.id
)
SELECT t.id FROM /* TEMPLATE: table */hookline.inbox AS t
WHERE t.id = ANY($1::bigint[]) AND t.status <> 'done'
  AND NOT (t.status = 'processing' AND t.locked_by = $2);

-- name: complete
-- Batched completions: (id, attempts) pairs; a pair whose lease was lost is skipped.
-- Inside a handler's transaction this is also the proof that the lease is still
-- ours: no id back means another worker owns the event now, and we roll back.
-- Returns the ids done (NULL: none).
WITH done AS (
    UPDATE /* TEMPLATE: table */hookline.inbox AS t
    SET status = 'done', processed_at = now(), lease_expires_at = NULL, locked_by = NULL,
        last_error = NULL/* TEMPLATE_BEGIN: deferrable */, deferred_since = NULL/* TEMPLATE_END */, suspect = false
    FROM unnest($1::bigint[], $2::integer[]) AS c(id, attempts)
    WHERE t.id = c.id AND t.attempts = c.attempts AND (t.status = 'processing') IS TRUE AND t.locked_by = $3
    RETURNING t.id, t./* TEMPLATE: partition */provider AS part, t.attempts, $3::text AS worker, 'done'::text AS outcome,
              -- from the claim to now (a delivery's HTTP latency: record_responses)
              coalesce(NULL::float8/* TEMPLATE_BEGIN: timed */, extract(epoch FROM clock_timestamp() - t.claimed_at) * 1000/* TEMPLATE_END */) AS latency_ms
)
SELECT array_agg(id) AS ids,
       hookline.log_attempts(/* TEMPLATE: log_queue */'inbox', array_agg(id), array_agg(part), array_agg(attempts),
                             array_agg(worker), array_agg(outcome), NULL, NULL,
                             array_agg(latency_ms)) AS logged
FROM done;

-- name: fail
-- A failed attempt: retried after $4 seconds, or dead when $4 is NULL ($5: the error;
-- $6: what the attempt log keeps instead, when not NULL: the error with a handler's traceback).
-- Returns the number booked: 1, or 0 when the lease was lost.
WITH failed AS (
    UPDATE /* TEMPLATE: table */hookline.inbox AS t
    SET status = CASE WHEN $4::float8 IS NULL THEN 'dead' ELSE 'pending' END,
        next_attempt_at = coalesce(now() + make_interval(secs => $4::float8), t.next_attempt_at),
        processed_at = CASE WHEN $4::float8 IS NULL THEN now() ELSE t.processed_at END,
        lease_expires_at = NULL, locked_by = NULL, last_error = $5
    WHERE id = $1 AND attempts = $2 AND (status = 'processing') IS TRUE AND locked_by = $3
    RETURNING t.id, t./* TEMPLATE: partition */provider AS part, t.attempts, $3::text AS worker,
              CASE WHEN $4::float8 IS NULL THEN 'dead' ELSE 'retry' END AS outcome,
              coalesce($6::text, t.last_error) AS logged_error,
              coalesce(NULL::float8/* TEMPLATE_BEGIN: timed */, extract(epoch FROM clock_timestamp() - t.claimed_at) * 1000/* TEMPLATE_END */) AS latency_ms
)
SELECT count(*) AS booked,
       hookline.log_attempts(/* TEMPLATE: log_queue */'inbox', array_agg(id), array_agg(part), array_agg(attempts),
                             array_agg(worker), array_agg(outcome), array_agg(logged_error), NULL,
                             array_agg(latency_ms)) AS logged
FROM failed;

-- name: release
-- Give leases back without counting the attempt (shutdown before the work began,
-- or a deferral: waiting for a predecessor is not a failure).
UPDATE /* TEMPLATE: table */hookline.inbox AS t
SET status = 'pending', attempts = t.attempts - 1, lease_expires_at = NULL, locked_by = NULL,
    next_attempt_at = now() + make_interval(secs => $3)
FROM unnest($1::bigint[]) AS r(id)
WHERE t.id = r.id AND (t.status = 'processing') IS TRUE AND t.locked_by = $2
RETURNING t.id;

-- name: lock_expired
-- The rescuer, step one: rows whose lease ran out (oldest first, of one partition
-- when $2 is not null), locked for this transaction. Locked rows are skipped: a
-- worker still holding its row lock is still working on it. Queue.sweep_expired
-- then decides each row's fate with the partition's RetryPolicy (the one backoff
-- formula, in Python) and writes it with requeue_expired.
SELECT id, /* TEMPLATE: partition */provider AS partition, attempts, locked_by FROM /* TEMPLATE: table */hookline.inbox
WHERE status = 'processing' AND lease_expires_at < now()
  AND ($2::text IS NULL OR /* TEMPLATE: partition */provider = $2)
ORDER BY lease_expires_at
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: requeue_expired
-- The rescuer, step two: each locked row (id $1) goes back to pending after its
-- delay $3 — or to dead when $2 (its partition's maxAttempts is used up) — with the
-- attempt counted. Every row taken back becomes a suspect (see claim_suspect). $4 is
-- each row's lease holder as lock_expired read it (the attempt log names it; the
-- UPDATE clears it, and its RETURNING sees only the new row).
WITH requeued AS (
    UPDATE /* TEMPLATE: table */hookline.inbox AS t
    SET status = CASE WHEN x.dead THEN 'dead' ELSE 'pending' END,
        processed_at = CASE WHEN x.dead THEN now() END,
        next_attempt_at = now() + make_interval(secs => x.delay),
        last_error = format('lease expired during attempt %s (worker %s died or stalled)', t.attempts, t.locked_by),
        lease_expires_at = NULL,
        locked_by = NULL,
        suspect = true
    FROM unnest($1::bigint[], $2::boolean[], $3::float8[], $4::text[]) AS x(id, dead, delay, worker)
    WHERE t.id = x.id AND (t.status = 'processing') IS TRUE
    RETURNING t.id, t./* TEMPLATE: partition */provider AS part, t.attempts, x.worker,
              CASE WHEN x.dead THEN 'dead' ELSE 'expired' END AS outcome, t.last_error,
              coalesce(NULL::float8/* TEMPLATE_BEGIN: timed */, extract(epoch FROM clock_timestamp() - t.claimed_at) * 1000/* TEMPLATE_END */) AS latency_ms
)
SELECT count(*) AS booked,
       hookline.log_attempts(/* TEMPLATE: log_queue */'inbox', array_agg(id), array_agg(part), array_agg(attempts),
                             array_agg(worker), array_agg(outcome), array_agg(last_error), NULL,
                             array_agg(latency_ms)) AS logged
FROM requeued;

-- name: replay_dead
-- Requeue dead rows (all, or one partition), optionally only those that died
-- within [since, until) or only the ids $4. Attempts restart so the retry policy
-- applies afresh, and a deferral clock restarts too. Suspects stay suspects: a
-- replayed event that killed its consumers runs alone. Queue.replay_dead wakes
-- the consumers with `wake` in the same transaction.
UPDATE /* TEMPLATE: table */hookline.inbox
SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL, processed_at = NULL
    /* TEMPLATE_BEGIN: deferrable */, deferred_since = NULL/* TEMPLATE_END */
WHERE status = 'dead'
  AND ($1::text IS NULL OR /* TEMPLATE: partition */provider = $1)
  AND ($2::timestamptz IS NULL OR processed_at >= $2)
  AND ($3::timestamptz IS NULL OR processed_at < $3)
  AND ($4::bigint[] IS NULL OR id = ANY($4::bigint[]))
RETURNING id, /* TEMPLATE: partition */provider AS partition;

-- name: wake
-- Wake the consumers of channel $1 for the partitions $2 (the payload names the
-- partition; workers of other providers ignore it). Sent when the transaction commits.
SELECT pg_notify($1, part) FROM unnest($2::text[]) AS part;

-- name: stats
-- Backlog per partition for metrics, status and autoscaling. One aggregate per
-- partial index (claimable, dead, suspect), each read alone: a single scan filtered
-- on status IN ('pending', 'dead') matches none of them, and over a partitioned
-- table with history the planner read every partition whole (70 ms at 200,000
-- delivered rows, benchmarks/storage.py).
WITH pending AS (
    SELECT /* TEMPLATE: partition */provider AS partition, count(*) AS pending, min(next_attempt_at) AS oldest
    FROM /* TEMPLATE: table */hookline.inbox WHERE status = 'pending'
    GROUP BY 1
), dead AS (
    SELECT /* TEMPLATE: partition */provider AS partition, count(*) AS dead
    FROM /* TEMPLATE: table */hookline.inbox WHERE status = 'dead'
    GROUP BY 1
), suspects AS (
    SELECT /* TEMPLATE: partition */provider AS partition, count(*) AS suspects
    FROM /* TEMPLATE: table */hookline.inbox WHERE status = 'pending' AND suspect
    GROUP BY 1
)
SELECT partition, coalesce(pending.pending, 0) AS pending,
       coalesce(extract(epoch FROM now() - pending.oldest), 0) AS oldest_pending_seconds,
       coalesce(dead.dead, 0) AS dead, coalesce(suspects.suspects, 0) AS suspects
FROM pending FULL JOIN dead USING (partition) LEFT JOIN suspects USING (partition);
