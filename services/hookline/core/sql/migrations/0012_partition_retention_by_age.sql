-- Hookline schema, version 12: append-only partitioned tables (logs such as an attempt
-- log) retained by age alone, by the same partition manager as the inbox.
--
-- A table registered in hookline.partition_config with `retain` set gets its
-- partitions created ahead (hookline.ensure_partitions) and dropped whole once their
-- whole period is older than `retain` (hookline.expire_by_age). Such a table must hold
-- nothing that outlives its age (no pending work), which is why the inbox, whose
-- pending and dead events are kept whatever their age, keeps `retain` NULL and its own
-- rules (hookline.expire_inbox).
ALTER TABLE hookline.partition_config ADD COLUMN retain interval CHECK (retain > interval '0');

-- Drop every partition of every table with a `retain` whose period ended more than
-- `retain` ago; one row per partition dropped. A drop waits at most lock_wait for its
-- lock and is otherwise left for the next pass ("drop_deferred"), so it never queues
-- writers behind a long reader.
CREATE FUNCTION hookline.expire_by_age(lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text) LANGUAGE plpgsql AS $$
DECLARE
    part record;
BEGIN
    FOR part IN SELECT p.name FROM hookline.partition_config AS cfg,
                       LATERAL hookline.partitions(cfg.parent) AS p
                WHERE cfg.retain IS NOT NULL AND NOT p.is_default AND p.upper_bound <= now() - cfg.retain LOOP
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
            EXECUTE format('DROP TABLE %s', part.name);
            PERFORM set_config('lock_timeout', '0', true);
            action := 'dropped'; target := part.name;
        EXCEPTION WHEN lock_not_available THEN
            action := 'drop_deferred'; target := part.name;
        END;
        RETURN NEXT;
    END LOOP;
END $$;
