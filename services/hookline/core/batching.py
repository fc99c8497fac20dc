"""Many concurrent callers, one database write per batch: the group-commit primitive.

Each caller submits an item and waits for its own result. Writer tasks take
whatever has queued up — at most ``max_batch`` items, after waiting at most
``window`` seconds for more — and hand the batch to ``write``, which returns one
result per item, in order. A caller's result arrives only after its batch's
write returned (for an autocommit statement or a transaction: after commit). If
the write fails, every caller in that batch gets the exception.

Under light load a batch is one item and waits at most ``window``; under heavy
load batches grow by themselves while the previous write is in flight. The
receiver stores events this way, and workers and relays record completions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    def __init__(self, write: Callable[[list[T]], Awaitable[Sequence[R]]], *, name: str,
                 max_batch: int = 128, window: float = 0.001, writers: int = 1,
                 expected: Callable[[], int] | None = None) -> None:
        self._write = write
        # How many items could still arrive (e.g. events in flight): waiting for more than
        # that cannot grow the batch, so the window is skipped.
        self._expected = expected
        self._name = name
        self._max_batch = max_batch
        self._window = window
        self._writers = writers
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(), name=f"{self._name}-{i}") for i in range(self._writers)]

    async def stop(self) -> None:
        """Write what is queued (its callers are waiting), then stop the writers."""
        if self._tasks:
            await self._queue.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    @property
    def queued(self) -> int:
        """Items submitted and not yet written."""
        return self._queue.qsize()

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return await future

    def _take_ready(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        while len(batch) < self._max_batch and not self._queue.empty():
            batch.append(self._queue.get_nowait())

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            self._take_ready(batch)
            if (len(batch) < self._max_batch and self._window > 0
                    and (self._expected is None or len(batch) < self._expected())):
                await asyncio.sleep(self._window)
                self._take_ready(batch)
            try:
                await self._flush(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([item for item, _ in batch])
        except Exception as exc:
            log.warning("batched write failed", extra={"batcher": self._name, "items": len(batch),
                                                       "error": repr(exc)[:300]})
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
