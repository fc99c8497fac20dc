"""One timeout shared by many waiting futures, checked by one sweep per tick.

``asyncio.timeout`` arms a timer and cancels it again for every task it bounds: about
9 µs per event on the receiver's hot path, a few percent of its CPU per event. Every
event waits for the group commit under the same limit, so here each waiting future joins
a queue in arrival order (which is deadline order) and a sweeper, once per ``tick``,
fails those whose time is up with :class:`TimeoutError` and drops those that finished;
it stops at the first one still within its time. A deadline fires up to ``tick`` late.

Behind one slow batch at the front, the futures that finished since would stay until it did:
rate x timeout of them (90,000 at 9,000 events/s and 10 s). So once the queue holds more than
twice what was still waiting when it was last pruned (and more than ``PRUNE_FLOOR``), the sweep
drops every finished one; a queue that doubled before it is pruned again is not walked over and
over while most of it is still waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hookline.core.tasks import cancel_and_wait

Expired = Callable[["asyncio.Future[Any]"], None]

PRUNE_FLOOR = 1024  # below this many, finished futures behind a waiting one are left to the front's pace


class _Waiting:
    __slots__ = ("deadline", "future", "on_expiry")

    def __init__(self, future: asyncio.Future[Any], deadline: float, on_expiry: Expired) -> None:
        self.future = future
        self.deadline = deadline
        self.on_expiry = on_expiry


class Deadlines:
    def __init__(self, seconds: float, tick: float | None = None) -> None:
        self.seconds = seconds
        self.tick = tick if tick is not None else min(1.0, seconds / 10)
        self._waiting: deque[_Waiting] = deque()
        self._prune_above = PRUNE_FLOOR
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="deadlines")

    async def stop(self) -> None:
        await cancel_and_wait(self._sweeper)
        self._sweeper = None

    def watch(self, future: asyncio.Future[Any], on_expiry: Expired) -> None:
        """Fail ``future`` with :class:`TimeoutError` once ``seconds`` have passed, unless it is done
        by then, and call ``on_expiry(future)`` (to withdraw what it waits for)."""
        self._waiting.append(_Waiting(future, time.monotonic() + self.seconds, on_expiry))

    def held(self) -> int:
        """Futures held: waiting, and finished ones not dropped yet."""
        return len(self._waiting)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.expire(time.monotonic())

    def expire(self, now: float) -> None:
        """Fail the futures whose deadline is past; forget the finished ones at the front, and all
        finished ones once the queue has doubled since it was last pruned."""
        waiting = self._waiting
        while waiting and (waiting[0].future.done() or waiting[0].deadline <= now):
            late = waiting.popleft()
            if not late.future.done():
                late.future.set_exception(TimeoutError(f"not done within {self.seconds:g} s"))
                late.on_expiry(late.future)
        if len(waiting) <= PRUNE_FLOOR:
            self._prune_above = PRUNE_FLOOR
        elif len(waiting) > self._prune_above:
            self._waiting = deque(w for w in waiting if not w.future.done())
            self._prune_above = max(PRUNE_FLOOR, 2 * len(self._waiting))
