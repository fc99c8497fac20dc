-- Hookline schema, version 29: the console's reading role (issue 28).
--
-- `hookline console` connects as the owner, like every service, but reads only as this
-- database's console role, hookline_console_<digest> (console/store.py switches to it in each
-- request's transaction), a NOLOGIN role that row-level security limits to what the request may
-- see, named in two transaction settings the store sets from the request's Access:
--   hookline.console_providers   a JSON array of provider names, or '*' for every provider;
--                                unset or empty: none (default-deny)
--   hookline.console_install_wide  'on': the outbox (endpoints, deliveries, outbox) too
-- A handler that forgets a filter, or hand-written SQL in that transaction, shows no more.
-- The role never reads a secret column (providers.secrets, destination_secret, endpoints.secrets)
-- and no partition directly (partitions carry no policy; the grants are on the parents).
-- Replays are written as the owner, after the role has read what may be replayed.

-- 1. Which role. Roles are the server's, shared by every database on it: one name for all would
-- let the owner of another database on the server, a member, read this one's events. So each
-- database has its own, named from the database. The name in use is recorded: a copy of the
-- database (CREATE DATABASE ... TEMPLATE, a restored dump) or a renamed one keeps using the
-- role it was made with until `hookline migrate` gives it its own (console_role_setup).
CREATE FUNCTION hookline.console_role_own_name() RETURNS text LANGUAGE sql STABLE
RETURN 'hookline_console_' || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
           pg_catalog.convert_to(pg_catalog.current_database(), 'UTF8')), 'hex'), 16);

CREATE TABLE hookline.console_role (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    name      text NOT NULL
);
INSERT INTO hookline.console_role (name) VALUES (hookline.console_role_own_name());

CREATE FUNCTION hookline.console_role_name() RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found text;
BEGIN
    SELECT name INTO found FROM hookline.console_role;
    IF found IS NULL THEN  -- fail closed: a scope that cannot switch role must not read as the owner
        RAISE EXCEPTION 'the console''s reading role is not recorded in hookline.console_role';
    END IF;
    RETURN found;
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

-- 3. Row-level security on the tables that had none: a permissive policy for every role keeps
-- what they could do before (their grants still decide); the console's restrictions (5) hold on
-- top of it and of the tenant policies (0006), which are permissive and let every role that is
-- not a tenant see everything. The owner, who runs the services and writes the replays,
-- bypasses row-level security as before.
ALTER TABLE hookline.attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.attempts USING (true) WITH CHECK (true);
ALTER TABLE hookline.handler_problems ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.handler_problems USING (true) WITH CHECK (true);
ALTER TABLE hookline.endpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.endpoints USING (true) WITH CHECK (true);
ALTER TABLE hookline.deliveries ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.deliveries USING (true) WITH CHECK (true);
ALTER TABLE hookline.outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY as_before ON hookline.outbox USING (true) WITH CHECK (true);

-- Whether the owner may SET ROLE to it. From 16 on a member may lack the SET option (the
-- membership a CREATEROLE role gets in a role it creates is ADMIN alone); before 16 any may.
CREATE FUNCTION hookline.console_role_switchable(reader text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN pg_has_role(current_user, reader,
                   CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'SET' ELSE 'MEMBER' END);

-- 4. Why the console cannot run yet (NULL: it can). Read by `hookline console` at start-up.
-- A member other than the owner could switch to the role, name every provider in the settings
-- and read them all, so the role must be the owner's alone.
CREATE FUNCTION hookline.console_role_problem() RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    reader text := hookline.console_role_name();
    others text;
    missing int;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = reader) THEN
        RETURN format('the console''s reading role %I does not exist, and %I may not create it without '
                      'CREATEROLE; as a role with CREATEROLE run: CREATE ROLE %I NOLOGIN; GRANT %I TO %I; '
                      'then `hookline migrate` again', reader, current_user, reader, reader, current_user);
    END IF;
    IF NOT hookline.console_role_switchable(reader) THEN
        RETURN format('%I may not switch to the console''s reading role %I; as a superuser or a role with ADMIN '
                      'on it run: GRANT %I TO %I; then `hookline migrate` again',
                      current_user, reader, reader, current_user);
    END IF;
    -- From 16 on a membership may be for ADMIN alone (a CREATEROLE role that made the role has
    -- one): that one reads nothing through it. Before 16 every membership could.
    IF current_setting('server_version_num')::int >= 160000 THEN
        SELECT string_agg(quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO others
        FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member
        WHERE a.roleid = (SELECT oid FROM pg_roles WHERE rolname = reader) AND m.rolname <> current_user
          AND (a.set_option OR a.inherit_option);
    ELSE
        SELECT string_agg(quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO others
        FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member
        WHERE a.roleid = (SELECT oid FROM pg_roles WHERE rolname = reader) AND m.rolname <> current_user;
    END IF;
    IF others IS NOT NULL THEN
        RETURN format('the console''s reading role %I is granted to %s as well, who could read every provider''s '
                      'events through it; the role must be %I''s alone: REVOKE %I FROM %s',
                      reader, others, current_user, reader, others);
    END IF;
    SELECT 7 - count(*) INTO missing FROM pg_policy
    WHERE polname LIKE 'console\_%' AND polroles = ARRAY[(SELECT oid FROM pg_roles WHERE rolname = reader)]
        AND polrelid IN ('hookline.providers'::regclass, 'hookline.inbox'::regclass, 'hookline.attempts'::regclass,
                         'hookline.handler_problems'::regclass, 'hookline.endpoints'::regclass,
                         'hookline.deliveries'::regclass, 'hookline.outbox'::regclass);
    IF missing > 0 THEN
        RETURN 'the console''s row-level security is not in place yet: run `hookline migrate`';
    END IF;
    RETURN NULL;
END $$;

-- 5. Make the role and give it what it reads; returns console_role_problem(). Runs with the
-- caller's rights (creating the role needs CREATEROLE), in this migration and again at each
-- `hookline migrate`, so an owner without CREATEROLE migrates all the same (only the console
-- waits) and a role made for it later is taken up. Converges: grants again, adds what is missing.
CREATE FUNCTION hookline.console_role_setup() RETURNS text
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
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.console_providers(), hookline.console_install_wide() TO %I',
                   reader);
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', reader);
    EXECUTE format('GRANT SELECT (name, spec, updated_at, managed_by, owner_namespace, owner_name, owner_uid) '
                   'ON hookline.providers TO %I', reader);
    EXECUTE format('GRANT SELECT ON hookline.inbox, hookline.attempts, hookline.handler_problems TO %I', reader);
    EXECUTE format('GRANT SELECT (name, url, event_types, ordered, max_attempts, initial_delay_seconds, '
                   'max_delay_seconds, timeout_seconds, enabled, disabled_at, disabled_reason, consecutive_failures, '
                   'circuit_open_until, created_at, circuit_state, circuit_changed_at, window_started_at, '
                   'window_successes, window_failures, previous_successes, previous_failures, probe_successes, '
                   'probe_failures) ON hookline.endpoints TO %I', reader);
    EXECUTE format('GRANT SELECT ON hookline.deliveries, hookline.outbox TO %I', reader);
    FOR restriction IN SELECT * FROM (VALUES
        ('providers', 'console_providers',
         '(SELECT hookline.console_providers()) IS NULL OR name = ANY ((SELECT hookline.console_providers())::text[])'),
        ('inbox', 'console_events',
         '(SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[])'),
        ('attempts', 'console_attempts',
         'CASE WHEN queue = ''inbox'' THEN (SELECT hookline.console_providers()) IS NULL '
         'OR part = ANY ((SELECT hookline.console_providers())::text[]) ELSE (SELECT hookline.console_install_wide()) END'),
        ('handler_problems', 'console_handler_problems',
         '(SELECT hookline.console_providers()) IS NULL OR provider = ANY ((SELECT hookline.console_providers())::text[])'),
        ('endpoints', 'console_endpoints', '(SELECT hookline.console_install_wide())'),
        ('deliveries', 'console_deliveries', '(SELECT hookline.console_install_wide())'),
        ('outbox', 'console_outbox', '(SELECT hookline.console_install_wide())')
    ) AS r(tab, policy, expression) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polname = restriction.policy
                       AND polrelid = format('hookline.%I', restriction.tab)::regclass) THEN
            EXECUTE format('CREATE POLICY %I ON hookline.%I AS RESTRICTIVE FOR SELECT TO %I USING (%s)',
                           restriction.policy, restriction.tab, reader, restriction.expression);
        END IF;
    END LOOP;
    RETURN hookline.console_role_problem();
END $$;

REVOKE EXECUTE ON FUNCTION hookline.console_role_own_name(), hookline.console_role_name(), hookline.console_providers(),
    hookline.console_install_wide(), hookline.console_role_switchable(text), hookline.console_role_problem(), hookline.console_role_setup() FROM PUBLIC;

SELECT hookline.console_role_setup();

-- 6. A replay is recorded in the attempt log: outcome 'replayed', who in `worker`
-- ("console:<subject>"), attempt 0 (the count starts again after it).
ALTER TABLE hookline.attempts DROP CONSTRAINT attempts_outcome_check,
    ADD CONSTRAINT attempts_outcome_check
        CHECK (outcome IN ('done', 'retry', 'dead', 'expired', 'parked', 'replayed'));

-- 7. The console's lists, newest first, keyset-paginated on (received_at, id) per provider
-- (console.sql walks each provider's range and merges): received_at is the partition key, so a
-- page reads the newest partitions first and stops. The dead letters get a partial index of
-- their own, which rows enter only when they die (nothing for the receiver to write).
CREATE INDEX inbox_console_idx ON hookline.inbox (provider, received_at, id);
CREATE INDEX inbox_console_dead_idx ON hookline.inbox (provider, received_at, id) WHERE status = 'dead';
