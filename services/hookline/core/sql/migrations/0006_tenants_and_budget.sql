-- Hookline schema, version 6: what a namespace can reach, and the workers' connection budget.
--
-- Tenants. The operator gives every WebhookProvider's workers their own Postgres
-- role (LOGIN, a generated password) and writes that role's URL into a Secret it
-- owns in the provider's namespace; the worker pods there connect with it.
-- Row-level security limits such a role to the rows of providers whose
-- owner_namespace is its namespace: inbox events, entity states and provider rows
-- (with their secrets) of other namespaces are invisible to it and cannot be
-- changed. The full credential stays in the release namespace, with the receiver,
-- relay and operator.
--
-- The tables' owner (the role that ran the migrations, which the services use)
-- bypasses row-level security, so the hot paths run exactly as before. Roles that
-- are not tenants keep seeing every row their table privileges allow (the
-- "not a tenant" arm of each policy), so enabling RLS changes nothing for them.

CREATE TABLE hookline.tenants (
    role_name   text PRIMARY KEY,
    namespace   text NOT NULL,
    -- The WebhookProvider whose workers log in as this role.
    owner_uid   text NOT NULL UNIQUE,
    -- SHA-256 of the password the role was last given (never the password): the operator
    -- re-applies the password in the role's Secret whenever this differs.
    password_sha256  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The session's namespace when it logged in as a tenant; NULL for every other role.
-- Definer's rights, so that no role needs to read hookline.tenants (a service
-- running as a role other than the tables' owner keeps working); session_user,
-- because inside such a function current_user is the function's owner. A tenant
-- cannot change its session_user. Policies call it as
-- (SELECT hookline.tenant_namespace()), which Postgres evaluates once per statement.
-- PL/pgSQL rather than SQL: its statement plans are cached for the session, where a
-- SQL function that cannot be inlined is planned again on every call.
CREATE FUNCTION hookline.tenant_namespace() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT t.namespace FROM hookline.tenants AS t WHERE t.role_name = session_user);
END $$;

-- tenant_providers() looks a namespace's providers up once per statement.
CREATE INDEX providers_owner_namespace_idx ON hookline.providers (owner_namespace)
    WHERE owner_namespace IS NOT NULL;

ALTER TABLE hookline.providers ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_providers ON hookline.providers
    USING ((SELECT hookline.tenant_namespace()) IS NULL
           OR owner_namespace = (SELECT hookline.tenant_namespace()));

-- Events and entity states belong to a provider name; a tenant reaches those of
-- its namespace's providers. The names come from a definer's-rights function, so
-- that roles that are not tenants need no access to hookline.providers.
CREATE FUNCTION hookline.tenant_providers() RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tenant text := (SELECT t.namespace FROM hookline.tenants AS t WHERE t.role_name = session_user);
BEGIN
    IF tenant IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT array_agg(p.name) FROM hookline.providers AS p WHERE p.owner_namespace = tenant), '{}');
END $$;

ALTER TABLE hookline.inbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_events ON hookline.inbox
    USING ((SELECT hookline.tenant_providers()) IS NULL
           OR provider = ANY ((SELECT hookline.tenant_providers())::text[]));

ALTER TABLE hookline.entity_states ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_entity_states ON hookline.entity_states
    USING ((SELECT hookline.tenant_providers()) IS NULL
           OR provider = ANY ((SELECT hookline.tenant_providers())::text[]));

-- Create (or converge) a tenant's role: login with the given SCRAM verifier (the
-- operator hashes the password itself, so the cleartext never reaches the server
-- or its logs) and exactly the privileges a worker needs. Runs with the caller's
-- rights: the operator's role needs CREATEROLE.
CREATE FUNCTION hookline.ensure_tenant(tenant_role text, tenant_namespace text, tenant_owner_uid text,
                                       password_verifier text, password_digest text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- One at a time: concurrent GRANTs on one table fail with "tuple concurrently updated".
    PERFORM pg_advisory_xact_lock(hashtextextended('hookline.tenants', 0));
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = tenant_role) THEN
        EXECUTE format('CREATE ROLE %I LOGIN NOINHERIT', tenant_role);
    END IF;
    EXECUTE format('ALTER ROLE %I LOGIN PASSWORD %L', tenant_role, password_verifier);
    EXECUTE format('COMMENT ON ROLE %I IS %L', tenant_role,
                   format('Hookline workers of WebhookProvider uid %s in namespace %s, database %s',
                          tenant_owner_uid, tenant_namespace, current_database()));
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', tenant_role);
    EXECUTE format('GRANT SELECT ON hookline.providers TO %I', tenant_role);
    EXECUTE format('GRANT SELECT, UPDATE ON hookline.inbox TO %I', tenant_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON hookline.entity_states TO %I', tenant_role);
    INSERT INTO hookline.tenants (role_name, namespace, owner_uid, password_sha256)
    VALUES (tenant_role, tenant_namespace, tenant_owner_uid, password_digest)
    ON CONFLICT (role_name) DO UPDATE SET password_sha256 = EXCLUDED.password_sha256;
END $$;

-- Remove a tenant's role once its WebhookProvider is gone. It can no longer log in
-- in any case; it is dropped unless someone granted it more (e.g. a team's own
-- tables), which is then left for whoever granted it.
CREATE FUNCTION hookline.drop_tenant(tenant_role text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('hookline.tenants', 0));
    DELETE FROM hookline.tenants WHERE role_name = tenant_role;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = tenant_role) THEN
        RETURN true;
    END IF;
    EXECUTE format('ALTER ROLE %I NOLOGIN', tenant_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA hookline FROM %I', tenant_role);
    EXECUTE format('REVOKE ALL ON SCHEMA hookline FROM %I', tenant_role);
    BEGIN
        EXECUTE format('DROP ROLE %I', tenant_role);
    EXCEPTION WHEN dependent_objects_still_exist THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- The workers' connection budget (chart value database.maxConnections). One row per
-- worker Deployment the operator manages, keyed by its WebhookProvider's uid:
-- `wanted` is what scaling asks for, `replicas` what the Deployment is set to.
-- Grants are decided over all rows under one lock, so providers that compete for
-- the budget get fair shares and the sum of replicas x connections never passes it.
CREATE TABLE hookline.worker_allocations (
    owner_uid               text PRIMARY KEY,
    owner_namespace         text NOT NULL,
    owner_name              text NOT NULL,
    wanted                  integer NOT NULL CHECK (wanted >= 0),
    replicas                integer NOT NULL CHECK (replicas >= 0),
    connections_per_replica integer NOT NULL CHECK (connections_per_replica > 0),
    seen_at                 timestamptz NOT NULL DEFAULT now()
);
