-- Hookline schema, version 30: outgoing webhooks per namespace (issue 29).
--
-- Until now every endpoint was install-wide and every publish reached every endpoint whose
-- event types matched. Now an endpoint may belong to a namespace (a WebhookEndpoint resource,
-- reconciled by the operator), and so may an event:
--   * an endpoint of namespace N is stored under the name 'N/<resource name>' (a Kubernetes
--     namespace and a resource name hold no '/', the CLI's install-wide names never do), so
--     the one key every table, metric and log line already uses is qualified by namespace;
--   * an event published by a tenant (a WebhookProvider's workers, or the namespace's
--     publisher role the operator makes) belongs to the tenant's namespace and reaches only
--     that namespace's endpoints; the platform publishes install-wide events, or events of a
--     namespace it names;
--   * tenants read their namespace's endpoints (never their secrets), events and deliveries,
--     and write none of them: publishing is hookline.publish, with the owner's rights.

ALTER TABLE hookline.endpoints
    ADD COLUMN namespace text,
    ADD COLUMN resource_name text,
    ADD COLUMN owner_uid text,
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT endpoints_qualified_name CHECK (
        CASE WHEN namespace IS NULL THEN strpos(name, '/') = 0 AND resource_name IS NULL
             ELSE name = namespace || '/' || resource_name END);

COMMENT ON COLUMN hookline.endpoints.namespace IS
    'The Kubernetes namespace of the WebhookEndpoint this row is (NULL: an install-wide endpoint made with the CLI).';
COMMENT ON COLUMN hookline.endpoints.paused IS
    'Set by the user (spec.paused, `hookline endpoints pause`): its deliveries wait, nothing is parked or lost.';

-- Relays re-read their endpoints when one is paused or resumed.
DROP TRIGGER endpoints_changed ON hookline.endpoints;
CREATE TRIGGER endpoints_changed
    AFTER INSERT OR DELETE OR UPDATE OF url, event_types, ordered, secrets, max_attempts, initial_delay_seconds,
        max_delay_seconds, timeout_seconds, enabled, paused OR TRUNCATE
    ON hookline.endpoints FOR EACH STATEMENT EXECUTE FUNCTION hookline.endpoints_changed();

ALTER TABLE hookline.outbox ADD COLUMN namespace text;
COMMENT ON COLUMN hookline.outbox.namespace IS
    'The namespace the event was published in (NULL: install-wide); it reaches only that namespace''s endpoints.';

-- The key the aggregate lock of publish is hashed with. Advisory locks are not access-controlled:
-- with a key anyone can compute, any role could hold another team's aggregate and stall its
-- publishes. Seeded with a value only the owner can read, the keys cannot be aimed at.
CREATE TABLE hookline.outbox_lock_seed (
    seed bigint NOT NULL,
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row)
);
INSERT INTO hookline.outbox_lock_seed (seed)
VALUES (('x' || left(replace(gen_random_uuid()::text, '-', ''), 16))::bit(64)::bigint);

-- Definer's rights: a tenant may publish without any privilege on the tables, and the
-- namespace comes from its login (session_user, through tenant_namespace), never from it.
-- A tenant naming another namespace is refused; the platform (any role that is not a
-- tenant and was granted EXECUTE) may name one. `endpoint` is a name within the event's
-- namespace. EXECUTE stays revoked from PUBLIC (0025); tenants get it in
-- grant_tenant_privileges below.
-- A new argument is a new function: the roles granted EXECUTE on the old one (producers
-- outside the tenants, README "The tenant boundary in Postgres") keep it on the new one.
CREATE TEMPORARY TABLE publish_grantees ON COMMIT DROP AS
SELECT DISTINCT a.grantee::regrole::text AS grantee
FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
WHERE p.oid = 'hookline.publish(text, jsonb, text, text, text)'::regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;
DROP FUNCTION hookline.publish(text, jsonb, text, text, text);
CREATE FUNCTION hookline.publish(event_type text, payload jsonb, aggregate_type text DEFAULT NULL,
                                 aggregate_id text DEFAULT NULL, endpoint text DEFAULT NULL,
                                 namespace text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    tenant      text := hookline.tenant_namespace();
    event_ns    text := coalesce(tenant, publish.namespace);
    target      text;
    new_id      bigint;
    new_event   text;
    agg_key     text;
    published   timestamptz;
BEGIN
    IF publish.event_type IS NULL OR publish.event_type = '' THEN
        RAISE EXCEPTION 'hookline.publish: event_type is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF publish.payload IS NULL THEN
        RAISE EXCEPTION 'hookline.publish: payload is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tenant IS NOT NULL AND publish.namespace IS DISTINCT FROM NULL AND publish.namespace <> tenant THEN
        RAISE EXCEPTION 'hookline.publish: this login publishes in namespace %, not %', tenant, publish.namespace
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF publish.endpoint IS NOT NULL THEN
        target := CASE WHEN event_ns IS NULL THEN publish.endpoint ELSE event_ns || '/' || publish.endpoint END;
        IF NOT EXISTS (SELECT 1 FROM hookline.endpoints AS e WHERE e.name = target) THEN
            RAISE EXCEPTION 'hookline.publish: no endpoint named % in %', publish.endpoint,
                coalesce('namespace ' || event_ns, 'the install-wide endpoints')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF publish.aggregate_id IS NOT NULL THEN
        agg_key := coalesce(publish.aggregate_type, '') || ':' || publish.aggregate_id;
        PERFORM pg_advisory_xact_lock(hashtextextended(
            'hookline.outbox/' || coalesce(event_ns, '') || '/' || agg_key,
            (SELECT s.seed FROM hookline.outbox_lock_seed AS s)));
    END IF;
    -- msg_ + 12 hex digits of milliseconds + 20 random hex digits: unique, and
    -- roughly time-sortable when read by a human.
    new_event := 'msg_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
                 || left(replace(gen_random_uuid()::text, '-', ''), 20);
    INSERT INTO hookline.outbox (event_id, event_type, payload, aggregate_type, aggregate_id, endpoint,
                                 traceparent, namespace)
    VALUES (new_event, publish.event_type, publish.payload, publish.aggregate_type, publish.aggregate_id,
            target, hookline.current_traceparent(), event_ns)
    RETURNING id, created_at INTO new_id, published;
    INSERT INTO hookline.deliveries (outbox_id, endpoint, aggregate_key, status, created_at)
    SELECT new_id, e.name, agg_key, CASE WHEN e.enabled THEN 'pending' ELSE 'parked' END, published
    FROM hookline.endpoints AS e
    WHERE e.namespace IS NOT DISTINCT FROM event_ns
      AND CASE WHEN target IS NULL
               THEN hookline.event_type_matches(e.event_types, publish.event_type)
               ELSE e.name = target END
    ORDER BY e.name;
    -- Wakes idle relays at commit (never for a rollback). Identical notifications
    -- in one transaction are folded, so a batch of publishes sends one.
    PERFORM pg_notify('hookline_outbox', '');
    RETURN new_event;
END $$;
REVOKE EXECUTE ON FUNCTION hookline.publish(text, jsonb, text, text, text, text) FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT grantee FROM pg_temp.publish_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.publish(text, jsonb, text, text, text, text) TO %s',
                       g.grantee);
    END LOOP;
END $$;

-- What a tenant reads of the outbox: its namespace's rows, restricted on top of every other
-- policy (as_before, the console's). Roles that are not tenants see what they saw before, with
-- the plans they had: "(SELECT tenant_namespace() IS NULL)" is one boolean the planner guesses
-- true half the time, where "(SELECT ...) IS NULL OR ..." was guessed to keep 1 row in 100,
-- which turned the console's walks down the deliveries' key into sorts of whole partitions.
CREATE POLICY tenant_endpoints ON hookline.endpoints AS RESTRICTIVE
    USING ((SELECT hookline.tenant_namespace() IS NULL) OR namespace = (SELECT hookline.tenant_namespace()));
CREATE POLICY tenant_outbox ON hookline.outbox AS RESTRICTIVE
    USING ((SELECT hookline.tenant_namespace() IS NULL) OR namespace = (SELECT hookline.tenant_namespace()));
-- A delivery's endpoint name starts with its namespace and a '/' (the '/' keeps 'team' from
-- matching 'team-a/...').
CREATE POLICY tenant_deliveries ON hookline.deliveries AS RESTRICTIVE
    USING ((SELECT hookline.tenant_namespace() IS NULL)
           OR starts_with(endpoint, (SELECT hookline.tenant_namespace()) || '/'));

-- A tenant's privileges, now with the outbox: reads of its namespace's endpoints (no secret
-- column), events and deliveries, and publish. Nothing of the outbox is writable to it.
CREATE OR REPLACE FUNCTION hookline.grant_tenant_privileges(tenant_role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA hookline TO %I', tenant_role);
    EXECUTE format('REVOKE ALL ON hookline.providers, hookline.inbox, hookline.entity_states, hookline.endpoints, '
                   'hookline.outbox, hookline.deliveries FROM %I', tenant_role);
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
    EXECUTE format('GRANT SELECT (name, namespace, resource_name, url, event_types, ordered, enabled, paused, '
                   'disabled_at, disabled_reason, circuit_state, circuit_changed_at) ON hookline.endpoints TO %I',
                   tenant_role);
    EXECUTE format('GRANT SELECT ON hookline.outbox, hookline.deliveries TO %I', tenant_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION hookline.publish(text, jsonb, text, text, text, text) TO %I',
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

-- The install-wide and each namespace's endpoints are looked up by namespace at every publish.
CREATE INDEX endpoints_namespace_idx ON hookline.endpoints (namespace);
