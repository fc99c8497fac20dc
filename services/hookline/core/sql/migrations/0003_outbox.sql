-- Hookline schema, version 3: the transactional outbox, its endpoints and deliveries.

CREATE TABLE hookline.endpoints (
    name                  text PRIMARY KEY,
    url                   text NOT NULL,
    -- Exact types, 'prefix.*' patterns, or '*' for everything.
    event_types           text[] NOT NULL DEFAULT '{*}',
    -- Ordered endpoints get one aggregate's events one at a time, in commit order.
    ordered               boolean NOT NULL DEFAULT false,
    -- [{"value": "whsec_...", "notAfter": null | RFC 3339}] like providers.secrets:
    -- every secret still valid signs (rotation), and it never leaves this column
    -- except to sign.
    secrets               jsonb NOT NULL DEFAULT '[]',
    max_attempts          integer NOT NULL DEFAULT 12 CHECK (max_attempts > 0),
    initial_delay_seconds float8 NOT NULL DEFAULT 5 CHECK (initial_delay_seconds >= 0),
    max_delay_seconds     float8 NOT NULL DEFAULT 3600 CHECK (max_delay_seconds >= 0),
    timeout_seconds       float8 NOT NULL DEFAULT 10 CHECK (timeout_seconds > 0),
    -- A 410 Gone disables the endpoint; its undelivered deliveries are parked.
    enabled               boolean NOT NULL DEFAULT true,
    disabled_at           timestamptz,
    disabled_reason       text,
    -- Circuit breaker, shared by every relay because it lives here: after
    -- `threshold` consecutive failures the circuit is open and relays only send
    -- one probe whenever circuit_open_until has passed (the relay that wins the
    -- UPDATE pushing it forward sends it). A success resets both columns.
    consecutive_failures  integer NOT NULL DEFAULT 0,
    circuit_open_until    timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now()
);

-- Relays cache endpoints; this tells them to re-read at once (rare, tiny writes).
CREATE FUNCTION hookline.endpoints_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hookline_endpoints', '');
    RETURN NULL;
END $$;

CREATE TRIGGER endpoints_changed
    AFTER INSERT OR DELETE OR TRUNCATE OR UPDATE OF url, event_types, ordered, secrets, max_attempts,
        initial_delay_seconds, max_delay_seconds, timeout_seconds, enabled ON hookline.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION hookline.endpoints_changed();

-- One row per published event. `id` orders events; `event_id` is the public,
-- stable id sent as webhook-id on every attempt to every endpoint.
CREATE TABLE hookline.outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text NOT NULL UNIQUE,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    aggregate_type  text,
    aggregate_id    text,
    endpoint        text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Retention walks events by age.
CREATE INDEX outbox_created_idx ON hookline.outbox (created_at);

-- One row per (event, endpoint): the queue the relay claims from (see core/sql/queue.sql).
CREATE TABLE hookline.deliveries (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id         bigint NOT NULL REFERENCES hookline.outbox (id) ON DELETE CASCADE,
    endpoint          text NOT NULL REFERENCES hookline.endpoints (name) ON DELETE CASCADE,
    -- aggregate_type:aggregate_id, the unit of ordering for ordered endpoints.
    aggregate_key     text,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'processing', 'done', 'dead', 'parked')),
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz,
    locked_by         text,
    last_error        text,
    processed_at      timestamptz,
    deferred_since    timestamptz,
    -- The last answer, for `dlq list` and whoever is debugging the endpoint.
    last_status       integer,
    last_response     text,
    last_latency_ms   float8,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT deliveries_event_endpoint_key UNIQUE (outbox_id, endpoint)
);

-- The claim query is, per endpoint:
--   WHERE status = 'pending' AND endpoint = $1 AND next_attempt_at <= now()
--   ORDER BY next_attempt_at, id LIMIT n FOR UPDATE SKIP LOCKED
-- A partial index over exactly the claimable rows in exactly that order lets
-- Postgres read the first n entries and stop: no sort, and delivered rows (almost
-- all of them, over time) never enter it, so it stays small as the table grows.
CREATE INDEX deliveries_claimable_idx ON hookline.deliveries (endpoint, next_attempt_at, id)
    WHERE status = 'pending';

-- The lease sweeper looks only at leased rows whose lease ran out.
CREATE INDEX deliveries_leased_idx ON hookline.deliveries (lease_expires_at)
    WHERE status = 'processing';

-- Dead letters are listed and replayed per endpoint.
CREATE INDEX deliveries_dead_idx ON hookline.deliveries (endpoint, id) WHERE status = 'dead';

-- Ordered claims ask "is there an older unfinished delivery of this aggregate
-- for this endpoint?" — one probe into this index per candidate.
CREATE INDEX deliveries_unfinished_aggregate_idx ON hookline.deliveries (endpoint, aggregate_key, id)
    WHERE status IN ('pending', 'processing', 'parked') AND aggregate_key IS NOT NULL;

-- Parked deliveries are found per endpoint when it is re-enabled.
CREATE INDEX deliveries_parked_idx ON hookline.deliveries (endpoint) WHERE status = 'parked';

CREATE FUNCTION hookline.event_type_matches(patterns text[], event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (
        SELECT 1 FROM unnest(patterns) AS p
        WHERE p = '*' OR p = event_type
           OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1)))
    )
$$;

-- Publish an event in the caller's transaction: it exists (and is delivered)
-- exactly when that transaction commits. Returns the event id (webhook-id).
--
-- Fan-out happens here, at publish time: one delivery per matching endpoint
-- (event_types match exactly or by 'prefix.*'; `endpoint` sends to that one
-- endpoint only, whatever its event types). A disabled endpoint's delivery is
-- created parked, so re-enabling it delivers what it missed. Endpoints created
-- later do not receive earlier events.
--
-- Ordering: events of one aggregate take a transaction-scoped advisory lock
-- before their id is drawn, so a second transaction publishing for the same
-- aggregate waits until the first commits or rolls back. Hence, per aggregate,
-- id order IS commit order, and a relay that sends an aggregate's deliveries in
-- id order sends them in commit order. (Producers usually hold a row lock on the
-- aggregate anyway; this costs them nothing new.)
CREATE FUNCTION hookline.publish(event_type text, payload jsonb, aggregate_type text DEFAULT NULL,
                                 aggregate_id text DEFAULT NULL, endpoint text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_id    bigint;
    new_event text;
    agg_key   text;
BEGIN
    IF publish.event_type IS NULL OR publish.event_type = '' THEN
        RAISE EXCEPTION 'hookline.publish: event_type is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF publish.payload IS NULL THEN
        RAISE EXCEPTION 'hookline.publish: payload is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF publish.endpoint IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM hookline.endpoints AS e WHERE e.name = publish.endpoint) THEN
        RAISE EXCEPTION 'hookline.publish: no endpoint named %', publish.endpoint
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF publish.aggregate_id IS NOT NULL THEN
        agg_key := coalesce(publish.aggregate_type, '') || ':' || publish.aggregate_id;
        PERFORM pg_advisory_xact_lock(hashtextextended('hookline.outbox/' || agg_key, 0));
    END IF;
    -- msg_ + 12 hex digits of milliseconds + 20 random hex digits: unique, and
    -- roughly time-sortable when read by a human.
    new_event := 'msg_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
                 || left(replace(gen_random_uuid()::text, '-', ''), 20);
    INSERT INTO hookline.outbox (event_id, event_type, payload, aggregate_type, aggregate_id, endpoint)
    VALUES (new_event, publish.event_type, publish.payload, publish.aggregate_type, publish.aggregate_id,
            publish.endpoint)
    RETURNING id INTO new_id;
    INSERT INTO hookline.deliveries (outbox_id, endpoint, aggregate_key, status)
    SELECT new_id, e.name, agg_key, CASE WHEN e.enabled THEN 'pending' ELSE 'parked' END
    FROM hookline.endpoints AS e
    WHERE CASE WHEN publish.endpoint IS NULL
               THEN hookline.event_type_matches(e.event_types, publish.event_type)
               ELSE e.name = publish.endpoint END
    ORDER BY e.name;
    -- Wakes idle relays at commit (never for a rollback). Identical notifications
    -- in one transaction are folded, so a batch of publishes sends one.
    PERFORM pg_notify('hookline_outbox', '');
    RETURN new_event;
END $$;
