-- Hookline schema, version 27: failures you can see (issue 25, points 5 and 6).
--
-- 1. A handler that cannot be imported is a configuration error, not a failure of its events:
--    the worker puts them back without counting their attempts and records the problem here,
--    once per provider, for `hookline status` (core/status.py). A row names the handler it is
--    about: status shows it only while the provider's spec still names that handler, so a fixed
--    spec clears it at once; the worker deletes it when the handler imports.
CREATE TABLE hookline.handler_problems (
    provider text PRIMARY KEY,
    handler text NOT NULL,
    problem text NOT NULL,
    worker text NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
);

-- The worker's one way to write that table, tenant workers included: like log_attempts, a
-- tenant's role reaches only its own providers' rows (tenant_providers(), 0025). NULL problem:
-- the handler imports, the row goes. Returns whether a row was written or deleted.
CREATE FUNCTION hookline.report_handler_problem(provider_name text, handler_path text, problem text,
                                                worker_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tenant text[] := hookline.tenant_providers();
BEGIN
    IF tenant IS NOT NULL AND NOT provider_name = ANY (tenant) THEN
        RETURN false;
    END IF;
    IF problem IS NULL THEN
        DELETE FROM hookline.handler_problems AS h WHERE h.provider = provider_name;
    ELSE
        INSERT INTO hookline.handler_problems AS h (provider, handler, problem, worker)
        VALUES (provider_name, handler_path, left(problem, 2000), worker_id)
        ON CONFLICT ON CONSTRAINT handler_problems_pkey DO UPDATE
            SET handler = EXCLUDED.handler, problem = EXCLUDED.problem, worker = EXCLUDED.worker,
                since = CASE WHEN (h.handler, h.problem) = (EXCLUDED.handler, EXCLUDED.problem) THEN h.since
                             ELSE now() END;
    END IF;
    RETURN FOUND;
END $$;
REVOKE EXECUTE ON FUNCTION hookline.report_handler_problem(text, text, text, text) FROM PUBLIC;

-- 2. The attempt log keeps a failed handler's traceback with its error (queue.sql's fail
--    passes both; the inbox row keeps the error alone): 8 KB, which the worker bounds by
--    cutting the middle out (worker/completer.py bounded). Was 2000 characters.
--    CREATE OR REPLACE keeps the function's privileges.
CREATE OR REPLACE FUNCTION hookline.log_attempts(log_queue text, row_ids bigint[], parts text[],
                                                 attempt_numbers integer[], workers text[], outcomes text[],
                                                 errors text[], http_statuses integer[],
                                                 latencies double precision[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH tenant AS MATERIALIZED (SELECT hookline.tenant_providers() AS providers),
    logged AS (
        INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome, error, http_status, latency_ms)
        SELECT log_queue, a.row_id, a.part, a.attempt, a.worker, a.outcome,
               CASE WHEN a.outcome <> 'done' THEN left(a.error, 8192) END, a.http_status, a.latency_ms
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

-- 3. Tenant workers may report their handlers' problems (0026's grants, plus that one function).
CREATE OR REPLACE FUNCTION hookline.grant_tenant_privileges(tenant_role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', tenant_role);
    EXECUTE format('REVOKE ALL ON hookline.providers, hookline.inbox, hookline.entity_states FROM %I', tenant_role);
    EXECUTE format('GRANT SELECT (name, spec, updated_at, managed_by, owner_namespace, owner_name, owner_uid) '
                   'ON hookline.providers TO %I', tenant_role);
    EXECUTE format('GRANT SELECT ON hookline.inbox TO %I', tenant_role);
    EXECUTE format('GRANT UPDATE (status, attempts, next_attempt_at, lease_expires_at, locked_by, last_error, '
                   'processed_at, deferred_since, suspect, claimed_at) ON hookline.inbox TO %I', tenant_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON hookline.entity_states TO %I', tenant_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.log_attempts(text, bigint[], text[], integer[], text[], '
                   'text[], text[], integer[], float8[]) TO %I', tenant_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.report_handler_problem(text, text, text, text) TO %I',
                   tenant_role);
END $$;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tn.role_name FROM hookline.tenants AS tn
             JOIN pg_catalog.pg_roles AS r ON r.rolname = tn.role_name LOOP
        PERFORM hookline.grant_tenant_privileges(t.role_name);
    END LOOP;
END $$;
