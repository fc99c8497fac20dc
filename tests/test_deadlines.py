"""The receiver's shared store deadline: late futures fail, finished ones are not kept behind a slow one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hookline.receiver.deadlines import PRUNE_FLOOR, Deadlines


def watched(deadlines: Deadlines, expired: list[asyncio.Future[Any]], n: int, *,
            finish: bool) -> list[asyncio.Future[Any]]:
    """``n`` new futures watched, each withdrawn into ``expired`` when late; ``finish``: done at once."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(n)]
    for future in futures:
        deadlines.watch(future, expired.append)
        if finish:
            future.set_result("stored")
    return futures


async def test_finished_futures_behind_a_slow_one_are_dropped_and_the_slow_ones_still_expire() -> None:
    deadlines = Deadlines(10)
    expired: list[asyncio.Future[Any]] = []
    slow = watched(deadlines, expired, 1, finish=False)
    watched(deadlines, expired, 3 * PRUNE_FLOOR, finish=True)
    slow += watched(deadlines, expired, 1, finish=False)
    watched(deadlines, expired, 3 * PRUNE_FLOOR, finish=True)

    deadlines.expire(time.monotonic())  # within the time: nothing fails, the finished ones go
    assert deadlines.held() == 2
    assert not expired and not any(f.done() for f in slow)

    deadlines.expire(time.monotonic() + 11)
    assert expired == slow  # in arrival order, each withdrawn once
    assert all(isinstance(f.exception(), TimeoutError) for f in slow)
    assert deadlines.held() == 0


async def test_a_queue_mostly_still_waiting_is_not_walked_again_until_it_doubles() -> None:
    deadlines = Deadlines(10)
    expired: list[asyncio.Future[Any]] = []
    waiting = watched(deadlines, expired, 2 * PRUNE_FLOOR, finish=False)
    watched(deadlines, expired, PRUNE_FLOOR, finish=True)
    deadlines.expire(time.monotonic())
    assert deadlines.held() == 2 * PRUNE_FLOOR  # pruned once: the finished third went
    watched(deadlines, expired, PRUNE_FLOOR, finish=True)
    deadlines.expire(time.monotonic())
    assert deadlines.held() == 3 * PRUNE_FLOOR  # not yet twice what was waiting: left as it is
    watched(deadlines, expired, PRUNE_FLOOR + 1, finish=True)
    deadlines.expire(time.monotonic())
    assert deadlines.held() == 2 * PRUNE_FLOOR
    for future in waiting:
        future.set_result("stored")
    deadlines.expire(time.monotonic())
    assert deadlines.held() == 0 and not expired
