"""The Maintainer (core/maintenance.py): of processes racing for a scope, one runs the leader's
jobs; when its connection dies another takes over; per-process jobs run everywhere; and the
lease rescuer's backoff is the partition's RetryPolicy."""

from __future__ import annotations

import asyncpg
import pytest

from hookline.core.maintenance import Job, Maintainer, sweep_once
from hookline.core.queue import RetryPolicy
from support.dedicated import GatedConnection
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE_HOLDER = "SELECT holder FROM hookline.maintenance_leaders WHERE scope = 'test' AND expires_at > now()"


class Runs:
    """Which maintainer ran which job, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def job(self, maintainer: str, name: str, *, per_process: bool = False) -> Job:
        async def run() -> None:
            self.log.append((maintainer, name))

        return Job(name, run, interval=0.05, per_process=per_process)

    def of(self, name: str) -> list[str]:
        return [maintainer for maintainer, job in self.log if job == name]


def maintainer(name: str, runs: Runs, connection: GatedConnection) -> Maintainer:
    jobs = [runs.job(name, "rescue"), runs.job(name, "gauges", per_process=True)]
    return Maintainer("test", jobs, connection, election_interval=0.1)


async def test_one_leader_runs_leader_jobs_and_another_takes_over_when_its_connection_dies(
        database_url: str, pool: asyncpg.Pool) -> None:
    runs = Runs()
    connections = {name: GatedConnection(database_url) for name in ("a", "b")}
    maintainers = {name: maintainer(name, runs, connections[name]) for name in ("a", "b")}
    for m in maintainers.values():
        await m.start()
    try:
        await eventually(lambda: any(m.is_leader for m in maintainers.values()))
        leader = next(name for name, m in maintainers.items() if m.is_leader)
        other = "b" if leader == "a" else "a"
        # Both refresh their own gauges; only the leader rescues, however long we look.
        await eventually(lambda: {"a", "b"} <= set(runs.of("gauges")) and len(runs.of("rescue")) >= 20)
        assert set(runs.of("rescue")) == {leader}
        assert not maintainers[other].is_leader

        # The leader's database connection dies, and (gated) it cannot get a new one.
        connections[leader].gate.clear()
        rescued_before = len(runs.of("rescue"))
        assert await pool.fetchval(LEASE_HOLDER) == maintainers[leader].holder
        leader_connection = connections[leader].last
        assert leader_connection is not None
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", leader_connection.get_server_pid())
        await eventually(lambda: maintainers[other].is_leader)
        assert not maintainers[leader].is_leader
        await eventually(lambda: other in runs.of("rescue")[rescued_before:])

        # Back online, the old leader stays a follower: the lease is held.
        connections[leader].gate.set()
        await eventually(lambda: connections[leader].opened == 2)
        handover = len(runs.of("rescue"))
        await eventually(lambda: len(runs.of("rescue")) >= handover + 20)
        assert set(runs.of("rescue")[handover:]) == {other}
        assert not maintainers[leader].is_leader
    finally:
        for m in maintainers.values():
            await m.stop()
    # The leader that stops hands its lease over at once.
    assert await pool.fetchval(LEASE_HOLDER) is None


async def test_the_rescuer_waits_as_the_retry_policy_says(pool: asyncpg.Pool) -> None:
    await pool.execute("""
        INSERT INTO hookline.inbox (provider, event_id, body, headers, status, attempts, locked_by,
                                    lease_expires_at)
        SELECT 'p', 'evt-' || n, '{}'::bytea, '{}'::jsonb, 'processing', n, 'gone-worker', now() - interval '1 s'
        FROM generate_series(1, 3) AS n""")
    # initial == max: every delay is exactly 30 s, whatever the jitter.
    policy = RetryPolicy(max_attempts=3, initial_delay=30, max_delay=30)
    swept = await sweep_once(pool, {"p": policy})
    assert (swept.requeued, swept.dead, swept.crashed) == ({"p": 2}, {"p": 1}, {"p": 1})
    rows = await pool.fetch("SELECT attempts, status, extract(epoch FROM next_attempt_at - now()) AS wait "
                            "FROM hookline.inbox ORDER BY attempts")
    assert [r["status"] for r in rows] == ["pending", "pending", "dead"]
    assert all(29 < r["wait"] <= 30 for r in rows[:2])
