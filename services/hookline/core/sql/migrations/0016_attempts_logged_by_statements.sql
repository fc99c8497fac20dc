-- Hookline schema, version 16: the attempt log (0013) written by the statements that book
-- outcomes, one INSERT per statement, instead of a row trigger per completion; and the
-- handler time of every inbox attempt.
--
-- Why: the AFTER UPDATE row triggers of 0013 ran a PL/pgSQL function and a one-row
-- INSERT for every completion (~100 µs each), while a worker completes events in batches
-- of hundreds. Now each booking statement of queue.sql (complete, retry, bury,
-- requeue_expired) and disable_endpoint hands the rows it booked to
-- hookline.log_attempts in the same statement: one call and one INSERT ... SELECT per
-- batch, committed atomically with the outcome, as the trigger was. What is logged is
-- unchanged: the first 20 attempts of a run and its final one (hookline.attempt_logged).

-- When the current attempt was claimed (set by claim and claim_suspect): an inbox
-- attempt's latency is from here to its outcome. Nullable, no default: adding it to the
-- partitioned inbox is a catalog change only, with no rewrite of any partition.
ALTER TABLE hookline.inbox ADD COLUMN claimed_at timestamptz;

-- Append booked attempts to the log, one array element per attempt. Definer's rights, as
-- the trigger had: tenant worker roles (migration 0006) book outcomes of their own events
-- but have no privilege on the log, so they can neither read it nor write it directly.
-- Any role may call this (EXECUTE is PUBLIC, so that every role that can book an outcome
-- can log it): it can append rows, never read or change them.
CREATE FUNCTION hookline.log_attempts(log_queue text, row_ids bigint[], parts text[], attempt_numbers integer[],
                                      workers text[], outcomes text[], errors text[], http_statuses integer[],
                                      latencies float8[])
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH logged AS (
        INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome, error, http_status, latency_ms)
        SELECT log_queue, a.row_id, a.part, a.attempt, a.worker, a.outcome,
               CASE WHEN a.outcome <> 'done' THEN left(a.error, 2000) END, a.http_status, a.latency_ms
        FROM unnest(row_ids, parts, attempt_numbers, workers, outcomes, errors, http_statuses, latencies)
            AS a(row_id, part, attempt, worker, outcome, error, http_status, latency_ms)
        WHERE a.row_id IS NOT NULL AND hookline.attempt_logged(a.attempt, a.outcome)
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged
$$;

DROP TRIGGER inbox_attempt_logged ON hookline.inbox;
DROP TRIGGER deliveries_attempt_logged ON hookline.deliveries;
DROP FUNCTION hookline.log_inbox_attempt();
DROP FUNCTION hookline.log_delivery_attempt();
-- The booking statements name each outcome themselves.
DROP FUNCTION hookline.attempt_outcome(text, text);
