-- Statements of the inbox worker (hookline/worker) beyond the queue's own (queue.sql).

-- name: claimed_events
-- The worker's claim: queue.sql's claim as rendered for the inbox takes the place of
-- the stand-in below (Queue.claim_within, worker/service.py CLAIM_EVENTS), and each claimed event comes
-- back in only the columns the worker reads (Event.from_row, the deferral clock, the claim floor).
-- The claim's own RETURNING is the whole row (19 columns, four timestamps among them):
-- decoding that cost the worker about a tenth of its CPU per event in a no-op drain.
WITH claimed AS (
    SELECT * FROM hookline.inbox WHERE false
)
SELECT id, provider, event_id, event_type, entity_key, received_at, headers, body, content_type, attempts,
       deferred_since, next_attempt_at
FROM claimed;

-- name: put_back
-- The handler cannot be imported (a configuration error, worker/processing.py): back to pending
-- for $4 seconds without counting the attempt, $5 saying why. Guarded like every completion.
UPDATE hookline.inbox
SET status = 'pending', attempts = attempts - 1, next_attempt_at = now() + make_interval(secs => $4),
    lease_expires_at = NULL, locked_by = NULL, last_error = $5
WHERE id = $1 AND attempts = $2 AND (status = 'processing') IS TRUE AND locked_by = $3
RETURNING id;

-- name: report_handler_problem
-- What the worker found wrong with provider $1's handler $2 ($3; NULL: nothing any more), as
-- worker $4 (hookline.report_handler_problem, migration 0027; `hookline status` shows it).
SELECT hookline.report_handler_problem($1, $2, $3, $4);
