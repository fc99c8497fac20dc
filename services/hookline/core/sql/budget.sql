-- The workers' connection budget (migrations/0006_tenants_and_budget.sql), loaded by
-- hookline.core.db.query(name, "budget.sql") in the operator's budget module. Every
-- decision runs in one transaction under lock_budget, so two providers' scaling
-- timers never both spend the same connections.

-- name: lock_budget
-- A table lock, not an advisory key (migration 0025): no tenant role can take it. It lets
-- statements read the table meanwhile; another decision waits.
LOCK TABLE hookline.worker_allocations IN SHARE ROW EXCLUSIVE MODE;

-- name: forget_stale_allocations
-- A row nobody refreshed for $1 seconds belongs to a resource the operator no
-- longer manages (deleted while it was down, or a namespace no longer watched).
DELETE FROM hookline.worker_allocations WHERE seen_at < now() - make_interval(secs => $1);

-- name: upsert_allocation
INSERT INTO hookline.worker_allocations (owner_uid, owner_namespace, owner_name, wanted, replicas,
                                         connections_per_replica, seen_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (owner_uid) DO UPDATE
    SET wanted = EXCLUDED.wanted, replicas = EXCLUDED.replicas,
        connections_per_replica = EXCLUDED.connections_per_replica, seen_at = now();

-- name: allocations
SELECT owner_uid, wanted, replicas, connections_per_replica FROM hookline.worker_allocations;

-- name: set_allocated_replicas
UPDATE hookline.worker_allocations SET replicas = $2, seen_at = now() WHERE owner_uid = $1;

-- name: delete_allocation
DELETE FROM hookline.worker_allocations WHERE owner_uid = $1;
