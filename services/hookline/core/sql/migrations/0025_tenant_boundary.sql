-- Hookline schema, version 25: the tenant boundary, default-deny (issue 23).
--
-- A tenant is a WebhookProvider's worker role (0006). Before this version it could call
-- every function in the schema (Postgres grants EXECUTE to PUBLIC by default, so an
-- owner's-rights archive_provider_events() erased another team's inbox), resolve the
-- unqualified calls of caller's-rights functions to trojans of its own in schema public,
-- take the advisory keys the housekeeping elected its leader and serialised on, write
-- every inbox column (received_at moved rows into the default partition) and read the
-- signing secrets of its own providers. Now:
--   * no function is executable by PUBLIC but the two lookups row-level security policies
--     call for whoever reads a table; tenants get the attempt log besides;
--   * every function either pins search_path = pg_catalog, pg_temp or has an SQL-standard
--     body (names bound when it was created, and still inlined by the planner);
--   * leadership and serialisation use owner-only tables no tenant can lock (below);
--   * a tenant may UPDATE only the inbox columns a worker writes and may SELECT the
--     providers' columns without the signing secrets;
--   * the tenants' identities are no longer in COMMENT ON ROLE, which every role can read
--     through pg_roles (hookline.tenants, owner-only, keeps them).

-- 1. Nothing executable by PUBLIC (but the policies' lookups, 6.). The owner keeps EXECUTE;
-- tenants are granted theirs in grant_tenant_privileges below. Producers in other roles
-- that call hookline.publish need `GRANT EXECUTE ON FUNCTION hookline.publish(...)` and
-- INSERT on the outbox (README, "The tenant boundary in Postgres"). tests/test_tenant_boundary.py fails
-- when a later migration adds a function without revoking it.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA hookline FROM PUBLIC;

-- 2. Names bound where they cannot be hijacked. The small SQL functions get SQL-standard
-- bodies: parsed and bound when created (migrations run with search_path = pg_catalog,
-- pg_temp, core/migrations.py), so no search path at call time can change what they call,
-- and, unlike a function with a SET clause, the planner still inlines them (attempt_logged
-- runs for every attempt logged, retention for every row retention looks at).
CREATE OR REPLACE FUNCTION hookline.retention(spec jsonb, field text, unit interval, fallback interval)
RETURNS interval LANGUAGE sql IMMUTABLE
RETURN coalesce((spec -> 'retention' ->> field)::float8 * unit, fallback);

CREATE OR REPLACE FUNCTION hookline.attempt_logged(attempt integer, status text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN attempt <= 20 OR status IN ('done', 'dead');

CREATE OR REPLACE FUNCTION hookline.event_type_matches(patterns text[], event_type text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN EXISTS (
    SELECT 1 FROM unnest(patterns) AS p
    WHERE p = '*' OR p = event_type OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1))));

CREATE OR REPLACE FUNCTION hookline.archived_provider_name(provider_name text, owner_uid text)
RETURNS text LANGUAGE sql IMMUTABLE
RETURN provider_name || '@' || owner_uid;

CREATE OR REPLACE FUNCTION hookline.current_traceparent()
RETURNS text LANGUAGE sql STABLE
RETURN (SELECT CASE WHEN t ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN t END
        FROM (SELECT current_setting('hookline.traceparent', true) AS t) AS s);

CREATE OR REPLACE FUNCTION hookline.endpoint_retention(amount double precision, unit interval, fallback interval)
RETURNS interval LANGUAGE sql IMMUTABLE
RETURN coalesce(amount * unit, fallback);

CREATE OR REPLACE FUNCTION hookline.last_partition_rows()
RETURNS bigint LANGUAGE sql STABLE
RETURN nullif(current_setting('hookline.last_partition_rows', true), '')::bigint;

-- 3. Housekeeping no tenant can block. Advisory locks are not access-controlled: any role
-- could take the keys the maintenance leaders, the tenancy, the budget and the migrations
-- serialised on. Leadership is now a lease in a table only the owner can write
-- (core/maintenance.py renews it; a leader that dies is replaced once its lease runs out,
-- one that stops hands it over at once); serialisation is a table lock on an owner-only
-- table (a role without privileges on a table cannot lock it, not even for the length of
-- a failing statement: its lock goes with the statement's error).
CREATE TABLE hookline.maintenance_leaders (
    scope       text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- Exactly what a tenant's workers use, nothing more; converges a role of an older version.
-- Column lists, not whole tables: a worker writes its events' processing state, never what
-- was received (received_at decides the partition and the dedup keys' horizon; body and
-- headers are the partner's bytes), and never needs the providers' signing secrets.
CREATE FUNCTION hookline.grant_tenant_privileges(tenant_role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', tenant_role);
    EXECUTE format('REVOKE ALL ON hookline.providers, hookline.inbox, hookline.entity_states FROM %I', tenant_role);
    EXECUTE format('GRANT SELECT (name, spec, updated_at, destination_secret, managed_by, owner_namespace, '
                   'owner_name, owner_uid) ON hookline.providers TO %I', tenant_role);
    EXECUTE format('GRANT SELECT ON hookline.inbox TO %I', tenant_role);
    EXECUTE format('GRANT UPDATE (status, attempts, next_attempt_at, lease_expires_at, locked_by, last_error, '
                   'processed_at, deferred_since, suspect, claimed_at) ON hookline.inbox TO %I', tenant_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON hookline.entity_states TO %I', tenant_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.log_attempts(text, bigint[], text[], integer[], text[], '
                   'text[], text[], integer[], float8[]) TO %I', tenant_role);
END $$;

-- Create (or converge) a tenant's role (0006), one at a time: concurrent GRANTs on one
-- table fail with "tuple concurrently updated". The lock is on hookline.tenants, which a
-- tenant cannot lock. Runs with the caller's rights: the operator's role needs CREATEROLE.
CREATE OR REPLACE FUNCTION hookline.ensure_tenant(tenant_role text, tenant_namespace text, tenant_owner_uid text,
                                                  password_verifier text, password_digest text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOCK TABLE hookline.tenants IN SHARE ROW EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = tenant_role) THEN
        EXECUTE format('CREATE ROLE %I LOGIN NOINHERIT', tenant_role);
    END IF;
    EXECUTE format('ALTER ROLE %I LOGIN PASSWORD %L', tenant_role, password_verifier);
    -- Nothing about the tenant in pg_roles, which every role reads.
    EXECUTE format('COMMENT ON ROLE %I IS NULL', tenant_role);
    PERFORM hookline.grant_tenant_privileges(tenant_role);
    INSERT INTO hookline.tenants (role_name, namespace, owner_uid, password_sha256)
    VALUES (tenant_role, tenant_namespace, tenant_owner_uid, password_digest)
    ON CONFLICT (role_name) DO UPDATE SET password_sha256 = EXCLUDED.password_sha256;
END $$;

CREATE OR REPLACE FUNCTION hookline.drop_tenant(tenant_role text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOCK TABLE hookline.tenants IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM hookline.tenants WHERE role_name = tenant_role;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = tenant_role) THEN
        RETURN true;
    END IF;
    EXECUTE format('ALTER ROLE %I NOLOGIN', tenant_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA hookline FROM %I', tenant_role);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA hookline FROM %I', tenant_role);
    EXECUTE format('REVOKE ALL ON SCHEMA hookline FROM %I', tenant_role);
    BEGIN
        EXECUTE format('DROP ROLE %I', tenant_role);
    EXCEPTION WHEN dependent_objects_still_exist THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- 4. Retention no provider can switch off for the install. expire_inbox dropped a whole
-- partition only once the LONGEST doneHours of all providers had passed, and a dead letter
-- kept its partition for its provider's deadDays: one spec with doneHours 87,600 kept
-- every team's events for ten years. Each provider's retention is now bounded by the
-- install's maximum (core/partitions.py, chart retention.maxDoneHours / maxDeadDays), and
-- the default partition, which no drop ever reaches, is cleaned by the same batch deletes.
CREATE FUNCTION hookline.bounded_retention(spec jsonb, field text, unit interval, fallback interval,
                                           maximum interval)
RETURNS interval LANGUAGE sql IMMUTABLE
RETURN least(hookline.retention(spec, field, unit, fallback), maximum);

DROP FUNCTION hookline.expire_inbox(interval, interval, integer, interval);
DROP FUNCTION hookline.inbox_partition_survivors(text, interval);

CREATE FUNCTION hookline.inbox_partition_survivors(part text, dead_default interval, dead_max interval)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found boolean;
BEGIN
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM %1$s WHERE status IN (''pending'', ''processing''))
             OR EXISTS (SELECT 1 FROM %1$s AS d LEFT JOIN hookline.providers AS pr ON pr.name = d.provider
                        WHERE d.status = ''dead''
                          AND d.processed_at > now() - hookline.bounded_retention(pr.spec, ''deadDays'', ''1 day'',
                                                                                  $1, $2))',
        part) INTO found USING dead_default, dead_max;
    RETURN found;
END $$;

CREATE FUNCTION hookline.expire_inbox(done_default interval, dead_default interval, batch integer,
                                      lock_wait interval, done_max interval, dead_max interval)
RETURNS TABLE (action text, target text, affected bigint) LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    longest_done  interval;
    shortest_done interval;
    part          record;
    n             bigint;
BEGIN
    SELECT least(greatest(done_default, max(hookline.retention(spec, 'doneHours', '1 hour', done_default))), done_max),
           least(done_default, min(hookline.retention(spec, 'doneHours', '1 hour', done_default)), done_max)
    INTO longest_done, shortest_done FROM hookline.providers;
    FOR part IN SELECT * FROM hookline.partitions('hookline.inbox') AS p
                WHERE NOT p.is_default AND p.upper_bound <= now() - longest_done LOOP
        CONTINUE WHEN hookline.inbox_partition_survivors(part.name, dead_default, dead_max);
        action := hookline.drop_partition('hookline.inbox', part.name, lock_wait,
                                          format('SELECT NOT hookline.inbox_partition_survivors($1, $2, %L)', dead_max),
                                          dead_default);
        target := part.name;
        affected := CASE WHEN action = 'kept' THEN hookline.inbox_partition_kept(part.name) ELSE 0 END;
        IF action = 'dropped' THEN
            affected := hookline.last_partition_rows();
        END IF;
        RETURN NEXT;
        CONTINUE WHEN action = 'drop_deferred';
        RETURN;  -- one drop per transaction
    END LOOP;
    -- The partitions old enough for some provider's rows, and the default partition, whose rows
    -- are judged by their own times (it holds whatever fell outside the premade partitions).
    FOR part IN SELECT * FROM hookline.partitions('hookline.inbox') AS p
                WHERE p.is_default OR p.upper_bound <= now() - shortest_done LOOP
        IF NOT part.is_default AND part.upper_bound <= now() - longest_done THEN
            action := 'kept'; target := part.name; affected := hookline.inbox_partition_kept(part.name);
            RETURN NEXT;
        END IF;
        EXECUTE format(
            'WITH doomed AS (
                 SELECT e.ctid FROM %1$s AS e LEFT JOIN hookline.providers AS pr ON pr.name = e.provider
                 WHERE (e.status = ''done'' AND coalesce(%2$L::timestamptz, greatest(e.received_at, e.processed_at))
                                                <= now() - hookline.bounded_retention(pr.spec, ''doneHours'', ''1 hour'',
                                                                                      $1, $4))
                    OR (e.status = ''dead'' AND e.processed_at
                                                <= now() - hookline.bounded_retention(pr.spec, ''deadDays'', ''1 day'',
                                                                                      $2, $5))
                 LIMIT $3
             ), gone AS (DELETE FROM %1$s AS e USING doomed WHERE e.ctid = doomed.ctid RETURNING 1)
             SELECT count(*) FROM gone', part.name, part.upper_bound)
            INTO n USING done_default, dead_default, batch, done_max, dead_max;
        IF n > 0 THEN
            action := 'deleted'; target := part.name; affected := n;
            RETURN NEXT;
        END IF;
    END LOOP;
    SELECT count(*) INTO n FROM (SELECT 1 FROM hookline.inbox_default LIMIT 10000) AS d;
    IF n > 0 THEN
        action := 'default_rows'; target := 'hookline.inbox_default'; affected := n;
        RETURN NEXT;
    END IF;
END $$;

-- 5. Every other function pins its search path. (The SQL-standard bodies above need none;
-- the owner's-rights functions of 0006-0024 already pin theirs.)
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'hookline'::regnamespace AND p.prosqlbody IS NULL
               AND NOT coalesce(p.proconfig, '{}') && ARRAY['search_path=pg_catalog, pg_temp'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END $$;

-- 6. The functions created above are not PUBLIC's either; existing tenants converge. The two
-- lookups the row-level security policies call stay PUBLIC's: a policy runs them for whichever
-- role reads the table (a reporting role the owner granted SELECT, say), and they tell a role
-- only its own namespace and providers.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA hookline FROM PUBLIC;
GRANT EXECUTE ON FUNCTION hookline.tenant_namespace(), hookline.tenant_providers() TO PUBLIC;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tn.role_name FROM hookline.tenants AS tn
             JOIN pg_catalog.pg_roles AS r ON r.rolname = tn.role_name LOOP
        PERFORM hookline.grant_tenant_privileges(t.role_name);
        BEGIN
            EXECUTE format('COMMENT ON ROLE %I IS NULL', t.role_name);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'could not clear the comment on role %: the operator clears it when it next converges the role',
                t.role_name;
        END;
    END LOOP;
END $$;
