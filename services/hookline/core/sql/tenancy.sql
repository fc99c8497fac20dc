-- What the operator runs to give each WebhookProvider's workers their own, row-limited
-- Postgres role (see migrations/0006_tenants_and_budget.sql), loaded by
-- hookline.core.db.query(name, "tenancy.sql").

-- name: ensure_tenant
-- $1 role, $2 namespace, $3 the WebhookProvider's uid, $4 SCRAM-SHA-256 verifier,
-- $5 SHA-256 of the password (recorded to notice when the Secret holds another one).
SELECT hookline.ensure_tenant($1, $2, $3, $4, $5);

-- name: drop_tenant
SELECT hookline.drop_tenant(role_name) FROM hookline.tenants WHERE owner_uid = $1;

-- name: destination_secret
-- The secret the worker signs destination calls with, for the row this resource owns.
SELECT destination_secret FROM hookline.providers WHERE name = $1 AND owner_uid = $2;

-- name: tenant_ready
-- The role exists, may log in, is registered and was last given the password whose
-- SHA-256 is $2 (the one in its Secret): nothing to converge.
SELECT EXISTS (SELECT 1 FROM hookline.tenants AS t JOIN pg_roles AS r ON r.rolname = t.role_name
               WHERE t.role_name = $1 AND r.rolcanlogin AND t.password_sha256 = $2);
