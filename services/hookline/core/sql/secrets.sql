-- Every column that holds a signing secret sealed at rest (core/secrets_at_rest.py), for
-- sealing plaintext in place and re-wrapping under a new key (core/stored_secrets.py), loaded
-- by hookline.core.db.query(name, "secrets.sql"). Rows are locked while they are rewritten:
-- concurrent runs take turns, and the later one finds nothing left to do. Secrets as text, so
-- that a connection with or without a jsonb codec reads and writes them alike.

-- name: lock_provider_secrets
SELECT name, secrets::text AS secrets, destination_secret FROM hookline.providers ORDER BY name FOR UPDATE;

-- name: set_provider_secrets
UPDATE hookline.providers SET secrets = $2::text::jsonb, destination_secret = $3 WHERE name = $1;

-- name: lock_endpoint_secrets
-- The signing secrets and the egress (its secret values sealed: relay/egress.py).
SELECT name, secrets::text AS secrets, egress::text AS egress FROM hookline.endpoints ORDER BY name FOR UPDATE;

-- name: set_endpoint_secrets
UPDATE hookline.endpoints SET secrets = $2::text::jsonb, egress = $3::text::jsonb WHERE name = $1;

-- name: count_plaintext_secrets
-- Values from before encryption at rest (not in the sealed format, whose prefix is hl1:).
SELECT (SELECT count(*) FROM hookline.providers AS p, jsonb_array_elements(p.secrets) AS s
        WHERE s->>'value' NOT LIKE 'hl1:%')
     + (SELECT count(*) FROM hookline.providers WHERE destination_secret NOT LIKE 'hl1:%')
     + (SELECT count(*) FROM hookline.endpoints AS e, jsonb_array_elements(e.secrets) AS s
        WHERE s->>'value' NOT LIKE 'hl1:%');
