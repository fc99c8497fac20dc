-- Hookline schema, version 1: the provider registry and the inbox.

CREATE TABLE hookline.providers (
    name        text PRIMARY KEY,
    -- The WebhookProvider spec without secret values, exactly as applied.
    spec        jsonb NOT NULL,
    -- [{"value": "...", "notAfter": null | RFC 3339}], kept apart from spec so that
    -- listing or logging a spec can never leak a secret.
    secrets     jsonb NOT NULL DEFAULT '[]',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Services cache providers in memory; this tells them to re-read at once. Per
-- row, so that an upsert that changes nothing (the operator re-syncs on a timer)
-- wakes nobody.
CREATE FUNCTION hookline.providers_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hookline_providers', coalesce(NEW.name, OLD.name));
    RETURN NULL;
END $$;

CREATE TRIGGER providers_changed
    AFTER INSERT OR UPDATE OR DELETE ON hookline.providers
    FOR EACH ROW EXECUTE FUNCTION hookline.providers_changed();

CREATE TABLE hookline.inbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider          text NOT NULL,
    event_id          text NOT NULL,
    event_type        text,
    entity_key        text,
    received_at       timestamptz NOT NULL DEFAULT now(),
    headers           jsonb NOT NULL DEFAULT '{}',
    -- The body exactly as received: signatures are computed over these bytes.
    body              bytea NOT NULL,
    content_type      text,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'processing', 'done', 'dead')),
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz,
    locked_by         text,
    last_error        text,
    processed_at      timestamptz,
    -- Set while an ordered event waits for its predecessor; deferrals are not attempts.
    deferred_since    timestamptz,
    CONSTRAINT inbox_provider_event_id_key UNIQUE (provider, event_id)
);

-- The claim query is, per provider:
--   WHERE status = 'pending' AND provider = $1 AND next_attempt_at <= now()
--   ORDER BY next_attempt_at, id LIMIT n FOR UPDATE SKIP LOCKED
-- A partial index over exactly the claimable rows, in exactly that order, lets
-- Postgres read the first n entries and stop: no sort, and done/dead rows (the
-- vast majority over time) never enter the index, so it stays small however
-- large the table grows. Workers claim one provider at a time (round robin),
-- which keeps provider as the leading equality column and gives fairness.
CREATE INDEX inbox_claimable_idx ON hookline.inbox (provider, next_attempt_at, id)
    WHERE status = 'pending';

-- The lease sweeper looks only at leased rows whose lease has run out.
CREATE INDEX inbox_leased_idx ON hookline.inbox (lease_expires_at)
    WHERE status = 'processing';

-- Dead letters are listed and replayed per provider; keep that cheap too.
CREATE INDEX inbox_dead_idx ON hookline.inbox (provider, id) WHERE status = 'dead';
