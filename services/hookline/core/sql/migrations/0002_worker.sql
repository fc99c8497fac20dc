-- Hookline schema, version 2: what the worker needs beyond the inbox.

-- Per-entity state for providers with spec.ordering. It changes in the same
-- transaction as the event that moves it, so state and "done" never disagree.
CREATE TABLE hookline.entity_states (
    provider    text NOT NULL,
    entity_key  text NOT NULL,
    state       text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, entity_key)
);

-- Deferred events of one entity are released together when a predecessor applies.
CREATE INDEX inbox_deferred_idx ON hookline.inbox (provider, entity_key)
    WHERE status = 'pending' AND deferred_since IS NOT NULL;

-- The Standard Webhooks secret the worker signs destination calls with, so the
-- internal service can verify that a call came from Hookline. Generated on first
-- apply and kept across re-applies.
ALTER TABLE hookline.providers ADD COLUMN destination_secret text;
