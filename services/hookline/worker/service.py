"""The worker service: claim, process, heartbeat, complete in batches, shut down cleanly.

Loop: for each provider in turn (round robin, so a flood from one provider does
not starve another) claim up to the free concurrency in one statement, start a
task per event, and when nothing is due, sleep until the receiver's NOTIFY or
the poll interval — whichever comes first — so an idle worker costs Postgres
one cheap index probe per provider per poll interval.

An event whose lease expired (its worker crashed, maybe because of it) is a
suspect and runs alone in a worker (``core/consumer.py``); an event whose effect
is done keeps its lease until its batched completion commits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from hookline.core import db, delivery, metrics
from hookline.core.batching import Batcher
from hookline.core.consumer import HeldConnection, LeasedConsumer
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.listener import Listener
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.queue import INBOX, make_worker_id
from hookline.worker.event import Event
from hookline.worker.processing import Processor

log = logging.getLogger(__name__)

# The claim a worker runs: the inbox's claim, returning only the columns the worker reads.
CLAIM_EVENTS = INBOX.claim_within(db.query("claimed_events", "worker.sql"))


class BatchCompleter:
    """Marks events done in batches: many handlers finishing at once cost one UPDATE."""

    def __init__(self, pool: asyncpg.Pool, worker_id: str, in_flight: Callable[[], int], max_batch: int = 500,
                 window: float = 0.005) -> None:
        self._worker_id = worker_id
        # Its one writer's connection, kept while completions come one batch after another (see
        # release_if_idle), as the claim loop keeps its own.
        self._held = HeldConnection(pool)
        self._writing = False
        self._batcher: Batcher[tuple[int, int], bool] = Batcher(
            self._write, name="completer", max_batch=max_batch, window=window, expected=in_flight)

    def start(self) -> None:
        self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()
        await self._held.release()

    async def release_if_idle(self) -> None:
        """Give the writer's connection back if no completion is being written or waits for one."""
        if not self._writing and not self._batcher.queued:
            await self._held.release()

    @property
    def backlog(self) -> int:
        return self._batcher.queued

    async def complete(self, id: int, attempts: int) -> bool:
        """True when the event is now done; False when its lease had been lost."""
        return await self._batcher.submit((id, attempts))

    async def _write(self, items: list[tuple[int, int]]) -> list[bool]:
        self._writing = True
        try:
            done = await self._held.run(lambda conn: INBOX.complete(conn, items, self._worker_id))
        finally:
            self._writing = False
        return [id in done for id, _ in items]


class Worker(LeasedConsumer):
    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, *, providers: list[str] | None = None,
                 concurrency: int = 16, poll_interval: float = 1.0, grace_period: float = 25.0,
                 worker_id: str | None = None, listener: Listener | None = None,
                 batch_seconds: float = 0.05) -> None:
        super().__init__(pool, INBOX, worker_id=worker_id or make_worker_id(),
                         channels=(INBOX.channel,), concurrency=concurrency,
                         poll_interval=poll_interval, grace_period=grace_period, listener=listener,
                         # Under load, claim once a quarter of the slots is free rather than for every
                         # single one: claims of one event made the claims, and transactions of one
                         # event, the work (idle, every slot is free and the first event goes at once).
                         refill=concurrency // 4,
                         # As many effects may wait for their batched completion as run at once.
                         completion_overlap=concurrency)
        self.registry = registry
        self.only = providers or None
        self.completer = BatchCompleter(pool, self.worker_id, lambda: len(self.in_flight))
        self.session = delivery.create_session(allow_private_networks=True, connections=concurrency)
        self.processor = Processor(pool, self.session, self.worker_id, self.completer.complete, self.effect_done,
                                   concurrency=concurrency, batch_seconds=batch_seconds)
        self._rotation = 0
        # The claim loop's connection, kept while it claims back to back.
        self._claims = HeldConnection(pool)

    def providers(self) -> list[Provider]:
        known = self.registry.all()
        names = self.only if self.only is not None else sorted(known)
        return [known[n] for n in names if n in known]

    def shortest_lease(self) -> float:
        # Paced by every provider this worker may claim for, not only what is in flight, so an
        # event claimed just after a beat still gets its first extension well before its lease ends.
        return float(min((p.lease_seconds for p in self.providers()), default=60))

    def on_notify(self, channel: str, payload: str) -> bool:
        return self.only is None or payload in self.only

    async def start(self) -> None:
        self.completer.start()
        await self.start_loops()
        metrics.worker_concurrency.set(self.concurrency)
        tune_gc_for_serving()
        log.info("worker started", extra={"worker": self.worker_id, "providers": self.only or "all",
                                          "concurrency": self.concurrency})

    async def stop(self) -> None:
        await self.stop_loops()
        await self._claims.release()
        await self.processor.stop()
        await self.completer.stop()
        await self.session.close()
        log.info("worker stopped", extra={"worker": self.worker_id})

    def on_finished(self, id: int, partition: str, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Booking a failure failed (Postgres away): the lease expires and the sweeper decides.
            log.warning("event bookkeeping failed; its lease will expire and it runs again",
                        extra={"provider": partition, "id": id, "error": f"{type(exc).__name__}: {exc}"[:300]})

    def suspect_partitions(self) -> dict[str, float]:
        return {p.name: float(p.lease_seconds) for p in self.providers()}

    async def start_suspect(self, row: asyncpg.Record) -> None:
        provider = self.registry.all().get(row["provider"])
        if provider is not None:
            self._start(provider, row, alone=True)  # never in a transaction with other events

    def _start(self, provider: Provider, row: asyncpg.Record, *, alone: bool = False) -> None:
        event = Event.from_row(row)
        deferred = row["deferred_since"]
        deferred_since = deferred.timestamp() if deferred is not None else None
        self.spawn(event.id, self.processor.process(event, provider, deferred_since, alone=alone),
                   provider.lease_seconds, provider.name)

    async def claim_round(self) -> int:
        providers = self.providers()
        if not providers:
            return 0
        self._rotation = (self._rotation + 1) % len(providers)
        claimed = 0
        for provider in providers[self._rotation:] + providers[: self._rotation]:
            if self.free_slots <= 0 or self.stopping:
                break
            if self.processor.waiting(provider):
                continue  # its handler does not import: nothing of it can run yet
            rows = await self._claims.fetch(CLAIM_EVENTS, provider.name, self.free_slots, self.worker_id,
                                            float(provider.lease_seconds))
            for row in rows:
                self._start(provider, row)
            claimed += len(rows)
        if not claimed:
            # Idle: the connections go back to the pool until the next claim (the completer's once its
            # last completion is written: an empty claim round comes every poll interval while idle).
            await self._claims.release()
            await self.completer.release_if_idle()
        return claimed
