-- Hookline schema, version 28: claims whose plan does not depend on when ANALYZE ran (issue 26).
--
-- The share of pending rows in a partition swings from none (the backlog drained) to all of the
-- newest rows (a burst) within seconds; an ANALYZE sees one instant of it. After one that saw no
-- pending row, the planner expected one row per partition's claimable index and chose to read
-- every pending row and sort them, per claim: 20 ms a claim with 20,000 pending in a partition of
-- 2,000,000 done events (docs/performance.md, "A drain that does not decay"). Without statistics
-- on status the planner uses its fixed guess for `status = 'pending'` (0.5 % of the rows), and the
-- claims stay ordered reads of the partial indexes whatever the last ANALYZE saw. The same for the
-- deliveries' attempts, which picks their due retries (`attempts > 0`: after an ANALYZE that saw
-- none, a burst of retries was sorted whole per claim). Nothing else reads these columns for its
-- selectivity: the statistics queries read the partial indexes too.
ALTER TABLE hookline.inbox ALTER COLUMN status SET STATISTICS 0;
ALTER TABLE hookline.deliveries ALTER COLUMN status SET STATISTICS 0;
ALTER TABLE hookline.deliveries ALTER COLUMN attempts SET STATISTICS 0;

-- A target of 0 stops ANALYZE from collecting the column but keeps what it collected before:
-- PostgreSQL 18 can clear it (pg_clear_attribute_stats); on older servers the old partitions keep
-- it until retention drops them, and the new ones never have it.
DO $$
DECLARE
    rel regclass;
BEGIN
    IF current_setting('server_version_num')::int >= 180000 THEN
        FOR rel IN SELECT r.relid FROM pg_partition_tree('hookline.inbox') AS r
                   UNION ALL SELECT r.relid FROM pg_partition_tree('hookline.deliveries') AS r LOOP
            PERFORM pg_catalog.pg_clear_attribute_stats(n.nspname, c.relname, a.attname, i.inh)
            FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                 JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attstattarget = 0,
                 (VALUES (false), (true)) AS i(inh)
            WHERE c.oid = rel;
        END LOOP;
    END IF;
END $$;

-- New partitions get their parent's statistics targets of 0 (CREATE TABLE ... PARTITION OF copies
-- the columns, not their targets). Otherwise as in 0011 (and 0025's search_path).
CREATE OR REPLACE FUNCTION hookline.ensure_partitions(parent_table text) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cfg     hookline.partition_config;
    period  timestamptz;
    name    text;
    col     name;
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
                FOR col IN SELECT a.attname FROM pg_attribute AS a
                           WHERE a.attrelid = parent_table::regclass AND a.attnum > 0 AND NOT a.attisdropped
                             AND a.attstattarget = 0 LOOP
                    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 0', name, col);
                END LOOP;
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
