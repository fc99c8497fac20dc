-- Hookline schema, version 8: crash isolation.
--
-- A row whose last attempt ended in an expired lease (its consumer died, was
-- killed or stalled) is a suspect: it may be what killed the consumer. The lease
-- sweeper sets the flag on every row it takes back; normal claims skip suspects,
-- and a consumer claims a suspect only when nothing else is in flight in it, and
-- alone, so the next crash costs attempts only to the row that causes it. A
-- completion ("done") clears the flag. Adding a column with a constant default
-- rewrites nothing (Postgres 11+).
ALTER TABLE hookline.inbox ADD COLUMN suspect boolean NOT NULL DEFAULT false;
ALTER TABLE hookline.deliveries ADD COLUMN suspect boolean NOT NULL DEFAULT false;

-- Suspects are few; claiming one reads this small index instead of filtering the
-- claimable index. Normal claims keep using the claimable index and skip the
-- (rare) suspect entries in it.
CREATE INDEX inbox_suspect_idx ON hookline.inbox (provider, next_attempt_at, id)
    WHERE status = 'pending' AND suspect;
CREATE INDEX deliveries_suspect_idx ON hookline.deliveries (endpoint, next_attempt_at, id)
    WHERE status = 'pending' AND suspect;
