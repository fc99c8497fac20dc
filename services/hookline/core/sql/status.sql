-- `hookline status` (hookline.core.status): the seed's monitoring queries. Every
-- part reads an index whose size follows unfinished work or recent minutes, never
-- the whole history. The inbox queue signals come from provider_stats (queries.sql).

-- name: provider_names
SELECT name FROM hookline.providers ORDER BY name;

-- name: recent_inbox_activity
-- Per provider, events accepted and attempts failed in the last $1 seconds.
-- accepted: inbox_received_brin_idx (the recent block ranges of the inbox);
-- failed: attempts_part_at_idx, one range per provider named in $2 (migration 0013).
WITH accepted AS (
    SELECT provider, count(*) AS accepted FROM hookline.inbox
    WHERE received_at > now() - make_interval(secs => $1)
    GROUP BY provider
), failed AS (
    SELECT p.name AS provider, f.failed FROM unnest($2::text[]) AS p(name)
    CROSS JOIN LATERAL (
        SELECT count(*) AS failed FROM hookline.attempts AS a
        WHERE a.queue = 'inbox' AND a.part = p.name AND a.at > now() - make_interval(secs => $1)
          AND a.outcome <> 'done'
    ) AS f
    WHERE f.failed > 0
)
SELECT provider, coalesce(accepted.accepted, 0) AS accepted, coalesce(failed.failed, 0) AS failed
FROM accepted FULL JOIN failed USING (provider);

-- name: endpoint_status
-- Per endpoint: undelivered work by state (deliveries_claimable_idx, deliveries_parked_idx,
-- deliveries_dead_idx), the circuit, and the last answer (attempts_part_at_idx, newest first).
SELECT e.name, e.enabled, e.disabled_reason, e.circuit_state,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'pending')
           AS pending,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'parked')
           AS parked,
       (SELECT count(*) FROM hookline.deliveries AS d WHERE d.endpoint = e.name AND d.status = 'dead') AS dead,
       last.at AS last_at, last.outcome AS last_outcome, last.http_status AS last_http_status,
       last.latency_ms AS last_latency_ms, last.error AS last_error
FROM hookline.endpoints AS e
LEFT JOIN LATERAL (
    SELECT a.at, a.outcome, a.http_status, a.latency_ms, a.error FROM hookline.attempts AS a
    WHERE a.queue = 'deliveries' AND a.part = e.name
    ORDER BY a.at DESC
    LIMIT 1
) AS last ON true
ORDER BY e.name;

-- name: handler_problems
-- Handlers a worker could not import (migration 0027), while the provider's spec still names
-- that handler: a spec fixed since no longer shows the old problem. One row per provider at most.
SELECT h.provider, h.handler, h.problem, h.worker, h.since
FROM hookline.handler_problems AS h
JOIN hookline.providers AS p ON p.name = h.provider AND p.spec ->> 'handler' = h.handler
ORDER BY h.provider;

-- name: database_durability
-- What the server does to keep a commit it acknowledged (core/durability.py). pg_stat_replication
-- shows a role without pg_read_all_stats (pg_monitor) its rows with every column but the pid empty:
-- those standbys are counted as unseen, not as asynchronous.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       current_setting('fsync') AS fsync,
       current_setting('full_page_writes') AS full_page_writes,
       count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')) AS synchronous_standbys,
       count(r.pid) FILTER (WHERE r.sync_state IS NULL) AS unseen_standbys,
       count(r.pid) AS standbys
FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_stat_replication AS r ON true;
