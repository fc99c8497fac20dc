-- Hookline schema, version 13: what `hookline status` and `hookline events show` read.
--
-- The attempt log: one row per finished attempt of an inbox event or an outbox
-- delivery (when, which worker, outcome, error, and for deliveries the HTTP status
-- and latency). It is append-only and has no foreign key and no unique key, so it
-- can be partitioned by `at` and pruned by dropping old partitions: retention keeps
-- it no longer than the events it describes. Bounded per event: the first 20
-- attempts of a run and its final one (done or dead) are logged, so an event
-- retried 1000 times costs at most 21 rows per run (a replay starts a new run).
CREATE TABLE hookline.attempts (
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    queue        text NOT NULL CHECK (queue IN ('inbox', 'deliveries')),
    row_id       bigint NOT NULL,           -- hookline.inbox.id or hookline.deliveries.id
    part         text NOT NULL,             -- the provider or the endpoint
    attempt      integer NOT NULL,
    worker       text,                      -- the lease holder (locked_by) of the attempt
    outcome      text NOT NULL CHECK (outcome IN ('done', 'retry', 'dead', 'expired', 'parked')),
    error        text,
    http_status  integer,
    latency_ms   float8
);

-- `events show` / `deliveries show`: one event's attempts.
CREATE INDEX attempts_row_idx ON hookline.attempts (queue, row_id, attempt);
-- `status`: failures per provider in the last minutes, the last answer of each endpoint.
CREATE INDEX attempts_part_at_idx ON hookline.attempts (queue, part, at);

-- Every attempt is logged by the statement that books its outcome (complete, retry,
-- bury, the lease rescuer, disable_endpoint), whoever runs it: a row trigger on the
-- status leaving 'processing'. Definer's rights, so that tenant worker roles need no
-- privilege on the log. Attempts given back uncounted (a deferral, a shutdown's
-- release: attempts goes down) are not attempts and are not logged.
-- The outcome of an attempt from the row it left behind.
CREATE FUNCTION hookline.attempt_outcome(status text, last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status IN ('done', 'dead', 'parked') THEN status
                WHEN last_error LIKE 'lease expired during attempt%' THEN 'expired'
                ELSE 'retry' END
$$;

-- Logged: the first 20 attempts of a run, and the last one whatever its number.
CREATE FUNCTION hookline.attempt_logged(attempt integer, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT attempt <= 20 OR status IN ('done', 'dead')
$$;

CREATE FUNCTION hookline.log_inbox_attempt() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome, error)
    VALUES ('inbox', NEW.id, NEW.provider, OLD.attempts, OLD.locked_by,
            hookline.attempt_outcome(NEW.status, NEW.last_error),
            CASE WHEN NEW.status <> 'done' THEN left(NEW.last_error, 2000) END);
    RETURN NULL;
END $$;

CREATE FUNCTION hookline.log_delivery_attempt() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- disable_endpoint writes the answer with the outcome; otherwise record_responses
    -- adds it to this row later in the same transaction.
    answered boolean := NEW.last_latency_ms IS DISTINCT FROM OLD.last_latency_ms;
BEGIN
    INSERT INTO hookline.attempts (queue, row_id, part, attempt, worker, outcome, error, http_status, latency_ms)
    VALUES ('deliveries', NEW.id, NEW.endpoint, OLD.attempts, OLD.locked_by,
            hookline.attempt_outcome(NEW.status, NEW.last_error),
            CASE WHEN NEW.status <> 'done' THEN left(NEW.last_error, 2000) END,
            CASE WHEN answered THEN NEW.last_status END, CASE WHEN answered THEN NEW.last_latency_ms END);
    RETURN NULL;
END $$;

-- WHEN is checked without calling the function, so claims and heartbeats pay nothing.
CREATE TRIGGER inbox_attempt_logged AFTER UPDATE OF status ON hookline.inbox
    FOR EACH ROW WHEN (OLD.status = 'processing' AND NEW.status <> 'processing' AND NEW.attempts >= OLD.attempts
                       AND hookline.attempt_logged(OLD.attempts, NEW.status))
    EXECUTE FUNCTION hookline.log_inbox_attempt();
CREATE TRIGGER deliveries_attempt_logged AFTER UPDATE OF status ON hookline.deliveries
    FOR EACH ROW WHEN (OLD.status = 'processing' AND NEW.status <> 'processing' AND NEW.attempts >= OLD.attempts
                       AND hookline.attempt_logged(OLD.attempts, NEW.status))
    EXECUTE FUNCTION hookline.log_delivery_attempt();

-- `status`: events accepted in the last minutes. BRIN: received_at follows insertion
-- order, so a block-range summary finds the recent rows for almost no cost on insert.
CREATE INDEX inbox_received_brin_idx ON hookline.inbox USING brin (received_at);
