"""The workers' connection budget (operator/budget.py): fair shares, and grants decided in Postgres that
never add up past the budget, however providers' scaling timers interleave. The operator end to end
(Deployments, the Scaling condition, Events) is in tests/operator/test_budget.py."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import asyncpg
import pytest

from hookline import outbox
from hookline.core import pools
from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from hookline_operator import budget
from hookline_operator.budget import Demand
from hookline_operator.ownership import Resource
from support.endpoints import Answer, TestEndpoint
from support.processes import relay as relay_process
from support.waiting import eventually


def test_fair_shares_fill_the_smallest_first() -> None:
    demands = {"a": Demand(10, 20), "b": Demand(1, 20), "c": Demand(10, 20)}
    assert budget.fair_shares(demands, 100) == {"a": 2, "b": 1, "c": 2}
    assert budget.fair_shares(demands, 1000) == {"a": 10, "b": 1, "c": 10}
    assert budget.fair_shares(demands, 19) == {"a": 0, "b": 0, "c": 0}
    assert budget.fair_shares({}, 100) == {}


def test_fair_shares_never_exceed_the_budget_with_mixed_pool_sizes() -> None:
    rng = random.Random(7)
    for _ in range(200):
        demands = {f"p{i}": Demand(rng.randint(0, 12), rng.randint(1, 40)) for i in range(rng.randint(1, 8))}
        total = rng.randint(0, 400)
        shares = budget.fair_shares(demands, total)
        assert sum(shares[k] * d.connections_per_replica for k, d in demands.items()) <= total
        assert all(0 <= shares[k] <= d.wanted for k, d in demands.items())


def test_fair_shares_are_max_min_fair_and_use_what_fits() -> None:
    rng = random.Random(11)
    for _ in range(300):
        per_replica = rng.randint(1, 30)
        demands = {f"p{i}": Demand(rng.randint(0, 15), per_replica) for i in range(rng.randint(1, 12))}
        total = rng.randint(0, 600)
        shares = budget.fair_shares(demands, total)
        units = total // per_replica
        assert sum(shares.values()) == min(units, sum(d.wanted for d in demands.values()))
        for key, share in shares.items():
            if share < demands[key].wanted:  # held back: nobody has more than one replica above it
                assert max(shares.values()) <= share + 1, (demands, total, shares)


def rows(**allocations: tuple[int, int]) -> list[dict[str, object]]:
    return [{"owner_uid": k, "wanted": w, "replicas": r, "connections_per_replica": 20}
            for k, (w, r) in allocations.items()]


def test_a_newcomer_waits_for_connections_others_still_hold() -> None:
    # a holds all 5 replicas of a 100-connection budget; b arrives wanting 5.
    state = rows(a=(5, 5), b=(5, 0))
    grant_b = budget.decide("b", 5, 0, state, 100)
    assert (grant_b.replicas, grant_b.capped) == (0, True)
    assert "allows 0" in grant_b.message and "100 connections" in grant_b.message
    # a's next tick shrinks it to its fair share at once...
    grant_a = budget.decide("a", 5, 5, state, 100)
    assert grant_a.replicas == 3 and grant_a.capped
    # ...and b then grows into what a freed.
    assert budget.decide("b", 5, 0, rows(a=(5, 3), b=(5, 0)), 100).replicas == 2


def test_no_budget_problem_no_cap() -> None:
    grant = budget.decide("a", 4, 1, rows(a=(4, 1), b=(1, 1)), 1000)
    assert grant == budget.Grant(4, False, "")
    assert budget.decide("a", 0, 3, rows(a=(0, 3)), 20).replicas == 0  # scaling down is never held up


def test_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(budget.BUDGET_ENV, raising=False)
    assert budget.configured_budget() is None
    monkeypatch.setenv(budget.BUDGET_ENV, "136")
    assert budget.configured_budget() == 136
    monkeypatch.setenv(budget.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match="whole number"):
        budget.configured_budget()


async def test_concurrent_grants_never_pass_the_budget(pool: asyncpg.Pool) -> None:
    """Many providers' timers deciding at once, scaling up and down at random: the replicas the
    rows say are held (what the Deployments are set to) never add up past the budget."""
    total, per_replica = 200, 20
    providers = [Resource("ns", f"p{i}", str(uuid.uuid4()), 1) for i in range(8)]
    replicas = dict.fromkeys((p.uid for p in providers), 0)
    rng = random.Random(3)

    async def tick(res: Resource) -> None:
        wanted = rng.randint(0, 6)
        decision = await budget.grant(pool, res, wanted, replicas[res.uid], per_replica, total, 300)
        if decision.replicas < replicas[res.uid]:
            replicas[res.uid] = decision.replicas  # scaled down first, then recorded
            await budget.record(pool, res, decision.replicas)
        else:
            replicas[res.uid] = decision.replicas
        assert sum(replicas.values()) * per_replica <= total

    for _ in range(15):
        await asyncio.gather(*(tick(p) for p in providers))
    held = await pool.fetchval("SELECT sum(replicas * connections_per_replica) FROM hookline.worker_allocations")
    assert held <= total
    # With everyone asking for more than its share, everyone ends up with its fair share.
    for _ in range(3):
        for p in providers:
            decision = await budget.grant(pool, p, 6, replicas[p.uid], per_replica, total, 300)
            if decision.replicas < replicas[p.uid]:
                await budget.record(pool, p, decision.replicas)
            replicas[p.uid] = decision.replicas
    assert sorted(replicas.values()) == [1, 1, 1, 1, 1, 1, 2, 2]


async def test_forgotten_and_stale_rows_free_their_connections(pool: asyncpg.Pool) -> None:
    gone, stale, live = (Resource("ns", n, str(uuid.uuid4()), 1) for n in ("gone", "stale", "live"))
    await budget.grant(pool, gone, 2, 0, 20, 100, 300)
    await budget.grant(pool, stale, 2, 0, 20, 100, 300)
    await pool.execute("UPDATE hookline.worker_allocations SET seen_at = now() - interval '10 minutes' "
                       "WHERE owner_uid = $1", stale.uid)
    await budget.forget(pool, gone)
    assert (await budget.grant(pool, live, 5, 0, 20, 100, 300)).replicas == 5


# --- what a service process really holds ------------------------------------------------------------

RELAY_CONCURRENCY = 32  # above pools.RELAY_CAP: deliveries outnumber the relay's pool


async def backends_of(pool: asyncpg.Pool, application_name: str) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                                   application_name))


async def test_a_relay_with_every_pool_connection_busy_holds_its_budget_and_no_more(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    """``pools.relay`` is what the chart and the operator count per relay pod. A table lock holds every
    delivery's bookkeeping, so the relay's pool fills up; the relay's backends in pg_stat_activity
    (its LISTEN, its maintenance locks and that full pool) then add up to exactly the budget."""
    name = f"relay-budget-{uuid.uuid4().hex[:8]}"
    budget_total = pools.relay(RELAY_CONCURRENCY)
    async with TestEndpoint(get_scheme("standard-webhooks").generate_secret(), lambda n, r: Answer(500)) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "failing", ep.url, secret=ep.secret, max_attempts=1000,
                                initial_delay=0.05, max_delay=0.1)
            async with conn.transaction():
                for i in range(200):
                    await outbox.publish(conn, "budget.test", {"n": i})
        relay = await asyncio.to_thread(relay_process, f"{database_url}?application_name={name}", log_dir,
                                        "--allow-private-networks", "--concurrency", str(RELAY_CONCURRENCY),
                                        "--breaker-min-volume", "1000000")  # failures keep flowing
        try:
            await eventually(lambda: len(ep.received) >= 50, timeout=30)
            async with pool.acquire() as locker, locker.transaction():
                await locker.execute("LOCK TABLE hookline.deliveries IN EXCLUSIVE MODE")  # reads go on, writes wait
                await eventually(lambda: _at_least(pool, name, budget_total), timeout=30)
                most = budget_total
                for _ in range(40):  # a while longer: nothing opens beyond it
                    most = max(most, await backends_of(pool, name))
                    await asyncio.sleep(0.05)
            assert most == budget_total, f"{most} connections, budget {budget_total}"
        finally:
            assert relay.stop() == 0, relay.logs()


async def _at_least(pool: asyncpg.Pool, application_name: str, count: int) -> bool:
    return await backends_of(pool, application_name) >= count
