-- Hookline schema, version 31: rate limits per endpoint that hold across relays, and a breaker
-- that slows an endpoint which is alive but fails often instead of starving it (issue 29).
--
-- rate_per_second / rate_burst: a token bucket on the endpoint's row, refilled by the database's
-- clock and taken by each relay in the transaction of its claim (outbox.sql take_tokens), so all
-- relays together send at most burst at once and perSecond on average. max_in_flight: at most
-- this many of its deliveries are 'processing' at once, over all relays (a relay that dies holds
-- its slots until the sweep requeues its leases). All NULL: unlimited, claimed as before.
-- A 429 halves the rate it gets (throttle_factor) and stops the bucket until its Retry-After
-- (throttled_until); the factor grows back to 1 over the next minute (hookline.throttle_factor).
ALTER TABLE hookline.endpoints
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst >= 1),
    ADD COLUMN max_in_flight integer CHECK (max_in_flight >= 1),
    ADD COLUMN rate_tokens double precision,
    ADD COLUMN rate_updated_at timestamptz,
    ADD COLUMN throttled_at timestamptz,
    ADD COLUMN throttled_until timestamptz,
    ADD COLUMN throttled_factor double precision NOT NULL DEFAULT 1 CHECK (throttled_factor > 0 AND throttled_factor <= 1),
    -- Openings in a row, without half a window closed between: the wait before the next probe
    -- doubles with each, from 1 s up to --breaker-probe-interval (relay/breaker.py).
    ADD COLUMN circuit_openings integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT endpoints_rate_limit_whole CHECK ((rate_per_second IS NULL) = (rate_burst IS NULL));

-- The share of its rate a throttled endpoint gets back: the factor a 429 left, climbing linearly
-- to the whole rate over the minute after its Retry-After ended.
CREATE FUNCTION hookline.throttle_factor(factor double precision, since timestamptz, now timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE
RETURN CASE WHEN since IS NULL OR since >= now THEN factor
            ELSE least(1.0, factor + (1.0 - factor) * extract(epoch FROM now - since) / 60.0) END;
REVOKE EXECUTE ON FUNCTION hookline.throttle_factor(double precision, timestamptz, timestamptz) FROM PUBLIC;

-- Relays re-read their endpoints when a limit changes.
DROP TRIGGER endpoints_changed ON hookline.endpoints;
CREATE TRIGGER endpoints_changed
    AFTER INSERT OR DELETE OR UPDATE OF url, event_types, ordered, secrets, max_attempts, initial_delay_seconds,
        max_delay_seconds, timeout_seconds, enabled, paused, rate_per_second, rate_burst, max_in_flight OR TRUNCATE
    ON hookline.endpoints FOR EACH STATEMENT EXECUTE FUNCTION hookline.endpoints_changed();
