"""The group-commit primitive: every caller is answered, whatever the write does.

These drive ``Batcher`` with small write functions (no database is needed to show the
bookkeeping); the receiver tests show the same over a real Postgres.
"""

from __future__ import annotations

import asyncio

import pytest

from hookline.core.batching import Batcher, BatcherFull, BatchResultMismatch

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Poison(ValueError):
    """Stands in for a data error: the item's own fault."""


async def test_a_write_returning_the_wrong_number_of_results_fails_its_batch_only() -> None:
    calls: list[list[int]] = []

    async def write(items: list[int]) -> list[int]:
        calls.append(items)
        return items[:-1] if 13 in items else items  # one result short when 13 is in the batch

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=8, window=0.05)
    batcher.start()
    try:
        first = await asyncio.gather(*(batcher.submit(i) for i in (11, 12, 13)), return_exceptions=True)
        assert all(isinstance(r, BatchResultMismatch) for r in first)
        # The writer survived: later submits are answered.
        assert await asyncio.gather(*(batcher.submit(i) for i in (1, 2))) == [1, 2]
    finally:
        await asyncio.wait_for(batcher.stop(), 5)


async def test_isolate_bisects_so_only_the_bad_items_fail() -> None:
    async def write(items: list[int]) -> list[int]:
        if any(i < 0 for i in items):
            raise Poison(f"negative in {items}")
        return [i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=64, window=0.05,
                                         isolate=lambda exc: isinstance(exc, Poison))
    batcher.start()
    try:
        items = [1, 2, -3, 4, 5, 6, -7, 8, 9]
        results = await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)
        for item, result in zip(items, results, strict=True):
            if item < 0:
                assert isinstance(result, Poison)
            else:
                assert result == item * 10
    finally:
        await batcher.stop()


async def test_errors_that_are_not_isolated_fail_the_whole_batch() -> None:
    async def write(items: list[int]) -> list[int]:
        raise ConnectionError("database went away")

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=64, window=0.05,
                                         isolate=lambda exc: isinstance(exc, Poison))
    batcher.start()
    try:
        results = await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
    finally:
        await batcher.stop()


async def test_bounded_queue_refuses_at_once_and_cancelled_callers_leave_it() -> None:
    gate = asyncio.Event()
    written: list[int] = []

    async def write(items: list[int]) -> list[int]:
        await gate.wait()
        written.extend(items)
        return items

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=1, window=0, max_queued=2)
    batcher.start()
    try:
        in_flight = asyncio.create_task(batcher.submit(0))
        await asyncio.sleep(0.01)
        assert batcher.queued == 0  # the writer has taken item 0 and waits on the gate
        queued = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        assert batcher.queued == 2
        with pytest.raises(BatcherFull):
            await batcher.submit(3)
        queued[0].cancel()  # a caller gives up (its request timed out)
        with pytest.raises(asyncio.CancelledError):
            await queued[0]
        assert batcher.queued == 1
        later = asyncio.create_task(batcher.submit(4))  # room again
        await asyncio.sleep(0.01)
        gate.set()
        assert await asyncio.gather(in_flight, queued[1], later) == [0, 2, 4]
        assert 1 not in written  # the cancelled item was never written
    finally:
        gate.set()
        await batcher.stop()


async def test_stop_waits_for_queued_items() -> None:
    async def write(items: list[int]) -> list[int]:
        await asyncio.sleep(0.05)
        return items

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=2, window=0)
    batcher.start()
    pending = [asyncio.create_task(batcher.submit(i)) for i in range(6)]
    await asyncio.sleep(0)
    await batcher.stop()
    assert [t.result() for t in pending] == list(range(6))


async def test_only_the_active_writers_take_work_and_more_are_let_in_as_it_grows() -> None:
    """``active`` caps how many writers write at once (fewer writers, bigger batches); when it grows,
    waiting writers join in at the next submit."""
    active = 1
    writing = 0
    most_at_once = 0
    sizes: list[int] = []
    release = asyncio.Event()

    async def write(items: list[int]) -> list[int]:
        nonlocal writing, most_at_once
        writing += 1
        most_at_once = max(most_at_once, writing)
        sizes.append(len(items))
        await release.wait()
        writing -= 1
        return items

    batcher: Batcher[int, int] = Batcher(write, name="t", max_batch=100, window=0.0, writers=4,
                                         active=lambda: active)
    batcher.start()
    try:
        first = asyncio.ensure_future(asyncio.gather(*(batcher.submit(i) for i in range(10))))
        await asyncio.sleep(0.05)
        more = asyncio.ensure_future(asyncio.gather(*(batcher.submit(i) for i in range(10, 20))))
        await asyncio.sleep(0.05)
        assert most_at_once == 1  # one writer busy; the other three stood down
        active = 3
        last = asyncio.ensure_future(asyncio.gather(*(batcher.submit(i) for i in range(20, 25))))
        await asyncio.sleep(0.05)
        assert most_at_once == 2  # a second writer took what had queued meanwhile
        release.set()
        assert await asyncio.wait_for(asyncio.gather(first, more, last), 5) == [
            list(range(10)), list(range(10, 20)), list(range(20, 25))]
        assert sum(sizes) == 25 and max(sizes) >= 10  # what queued behind the one writer went as one batch
    finally:
        release.set()
        await batcher.stop()
