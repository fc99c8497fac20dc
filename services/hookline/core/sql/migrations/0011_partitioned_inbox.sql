-- Hookline schema, version 11: the inbox partitioned by time, dedup keys that outlive
-- payloads, and the partition manager's functions (issue 13).
--
-- Why: an inbox that keeps every event forever grows without bound, and every
-- completion is an UPDATE of a growing table. Partitioned by received_at, old events
-- leave by DROP TABLE of a whole partition (no long DELETE, no vacuum debt), and the
-- hot partition (today's) stays small enough for autovacuum to keep up.
--
-- Upgrade in place: the existing table becomes the first partition ("legacy", from
-- MINVALUE to the end of the current period) by ATTACH PARTITION — no copy; its
-- indexes are attached to the partitioned indexes of the same definition, and rows
-- in every state (pending, processing, done, dead) keep their id and state. Only the
-- new primary key (id, received_at) is built on it, and its rows are scanned once to
-- check the partition bound. The legacy partition is retained like any other: it is
-- dropped whole once nothing in it must be kept (see hookline.inbox_partition_expired).
--
-- Uniqueness of (provider, event_id) cannot live in the partitioned table (a unique
-- index there must contain received_at, which differs between a first delivery and
-- its retry). It moves to hookline.inbox_keys, claimed in the same statement that
-- stores the event (queries.sql, insert_inbox_batch), with a retention of its own.

ALTER TABLE hookline.inbox RENAME TO inbox_legacy;
-- Replaced by the partitioned table's primary key (id, received_at), built at ATTACH.
ALTER TABLE hookline.inbox_legacy DROP CONSTRAINT inbox_pkey;
ALTER INDEX hookline.inbox_claimable_idx RENAME TO inbox_legacy_claimable_idx;
ALTER INDEX hookline.inbox_leased_idx RENAME TO inbox_legacy_leased_idx;
ALTER INDEX hookline.inbox_dead_idx RENAME TO inbox_legacy_dead_idx;
ALTER INDEX hookline.inbox_deferred_idx RENAME TO inbox_legacy_deferred_idx;
ALTER INDEX hookline.inbox_retrying_idx RENAME TO inbox_legacy_retrying_idx;
ALTER INDEX hookline.inbox_suspect_idx RENAME TO inbox_legacy_suspect_idx;
ALTER TABLE hookline.inbox_legacy ALTER COLUMN id DROP IDENTITY;

CREATE TABLE hookline.inbox (
    LIKE hookline.inbox_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS,
    PRIMARY KEY (id, received_at)
) PARTITION BY RANGE (received_at);
ALTER TABLE hookline.inbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;

-- The same partial indexes as before (see migrations 0001, 0002, 0005, 0008), now per
-- partition; ATTACH below adopts the legacy table's identical ones.
CREATE INDEX inbox_claimable_idx ON hookline.inbox (provider, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX inbox_leased_idx ON hookline.inbox (lease_expires_at) WHERE status = 'processing';
CREATE INDEX inbox_dead_idx ON hookline.inbox (provider, id) WHERE status = 'dead';
CREATE INDEX inbox_deferred_idx ON hookline.inbox (provider, entity_key)
    WHERE status = 'pending' AND deferred_since IS NOT NULL;
CREATE INDEX inbox_retrying_idx ON hookline.inbox (provider, next_attempt_at)
    WHERE status = 'pending' AND attempts > 0 AND deferred_since IS NULL;
CREATE INDEX inbox_suspect_idx ON hookline.inbox (provider, next_attempt_at, id) WHERE status = 'pending' AND suspect;
-- One event by its id (`hookline events show`, `dlq replay --event`): what the unique
-- constraint's index did before, without the uniqueness (hookline.inbox_keys has it).
CREATE INDEX inbox_event_idx ON hookline.inbox (provider, event_id);

-- Vacuum-friendly. A completion sets status, processed_at, lease_expires_at and
-- locked_by; status is in every partial index's predicate and lease_expires_at is
-- indexed, so a completion can never be a HOT update. What keeps it cheap: the new
-- (done) version enters no partial index, only the primary key, and fillfactor 80
-- leaves room on the page for it (claim, heartbeat and completion each write a
-- version of a row while it is young), so it rarely extends the table. Autovacuum
-- runs on each partition by its own size: thresholds lowered so the hot partition
-- is vacuumed after ~2% churn instead of 20%, keeping dead index entries in the
-- claimable index few; old partitions are not vacuumed again, they are dropped.
-- (Storage parameters of a partitioned table are applied to partitions created
-- later by hookline.ensure_partitions; the legacy partition gets them here.)

-- The legacy table becomes the partition of everything up to the end of the current day;
-- on a new install (nothing in it) it is dropped instead, and the partition manager's
-- daily partitions start today.
DO $$
DECLARE
    legacy_end timestamptz := date_bin('1 day', now(), timestamptz '2000-01-01 00:00+00') + interval '1 day';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM hookline.inbox_legacy) THEN
        DROP TABLE hookline.inbox_legacy;
        RETURN;
    END IF;
    ALTER TABLE hookline.inbox_legacy SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
    EXECUTE format('ALTER TABLE hookline.inbox_legacy ADD CONSTRAINT inbox_legacy_bound '
                   'CHECK (received_at IS NOT NULL AND received_at < %L)', legacy_end);
    EXECUTE format('ALTER TABLE hookline.inbox ATTACH PARTITION hookline.inbox_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', legacy_end);
    -- The CHECK let ATTACH skip its own scan; the partition bound says the same now.
    ALTER TABLE hookline.inbox_legacy DROP CONSTRAINT inbox_legacy_bound;
    -- New ids continue after the legacy ones.
    PERFORM setval(pg_get_serial_sequence('hookline.inbox', 'id'),
                   coalesce((SELECT max(id) FROM hookline.inbox_legacy), 0) + 1, false);
END $$;

-- Rows whose received_at falls in no partition (the manager fell behind) land here
-- instead of failing the insert; the manager logs them (hookline.partition_report).
CREATE TABLE hookline.inbox_default PARTITION OF hookline.inbox DEFAULT;

-- Row-level security and tenant grants as on the old table (migration 0006).
ALTER TABLE hookline.inbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_events ON hookline.inbox
    USING ((SELECT hookline.tenant_providers()) IS NULL
           OR provider = ANY ((SELECT hookline.tenant_providers())::text[]));
DO $$
DECLARE
    tenant text;
BEGIN
    FOR tenant IN SELECT role_name FROM hookline.tenants LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = tenant) THEN
            EXECUTE format('GRANT SELECT, UPDATE ON hookline.inbox TO %I', tenant);
        END IF;
    END LOOP;
END $$;

-- Dedup keys, kept apart from payloads so that they can outlive them: a compact row
-- per event, unique across all time the key is kept. Not partitioned (a unique
-- index across partitions is what we cannot have); expired keys are deleted in
-- small batches by the partition manager, oldest first through received_at's index.
-- A key is never deleted while its event's partition exists, so a stored event is
-- always protected by its key.
CREATE TABLE hookline.inbox_keys (
    provider     text NOT NULL,
    event_id     text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
) WITH (fillfactor = 100, autovacuum_vacuum_scale_factor = 0.05);
-- Insert-only until deleted, so the table is packed full.
CREATE INDEX inbox_keys_received_idx ON hookline.inbox_keys (received_at);

-- The legacy rows' keys. The keys table holds this uniqueness now; the legacy table's
-- unique constraint would only cost writes.
DO $$
BEGIN
    IF to_regclass('hookline.inbox_legacy') IS NOT NULL THEN
        INSERT INTO hookline.inbox_keys (provider, event_id, received_at)
        SELECT provider, event_id, received_at FROM hookline.inbox_legacy;
        ALTER TABLE hookline.inbox_legacy DROP CONSTRAINT inbox_provider_event_id_key;
    END IF;
END $$;

-- The partition manager's settings per partitioned table, like pg_partman's part_config:
-- the width of a partition and how many are created ahead of time.
CREATE TABLE hookline.partition_config (
    parent         text PRIMARY KEY,
    width          interval NOT NULL CHECK (width > interval '0'),
    premake        integer NOT NULL DEFAULT 3 CHECK (premake >= 1),
    -- Storage parameters every new partition gets (see the comment on inbox above).
    storage        text NOT NULL DEFAULT ''
);
INSERT INTO hookline.partition_config (parent, width, premake, storage)
VALUES ('hookline.inbox', interval '1 day', 3,
        'fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, '
        'autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02');

-- Every range partition of a table with its bounds (NULL lower = MINVALUE); the
-- default partition has both NULL and is_default.
CREATE FUNCTION hookline.partitions(parent text)
RETURNS TABLE (name text, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass::text,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz,
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
    FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
    ORDER BY 2 NULLS FIRST
$$;

-- Create the partitions of the current period and `premake` periods ahead that do
-- not exist yet, on a grid of `width` from 2000-01-01 UTC. Returns the names created.
-- A period already covered (by the legacy partition, or a partition of another
-- width) is skipped; so is one the default partition holds rows of (they must be
-- moved first: the manager reports them).
CREATE FUNCTION hookline.ensure_partitions(parent_table text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    cfg     hookline.partition_config;
    period  timestamptz;
    name    text;
BEGIN
    SELECT * INTO STRICT cfg FROM hookline.partition_config WHERE parent = parent_table;
    period := date_bin(cfg.width, now(), timestamptz '2000-01-01 00:00+00');
    FOR step IN 0 .. cfg.premake LOOP
        name := parent_table || '_p' || to_char(period AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
        IF to_regclass(name) IS NULL AND NOT EXISTS (
            SELECT 1 FROM hookline.partitions(parent_table) AS p
            WHERE NOT p.is_default AND coalesce(p.lower_bound, '-infinity') < period + cfg.width
              AND p.upper_bound > period) THEN
            BEGIN
                EXECUTE format('CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%L) TO (%L)%s',
                               name, parent_table, period, period + cfg.width,
                               CASE WHEN cfg.storage = '' THEN '' ELSE ' WITH (' || cfg.storage || ')' END);
                RETURN NEXT name;
            EXCEPTION
                WHEN check_violation THEN
                    RAISE WARNING 'hookline: % not created: the default partition holds rows of that period', name;
                WHEN duplicate_table THEN
                    NULL;  -- another session created it meanwhile (the Maintainer's leader lock makes this rare)
            END;
        END IF;
        period := period + cfg.width;
    END LOOP;
END $$;

SELECT hookline.ensure_partitions('hookline.inbox');

-- A provider's retention (spec.retention, hours or days), else the default given.
CREATE FUNCTION hookline.retention(spec jsonb, field text, unit interval, fallback interval) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((spec -> 'retention' ->> field)::float8 * unit, fallback)
$$;

-- One pass of inbox retention, like pg_partman's retention plus River's cleaner:
-- every range partition whose period ended before the shortest done-retention is
-- looked at, oldest first.
--   * Nothing in it must be kept (its period ended longer ago than the longest
--     done-retention, nothing pending or processing, no dead letter younger than
--     its provider's deadDays): it is dropped whole ("dropped"). It is locked first
--     (waiting at most lock_wait), so a replay cannot slip a row back to pending
--     between the check and the drop; a lock not granted in time defers the drop to
--     the next pass ("drop_deferred") rather than queueing ingest behind it.
--   * Otherwise the survivors stay where they are ("kept": how many rows hold a
--     partition past its period back), and up to `batch` rows past their
--     own limit are deleted ("deleted": done rows of providers whose doneHours have
--     passed, dead letters older than deadDays). Pending and processing rows are
--     never deleted. The caller repeats while a pass deletes a full batch.
-- Done retention counts from received_at (the partition key), so that whole
-- partitions can go without reading them; dead retention from processed_at.
-- The default partition is not dropped; its rows are reported ("default_rows").
CREATE FUNCTION hookline.expire_inbox(done_default interval, dead_default interval, batch integer,
                                      lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text, affected bigint) LANGUAGE plpgsql AS $$
DECLARE
    longest_done  interval;
    shortest_done interval;
    part          record;
    survivors     boolean;
    n             bigint;
BEGIN
    SELECT greatest(done_default, max(hookline.retention(spec, 'doneHours', '1 hour', done_default))),
           least(done_default, min(hookline.retention(spec, 'doneHours', '1 hour', done_default)))
    INTO longest_done, shortest_done FROM hookline.providers;
    FOR part IN SELECT * FROM hookline.partitions('hookline.inbox') AS p
                WHERE NOT p.is_default AND p.upper_bound <= now() - shortest_done LOOP
        IF part.upper_bound <= now() - longest_done THEN
            BEGIN
                PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
                EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part.name);
                PERFORM set_config('lock_timeout', '0', true);
                EXECUTE format(
                    'SELECT EXISTS (SELECT 1 FROM %1$s WHERE status IN (''pending'', ''processing''))
                         OR EXISTS (SELECT 1 FROM %1$s AS d LEFT JOIN hookline.providers AS pr ON pr.name = d.provider
                                    WHERE d.status = ''dead''
                                      AND d.processed_at > now() - hookline.retention(pr.spec, ''deadDays'', ''1 day'', $1))',
                    part.name) INTO survivors USING dead_default;
                IF NOT survivors THEN
                    -- Rows dropped, for the metrics: counted while small, estimated when big
                    -- (counting a day of events would read what the drop is there to avoid).
                    SELECT CASE WHEN c.reltuples > 100000 THEN c.reltuples::bigint END INTO n
                    FROM pg_class AS c WHERE c.oid = part.name::regclass;
                    IF n IS NULL THEN
                        EXECUTE format('SELECT count(*) FROM %s', part.name) INTO n;
                    END IF;
                    EXECUTE format('DROP TABLE %s', part.name);
                    action := 'dropped'; target := part.name; affected := n;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
                -- What holds it back: unfinished and dead rows (read through their partial indexes).
                EXECUTE format('SELECT count(*) FROM %s WHERE status IN (''pending'', ''processing'', ''dead'')',
                               part.name) INTO n;
                action := 'kept'; target := part.name; affected := n;
                RETURN NEXT;
            EXCEPTION WHEN lock_not_available THEN
                action := 'drop_deferred'; target := part.name; affected := 0;
                RETURN NEXT;
                CONTINUE;
            END;
        END IF;
        EXECUTE format(
            'WITH doomed AS (
                 SELECT e.ctid FROM %1$s AS e LEFT JOIN hookline.providers AS pr ON pr.name = e.provider
                 WHERE (e.status = ''done'' AND %2$L::timestamptz <= now() - hookline.retention(pr.spec, ''doneHours'', ''1 hour'', $1))
                    OR (e.status = ''dead'' AND e.processed_at <= now() - hookline.retention(pr.spec, ''deadDays'', ''1 day'', $2))
                 LIMIT $3
             ), gone AS (DELETE FROM %1$s AS e USING doomed WHERE e.ctid = doomed.ctid RETURNING 1)
             SELECT count(*) FROM gone', part.name, part.upper_bound) INTO n USING done_default, dead_default, batch;
        IF n > 0 THEN
            action := 'deleted'; target := part.name; affected := n;
            RETURN NEXT;
        END IF;
    END LOOP;
    SELECT count(*) INTO n FROM (SELECT 1 FROM hookline.inbox_default LIMIT 10000) AS d;
    IF n > 0 THEN
        action := 'default_rows'; target := 'hookline.inbox_default'; affected := n;
        RETURN NEXT;
    END IF;
END $$;

-- Up to `batch` dedup keys past their window (the provider's dedupDays, else the
-- default), oldest first — and never a key whose event may still be stored: only
-- keys received before the oldest partition that exists (and before every row of
-- the default partition). Returns how many were deleted.
CREATE FUNCTION hookline.expire_inbox_keys(dedup_default interval, batch integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    horizon timestamptz;
    n       bigint;
BEGIN
    SELECT least(coalesce(min(coalesce(p.lower_bound, '-infinity')), 'infinity'),
                 coalesce((SELECT min(received_at) FROM hookline.inbox_default), 'infinity'))
    INTO horizon FROM hookline.partitions('hookline.inbox') AS p WHERE NOT p.is_default;
    WITH doomed AS (
        SELECT k.provider, k.event_id FROM hookline.inbox_keys AS k
        LEFT JOIN hookline.providers AS pr ON pr.name = k.provider
        WHERE k.received_at < horizon
          AND k.received_at <= now() - hookline.retention(pr.spec, 'dedupDays', '1 day', dedup_default)
        ORDER BY k.received_at
        LIMIT batch
    ), gone AS (
        DELETE FROM hookline.inbox_keys AS k USING doomed
        WHERE k.provider = doomed.provider AND k.event_id = doomed.event_id RETURNING 1
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END $$;
