-- Hookline schema, version 17: the attempt log partitioned by time (issue 13), retained
-- by age by the partition manager (migration 0012's `retain`).
--
-- Why: every finished attempt adds a row (the first 20 of a run and the last), so the
-- log grows with all traffic. Partitioned by `at`, old attempts leave by DROP TABLE of a
-- whole day (no DELETE, no vacuum debt), and a lookup of one event's attempts reads only
-- the partitions from the event's arrival on (history.sql, attempts_of).
--
-- Retention: `partition_config.retain`, 72 hours by default, the default `doneHours` of
-- an event's payload (chart retention.doneHours), so a done event's attempts go no later
-- than the event itself. It is a setting of its own, documented in the README ("Retention
-- and storage"): an install whose providers keep payloads longer (or dead letters, whose
-- attempts are the interesting ones) raises it with
--   UPDATE hookline.partition_config SET retain = interval '14 days' WHERE parent = 'hookline.attempts';
--
-- Upgrade in place, as 0011 did for the inbox: the existing table becomes the partition
-- of everything up to the end of the current day ("legacy") by ATTACH PARTITION, no copy;
-- its two indexes are adopted by the partitioned indexes of the same definition, and its
-- rows are scanned once to check the bound. It is dropped whole once its day is older
-- than `retain`. On a new install (nothing logged yet) it is dropped instead.

ALTER TABLE hookline.attempts RENAME TO attempts_legacy;
ALTER INDEX hookline.attempts_row_idx RENAME TO attempts_legacy_row_idx;
ALTER INDEX hookline.attempts_part_at_idx RENAME TO attempts_legacy_part_at_idx;

CREATE TABLE hookline.attempts (
    LIKE hookline.attempts_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS
) PARTITION BY RANGE (at);
-- As in 0013, now per partition: one event's attempts; recent failures and the last answer per part.
CREATE INDEX attempts_row_idx ON hookline.attempts (queue, row_id, attempt);
CREATE INDEX attempts_part_at_idx ON hookline.attempts (queue, part, at);

DO $$
DECLARE
    legacy_end timestamptz := date_bin('1 day', now(), timestamptz '2000-01-01 00:00+00') + interval '1 day';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM hookline.attempts_legacy) THEN
        DROP TABLE hookline.attempts_legacy;
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE hookline.attempts_legacy ADD CONSTRAINT attempts_legacy_bound '
                   'CHECK (at IS NOT NULL AND at < %L)', legacy_end);
    EXECUTE format('ALTER TABLE hookline.attempts ATTACH PARTITION hookline.attempts_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', legacy_end);
    -- The CHECK let ATTACH skip its own scan; the partition bound says the same now.
    ALTER TABLE hookline.attempts_legacy DROP CONSTRAINT attempts_legacy_bound;
END $$;

-- Attempts whose time no partition covers (the manager was down for days) land here.
CREATE TABLE hookline.attempts_default PARTITION OF hookline.attempts DEFAULT;

-- Daily partitions, three ahead. Append-only but for the delivery answer record_responses
-- adds in the same transaction (a HOT update when the page has room: fillfactor 90);
-- vacuumed after inserts only to keep the visibility map current, never for churn.
INSERT INTO hookline.partition_config (parent, width, premake, storage, retain)
VALUES ('hookline.attempts', interval '1 day', 3,
        'fillfactor = 90, autovacuum_vacuum_insert_scale_factor = 0.1', interval '72 hours');

SELECT hookline.ensure_partitions('hookline.attempts');
