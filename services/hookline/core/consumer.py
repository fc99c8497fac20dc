"""The consumer loop shared by the inbox worker and the outbox relay.

Both do the same thing with different rows: claim leased rows partition by
partition, run one task per row, keep the leases alive while the tasks run,
wake up on NOTIFY (the process's ``core/listener.py``; polling as the fallback),
and on shutdown stop claiming, let in-flight tasks finish within a grace period,
and hand back the leases of the rest. Subclasses say what a claim round is
(``claim_round``) and call ``spawn`` for each claimed row.

Leases last until the outcome is committed. A task says when its effect is done
(``effect_done``); up to ``completion_overlap`` such tasks then wait for their
batched completion without holding a concurrency slot, so the next claim
overlaps the completion. Their ids stay in the heartbeat's set until the task
ends, so a slow completion never lets the sweeper hand a finished effect to
another consumer, and shutdown never hands such a lease back.

Crash isolation. A row whose lease expired is a *suspect* (see ``core/queue.py``):
it may be what killed its last consumer. Normal claims skip suspects. Now and
then the claim loop asks whether one is due; if so it stops claiming, lets
everything in flight finish, claims one suspect, and claims nothing else until
that task has ended. If the suspect kills the process again, no other row was in
it, so a crash costs attempts only to the row that causes it, and an innocent row
that shared a consumer with it loses at most the one attempt it was in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg

from hookline.core import db, metrics
from hookline.core.listener import Listener, Subscription
from hookline.core.queue import Queue
from hookline.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")

SUSPECT_CHECK_INTERVAL = 1.0  # seconds between "is a suspect due?" probes (one index probe each)
MIN_IDLE_WAIT = 0.01  # seconds: a row due this instant is claimed by the next round, not by a busy loop


class LeasedConsumer(ABC):
    def __init__(self, pool: asyncpg.Pool, queue: Queue, *, worker_id: str, channels: tuple[str, ...],
                 concurrency: int, poll_interval: float, grace_period: float, refill: int = 1,
                 completion_overlap: int = 0, listener: Listener) -> None:
        self.pool = pool
        self.queue = queue
        self.worker_id = worker_id
        self.channels = channels
        # The process's shared LISTEN connection (the Host's: core/host.py), started and stopped by its owner.
        self.listener = listener
        self._subscription: Subscription | None = None
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        # Claim again only once this many slots are free: claiming for every single free
        # slot would make the claim round trips, not the work, set the pace.
        self.refill = max(1, min(refill, concurrency))
        # id -> (task, lease, partition): tasks holding a concurrency slot.
        self.in_flight: dict[int, tuple[asyncio.Task[Any], float, str]] = {}
        # Tasks whose effect is done and whose completion is not committed yet: lease still kept.
        self.completing: dict[int, tuple[asyncio.Task[Any], float, str]] = {}
        # How many of those hold no slot. Bounded: while completions pile up (Postgres slow), stop claiming.
        self.completion_overlap = completion_overlap
        self.suspect: int | None = None  # the suspect running alone, if any
        self.suspect_check_interval = max(SUSPECT_CHECK_INTERVAL, poll_interval)
        self._suspect_waiting = False  # a suspect is due: drain, then run it alone
        self._suspects_checked = 0.0
        self.stopping = False
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    # --- what subclasses provide -----------------------------------------------------------

    @abstractmethod
    async def claim_round(self) -> int:
        """Claim what is due (round robin over partitions), ``spawn`` a task per row; return the count."""

    @abstractmethod
    def suspect_partitions(self) -> dict[str, float]:
        """The partitions this consumer may claim suspects from, with their lease lengths."""

    @abstractmethod
    async def start_suspect(self, row: asyncpg.Record) -> None:
        """Start the task for a claimed suspect row (with ``spawn``), as ``claim_round`` does for its rows."""

    def shortest_lease(self) -> float:
        """The shortest lease a claim may take; paces the heartbeat. Subclasses that know their
        partitions' leases say so (the default sees only what is leased at the moment)."""
        leased = [*self.in_flight.values(), *self.completing.values()]
        return min((lease for _, lease, _ in leased), default=60.0)

    def on_notify(self, channel: str, payload: str) -> bool:
        """Whether a notification should wake the claim loop."""
        return True

    def on_finished(self, id: int, partition: str, task: asyncio.Task[Any]) -> None:  # noqa: B027 - optional hook
        """Called when a spawned task ends (finished, failed or cancelled)."""

    # --- the shared mechanism --------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        return self.concurrency - len(self.in_flight) - max(0, len(self.completing) - self.completion_overlap)

    @property
    def busy(self) -> bool:
        """Anything running, or waiting for its completion, in this consumer."""
        return bool(self.in_flight or self.completing)

    def wake(self) -> None:
        self._wake.set()

    def spawn(self, id: int, work: Coroutine[Any, Any, Any], lease_seconds: float, partition: str) -> None:
        task = asyncio.create_task(work)
        self.in_flight[id] = (task, lease_seconds, partition)
        task.add_done_callback(functools.partial(self._finished, id))

    def effect_done(self, id: int) -> None:
        """The effect of ``id`` happened and only its bookkeeping is pending: let the next claim in now
        (within ``completion_overlap``), so claiming overlaps the batched completion instead of waiting
        for it. The heartbeat keeps extending its lease until the task ends (completion committed, or
        given up), and shutdown does not hand it back."""
        entry = self.in_flight.pop(id, None)
        if entry is not None:
            self.completing[id] = entry
            self._slot_freed()

    def _finished(self, id: int, task: asyncio.Task[Any]) -> None:
        entry = self.in_flight.pop(id, None) or self.completing.pop(id, None)
        if id == self.suspect:
            self.suspect = None
            self._suspect_waiting = True  # nothing is in flight: the next suspect, if any, goes now
        self._slot_freed()
        self.on_finished(id, entry[2] if entry else "", task)

    async def start_loops(self) -> None:
        # After a LISTEN reconnect notifications may have been missed: look at once.
        self._subscription = await self.listener.subscribe(self.channels, self._notified, self.wake)
        self._loops = [asyncio.create_task(self._claim_loop(), name="claim"),
                       asyncio.create_task(self._heartbeat_loop(), name="heartbeat")]

    async def stop_loops(self) -> None:
        """Stop claiming, let in-flight tasks finish within the grace period, give back the rest."""
        self.stopping = True
        self._slot_free.set()
        self._wake.set()
        if self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loops[0]
        running = [task for task, _, _ in [*self.in_flight.values(), *self.completing.values()]]
        if running:
            await asyncio.wait(running, timeout=self.grace_period)
        unfinished = {id: task for id, (task, _, _) in self.in_flight.items() if not task.done()}
        # Effects done but not booked: never released (that would repeat the effect at once);
        # their leases run out and the next attempt's guarded completion decides.
        unbooked = [task for task, _, _ in self.completing.values() if not task.done()]
        cancelled = [*unfinished.values(), *unbooked]
        for task in cancelled:
            task.cancel()
        if cancelled:
            await asyncio.wait(cancelled, timeout=5)
        if unbooked:
            log.warning("shutdown before these completions were written; their leases will expire",
                        extra={"queue": self.queue.table, "count": len(unbooked)})
        if unfinished:
            # Their transactions rolled back (or their calls were cut off): the next consumer takes them now.
            released = await self.queue.release(self.pool, list(unfinished), self.worker_id)
            log.info("released leases on shutdown", extra={"count": len(released)})
        await cancel_and_wait(*self._loops[1:])
        self._loops = []
        if self._subscription is not None:
            self.listener.unsubscribe(self._subscription)

    def _slot_freed(self) -> None:
        # Wake the claim loop only once it may claim (what it waits for): woken for every task that
        # ends, it mostly found too few free slots and slept again, a task switch per event. Once
        # set, it stays set until the loop waits again: nothing to work out until then.
        if not self._slot_free.is_set() and self._may_claim():
            self._slot_free.set()

    def _may_claim(self) -> bool:
        if self.suspect is not None:
            return False  # a suspect runs alone
        if self._suspect_waiting:
            return not self.busy  # draining so that the suspect can run alone
        return self.free_slots >= self.refill

    async def _claim_loop(self) -> None:
        while not self.stopping:
            while not self._may_claim() and not self.stopping:
                self._slot_free.clear()
                await self._slot_free.wait()
            if self.stopping:
                break
            self._wake.clear()
            try:
                if await self._suspect_due():
                    if self.busy:
                        continue  # claim nothing more; the wait above lasts until in-flight work is done
                    # Nothing claimed means another consumer took the suspect: claim as usual.
                    claimed = await self._claim_suspect() or await self.claim_round()
                else:
                    claimed = await self.claim_round()
            except Exception as exc:
                log.warning("claim failed; retrying", extra={"queue": self.queue.table, "error": str(exc)})
                await asyncio.sleep(1)
                continue
            if not claimed:
                try:
                    await asyncio.wait_for(self._wake.wait(), await self._idle_timeout())
                except TimeoutError:
                    # Nothing woke us: a row came due (or the poll interval ran out). A suspect the sweep
                    # made is due the same way, so look for one now, not a whole check interval later.
                    self._suspects_checked = 0.0

    async def _idle_timeout(self) -> float:
        """How long an idle claim loop waits for a wake-up: until the next row of its partitions comes
        due (retry backoff, deferral, swept lease: nothing notifies then), or its claims are due a look
        without their floor (``ClaimFloors``), at most the poll interval."""
        try:
            due = await self.queue.next_due(self.pool, list(self.suspect_partitions()))
        except Exception as exc:
            log.warning("could not read when the next row is due; polling", extra={"queue": self.queue.table,
                                                                                  "error": str(exc)})
            due = None
        waits = [w for w in (due, self.queue.floors.full_scan_due_in()) if w is not None]
        return min(self.poll_interval, max(MIN_IDLE_WAIT, min(waits))) if waits else self.poll_interval

    async def _suspect_due(self) -> bool:
        """Whether a suspect waits for this consumer; asked at most once per check interval."""
        now = time.monotonic()
        if not self._suspect_waiting and now >= self._suspects_checked + self.suspect_check_interval:
            self._suspects_checked = now
            partitions = self.suspect_partitions()
            self._suspect_waiting = bool(partitions) and await self.queue.suspects_due(self.pool, list(partitions))
        return self._suspect_waiting

    async def _claim_suspect(self) -> int:
        """Claim one suspect and start it; nothing else is in flight, and nothing is claimed until it ends."""
        self._suspect_waiting = False
        row = await self.queue.claim_suspect(self.pool, self.suspect_partitions(), self.worker_id)
        if row is None:
            return 0
        partition = row[self.queue.partition]
        metrics.suspects_claimed.labels(self.queue.table, partition).inc()
        log.info("running a suspect alone (its last lease expired)",
                 extra={"queue": self.queue.table, "id": row["id"], "partition": partition,
                        "attempt": row["attempts"]})
        self.suspect = row["id"]
        try:
            await self.start_suspect(row)
        finally:
            if row["id"] not in self.in_flight:
                self.suspect = None  # not started (e.g. its partition vanished): its lease runs out
        return 1

    def _notified(self, channel: str, payload: str) -> None:
        """NOTIFY is only a hint to look sooner; without it the claim loop polls."""
        if self.on_notify(channel, payload):
            self._wake.set()

    async def _heartbeat_loop(self) -> None:
        """Extend in-flight leases well before they run out; abandon work whose lease was lost."""
        while True:
            await asyncio.sleep(max(0.2, self.shortest_lease() / 3))
            by_lease: dict[float, list[int]] = {}
            for id, (_, lease, _) in [*self.in_flight.items(), *self.completing.items()]:
                by_lease.setdefault(lease, []).append(id)
            for lease, ids in by_lease.items():
                try:
                    lost = await self.queue.extend_leases(self.pool, ids, self.worker_id, lease)
                except Exception as exc:
                    log.warning("heartbeat failed", extra={"queue": self.queue.table, "error": str(exc)})
                    continue
                for id in lost:
                    if id in self.in_flight:
                        # The sweeper or another consumer has it; our result would not be committed anyway.
                        log.warning("lease lost; abandoning", extra={"queue": self.queue.table, "id": id})
                        self.in_flight[id][0].cancel()
                    elif id in self.completing:
                        # The effect happened; the guarded completion will find the row taken and report it.
                        log.warning("lease lost after the effect, before its completion was written",
                                    extra={"queue": self.queue.table, "id": id})


class HeldConnection:
    """A pool connection kept between statements by one loop that runs them back to back (a claim loop
    under a backlog), and given back when the loop goes idle (``release``) or a statement fails (the
    pool then replaces the connection if it broke). A pool acquire and release cost the worker about
    as much CPU as a 32-event claim's round trip; a claim loop under load takes one about every
    millisecond. Never the pool's last connection: after each statement it goes back if no other
    one is left (transactional handlers hold the rest), so the heartbeat and the other loops still
    get one. One loop only: statements on it never overlap."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: asyncpg.pool.PoolConnectionProxy | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    @property
    def lost(self) -> bool:
        """Whether the kept connection was ended by the server (a failover) and is not replaced yet.
        The server's goodbye reaches the client a moment after the backend is gone."""
        return self._conn is not None and db.connection_lost(self._conn)

    async def run(self, statement: Callable[[asyncpg.pool.PoolConnectionProxy], Awaitable[T]]) -> T:
        """``statement`` on the kept connection (taken from the pool if none is kept). It goes back when
        the statement fails, and after it when the pool has no other connection left."""
        if self.lost:
            await self.release()  # the server ended it while kept (a failover): the pool replaces it
        if self._conn is None:
            self._conn = await self._pool.acquire()
        try:
            result = await statement(self._conn)
        except BaseException:
            await self.release()
            raise
        pool = self._pool
        if pool.get_idle_size() == 0 and pool.get_size() >= pool.get_max_size():
            await self.release()
        return result

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        return await self.run(lambda conn: conn.fetch(sql, *args))

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.release(conn)


async def write_completion(write: Callable[[], Awaitable[bool]], lease_seconds: float,
                           context: dict[str, object]) -> bool | None:
    """Write the completion of an effect that has happened: True once written, False when the
    lease had been lost (the guarded write matched nothing). A write that raises is retried for
    one lease length from the first failure, while the heartbeat keeps the lease; then None: the
    outcome is unknown, the row is left as it is, its lease expires and the next attempt's
    guarded completion decides. Never a retry or a dead letter: the effect succeeded."""
    give_up_at: float | None = None
    pause = 0.05
    while True:
        try:
            return await write()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            give_up_at = give_up_at or time.monotonic() + lease_seconds
            if time.monotonic() + pause >= give_up_at:
                log.error("effect done but its completion could not be written; the lease will expire and it "
                          "runs again", extra={**context, "error": error})
                return None
            log.warning("completion write failed; retrying while the lease lasts", extra={**context, "error": error})
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)
