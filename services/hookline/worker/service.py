"""The worker service: claim, process, heartbeat, complete in batches, shut down cleanly.

Loop: for each provider in turn (round robin, so a flood from one provider does
not starve another) claim up to the free concurrency in one statement, start a
task per event, and when nothing is due, sleep until the receiver's NOTIFY or
the poll interval — whichever comes first — so an idle worker costs Postgres
one cheap index probe per provider per poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import Callable

import asyncpg

from hookline.core import delivery, metrics
from hookline.core.batching import Batcher
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.queue import INBOX
from hookline.worker.event import Event
from hookline.worker.processing import Processor, Result

log = logging.getLogger(__name__)


class BatchCompleter:
    """Marks events done in batches: many handlers finishing at once cost one UPDATE."""

    def __init__(self, pool: asyncpg.Pool, worker_id: str, in_flight: Callable[[], int], max_batch: int = 500,
                 window: float = 0.005) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._batcher: Batcher[tuple[int, int], bool] = Batcher(
            self._write, name="completer", max_batch=max_batch, window=window, expected=in_flight)

    def start(self) -> None:
        self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()

    async def complete(self, id: int, attempts: int) -> bool:
        """True when the event is now done; False when its lease had been lost."""
        return await self._batcher.submit((id, attempts))

    async def _write(self, items: list[tuple[int, int]]) -> list[bool]:
        done = await INBOX.complete(self._pool, items, self._worker_id)
        return [id in done for id, _ in items]


class Worker:
    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, *, providers: list[str] | None = None,
                 concurrency: int = 16, poll_interval: float = 1.0, grace_period: float = 25.0,
                 worker_id: str | None = None) -> None:
        self.pool = pool
        self.registry = registry
        self.only = providers or None
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.completer = BatchCompleter(pool, self.worker_id, lambda: len(self._in_flight))
        self.session = delivery.create_session(allow_private_networks=True, connections=concurrency)
        self.processor = Processor(pool, self.session, self.worker_id, self.completer.complete)
        self._in_flight: dict[int, tuple[asyncio.Task[Result], Provider]] = {}
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: asyncpg.Connection | None = None
        self._rotation = 0

    def providers(self) -> list[Provider]:
        known = self.registry.all()
        names = self.only if self.only is not None else sorted(known)
        return [known[n] for n in names if n in known]

    async def start(self) -> None:
        self.completer.start()
        self._tasks = [asyncio.create_task(self._claim_loop(), name="claim-loop"),
                       asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
                       asyncio.create_task(self._listen_loop(), name="listen")]
        log.info("worker started", extra={"worker": self.worker_id, "providers": self.only or "all",
                                          "concurrency": self.concurrency})

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if self.only is None or payload in self.only:
            self._wake.set()

    async def _listen_loop(self) -> None:
        """LISTEN is only a hint to look sooner; losing it just means waiting for the next poll."""
        while True:
            try:
                self._listener = await self.pool.acquire()
                lost = asyncio.Event()
                self._listener.add_termination_listener(lambda _c: lost.set())
                await self._listener.add_listener("hookline_inbox", self._on_notify)
                await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker LISTEN connection lost; polling meanwhile", extra={"error": str(exc)})
            finally:
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await self._listener.remove_listener("hookline_inbox", self._on_notify)
                    with contextlib.suppress(Exception):
                        await self.pool.release(self._listener)
                    self._listener = None
            await asyncio.sleep(1)

    async def _claim_loop(self) -> None:
        while not self._stopping:
            while len(self._in_flight) >= self.concurrency and not self._stopping:
                self._slot_free.clear()
                await self._slot_free.wait()
            if self._stopping:
                break
            self._wake.clear()
            try:
                claimed = await self._claim_round()
            except Exception as exc:
                log.warning("claim failed; retrying", extra={"error": str(exc)})
                await asyncio.sleep(1)
                continue
            if not claimed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    async def _claim_round(self) -> int:
        providers = self.providers()
        if not providers:
            return 0
        self._rotation = (self._rotation + 1) % len(providers)
        claimed = 0
        for provider in providers[self._rotation:] + providers[: self._rotation]:
            free = self.concurrency - len(self._in_flight)
            if free <= 0 or self._stopping:
                break
            rows = await INBOX.claim(self.pool, provider.name, free, self.worker_id, provider.lease_seconds)
            for row in rows:
                self._start(row, provider)
            claimed += len(rows)
        return claimed

    def _start(self, row: asyncpg.Record, provider: Provider) -> None:
        event = Event.from_row(row)
        deferred_since = row["deferred_since"].timestamp() if row["deferred_since"] else None
        task = asyncio.create_task(self.processor.process(event, provider, deferred_since))
        self._in_flight[event.id] = (task, provider)
        task.add_done_callback(functools.partial(self._finished, event.id))

    def _finished(self, id: int, _task: asyncio.Task[Result]) -> None:
        self._in_flight.pop(id, None)
        self._slot_free.set()

    async def _heartbeat_loop(self) -> None:
        """Extend leases of in-flight events well before they run out."""
        while True:
            # Paced by the shortest lease this worker may hold, so an event claimed just after
            # a beat still gets its first extension well before its lease runs out.
            leases = [p.lease_seconds for p in self.providers()] or [60]
            await asyncio.sleep(max(0.2, min(leases) / 3))
            by_lease: dict[int, list[int]] = {}
            for id, (_, provider) in list(self._in_flight.items()):
                by_lease.setdefault(provider.lease_seconds, []).append(id)
            for lease, ids in by_lease.items():
                try:
                    lost = await INBOX.extend_leases(self.pool, ids, self.worker_id, lease)
                except Exception as exc:
                    log.warning("heartbeat failed", extra={"error": str(exc)})
                    continue
                for id in lost:
                    if id in self._in_flight:
                        # The sweeper or another worker has it; our result would not be committed anyway.
                        log.warning("lease lost; abandoning event", extra={"inbox_id": id})
                        self._in_flight[id][0].cancel()

    async def stop(self) -> None:
        """Stop claiming, let in-flight events finish within the grace period, give back the rest."""
        self._stopping = True
        self._slot_free.set()
        self._wake.set()
        claim = self._tasks[0]
        with contextlib.suppress(asyncio.CancelledError):
            await claim
        in_flight = [t for t, _ in self._in_flight.values()]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.grace_period)
        unfinished = {id: t for id, (t, _) in self._in_flight.items() if not t.done()}
        for task in unfinished.values():
            task.cancel()
        if unfinished:
            await asyncio.wait(list(unfinished.values()), timeout=5)
            # Their transactions rolled back (or their calls were cut off): hand them to the next worker now.
            released = await INBOX.release(self.pool, list(unfinished), self.worker_id)
            log.info("released leases on shutdown", extra={"count": len(released)})
        for loop_task in self._tasks[1:]:
            loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        await self.completer.stop()
        await self.session.close()
        log.info("worker stopped", extra={"worker": self.worker_id})


class StatsReporter:
    """Refreshes the backlog gauges every few seconds with one indexed query."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, interval: float = 5.0) -> None:
        self.pool, self.registry, self.interval = pool, registry, interval
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        stats = await INBOX.stats(self.pool)
        for name in set(stats) | set(self.registry.all()):
            s = stats.get(name)
            metrics.inbox_backlog.labels(name).set(s.backlog if s else 0)
            metrics.inbox_oldest_pending.labels(name).set(s.oldest_pending_seconds if s else 0)
            metrics.inbox_dead.labels(name).set(s.dead if s else 0)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.refresh()
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stats")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
