-- Hookline schema, version 21: a tenant worker role logs attempts of its own events only.
--
-- Why: hookline.log_attempts (0016) is callable by every role, so that any role that
-- books an outcome can log it. A tenant's workers (0006) could then have appended
-- invented attempts to another team's events, which `hookline events show` would print
-- as that team's history. Now, for a tenant, an attempt is logged only when it names an
-- inbox event that exists under one of the tenant's own providers, the check the trigger
-- of 0013 got for free from row-level security. Other roles (the services' own, the
-- operator) are trusted as before: they can book any outcome anyway.
CREATE OR REPLACE FUNCTION hookline.log_attempts(log_queue text, row_ids bigint[], parts text[],
                                                 attempt_numbers integer[], workers text[], outcomes text[],
                                                 errors text[], http_statuses integer[], latencies float8[])
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH tenant AS (SELECT hookline.tenant_providers() AS providers),
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
