-- Hookline schema, version 24: hookline.log_attempts looks the calling role's tenant up
-- once per call, not once per attempt.
--
-- Why: the `tenant` CTE of 0021, referenced once, was inlined into the join with the
-- attempts, and its function call ran again for every attempt logged (a PL/pgSQL call
-- and an index probe of hookline.tenants each: with completions booked in batches,
-- 10,000 events cost 10,000 calls). MATERIALIZED evaluates it once. Same rows logged.
CREATE OR REPLACE FUNCTION hookline.log_attempts(log_queue text, row_ids bigint[], parts text[],
                                                 attempt_numbers integer[], workers text[], outcomes text[],
                                                 errors text[], http_statuses integer[], latencies float8[])
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH tenant AS MATERIALIZED (SELECT hookline.tenant_providers() AS providers),
    logged AS (
        INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome, error, http_status, latency_ms)
        SELECT log_queue, a.row_id, a.part, a.attempt, a.worker, a.outcome,
               CASE WHEN a.outcome <> 'done' THEN left(a.error, 2000) END, a.http_status, a.latency_ms
        FROM unnest(row_ids, parts, attempt_numbers, workers, outcomes, errors, http_statuses, latencies)
            AS a(row_id, part, attempt, worker, outcome, error, http_status, latency_ms), tenant
        WHERE a.row_id IS NOT NULL AND hookline.attempt_logged(a.attempt, a.outcome)
          AND (tenant.providers IS NULL
               OR (log_queue = 'inbox' AND a.part = ANY (tenant.providers)
                   AND EXISTS (SELECT 1 FROM hookline.inbox AS i WHERE i.id = a.row_id AND i.provider = a.part)))
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged
$$;
