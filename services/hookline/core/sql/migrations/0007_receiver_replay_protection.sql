-- Opt-in replay protection (spec.replayProtection.bodyHashWindowSeconds) for schemes whose
-- event id is not signed and that carry no signed timestamp (GitHub, Shopify): the first event
-- id seen with each body, remembered until expires_at. A replay of a captured request under a
-- new delivery id finds the hash and is answered as a duplicate of that first event.
CREATE TABLE hookline.inbox_body_hashes (
    provider     text NOT NULL,
    body_sha256  bytea NOT NULL,
    event_id     text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (provider, body_sha256)
);

-- Receivers delete expired hashes periodically.
CREATE INDEX inbox_body_hashes_expires_idx ON hookline.inbox_body_hashes (expires_at);
