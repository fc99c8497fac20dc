-- Statements of the inbox worker (hookline/worker) beyond the queue's own (queue.sql).

-- name: claimed_events
-- The worker's claim: queue.sql's claim as rendered for the inbox takes the place of
-- the stand-in below (Queue.claim_within, worker/service.py CLAIM_EVENTS), and each claimed event comes
-- back in only the columns the worker reads (Event.from_row and the deferral clock).
-- The claim's own RETURNING is the whole row (19 columns, four timestamps among them):
-- decoding that cost the worker about a tenth of its CPU per event in a no-op drain.
WITH claimed AS (
    SELECT * FROM hookline.inbox WHERE false
)
SELECT id, provider, event_id, event_type, entity_key, received_at, headers, body, content_type, attempts,
       deferred_since
FROM claimed;
