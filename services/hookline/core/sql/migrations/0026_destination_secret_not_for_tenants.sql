-- Hookline schema, version 26: signing secrets encrypted at rest (issue 23).
--
-- Every secret column now holds ciphertext sealed with keys Postgres never sees
-- (core/secrets_at_rest.py); `hookline migrate` seals the plaintext of older versions in
-- place, in Python (core/stored_secrets.py). A tenant's workers hold no key: the operator
-- mounts their destination signing secret from the Secret it mirrors it into
-- (HOOKLINE_DESTINATION_SECRET_FILE), so they read no secret column, and may read none:
-- destination_secret leaves the columns 0025 grants them. CREATE OR REPLACE keeps the
-- function's privileges (none for PUBLIC, 0025).
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
END $$;

-- Existing tenants converge (the operator's next ensure_tenant would, too).
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tn.role_name FROM hookline.tenants AS tn
             JOIN pg_catalog.pg_roles AS r ON r.rolname = tn.role_name LOOP
        PERFORM hookline.grant_tenant_privileges(t.role_name);
    END LOOP;
END $$;
