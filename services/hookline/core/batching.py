"""Many concurrent callers, one database write per batch: the group-commit primitive.

Each caller submits an item and waits for its own result. Writer tasks take
whatever has queued up — at most ``max_batch`` items, after waiting at most
``window`` seconds for more — and hand the batch to ``write``, which returns one
result per item, in order. A caller's result arrives only after its batch's
write returned (for an autocommit statement or a transaction: after commit).

Every caller is answered whatever happens: if the write raises, or returns the
wrong number of results, every caller in that batch gets an exception and the
writer goes on with the next batch. With ``isolate``, a batch whose write failed
for a reason that belongs to some item (``isolate(exc)`` is true: bad data, not
an unavailable database) is bisected and written again in halves, so only the
offending items get the error and their batch-mates are written.

With ``max_queued`` the queue is bounded: ``submit`` raises :class:`BatcherFull`
at once instead of queueing behind a slow database. A caller that gives up
(its ``submit`` is cancelled, e.g. by a timeout) leaves the queue at once, so it
takes no room and is not written later.

With ``active`` only that many of the writers take work at a time (the caller may
change it as it learns how long a write takes): fewer writers, bigger batches.

Under light load a batch is one item and waits at most ``window``; under heavy
load batches grow by themselves while the previous write is in flight. The
receiver stores events this way, and workers and relays record completions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from hookline.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatcherFull(Exception):
    """The queue holds ``max_queued`` items already: try again later."""


class BatchResultMismatch(RuntimeError):
    """``write`` returned a different number of results than it was given items."""


class _Waiter(Generic[T, R]):
    """One submitted item and the future its caller awaits (compared by identity)."""

    __slots__ = ("future", "item")

    def __init__(self, item: T, future: asyncio.Future[R]) -> None:
        self.item = item
        self.future = future


class Batcher(Generic[T, R]):
    def __init__(self, write: Callable[[list[T]], Awaitable[Sequence[R]]], *, name: str,
                 max_batch: int = 128, window: float = 0.001, writers: int = 1,
                 expected: Callable[[], int] | None = None, max_queued: int | None = None,
                 isolate: Callable[[Exception], bool] | None = None,
                 limit: Callable[[int], int] | None = None, active: Callable[[], int] | None = None) -> None:
        self._write = write
        # How many writers may take work now (at least one); the others wait until it grows.
        self._active = active
        # Given how many items are queued, how many the next batch may take (within max_batch).
        self._limit = limit
        # How many items could still arrive (e.g. events in flight): waiting for more than
        # that cannot grow the batch, so the window is skipped.
        self._expected = expected
        self._name = name
        self._max_batch = max_batch
        self._window = window
        self._writers = writers
        self._max_queued = max_queued
        self._isolate = isolate
        self._queue: deque[_Waiter[T, R]] = deque()
        # Writers waiting for work, each on its own future: a submit wakes one of them, not
        # all (with one writer per concurrency slot, waking every writer per item cost more
        # CPU than the batching saved).
        self._waiting_writers: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._unfinished = 0  # queued or being written
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(i), name=f"{self._name}-{i}") for i in range(self._writers)]

    async def stop(self, timeout: float | None = None) -> None:
        """Write what is queued (its callers are waiting), then stop the writers; after ``timeout``
        seconds a write still running is cancelled."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    @property
    def queued(self) -> int:
        """Items submitted and not yet taken by a writer."""
        return len(self._queue)

    async def submit(self, item: T) -> R:
        """Wait for ``item``'s result; raises :class:`BatcherFull` at once when the queue is full."""
        return await self.wait(self.enqueue(item))

    async def wait(self, future: asyncio.Future[R]) -> R:
        """The result of an :meth:`enqueue`'s ``future``; a caller cancelled meanwhile withdraws its item."""
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(future)
            raise

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` and return the future its result will be set on, for a caller that is
        not a task of its own (the receiver's short lane); raises :class:`BatcherFull` at once.
        A caller that gives up (cancels the future or sets its exception) calls :meth:`withdraw`."""
        if self._max_queued is not None and len(self._queue) >= self._max_queued:
            raise BatcherFull(f"{self._name}: {len(self._queue)} items queued already")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiter(item, future))
        self._started(1)
        self._wake_one_writer()
        return future

    def withdraw(self, future: asyncio.Future[R]) -> None:
        """Take a given-up item out of the queue at once, so it takes no room and is not written
        (a batch already being written cannot be recalled; its result is then not delivered)."""
        for waiter in self._queue:
            if waiter.future is future:
                self._queue.remove(waiter)
                self._finished(1)
                return

    def _started(self, n: int) -> None:
        self._unfinished += n
        self._idle.clear()

    def _finished(self, n: int) -> None:
        self._unfinished -= n
        if self._unfinished == 0:
            self._idle.set()

    def _active_writers(self) -> int:
        return self._writers if self._active is None else max(1, self._active())

    def _wake_one_writer(self) -> None:
        """Wake the longest-waiting writer that may write now."""
        active = self._active_writers()
        for entry in self._waiting_writers:
            index, writer = entry
            if index < active and not writer.done():  # a writer cancelled at stop leaves a done future
                self._waiting_writers.remove(entry)
                writer.set_result(None)
                return

    def _take_ready(self, batch: list[_Waiter[T, R]]) -> None:
        most = self._max_batch if self._limit is None else max(1, min(self._max_batch, self._limit(len(self._queue))))
        while len(batch) < most and self._queue:
            batch.append(self._queue.popleft())

    async def _next_batch(self, index: int) -> list[_Waiter[T, R]]:
        while not self._queue or index >= self._active_writers():
            if self._queue:  # this writer stands down: queued items need one that may write
                self._wake_one_writer()
            wakeup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting_writers.append((index, wakeup))
            await wakeup
        batch: list[_Waiter[T, R]] = []
        self._take_ready(batch)
        if (len(batch) < self._max_batch and self._window > 0
                and (self._expected is None or len(batch) < self._expected())):
            await asyncio.sleep(self._window)
            self._take_ready(batch)
        return batch

    async def _loop(self, index: int) -> None:
        while True:
            batch = await self._next_batch(index)
            try:
                await self._flush(batch)
            except Exception as exc:  # a bug in the bookkeeping must not strand the callers
                log.exception("batch writer failed", extra={"batcher": self._name})
                self._fail(batch, exc)
            finally:
                self._finished(len(batch))

    async def _flush(self, batch: list[_Waiter[T, R]]) -> None:
        try:
            results = await self._write([w.item for w in batch])
            if len(results) != len(batch):
                raise BatchResultMismatch(f"{self._name}: write returned {len(results)} results "
                                          f"for {len(batch)} items")
        except Exception as exc:
            if len(batch) > 1 and self._isolate is not None and self._isolate(exc):
                # Some item's data is at fault: write the halves apart, so only the bad items fail.
                half = len(batch) // 2
                await self._flush(batch[:half])
                await self._flush(batch[half:])
                return
            log.warning("batched write failed", extra={"batcher": self._name, "items": len(batch),
                                                       "error": repr(exc)[:300]})
            self._fail(batch, exc)
            return
        for waiter, result in zip(batch, results, strict=True):
            if not waiter.future.done():
                waiter.future.set_result(result)

    @staticmethod
    def _fail(batch: list[_Waiter[T, R]], exc: Exception) -> None:
        for waiter in batch:
            if not waiter.future.done():
                waiter.future.set_exception(exc)
