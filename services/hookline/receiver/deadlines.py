"""One timeout shared by many waiting tasks, checked by one sweep per tick.

``asyncio.timeout`` arms a timer and cancels it again for every task it bounds: about
9 µs per event on the receiver's hot path, a few percent of its CPU per event. Every
event waits for the group commit under the same limit, so here each waiting task joins
a queue in arrival order (which is deadline order) and a sweeper, once per ``tick``,
cancels those whose time is up and drops those that finished; it stops at the first
one still within its time. A deadline fires up to ``tick`` late.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable
from typing import TypeVar

from hookline.core.tasks import cancel_and_wait

T = TypeVar("T")


class _Waiting:
    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        # None once done: a finished task holds its result, which need not wait for the sweep.
        self.task: asyncio.Task[object] | None = task
        self.deadline = deadline
        self.cancelling = task.cancelling()  # cancellations asked for before ours (as asyncio.timeout)
        self.expired = False


class Deadlines:
    def __init__(self, seconds: float, tick: float | None = None) -> None:
        self.seconds = seconds
        self.tick = tick if tick is not None else min(1.0, seconds / 10)
        self._waiting: deque[_Waiting] = deque()
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="deadlines")

    async def stop(self) -> None:
        await cancel_and_wait(self._sweeper)
        self._sweeper = None

    async def within(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, or :class:`TimeoutError` once ``seconds`` have passed (and the
        awaitable is cancelled). Only in a task, and only while started."""
        task = asyncio.current_task()
        assert task is not None, "Deadlines.within runs in a task"
        waiting = _Waiting(task, time.monotonic() + self.seconds)
        self._waiting.append(waiting)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if waiting.expired and task.uncancel() <= waiting.cancelling:
                raise TimeoutError(f"not done within {self.seconds:g} s") from None
            raise
        finally:
            waiting.task = None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.expire(time.monotonic())

    def expire(self, now: float) -> None:
        """Cancel the tasks whose deadline is past; forget the finished ones at the front."""
        waiting = self._waiting
        while waiting and (waiting[0].task is None or waiting[0].deadline <= now):
            late = waiting.popleft()
            if late.task is not None:  # not done
                late.expired = True
                late.task.cancel()
