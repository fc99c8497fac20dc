-- Hookline schema, version 33: the console shows a team its own namespace's outbox (issue 29).
--
-- Until now only an install-wide reader (list on webhookproviders in every namespace) saw the
-- outbox. The console's Access now also names the WebhookEndpoints the user may get (a
-- SubjectAccessReview per resource, console/kube.py), set per transaction beside the providers:
--   hookline.console_endpoints   a JSON array of endpoint names (NAMESPACE/NAME);
--   hookline.console_namespaces  a JSON array of the namespaces of those endpoints, whose events
--                                (hookline.outbox rows) the user may read.
-- The restrictive policies on endpoints, deliveries, outbox and the deliveries' attempts admit
-- those rows as well; the grants add the endpoints' non-secret columns of migrations 0030-0031.

CREATE FUNCTION hookline.console_endpoints() RETURNS text[] LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE coalesce(pg_catalog.current_setting('hookline.console_endpoints', true), '')
           WHEN '' THEN '{}'::text[]
           ELSE ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                          pg_catalog.current_setting('hookline.console_endpoints', true)::jsonb))
       END;

CREATE FUNCTION hookline.console_namespaces() RETURNS text[] LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE coalesce(pg_catalog.current_setting('hookline.console_namespaces', true), '')
           WHEN '' THEN '{}'::text[]
           ELSE ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                          pg_catalog.current_setting('hookline.console_namespaces', true)::jsonb))
       END;

REVOKE EXECUTE ON FUNCTION hookline.console_endpoints(), hookline.console_namespaces() FROM PUBLIC;

-- The same setup as 0029's, with the policies and grants above (it also runs for a copied
-- database, so it must make the new policies, not the old ones).
CREATE OR REPLACE FUNCTION hookline.console_role_setup() RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    reader text;
    restriction record;
BEGIN
    -- Concurrent GRANTs on one object fail ("tuple concurrently updated"); no tenant can lock this.
    LOCK TABLE hookline.console_role IN SHARE ROW EXCLUSIVE MODE;
    reader := hookline.console_role_name();
    IF reader <> hookline.console_role_own_name() THEN
        -- A copy or a renamed database: take everything from the role it shares, then make its own.
        -- Should that fail below, the console has no policies and no role, and refuses to start.
        FOR restriction IN SELECT polname, polrelid::regclass AS tab FROM pg_policy
                           WHERE polname LIKE 'console\_%' AND polrelid IN (SELECT oid FROM pg_class
                               WHERE relnamespace = 'hookline'::regnamespace) LOOP
            EXECUTE format('DROP POLICY %I ON %s', restriction.polname, restriction.tab);
        END LOOP;
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = reader) THEN
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA hookline FROM %I', reader);
            EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA hookline FROM %I', reader);
            EXECUTE format('REVOKE ALL ON SCHEMA hookline FROM %I', reader);
        END IF;
        UPDATE hookline.console_role SET name = hookline.console_role_own_name() RETURNING name INTO reader;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = reader) THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', reader);
        EXCEPTION WHEN insufficient_privilege THEN
            RETURN hookline.console_role_problem();
        END;
    END IF;
    IF NOT hookline.console_role_switchable(reader) THEN
        BEGIN
            EXECUTE format('GRANT %I TO %I', reader, current_user);
        EXCEPTION WHEN insufficient_privilege THEN
            RETURN hookline.console_role_problem();
        END;
    END IF;
    -- Reading only, column lists where a table holds secrets (providers.secrets and
    -- destination_secret, endpoints.secrets); the parents only, so no partition can be read
    -- past the policies.
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.console_providers(), hookline.console_install_wide(), '
                   'hookline.console_endpoints(), hookline.console_namespaces() TO %I',
                   reader);
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', reader);
    EXECUTE format('GRANT SELECT (name, spec, updated_at, managed_by, owner_namespace, owner_name, owner_uid) '
                   'ON hookline.providers TO %I', reader);
    EXECUTE format('GRANT SELECT ON hookline.inbox, hookline.attempts, hookline.handler_problems TO %I', reader);
    EXECUTE format('GRANT SELECT (name, url, event_types, ordered, max_attempts, initial_delay_seconds, '
                   'max_delay_seconds, timeout_seconds, enabled, disabled_at, disabled_reason, consecutive_failures, '
                   'circuit_open_until, created_at, circuit_state, circuit_changed_at, window_started_at, '
                   'window_successes, window_failures, previous_successes, previous_failures, probe_successes, '
                   'probe_failures, namespace, resource_name, paused, rate_per_second, rate_burst, max_in_flight, '
                   'throttled_until, throttled_factor) ON hookline.endpoints TO %I', reader);
    EXECUTE format('GRANT SELECT ON hookline.deliveries, hookline.outbox TO %I', reader);
    FOR restriction IN SELECT * FROM (VALUES
        ('providers', 'console_providers',
         '(SELECT hookline.console_providers()) IS NULL OR name = ANY ((SELECT hookline.console_providers())::text[])'),
        ('inbox', 'console_events',
         '(SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[])'),
        ('attempts', 'console_attempts',
         'CASE WHEN queue = ''inbox'' THEN (SELECT hookline.console_providers()) IS NULL '
         'OR part = ANY ((SELECT hookline.console_providers())::text[]) ELSE (SELECT hookline.console_install_wide()) '
         'OR part = ANY ((SELECT hookline.console_endpoints())::text[]) END'),
        ('handler_problems', 'console_handler_problems',
         '(SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[])'),
        ('endpoints', 'console_endpoints',
         '(SELECT hookline.console_install_wide()) OR name = ANY ((SELECT hookline.console_endpoints())::text[])'),
        ('deliveries', 'console_deliveries',
         '(SELECT hookline.console_install_wide()) OR endpoint = ANY ((SELECT hookline.console_endpoints())::text[])'),
        ('outbox', 'console_outbox',
         '(SELECT hookline.console_install_wide()) OR namespace = ANY ((SELECT hookline.console_namespaces())::text[])')
    ) AS r(tab, policy, expression) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polname = restriction.policy
                       AND polrelid = format('hookline.%I', restriction.tab)::regclass) THEN
            EXECUTE format('CREATE POLICY %I ON hookline.%I AS RESTRICTIVE FOR SELECT TO %I USING (%s)',
                           restriction.policy, restriction.tab, reader, restriction.expression);
        END IF;
    END LOOP;
    RETURN hookline.console_role_problem();
END $$;

-- The outbox policies as they are now: dropped, and made again by the setup.
DO $$
DECLARE
    restriction record;
BEGIN
    FOR restriction IN SELECT polname, polrelid::regclass AS tab FROM pg_policy
                       WHERE polname IN ('console_attempts', 'console_endpoints', 'console_deliveries', 'console_outbox')
                         AND polrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'hookline'::regnamespace) LOOP
        EXECUTE format('DROP POLICY %I ON %s', restriction.polname, restriction.tab);
    END LOOP;
END $$;

SELECT hookline.console_role_setup();
