"""Housekeeping, in one place: a ``Maintainer`` runs named jobs, each at its interval.

River's shape: each housekeeping task is a small named job (the lease rescuer, the stats
refresher, the partition manager that also keeps the outbox's retention), and the jobs that act
on the shared database run only on the elected leader of their *scope* (``inbox``, ``outbox``,
``partitions``), so N workers or relays do the work once, not N times. Leadership is a lease in
``hookline.maintenance_leaders``, a table only the schema's owner can write (migration 0025: an
advisory lock, used before, can be taken by any role, a tenant's included, and so stop the
housekeeping of every team). The leader renews its lease every ``election_interval`` on a
dedicated connection (``core/dedicated.py``) and steps down as soon as a renewal fails, a whole
interval before the lease (three intervals) runs out; a leader that dies is replaced once its
lease has run out, one that stops hands the lease over at once. Jobs flagged ``per_process``
(this process's own gauges) run everywhere. Components contribute jobs by scope; the Host
(core/host.py) runs one Maintainer per scope.

``sweep_once`` is the rescuer's one pass. The operator runs the same rescuer in its own ``inbox``
maintainer (operator/hookline_operator/handlers.py), so operators and ``worker --sweep`` elect one.
Its backoff is the partition's ``RetryPolicy`` (``core/queue.py``), the same as a failed attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from hookline.core import db, inbox_stats, metrics, partitions
from hookline.core.dedicated import DedicatedConnection
from hookline.core.providers import ProviderRegistry
from hookline.core.queue import INBOX, Queue, RetryPolicy, SweepResult
from hookline.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 5.0  # seconds between lease rescues
STATS_INTERVAL = 5.0  # seconds between gauge refreshes
ELECTION_INTERVAL = 5.0  # seconds between a leader's renewals and a non-leader's attempts to take the lease
LEASE_INTERVALS = 3  # a lease lasts this many election intervals


@dataclass(frozen=True)
class Job:
    name: str
    run: Callable[[], Awaitable[object]]
    interval: float
    per_process: bool = False  # runs in every process (its own gauges), not only on the leader


class Maintainer:
    """Runs ``jobs`` of one ``scope``; leader-only jobs run while this process holds the scope's lock."""

    def __init__(self, scope: str, jobs: Sequence[Job], connection: DedicatedConnection,
                 election_interval: float = ELECTION_INTERVAL) -> None:
        self.scope = scope
        self.jobs = tuple(jobs)
        self._connection = connection
        self.election_interval = election_interval
        self.lease_seconds = LEASE_INTERVALS * election_interval
        # Who holds the lease, for people reading the table: host, process and this maintainer.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._conn: asyncpg.Connection | None = None
        self.leader = asyncio.Event()  # set while this process is the scope's leader
        self._leadership_changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def is_leader(self) -> bool:
        return self.leader.is_set()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._schedule(), name=f"maintainer-{self.scope}")]
        if any(not job.per_process for job in self.jobs):
            self._tasks.append(asyncio.create_task(self._elect(), name=f"maintainer-{self.scope}-election"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if self._conn is not None and self.is_leader:
            with contextlib.suppress(Exception):  # the lease runs out by itself otherwise
                await self._conn.execute(db.query("resign_maintenance_lease"), self.scope, self.holder,
                                         timeout=self.election_interval)
        self._set_leader(False)
        await self._drop_connection()

    # --- scheduling ---------------------------------------------------------------------------

    def _runnable(self, job: Job) -> bool:
        return job.per_process or self.is_leader

    async def _schedule(self) -> None:
        next_run = {job.name: 0.0 for job in self.jobs}
        while True:
            for job in self.jobs:
                if self._runnable(job) and time.monotonic() >= next_run[job.name]:
                    next_run[job.name] = time.monotonic() + job.interval
                    await self._run(job)
            due = [next_run[job.name] for job in self.jobs if self._runnable(job)]
            pause = max(0.05, min(due, default=time.monotonic() + 3600) - time.monotonic())
            self._leadership_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leadership_changed.wait(), pause)

    async def _run(self, job: Job) -> None:
        try:
            await job.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("maintenance job failed", extra={"scope": self.scope, "job": job.name, "error": str(exc)})

    # --- election -----------------------------------------------------------------------------

    def _set_leader(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.info("maintenance leadership " + ("taken" if leader else "given up"), extra={"scope": self.scope})
            (self.leader.set if leader else self.leader.clear)()
            self._leadership_changed.set()

    async def _elect(self) -> None:
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._connection.open()
                # Bounded by one interval: a renewal that hangs (a partition) is a renewal that failed.
                held = await self._conn.fetchval(db.query("take_maintenance_lease"), self.scope, self.holder,
                                                 self.lease_seconds, timeout=self.election_interval)
                self._set_leader(bool(held))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("maintenance election failed; retrying", extra={"scope": self.scope, "error": str(exc)})
                self._set_leader(False)
                await self._drop_connection()
            await asyncio.sleep(self.election_interval)

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._connection.close(conn)


# --- the jobs -------------------------------------------------------------------------------------


async def sweep_once(pool: asyncpg.Pool | asyncpg.Connection, policies: dict[str, RetryPolicy],
                     queue: Queue = INBOX, partition: str | None = None) -> SweepResult:
    """Return expired leases to pending (or dead when attempts are used up); the attempt counts.

    Every row taken back becomes a suspect, to be run alone (``core/consumer.py``): the
    sweeper cannot tell which of the rows a dead consumer held was the one that killed it.
    ``partition`` limits the sweep to one provider.
    """
    total = SweepResult({}, {})
    while True:
        result = await queue.sweep_expired(pool, policies, partition=partition)
        _add(total.requeued, result.requeued, lambda name, n: metrics.leases_swept.labels(
            queue.table, name, "requeued").inc(n))
        _add(total.dead, result.dead, lambda name, n: metrics.leases_swept.labels(queue.table, name, "dead").inc(n))
        _add(total.crashed, result.crashed, lambda name, n: metrics.consumer_crashes.labels(queue.table, name).inc(n))
        if result.total < 1000:
            break
    if total.total:
        log.info("expired leases swept; their rows are suspects now and run alone",
                 extra={"queue": queue.table, "requeued": total.requeued, "dead": total.dead,
                        "consumers": total.crashed})
    return total


def _add(total: dict[str, int], counts: dict[str, int], count: Callable[[str, int], None]) -> None:
    for name, n in counts.items():
        count(name, n)
        total[name] = total.get(name, 0) + n


def lease_rescuer(pool: asyncpg.Pool, policies: Callable[[], dict[str, RetryPolicy]], queue: Queue = INBOX,
                  interval: float = SWEEP_INTERVAL, swept: Callable[[SweepResult], None] | None = None) -> Job:
    """The leader's ``sweep_once`` every ``interval``; ``swept`` hears of each pass's result."""

    async def rescue() -> None:
        result = await sweep_once(pool, policies(), queue)
        if swept is not None:
            swept(result)

    return Job(f"lease-rescuer:{queue.table}", rescue, interval)


def inbox_stats_refresher(pool: asyncpg.Pool, registry: ProviderRegistry, interval: float = STATS_INTERVAL) -> Job:
    """This process's inbox gauges, from the operator's statistics query so both export the same
    numbers (backlog is due + in flight, retries and deferrals apart, the age only of due events)."""

    async def refresh() -> None:
        inbox_stats.publish(await inbox_stats.provider_stats(pool), registry.all())

    return Job("inbox-stats", refresh, interval, per_process=True)


def partition_manager(pool: asyncpg.Pool, retention: partitions.Retention,
                      interval: float = partitions.PARTITION_INTERVAL) -> Job:
    """The leader's partition pass every ``interval``: partitions of every registered table created
    ahead; retention of the inbox, the outbox with its deliveries, and logs (``core/partitions.py``)."""

    async def manage() -> None:
        await partitions.manage_partitions(pool, retention)

    return Job("partition-manager", manage, interval)


def inbox_jobs(pool: asyncpg.Pool, registry: ProviderRegistry, retention: partitions.Retention, *,
               sweep: bool) -> list[tuple[str, Job]]:
    """A worker's housekeeping by scope: its gauges; with ``sweep`` the inbox's lease rescuer and the
    partition manager on their leaders. The partition manager is elected in a scope of its own: the
    processes that may rescue leases (``worker --sweep``, the operator) and those that may manage
    partitions (``worker --sweep``, relays) differ, and one scope for both let a relay win the lease
    and leave leases unrescued."""
    jobs = [("inbox", inbox_stats_refresher(pool, registry))]
    if sweep:
        jobs += [("inbox", lease_rescuer(pool, lambda: {n: p.retry for n, p in registry.all().items()})),
                 ("partitions", partition_manager(pool, retention))]
    return jobs
