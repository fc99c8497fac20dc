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
import sys
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from hookline.core import db, metrics, pools
from hookline.core.batching import Batcher
from hookline.core.consumer import HeldConnection, LeasedConsumer
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.host import Connections, RegistryUse, Wiring
from hookline.core.http_client import WebhookClient
from hookline.core.listener import Listener
from hookline.core.maintenance import Job, inbox_jobs
from hookline.core.partitions import Retention
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.queue import INBOX, make_worker_id
from hookline.core.settings import Settings, WorkerSettings
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
    """The worker, a component of a Host (core/host.py): ``hookline worker`` and ``hookline dev``."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, listener: Listener,
                 settings: WorkerSettings | None = None, *, retention: Retention | None = None,
                 worker_id: str | None = None) -> None:
        settings = settings or WorkerSettings()
        concurrency = settings.concurrency
        super().__init__(pool, INBOX, worker_id=worker_id or make_worker_id(),
                         channels=(INBOX.channel,), concurrency=concurrency,
                         poll_interval=settings.poll_interval, grace_period=settings.grace_period, listener=listener,
                         # Under load, claim once a quarter of the slots is free rather than for every
                         # single one: claims of one event made the claims, and transactions of one
                         # event, the work (idle, every slot is free and the first event goes at once).
                         refill=concurrency // 4,
                         # As many effects may wait for their batched completion as run at once.
                         completion_overlap=concurrency)
        self.registry = registry
        self.settings, self.retention = settings, retention or Retention()
        self.only = list(settings.providers) if settings.providers else None
        self.completer = BatchCompleter(pool, self.worker_id, lambda: len(self.in_flight))
        self.session = WebhookClient(allow_private_networks=True, connections=concurrency)
        self.processor = Processor(pool, self.session, self.worker_id, self.completer.complete, self.effect_done,
                                   concurrency=concurrency, batch_seconds=settings.batch_seconds)
        self._rotation = 0
        # The claim loop's connection, kept while it claims back to back.
        self._claims = HeldConnection(pool)

    @classmethod
    def connections(cls, settings: Settings) -> Connections:
        # Connections open as load asks for them (an idle worker holds a few), up to the size the operator's
        # connection budget counts per worker pod: the pool, the shared LISTEN and the maintenance leader's
        # lease. A sweeping worker also takes part in the partition manager's election: one more lease
        # connection, on top of the budget (the operator starts no sweeping workers).
        worker = settings.worker
        return Connections(pools.worker(worker.concurrency) + (1 if worker.sweep else 0),
                           scopes=("inbox", "partitions") if worker.sweep else ("inbox",), min_pool=2,
                           generic_plans=True,
                           registry=RegistryUse(signing_secrets=False,
                                                destination_secret_file=worker.destination_secret_file))

    @classmethod
    def create(cls, wiring: Wiring) -> Worker:
        assert wiring.registry is not None  # connections() asks for it
        settings = wiring.settings.worker
        unknown = [n for n in settings.providers or () if wiring.registry.get(n) is None]
        if unknown:
            # Not fatal: the provider may be applied later; the worker picks it up then.
            print(f"hookline: warning: no provider named {', '.join(unknown)} yet; waiting for it", file=sys.stderr)
        return cls(wiring.pool, wiring.registry, wiring.listener, settings, retention=wiring.settings.retention)

    def jobs(self) -> Sequence[tuple[str, Job]]:
        return inbox_jobs(self.pool, self.registry, self.retention, sweep=self.settings.sweep)

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
            rows = await INBOX.fetch_claim(self._claims, CLAIM_EVENTS, provider.name, self.free_slots,
                                           self.worker_id, provider.lease_seconds)
            for row in rows:
                self._start(provider, row)
            claimed += len(rows)
        if not claimed:
            # Idle: the connections go back to the pool until the next claim (the completer's once its
            # last completion is written: an empty claim round comes every poll interval while idle).
            await self._claims.release()
            await self.completer.release_if_idle()
        return claimed
