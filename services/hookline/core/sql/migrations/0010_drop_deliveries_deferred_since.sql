-- Hookline schema, version 10: deliveries never had a deferral (only inbox events
-- wait for an entity's predecessor), so their deferred_since column was always
-- NULL. The queue statements set it only for the inbox now (the `deferrable`
-- template section of queue.sql).
--
-- Upgrading: relays of earlier versions still clear this column when they
-- complete a delivery, and fail to book completions once it is gone (the
-- deliveries are sent again after their lease, at least once as ever). Replace
-- the relays before or right after migrating.
ALTER TABLE hookline.deliveries DROP COLUMN deferred_since;
