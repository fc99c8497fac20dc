-- Hookline schema, version 19: retention never waits for a lock while it holds one.
--
-- Why: DROP TABLE of a partition takes an ACCESS EXCLUSIVE lock on the partitioned parent
-- too, and the retention passes of 0011/0012/0018 locked the partition first, then the
-- parent (inside DROP), in one transaction that could also hold row locks of its batch
-- deletes and the locks of partitions it had dropped before. Every query on the parent
-- locks the parent and then each partition it reads, so a claim or a completion holding
-- the parent and waiting for the locked partition, while the pass waits for the parent,
-- is a deadlock, and Postgres kills one of them, sometimes the worker's statement
-- (measured: benchmarks/storage.py's steady load with two-second partitions hit it within
-- a minute).
--
-- Now, as pg_partman drops one partition per commit: a pass either drops ONE partition,
-- locking the parent (ONLY, not its other partitions) before the partition, in the order
-- every query takes them, and does nothing else in that transaction; or it drops nothing
-- and does its batch deletes, which take no strong lock. A partition is only locked after
-- a check without a lock found nothing in it to keep, and is checked again under the lock.
-- The outbox's pair goes in two passes, deliveries first: an events partition is dropped
-- once no delivery of its period is left, so no statement ever has to lock both parents.
-- The caller runs passes while one dropped something (core/partitions.py). What is kept
-- is decided by the rules of 0011, 0012 and 0018, unchanged.

-- The inbox (0011): the oldest partition with nothing to keep is dropped alone; otherwise
-- rows past their own limit are deleted in batches. Rows kept and deferred drops are
-- reported as before.
CREATE OR REPLACE FUNCTION hookline.expire_inbox(done_default interval, dead_default interval, batch integer,
                                                 lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text, affected bigint) LANGUAGE plpgsql AS $$
DECLARE
    longest_done  interval;
    shortest_done interval;
    part          record;
    n             bigint;
BEGIN
    SELECT greatest(done_default, max(hookline.retention(spec, 'doneHours', '1 hour', done_default))),
           least(done_default, min(hookline.retention(spec, 'doneHours', '1 hour', done_default)))
    INTO longest_done, shortest_done FROM hookline.providers;
    FOR part IN SELECT * FROM hookline.partitions('hookline.inbox') AS p
                WHERE NOT p.is_default AND p.upper_bound <= now() - longest_done LOOP
        CONTINUE WHEN hookline.inbox_partition_survivors(part.name, dead_default);
        action := hookline.drop_partition('hookline.inbox', part.name, lock_wait,
                                          'SELECT NOT hookline.inbox_partition_survivors($1, $2)', dead_default);
        target := part.name;
        affected := CASE WHEN action = 'kept' THEN hookline.inbox_partition_kept(part.name) ELSE 0 END;
        IF action = 'dropped' THEN
            affected := hookline.last_partition_rows();
        END IF;
        RETURN NEXT;
        CONTINUE WHEN action = 'drop_deferred';
        RETURN;  -- one drop per transaction
    END LOOP;
    FOR part IN SELECT * FROM hookline.partitions('hookline.inbox') AS p
                WHERE NOT p.is_default AND p.upper_bound <= now() - shortest_done LOOP
        IF part.upper_bound <= now() - longest_done THEN
            action := 'kept'; target := part.name; affected := hookline.inbox_partition_kept(part.name);
            RETURN NEXT;
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

-- Drop one partition of `parent`: lock the parent (ONLY: not its other partitions) and
-- then the partition, as every query on the parent takes them, waiting at most
-- lock_wait ('drop_deferred' otherwise); then `still_droppable` (a query of the
-- partition's name and `arg`) is asked again under the lock ('kept' when false). Returns
-- 'dropped', 'kept' or 'drop_deferred'; the rows dropped are in hookline.last_partition_rows().
-- The caller commits before it waits for anything else.
CREATE FUNCTION hookline.drop_partition(parent text, part text, lock_wait interval, still_droppable text,
                                        arg interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    droppable boolean;
BEGIN
    BEGIN
        PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
        EXECUTE format('LOCK TABLE ONLY %s, %s IN ACCESS EXCLUSIVE MODE', parent, part);
        PERFORM set_config('lock_timeout', '0', true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'drop_deferred';
    END;
    EXECUTE still_droppable INTO droppable USING part, arg;
    IF NOT droppable THEN
        RETURN 'kept';
    END IF;
    PERFORM set_config('hookline.last_partition_rows', hookline.partition_rows(part)::text, true);
    EXECUTE format('DROP TABLE %s', part);
    RETURN 'dropped';
END $$;

-- The rows of the partition hookline.drop_partition dropped last in this transaction.
CREATE FUNCTION hookline.last_partition_rows() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('hookline.last_partition_rows', true), '')::bigint
$$;

-- Whether an inbox partition holds anything retention must keep: an unfinished event,
-- or a dead letter younger than its provider's deadDays (through the partial indexes).
CREATE FUNCTION hookline.inbox_partition_survivors(part text, dead_default interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found boolean;
BEGIN
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM %1$s WHERE status IN (''pending'', ''processing''))
             OR EXISTS (SELECT 1 FROM %1$s AS d LEFT JOIN hookline.providers AS pr ON pr.name = d.provider
                        WHERE d.status = ''dead''
                          AND d.processed_at > now() - hookline.retention(pr.spec, ''deadDays'', ''1 day'', $1))',
        part) INTO found USING dead_default;
    RETURN found;
END $$;

-- The rows holding an inbox partition back (unfinished and dead), read through their partial indexes.
CREATE FUNCTION hookline.inbox_partition_kept(part text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s WHERE status IN (''pending'', ''processing'', ''dead'')', part) INTO n;
    RETURN n;
END $$;

-- Rows a partition about to be dropped holds, for the metrics: counted while small,
-- estimated when big (counting a day of events would read what the drop is there to avoid).
CREATE FUNCTION hookline.partition_rows(part text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT CASE WHEN c.reltuples > 100000 THEN c.reltuples::bigint END INTO n
    FROM pg_class AS c WHERE c.oid = part::regclass;
    IF n IS NULL THEN
        EXECUTE format('SELECT count(*) FROM %s', part) INTO n;
    END IF;
    RETURN n;
END $$;

-- Whether a deliveries partition holds anything retention must keep: a delivery not
-- delivered yet (pending, in flight or parked), or a dead one younger than its
-- endpoint's deadDays.
CREATE FUNCTION hookline.deliveries_partition_survivors(part text, dead_default interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found boolean;
BEGIN
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM %1$s WHERE status IN (''pending'', ''processing'', ''parked''))
             OR EXISTS (SELECT 1 FROM %1$s AS d LEFT JOIN hookline.endpoints AS e ON e.name = d.endpoint
                        WHERE d.status = ''dead'' AND d.processed_at > now()
                              - hookline.endpoint_retention(e.retention_dead_days, ''1 day'', $1))',
        part) INTO found USING dead_default;
    RETURN found;
END $$;

CREATE FUNCTION hookline.deliveries_partition_kept(part text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s WHERE status IN (''pending'', ''processing'', ''parked'', ''dead'')',
                   part) INTO n;
    RETURN n;
END $$;

-- Whether a period of the outbox still has deliveries anywhere (its partition, or the
-- default one): its events partition is dropped only when it has none.
CREATE FUNCTION hookline.outbox_period_without_deliveries(part text, unused interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    bounds record;
    found  boolean;
BEGIN
    SELECT * INTO STRICT bounds FROM hookline.partitions('hookline.outbox') AS p WHERE p.name = part;
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM hookline.deliveries WHERE created_at >= %L AND created_at < %L)',
                   coalesce(bounds.lower_bound, '-infinity'), bounds.upper_bound) INTO found;
    RETURN found;
END $$;

-- The outbox (0018): per pass, one partition of the oldest droppable pair (the deliveries
-- first, the events in a later pass), or else the batch deletes.
CREATE OR REPLACE FUNCTION hookline.expire_outbox(done_default interval, dead_default interval, batch integer,
                                                  lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text, affected bigint) LANGUAGE plpgsql AS $$
DECLARE
    longest_done  interval;
    shortest_done interval;
    events        record;
    sends         text;
    n             bigint;
BEGIN
    SELECT greatest(done_default, max(hookline.endpoint_retention(e.retention_done_hours, '1 hour', done_default))),
           least(done_default, min(hookline.endpoint_retention(e.retention_done_hours, '1 hour', done_default)))
    INTO longest_done, shortest_done FROM hookline.endpoints AS e;
    FOR events IN SELECT * FROM hookline.partitions('hookline.outbox') AS p
                  WHERE NOT p.is_default AND p.upper_bound <= now() - longest_done LOOP
        SELECT d.name INTO sends FROM hookline.partitions('hookline.deliveries') AS d
        WHERE NOT d.is_default AND d.lower_bound IS NOT DISTINCT FROM events.lower_bound
          AND d.upper_bound = events.upper_bound;
        IF sends IS NOT NULL THEN
            CONTINUE WHEN hookline.deliveries_partition_survivors(sends, dead_default);
            action := hookline.drop_partition('hookline.deliveries', sends, lock_wait,
                                              'SELECT NOT hookline.deliveries_partition_survivors($1, $2)',
                                              dead_default);
            target := sends;
        ELSE
            CONTINUE WHEN NOT hookline.outbox_period_without_deliveries(events.name, NULL);
            action := hookline.drop_partition('hookline.outbox', events.name, lock_wait,
                                              'SELECT hookline.outbox_period_without_deliveries($1, $2)', NULL);
            target := events.name;
        END IF;
        affected := CASE WHEN action = 'dropped' THEN hookline.last_partition_rows()
                         WHEN action = 'kept' AND sends IS NOT NULL THEN hookline.deliveries_partition_kept(sends)
                         ELSE 0 END;
        RETURN NEXT;
        CONTINUE WHEN action = 'drop_deferred';
        RETURN;  -- one drop per transaction
    END LOOP;
    FOR events IN SELECT * FROM hookline.partitions('hookline.outbox') AS p
                  WHERE NOT p.is_default AND p.upper_bound <= now() - shortest_done LOOP
        IF events.upper_bound <= now() - longest_done THEN
            SELECT d.name INTO sends FROM hookline.partitions('hookline.deliveries') AS d
            WHERE NOT d.is_default AND d.lower_bound IS NOT DISTINCT FROM events.lower_bound
              AND d.upper_bound = events.upper_bound;
            IF sends IS NOT NULL THEN
                action := 'kept'; target := sends; affected := hookline.deliveries_partition_kept(sends);
                RETURN NEXT;
            END IF;
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

-- Tables retained by age alone (0012): one partition per pass, through drop_partition.
CREATE OR REPLACE FUNCTION hookline.expire_by_age(lock_wait interval DEFAULT '1 second')
RETURNS TABLE (action text, target text) LANGUAGE plpgsql AS $$
DECLARE
    part record;
BEGIN
    FOR part IN SELECT cfg.parent, p.name FROM hookline.partition_config AS cfg,
                       LATERAL hookline.partitions(cfg.parent) AS p
                WHERE cfg.retain IS NOT NULL AND NOT p.is_default AND p.upper_bound <= now() - cfg.retain LOOP
        action := hookline.drop_partition(part.parent, part.name, lock_wait, 'SELECT true', NULL);
        target := part.name;
        RETURN NEXT;
        CONTINUE WHEN action = 'drop_deferred';
        RETURN;  -- one drop per transaction
    END LOOP;
END $$;
