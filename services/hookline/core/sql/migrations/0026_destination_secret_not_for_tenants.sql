-- Signing secrets are encrypted at rest (core/secrets_at_rest.py; `hookline migrate` seals the
-- plaintext of older versions in place, in Python: Postgres never holds the key). A tenant's
-- workers hold no key either: the operator mounts their destination signing secret from the
-- Secret it mirrors it into (HOOKLINE_DESTINATION_SECRET_FILE), so they need no secret column,
-- and the ciphertext is theirs to read no longer. Revoked from every tenant role, whatever it
-- was granted before (a column privilege not held is a no-op to revoke).
DO $$
DECLARE
    tenant record;
BEGIN
    FOR tenant IN SELECT t.role_name FROM hookline.tenants AS t
                  JOIN pg_catalog.pg_roles AS r ON r.rolname = t.role_name LOOP
        EXECUTE format('REVOKE SELECT (destination_secret) ON hookline.providers FROM %I', tenant.role_name);
    END LOOP;
END $$;
