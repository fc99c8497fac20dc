-- The partition manager's statements (hookline.core.partitions), loaded by
-- hookline.core.db.query(name, "partitions.sql"). The work itself is in the
-- functions of migrations 0011, 0012 and 0018, so that each pass is one statement and one
-- transaction whatever the partition names are.

-- name: ensure_partitions
-- The partitions of the current period and the configured number ahead; returns
-- the names created now.
SELECT created FROM hookline.ensure_partitions($1::text) AS created;

-- name: expire_inbox
-- One retention pass over the inbox's partitions: drops, deferred drops, batch
-- deletes and rows found in the default partition, one row each. $5 and $6 bound
-- every provider's doneHours and deadDays (migration 0025).
SELECT action, target, affected
FROM hookline.expire_inbox($1::interval, $2::interval, $3::integer, $4::interval, $5::interval, $6::interval);

-- name: expire_outbox
-- One retention pass over the outbox's partition pairs (events and their deliveries,
-- migration 0018), per endpoint: drops, deferred drops, batch deletes, rows found in
-- the default partitions, one row each.
SELECT action, target, affected FROM hookline.expire_outbox($1::interval, $2::interval, $3::integer, $4::interval);

-- name: set_outbox_partition_width
-- The width and premake of the outbox's and deliveries' future partitions, both at once
-- (they must stay on one grid: retention drops them in pairs).
SELECT hookline.set_outbox_partition_width($1::interval, $2::integer);

-- name: expire_inbox_keys
-- Up to $2 dedup keys past their window and older than every stored event.
SELECT hookline.expire_inbox_keys($1::interval, $2::integer) AS deleted;

-- name: set_partition_width
-- The width and premake of a table's future partitions (tests and installs that want
-- narrower or wider partitions; existing partitions keep their bounds).
UPDATE hookline.partition_config SET width = $2::interval, premake = $3::integer WHERE parent = $1::text
RETURNING parent;

-- name: list_partitions
-- A table's partitions with their bounds and sizes, oldest first.
SELECT name, lower_bound, upper_bound, is_default, pg_total_relation_size(name::regclass) AS bytes
FROM hookline.partitions($1::text);

-- name: partitioned_tables
-- Every table the partition manager keeps partitions of.
SELECT parent FROM hookline.partition_config ORDER BY parent;

-- name: expire_by_age
-- Partitions of tables retained by age alone (partition_config.retain) dropped whole.
SELECT action, target FROM hookline.expire_by_age($1::interval);
