-- Hookline schema, version 18: outbox events and their deliveries partitioned by time,
-- retained per endpoint by the partition manager (issue 13; the inbox's were 0011/0012).
--
-- Why: the relay's cleaner deleted delivered events row by row (a long DELETE, vacuum
-- debt, an index on created_at kept only for it), and every completion is an UPDATE of
-- a deliveries table that grew with all history. Partitioned by created_at, old events
-- and deliveries leave by DROP TABLE of a whole pair of partitions.
--
-- The deliveries -> outbox foreign key goes. A unique key on a partitioned table must
-- contain the partition key, so the key would have to be (id, created_at) and every
-- delivery would carry and check it; and a referenced partition cannot be dropped
-- while the foreign key exists, which is the whole point. Like pgmq (a queue table and
-- its archive with no key between them) and pg_partman's advice for time-partitioned
-- children, the two tables are instead CO-PARTITIONED: a delivery's created_at IS its
-- event's created_at (hookline.publish writes both from the one value, below), so the
-- deliveries of the events in outbox partition P are exactly the rows of the deliveries
-- partition with P's bounds. Retention (hookline.expire_outbox) drops such a pair
-- together, or deletes deliveries first and then the events left without any, so no
-- delivery ever outlives its event. Deleting an endpoint still deletes its deliveries
-- (that foreign key stays: the referencing side may be partitioned).
--
-- Upgrade in place, as 0011 did for the inbox: both tables become the first partition
-- of their new parent ("legacy", from MINVALUE to the end of the current day) by ATTACH
-- PARTITION, no copy; their partial indexes are adopted by the partitioned indexes of
-- the same definition; only the new primary keys, the deliveries' (outbox_id, endpoint,
-- created_at) key and the new undelivered index are built on them. On a new install
-- (both empty) they are dropped and the daily partitions start today.

ALTER TABLE hookline.deliveries DROP CONSTRAINT deliveries_outbox_id_fkey;

-- Events -------------------------------------------------------------------------------
ALTER TABLE hookline.outbox RENAME TO outbox_legacy;
ALTER TABLE hookline.outbox_legacy DROP CONSTRAINT outbox_pkey;
-- event_id is unique by construction (publish: milliseconds and 80 random bits); a
-- unique index here would have to include created_at and so would prove nothing more.
ALTER TABLE hookline.outbox_legacy DROP CONSTRAINT outbox_event_id_key;
-- Only the old cleaner walked events by age; partitions are that walk now.
DROP INDEX hookline.outbox_created_idx;
ALTER TABLE hookline.outbox_legacy ALTER COLUMN id DROP IDENTITY;

CREATE TABLE hookline.outbox (
    LIKE hookline.outbox_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER TABLE hookline.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;
-- `hookline deliveries show msg_...`: one event by its public id (a probe per partition).
CREATE INDEX outbox_event_idx ON hookline.outbox (event_id);

-- Deliveries ---------------------------------------------------------------------------
ALTER TABLE hookline.deliveries RENAME TO deliveries_legacy;
ALTER TABLE hookline.deliveries_legacy DROP CONSTRAINT deliveries_pkey;
ALTER TABLE hookline.deliveries_legacy DROP CONSTRAINT deliveries_event_endpoint_key;
ALTER INDEX hookline.deliveries_claimable_idx RENAME TO deliveries_legacy_claimable_idx;
ALTER INDEX hookline.deliveries_leased_idx RENAME TO deliveries_legacy_leased_idx;
ALTER INDEX hookline.deliveries_dead_idx RENAME TO deliveries_legacy_dead_idx;
ALTER INDEX hookline.deliveries_unfinished_aggregate_idx RENAME TO deliveries_legacy_unfinished_aggregate_idx;
ALTER INDEX hookline.deliveries_parked_idx RENAME TO deliveries_legacy_parked_idx;
ALTER INDEX hookline.deliveries_suspect_idx RENAME TO deliveries_legacy_suspect_idx;
ALTER INDEX hookline.deliveries_retry_idx RENAME TO deliveries_legacy_retry_idx;
ALTER TABLE hookline.deliveries_legacy ALTER COLUMN id DROP IDENTITY;

CREATE TABLE hookline.deliveries (
    LIKE hookline.deliveries_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS,
    PRIMARY KEY (id, created_at),
    -- One delivery per (event, endpoint): created_at is the event's, so this is the old key.
    CONSTRAINT deliveries_event_endpoint_key UNIQUE (outbox_id, endpoint, created_at),
    CONSTRAINT deliveries_endpoint_fkey FOREIGN KEY (endpoint) REFERENCES hookline.endpoints (name) ON DELETE CASCADE
) PARTITION BY RANGE (created_at);
ALTER TABLE hookline.deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;
COMMENT ON COLUMN hookline.deliveries.created_at IS
    'The created_at of its outbox event (the partition key of both tables; migration 0018).';

-- The same partial indexes as before (migrations 0003, 0008, 0009), now per partition.
CREATE INDEX deliveries_claimable_idx ON hookline.deliveries (endpoint, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX deliveries_leased_idx ON hookline.deliveries (lease_expires_at) WHERE status = 'processing';
CREATE INDEX deliveries_dead_idx ON hookline.deliveries (endpoint, id) WHERE status = 'dead';
CREATE INDEX deliveries_unfinished_aggregate_idx ON hookline.deliveries (endpoint, aggregate_key, id)
    WHERE status IN ('pending', 'processing', 'parked') AND aggregate_key IS NOT NULL;
CREATE INDEX deliveries_parked_idx ON hookline.deliveries (endpoint) WHERE status = 'parked';
CREATE INDEX deliveries_suspect_idx ON hookline.deliveries (endpoint, next_attempt_at, id)
    WHERE status = 'pending' AND suspect;
CREATE INDEX deliveries_retry_idx ON hookline.deliveries (endpoint, next_attempt_at, id)
    WHERE status = 'pending' AND attempts > 0;
-- The relay's gauge "age of the oldest undelivered event per endpoint" (undelivered_age
-- in outbox.sql) read the whole table; this holds only what is not delivered yet.
CREATE INDEX deliveries_undelivered_idx ON hookline.deliveries (endpoint, created_at)
    WHERE status IN ('pending', 'processing', 'parked');

-- Row triggers (the attempt log of 0013, if still there) move from the legacy table to
-- the parent, which gives them to every partition; copied from whatever exists, so a
-- migration before this one that changed them is kept as it left them.
DO $$
DECLARE
    trig record;
BEGIN
    FOR trig IN SELECT t.tgname, pg_get_triggerdef(t.oid) AS def FROM pg_trigger AS t
                WHERE t.tgrelid = 'hookline.deliveries_legacy'::regclass AND NOT t.tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON hookline.deliveries_legacy', trig.tgname);
        EXECUTE replace(trig.def, ' ON hookline.deliveries_legacy ', ' ON hookline.deliveries ');
    END LOOP;
END $$;

-- Vacuum-friendly. Deliveries are updated like inbox events (claim, heartbeat,
-- completion; never HOT, status is in every partial index), so their partitions get
-- the inbox's settings (see 0011): fillfactor 80 for the new versions of young rows,
-- autovacuum after ~2% churn. Events are insert-only: packed full, vacuumed after
-- inserts only to keep the visibility map (index-only scans) current; old partitions
-- are dropped, not vacuumed.

-- Both legacy tables become the partitions of everything up to the end of the current
-- day (the same bound, so they are a pair for retention), or go on a new install.
DO $$
DECLARE
    legacy_end timestamptz := date_bin('1 day', now(), timestamptz '2000-01-01 00:00+00') + interval '1 day';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM hookline.outbox_legacy) AND NOT EXISTS (SELECT 1 FROM hookline.deliveries_legacy) THEN
        DROP TABLE hookline.deliveries_legacy;
        DROP TABLE hookline.outbox_legacy;
        RETURN;
    END IF;
    ALTER TABLE hookline.deliveries_legacy SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
    ALTER TABLE hookline.outbox_legacy SET (autovacuum_vacuum_insert_scale_factor = 0.05);
    -- A CHECK lets ATTACH skip its own scan; the partition bound says the same afterwards.
    EXECUTE format('ALTER TABLE hookline.outbox_legacy ADD CONSTRAINT outbox_legacy_bound '
                   'CHECK (created_at IS NOT NULL AND created_at < %L)', legacy_end);
    EXECUTE format('ALTER TABLE hookline.outbox ATTACH PARTITION hookline.outbox_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', legacy_end);
    ALTER TABLE hookline.outbox_legacy DROP CONSTRAINT outbox_legacy_bound;
    EXECUTE format('ALTER TABLE hookline.deliveries_legacy ADD CONSTRAINT deliveries_legacy_bound '
                   'CHECK (created_at IS NOT NULL AND created_at < %L)', legacy_end);
    EXECUTE format('ALTER TABLE hookline.deliveries ATTACH PARTITION hookline.deliveries_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', legacy_end);
    ALTER TABLE hookline.deliveries_legacy DROP CONSTRAINT deliveries_legacy_bound;
    -- New ids continue after the legacy ones.
    PERFORM setval(pg_get_serial_sequence('hookline.outbox', 'id'),
                   coalesce((SELECT max(id) FROM hookline.outbox_legacy), 0) + 1, false);
    PERFORM setval(pg_get_serial_sequence('hookline.deliveries', 'id'),
                   coalesce((SELECT max(id) FROM hookline.deliveries_legacy), 0) + 1, false);
END $$;

-- Rows no partition covers (the manager fell behind) land here instead of failing the
-- publish; the manager reports them.
CREATE TABLE hookline.outbox_default PARTITION OF hookline.outbox DEFAULT;
CREATE TABLE hookline.deliveries_default PARTITION OF hookline.deliveries DEFAULT;

-- The partition manager's settings: daily partitions, the same grid for both tables
-- (the pairing above needs the same bounds; hookline.set_outbox_partition_width keeps
-- them equal).
INSERT INTO hookline.partition_config (parent, width, premake, storage)
VALUES ('hookline.outbox', interval '1 day', 3, 'autovacuum_vacuum_insert_scale_factor = 0.05'),
       ('hookline.deliveries', interval '1 day', 3,
        'fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, '
        'autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02');
SELECT hookline.ensure_partitions('hookline.outbox');
SELECT hookline.ensure_partitions('hookline.deliveries');

CREATE FUNCTION hookline.set_outbox_partition_width(width interval, premake integer) RETURNS void
LANGUAGE sql AS $$
    UPDATE hookline.partition_config AS c SET width = set_outbox_partition_width.width,
                                              premake = set_outbox_partition_width.premake
    WHERE c.parent IN ('hookline.outbox', 'hookline.deliveries')
$$;

-- Per-endpoint retention (`hookline endpoints add --done-hours --dead-days`, or
-- `endpoints set-retention`); NULL: the install's default (chart retention.endpoints).
ALTER TABLE hookline.endpoints
    ADD COLUMN retention_done_hours float8 CHECK (retention_done_hours > 0),
    ADD COLUMN retention_dead_days float8 CHECK (retention_dead_days > 0);

-- An endpoint's retention in hours or days, else the default given.
CREATE FUNCTION hookline.endpoint_retention(amount float8, unit interval, fallback interval) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(amount * unit, fallback)
$$;

-- hookline.publish as in migration 0014; the deliveries take the event's created_at
-- (the partition key both tables share, see above).
CREATE OR REPLACE FUNCTION hookline.publish(event_type text, payload jsonb, aggregate_type text DEFAULT NULL,
                                 aggregate_id text DEFAULT NULL, endpoint text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_id      bigint;
    new_event   text;
    agg_key     text;
    published   timestamptz;
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
    RETURNING id, created_at INTO new_id, published;
    INSERT INTO hookline.deliveries (outbox_id, endpoint, aggregate_key, status, created_at)
    SELECT new_id, e.name, agg_key, CASE WHEN e.enabled THEN 'pending' ELSE 'parked' END, published
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

-- One pass of outbox retention, the inbox's rules (hookline.expire_inbox) applied per
-- endpoint, over the outbox partitions whose period ended before the shortest
-- done-retention, oldest first:
--   * Its period ended longer ago than the longest done-retention, the deliveries
--     partition of the same bounds exists, and nothing in it must be kept (nothing
--     pending, processing or parked, no dead letter younger than its endpoint's
--     deadDays): both are locked (deliveries first, as the relay reads them; waiting at
--     most lock_wait, else "drop_deferred" and the next pass) and dropped whole, one
--     "dropped" row per table.
--   * Otherwise the survivors stay ("kept": how many hold the pair back), and up to
--     `batch` deliveries past their own limit are deleted (done ones whose endpoint's
--     doneHours have passed since the event was published, dead ones older than
--     deadDays), then up to `batch` events of the period left with no delivery at all
--     ("deleted", per table). Pending, processing and parked deliveries, and their
--     events, are never deleted. The caller repeats while a pass deletes a full batch.
-- Rows in the default partitions are reported ("default_rows").
CREATE FUNCTION hookline.expire_outbox(done_default interval, dead_default interval, batch integer,
                                       lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text, affected bigint) LANGUAGE plpgsql AS $$
DECLARE
    longest_done  interval;
    shortest_done interval;
    events        record;
    sends         text;
    survivors     boolean;
    n             bigint;
BEGIN
    SELECT greatest(done_default, max(hookline.endpoint_retention(e.retention_done_hours, '1 hour', done_default))),
           least(done_default, min(hookline.endpoint_retention(e.retention_done_hours, '1 hour', done_default)))
    INTO longest_done, shortest_done FROM hookline.endpoints AS e;
    FOR events IN SELECT * FROM hookline.partitions('hookline.outbox') AS p
                  WHERE NOT p.is_default AND p.upper_bound <= now() - shortest_done LOOP
        SELECT d.name INTO sends FROM hookline.partitions('hookline.deliveries') AS d
        WHERE NOT d.is_default AND d.lower_bound IS NOT DISTINCT FROM events.lower_bound
          AND d.upper_bound = events.upper_bound;
        IF sends IS NOT NULL AND events.upper_bound <= now() - longest_done THEN
            BEGIN
                PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
                EXECUTE format('LOCK TABLE %s, %s IN ACCESS EXCLUSIVE MODE', sends, events.name);
                PERFORM set_config('lock_timeout', '0', true);
                EXECUTE format(
                    'SELECT EXISTS (SELECT 1 FROM %1$s WHERE status IN (''pending'', ''processing'', ''parked''))
                         OR EXISTS (SELECT 1 FROM %1$s AS d LEFT JOIN hookline.endpoints AS e ON e.name = d.endpoint
                                    WHERE d.status = ''dead'' AND d.processed_at > now()
                                          - hookline.endpoint_retention(e.retention_dead_days, ''1 day'', $1))',
                    sends) INTO survivors USING dead_default;
                IF NOT survivors THEN
                    action := 'dropped';
                    FOREACH target IN ARRAY ARRAY[events.name, sends] LOOP
                        -- Counted while small, estimated when big (as in expire_inbox).
                        SELECT CASE WHEN c.reltuples > 100000 THEN c.reltuples::bigint END INTO affected
                        FROM pg_class AS c WHERE c.oid = target::regclass;
                        IF affected IS NULL THEN
                            EXECUTE format('SELECT count(*) FROM %s', target) INTO affected;
                        END IF;
                        RETURN NEXT;
                    END LOOP;
                    EXECUTE format('DROP TABLE %s, %s', sends, events.name);
                    CONTINUE;
                END IF;
                -- What holds it back, read through the partial indexes of those states.
                EXECUTE format('SELECT count(*) FROM %s WHERE status IN (''pending'', ''processing'', ''parked'', ''dead'')',
                               sends) INTO n;
                action := 'kept'; target := sends; affected := n;
                RETURN NEXT;
            EXCEPTION WHEN lock_not_available THEN
                action := 'drop_deferred'; target := events.name; affected := 0;
                RETURN NEXT;
                CONTINUE;
            END;
        END IF;
        -- The period's rows by their partition key (the planner prunes to its partitions);
        -- the conditions are repeated in the DELETE so that a row a replay or the relay
        -- changed meanwhile is re-checked as it is now.
        EXECUTE format(
            'WITH doomed AS (
                 SELECT d.id, d.created_at FROM hookline.deliveries AS d
                 LEFT JOIN hookline.endpoints AS e ON e.name = d.endpoint
                 WHERE d.created_at >= %1$L AND d.created_at < %2$L
                   AND ((d.status = ''done'' AND d.created_at <= now()
                         - hookline.endpoint_retention(e.retention_done_hours, ''1 hour'', $1))
                     OR (d.status = ''dead'' AND d.processed_at <= now()
                         - hookline.endpoint_retention(e.retention_dead_days, ''1 day'', $2)))
                 LIMIT $3
             ), gone AS (
                 DELETE FROM hookline.deliveries AS d USING doomed
                 WHERE d.id = doomed.id AND d.created_at = doomed.created_at AND d.status IN (''done'', ''dead'')
                 RETURNING 1
             )
             SELECT count(*) FROM gone', coalesce(events.lower_bound, '-infinity'), events.upper_bound)
            INTO n USING done_default, dead_default, batch;
        IF n > 0 THEN
            action := 'deleted'; target := 'hookline.deliveries'; affected := n;
            RETURN NEXT;
        END IF;
        EXECUTE format(
            'WITH doomed AS (
                 SELECT o.id, o.created_at FROM hookline.outbox AS o
                 WHERE o.created_at >= %1$L AND o.created_at < %2$L
                   AND NOT EXISTS (SELECT 1 FROM hookline.deliveries AS d
                                   WHERE d.created_at >= %1$L AND d.created_at < %2$L AND d.outbox_id = o.id)
                 LIMIT $1
             ), gone AS (
                 DELETE FROM hookline.outbox AS o USING doomed
                 WHERE o.id = doomed.id AND o.created_at = doomed.created_at RETURNING 1
             )
             SELECT count(*) FROM gone', coalesce(events.lower_bound, '-infinity'), events.upper_bound)
            INTO n USING batch;
        IF n > 0 THEN
            action := 'deleted'; target := 'hookline.outbox'; affected := n;
            RETURN NEXT;
        END IF;
    END LOOP;
    FOREACH target IN ARRAY ARRAY['hookline.outbox_default', 'hookline.deliveries_default'] LOOP
        EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 10000) AS d', target) INTO affected;
        IF affected > 0 THEN
            action := 'default_rows';
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;
