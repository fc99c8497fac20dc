-- Hookline schema, version 9: the relay's circuit breaker opens on a failure rate
-- and closes after successful probes (see hookline/relay/breaker.py).
--
-- Every relay reads and writes these columns under the endpoint's row lock, so
-- they agree on each endpoint's state and exactly one of them makes each
-- transition. circuit_open_until keeps its column and now means "no probe starts
-- before this": while open, the end of the wait; while half-open, the hold of the
-- probe in flight (NULL: the next probe may start). consecutive_failures stays, for
-- `hookline endpoints list`; it no longer opens the circuit.
ALTER TABLE hookline.endpoints
    ADD COLUMN circuit_state text NOT NULL DEFAULT 'closed'
        CHECK (circuit_state IN ('closed', 'open', 'half_open')),
    ADD COLUMN circuit_changed_at timestamptz,
    -- The failure-rate window, in two halves: the current one started at
    -- window_started_at, the previous one right before it.
    ADD COLUMN window_started_at timestamptz,
    ADD COLUMN window_successes integer NOT NULL DEFAULT 0,
    ADD COLUMN window_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN previous_successes integer NOT NULL DEFAULT 0,
    ADD COLUMN previous_failures integer NOT NULL DEFAULT 0,
    -- Probe outcomes since the circuit went half-open.
    ADD COLUMN probe_successes integer NOT NULL DEFAULT 0,
    ADD COLUMN probe_failures integer NOT NULL DEFAULT 0;

-- Circuits the old rule left open stay open: their next probe decides.
UPDATE hookline.endpoints SET circuit_state = 'open', circuit_changed_at = now()
WHERE circuit_open_until IS NOT NULL;

-- The relay claims due retries before first attempts (claim_deliveries in
-- outbox.sql): this finds them without reading past an endpoint's never-tried
-- backlog, which sorts first in the claimable index.
CREATE INDEX deliveries_retry_idx ON hookline.deliveries (endpoint, next_attempt_at, id)
    WHERE status = 'pending' AND attempts > 0;
