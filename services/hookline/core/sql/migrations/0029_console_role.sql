-- Hookline schema, version 29: the console's reading role (issue 28).
--
-- `hookline console` connects as the owner, like every service, but reads only as
-- hookline_console (console/store.py: SET LOCAL ROLE in each request's transaction), a NOLOGIN
-- role that row-level security limits to what the request may see, named in two transaction
-- settings the store sets from the request's Access:
--   hookline.console_providers   a JSON array of provider names, or '*' for every provider;
--                                unset or empty: none (default-deny)
--   hookline.console_install_wide  'on': the outbox (endpoints, deliveries, outbox) too
-- A handler that forgets a filter, or hand-written SQL in that transaction, shows no more.
-- The role never reads a secret column (providers.secrets, destination_secret, endpoints.secrets)
-- and no partition directly (partitions carry no policy; the grants are on the parents).
-- Replays are written as the owner, after the role has read what may be replayed.

-- 1. The role, cluster-wide (it may exist from another database of the same server).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'hookline_console') THEN
        BEGIN
            CREATE ROLE hookline_console NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'the console''s reading role hookline_console does not exist and % may not create it',
                current_user
                USING HINT = 'create it once as a role with CREATEROLE: CREATE ROLE hookline_console NOLOGIN; '
                             'GRANT hookline_console TO ' || quote_ident(current_user) || '; then migrate again';
        END;
    END IF;
    -- The owner runs the console and switches to the role. Another database of the server may have
    -- made it, as another owner: then only a role with its ADMIN option can grant it here, and
    -- `hookline console` says so when it starts (the rest of Hookline does not need it).
    IF NOT pg_catalog.pg_has_role(current_user, 'hookline_console', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT hookline_console TO %I', current_user);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'role % may not switch to hookline_console, so `hookline console` cannot run as it',
                current_user
                USING HINT = 'as a superuser (or a role with ADMIN on it): GRANT hookline_console TO '
                             || quote_ident(current_user);
        END;
    END IF;
END $$;

-- 2. What the settings name. SQL-standard bodies: bound at creation (no search_path to hijack; calls
-- qualified all the same), inlined by the planner.
-- NULL means every provider (as tenant_providers() does), so the policies read
-- `(SELECT f()) IS NULL OR provider = ANY ((SELECT f()))`, one init plan and an index condition.
CREATE FUNCTION hookline.console_providers() RETURNS text[] LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE coalesce(pg_catalog.current_setting('hookline.console_providers', true), '')
           WHEN '*' THEN NULL
           WHEN '' THEN '{}'::text[]
           ELSE ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                          pg_catalog.current_setting('hookline.console_providers', true)::jsonb))
       END;

CREATE FUNCTION hookline.console_install_wide() RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE
RETURN coalesce(pg_catalog.current_setting('hookline.console_install_wide', true), '') = 'on';

REVOKE EXECUTE ON FUNCTION hookline.console_providers(), hookline.console_install_wide() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION hookline.console_providers(), hookline.console_install_wide() TO hookline_console;

-- 3. Grants: reading only, column lists where a table holds secrets.
GRANT USAGE ON SCHEMA hookline TO hookline_console;
GRANT SELECT (name, spec, updated_at, managed_by, owner_namespace, owner_name, owner_uid)
    ON hookline.providers TO hookline_console;
GRANT SELECT ON hookline.inbox, hookline.attempts, hookline.handler_problems TO hookline_console;
GRANT SELECT (name, url, event_types, ordered, max_attempts, initial_delay_seconds, max_delay_seconds,
              timeout_seconds, enabled, disabled_at, disabled_reason, consecutive_failures, circuit_open_until,
              created_at, circuit_state, circuit_changed_at, window_started_at, window_successes, window_failures,
              previous_successes, previous_failures, probe_successes, probe_failures)
    ON hookline.endpoints TO hookline_console;
GRANT SELECT ON hookline.deliveries, hookline.outbox TO hookline_console;

-- 4. Row-level security. The tenant policies (0006) are permissive and let every role that is
-- not a tenant see everything; the console's are RESTRICTIVE, so they hold on top of those.
-- The tables that had no row-level security get a permissive policy for every role that keeps
-- what they could do before (their grants still decide), then the console's restriction. The
-- owner, who runs the services and writes the replays, bypasses row-level security as before.
CREATE POLICY console_providers ON hookline.providers AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_providers()) IS NULL OR name = ANY ((SELECT hookline.console_providers())::text[]));

CREATE POLICY console_events ON hookline.inbox AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[]));

ALTER TABLE hookline.attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.attempts USING (true) WITH CHECK (true);
CREATE POLICY console_attempts ON hookline.attempts AS RESTRICTIVE FOR SELECT TO hookline_console
    USING (CASE WHEN queue = 'inbox'
                THEN (SELECT hookline.console_providers()) IS NULL OR part = ANY ((SELECT hookline.console_providers())::text[])
                ELSE (SELECT hookline.console_install_wide()) END);

ALTER TABLE hookline.handler_problems ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.handler_problems USING (true) WITH CHECK (true);
CREATE POLICY console_handler_problems ON hookline.handler_problems AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[]));

ALTER TABLE hookline.endpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.endpoints USING (true) WITH CHECK (true);
CREATE POLICY console_endpoints ON hookline.endpoints AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_install_wide()));

ALTER TABLE hookline.deliveries ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.deliveries USING (true) WITH CHECK (true);
CREATE POLICY console_deliveries ON hookline.deliveries AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_install_wide()));

ALTER TABLE hookline.outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.outbox USING (true) WITH CHECK (true);
CREATE POLICY console_outbox ON hookline.outbox AS RESTRICTIVE FOR SELECT TO hookline_console
    USING ((SELECT hookline.console_install_wide()));

-- 5. A replay is recorded in the attempt log: outcome 'replayed', who in `worker`
-- ("console:<subject>"), attempt 0 (the count starts again after it).
ALTER TABLE hookline.attempts DROP CONSTRAINT attempts_outcome_check,
    ADD CONSTRAINT attempts_outcome_check
        CHECK (outcome IN ('done', 'retry', 'dead', 'expired', 'parked', 'replayed'));

-- 6. The console's lists, newest first, keyset-paginated on (received_at, id) per provider
-- (console.sql walks each provider's range and merges): received_at is the partition key, so a
-- page reads the newest partitions first and stops. The dead letters get a partial index of
-- their own, which rows enter only when they die (nothing for the receiver to write).
CREATE INDEX inbox_console_idx ON hookline.inbox (provider, received_at, id);
CREATE INDEX inbox_console_dead_idx ON hookline.inbox (provider, received_at, id) WHERE status = 'dead';
