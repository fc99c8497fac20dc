-- The small CLI commands' own statements (hookline.commands: send-test, publish).

-- name: provider_exists
SELECT EXISTS (SELECT 1 FROM hookline.providers WHERE name = $1);

-- name: endpoints_of_event
-- The endpoints an outbox event ($1, msg_...) got a delivery for, by name: the
-- outbox's event_id key, then the deliveries' (outbox_id, endpoint) key.
SELECT coalesce(array_agg(d.endpoint ORDER BY d.endpoint), '{}')
FROM hookline.deliveries AS d
WHERE d.outbox_id = (SELECT id FROM hookline.outbox WHERE event_id = $1::text);
