"""The workers' connection budget: the sum over every worker Deployment the operator manages of
replicas x connections per replica never passes what the chart leaves for workers
(database.maxConnections minus receiver, relay, console, operator and migrations: HOOKLINE_WORKER_CONNECTION_BUDGET).

Shared by all providers, so it is decided in Postgres (``hookline.worker_allocations``) under one
lock, not in one timer's memory: every scaling decision records what its provider wants and has,
and grants are max-min fair over all of them (``fair_shares``). A provider never scales up into
connections another provider still holds; it scales down at once to its fair share, and the
connections it frees are recorded only after its Deployment has shrunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import asyncpg

from hookline.core import db, settings
from hookline_operator.ownership import Resource

BUDGET_ENV = settings.WORKER_CONNECTION_BUDGET
SQL = "budget.sql"


class Demand(NamedTuple):
    wanted: int
    connections_per_replica: int


class Grant(NamedTuple):
    replicas: int
    capped: bool
    message: str


def configured_budget() -> int | None:
    """Connections all workers may hold together; None when the chart sets no limit."""
    return settings.worker_connection_budget()


def fair_shares(demands: Mapping[str, Demand], budget: int) -> dict[str, int]:
    """Max-min fair replicas (water-filling): the highest level L such that every provider getting
    min(wanted, L) fits, then one more replica each, in key order (the same answer on every tick),
    to those that want more, while the rest of the budget allows. O(n log max(wanted))."""
    def cost(level: int) -> int:
        return sum(min(d.wanted, level) * d.connections_per_replica for d in demands.values())

    low, high = 0, max((d.wanted for d in demands.values()), default=0)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= budget else (low, middle - 1)
    shares = {key: min(d.wanted, low) for key, d in demands.items()}
    left = budget - cost(low)
    for key in sorted(demands):
        demand = demands[key]
        if shares[key] < demand.wanted and demand.connections_per_replica <= left:
            shares[key] += 1
            left -= demand.connections_per_replica
    return shares


def decide(uid: str, wanted: int, current: int, rows: Sequence[Mapping[str, Any]], budget: int) -> Grant:
    """This provider's replicas given everyone's rows (its own included); pure."""
    demands = {str(r["owner_uid"]): Demand(int(r["wanted"]), int(r["connections_per_replica"])) for r in rows}
    per_replica = demands[uid].connections_per_replica
    share = fair_shares(demands, budget)[uid]
    held_by_others = sum(int(r["replicas"]) * int(r["connections_per_replica"]) for r in rows if r["owner_uid"] != uid)
    free_for_us = max(0, budget - held_by_others) // per_replica
    replicas = min(wanted, share)
    if replicas > current:
        # Up only into connections nobody holds now: others shrink to their shares on their own ticks.
        replicas = max(current, min(replicas, free_for_us))
    if replicas >= wanted:
        return Grant(replicas, False, "")
    return Grant(replicas, True, (
        f"wants {wanted} replica(s), the connection budget allows {replicas}: workers may hold {budget} "
        f"connections (database.maxConnections), {per_replica} per replica, {held_by_others} held by other "
        f"providers' workers, fair share {share}"))


async def grant(pool: asyncpg.Pool, res: Resource, wanted: int, current: int, connections_per_replica: int,
                budget: int, stale_after: float) -> Grant:
    """Record this provider's demand and decide its replicas, atomically with everyone else's."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(db.query("lock_budget", SQL))
        await conn.execute(db.query("forget_stale_allocations", SQL), stale_after)
        # Until a scale-down has happened, the connections are still held: record the larger.
        await conn.execute(db.query("upsert_allocation", SQL), res.uid, res.namespace, res.name, wanted, current,
                           connections_per_replica)
        rows = [dict(r) for r in await conn.fetch(db.query("allocations", SQL))]
        decision = decide(res.uid, wanted, current, rows, budget)
        if decision.replicas > current:
            await conn.execute(db.query("set_allocated_replicas", SQL), res.uid, decision.replicas)
        return decision


async def record(pool: asyncpg.Pool, res: Resource, replicas: int) -> None:
    """What the Deployment is set to now, after a scale-down."""
    await pool.execute(db.query("set_allocated_replicas", SQL), res.uid, replicas)


async def hold(pool: asyncpg.Pool, res: Resource, replicas: int, connections_per_replica: int) -> None:
    """Scaling is paused: the replicas it has stay counted, and it asks for no more."""
    await pool.execute(db.query("upsert_allocation", SQL), res.uid, res.namespace, res.name, replicas, replicas,
                       connections_per_replica)


async def forget(pool: asyncpg.Pool, res: Resource) -> None:
    """The resource is gone (its Deployment with it)."""
    await pool.execute(db.query("delete_allocation", SQL), res.uid)
