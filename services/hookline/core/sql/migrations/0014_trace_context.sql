-- Hookline schema, version 14: W3C trace context (hookline[otel], hookline/core/tracing.py).
--
-- The receiver stores the traceparent of its span with each event, in the stored
-- headers (as a proxy forwards it: no change to the ingest statement); the worker's
-- handler span continues it; an outbox event published inside that span stores the
-- handler's traceparent here; the relay's delivery span continues that and sends its
-- own to the endpoint. NULL when tracing is off (the extra not installed).
ALTER TABLE hookline.outbox ADD COLUMN traceparent text;

-- The publisher's trace context: the transaction-local setting hookline.traceparent
-- (hookline.outbox.publish sets it; producers in any language may run
-- SET LOCAL hookline.traceparent = '00-...'). Anything not shaped like a version-00
-- traceparent is ignored rather than stored.
CREATE FUNCTION hookline.current_traceparent() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN t ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN t END
    FROM (SELECT current_setting('hookline.traceparent', true) AS t) AS s
$$;

-- hookline.publish as in migration 0003, storing the publisher's trace context.
CREATE OR REPLACE FUNCTION hookline.publish(event_type text, payload jsonb, aggregate_type text DEFAULT NULL,
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
    INSERT INTO hookline.outbox (event_id, event_type, payload, aggregate_type, aggregate_id, endpoint,
                                 traceparent)
    VALUES (new_event, publish.event_type, publish.payload, publish.aggregate_type, publish.aggregate_id,
            publish.endpoint, hookline.current_traceparent())
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
