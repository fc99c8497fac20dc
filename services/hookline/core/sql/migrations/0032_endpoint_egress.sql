-- Hookline schema, version 32: egress per endpoint (relay/egress.py): its own CONNECT proxy or none
-- (direct although the install has one), a client certificate with its key and a CA bundle to verify
-- it by, and OAuth2 client credentials whose token the relay sends as a bearer token.
--
-- One jsonb object: the non-secret fields in clear (the proxy's URL, the certificates, the token URL,
-- the client id), each secret value sealed (core/secrets_at_rest.py, in the context
-- hookline.endpoints.egress[<endpoint>].<field>). NULL: the install's egress, as before.
-- No tenant or console role is granted the column (their grants name columns): default-deny.
ALTER TABLE hookline.endpoints
    ADD COLUMN egress jsonb CONSTRAINT endpoints_egress_object CHECK (jsonb_typeof(egress) = 'object');
COMMENT ON COLUMN hookline.endpoints.egress IS
    'The endpoint''s own egress (proxy, client TLS, OAuth2), secret values sealed; NULL: the install''s.';

-- Relays re-read their endpoints when an endpoint's egress changes.
DROP TRIGGER endpoints_changed ON hookline.endpoints;
CREATE TRIGGER endpoints_changed
    AFTER INSERT OR DELETE OR UPDATE OF url, event_types, ordered, secrets, max_attempts, initial_delay_seconds,
        max_delay_seconds, timeout_seconds, enabled, paused, rate_per_second, rate_burst, max_in_flight, egress
        OR TRUNCATE
    ON hookline.endpoints FOR EACH STATEMENT EXECUTE FUNCTION hookline.endpoints_changed();
