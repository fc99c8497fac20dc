"""The maintenance loop, apart from the workers: the lease sweeper (River calls it the rescuer).

``sweep_once`` is the function the operator's timer calls; ``LeaseSweeper`` runs
it every few seconds inside ``hookline dev`` and ``hookline worker --sweep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from hookline.core import metrics
from hookline.core.queue import INBOX, Queue, RetryPolicy, SweepResult

log = logging.getLogger(__name__)


async def sweep_once(pool: asyncpg.Pool | asyncpg.Connection, policies: dict[str, RetryPolicy],
                     queue: Queue = INBOX, partition: str | None = None) -> SweepResult:
    """Return expired leases to pending (or dead when attempts are used up); the attempt counts.

    Every row taken back becomes a suspect, to be run alone (``core/consumer.py``): the
    sweeper cannot tell which of the rows a dead consumer held was the one that killed it.
    ``partition`` limits the sweep to one provider (the operator runs one timer per provider).
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


class LeaseSweeper:
    def __init__(self, pool: asyncpg.Pool, policies: Callable[[], dict[str, RetryPolicy]],
                 queue: Queue = INBOX, interval: float = 5.0) -> None:
        self.pool, self.policies, self.queue, self.interval = pool, policies, queue, interval
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            try:
                await sweep_once(self.pool, self.policies(), self.queue)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease sweep failed", extra={"error": str(exc)})
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sweeper-{self.queue.table}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
