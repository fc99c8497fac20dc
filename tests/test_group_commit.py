"""The receiver's group committer on a real Postgres: how many writers it keeps busy, and its store deadline.

Each test holds a SHARE lock on hookline.inbox_keys, so every batch a writer sends waits in Postgres
until the test lets it go, and counts the waiting statements in pg_stat_activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from hookline.core import db
from hookline.receiver.group_commit import GroupCommitter, InboxRow

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The only sessions of this test's database waiting for a lock are the committer's writers.
WAITING_INSERTS = """SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'"""


def row() -> InboxRow:
    return InboxRow("open", f"evt_{uuid.uuid4().hex}", None, None, {}, b"{}", None)


@dataclass
class Locked:
    committer: GroupCommitter
    pool: asyncpg.Pool
    lock: asyncpg.transaction.Transaction
    # pg_stat_activity is read outside the locker's transaction, whose view of it stays put.
    watcher: asyncpg.Connection

    async def until_waiting(self, batches: int) -> None:
        for _ in range(500):
            if await self.waiting() == batches:
                return
            await asyncio.sleep(0.02)
        pytest.fail(f"never {batches} batches waiting (now {await self.waiting()})")

    async def waiting(self) -> int:
        return int(await self.watcher.fetchval(WAITING_INSERTS))


@contextlib.asynccontextmanager
async def locked_committer(database_url: str, **options: Any) -> AsyncIterator[Locked]:
    pool = await db.create_pool(database_url, max_size=4)
    committer = GroupCommitter(pool, **options)
    committer.start()
    locker = await asyncpg.connect(database_url)
    watcher = await asyncpg.connect(database_url)
    lock = locker.transaction()
    await lock.start()
    await locker.execute("LOCK TABLE hookline.inbox_keys IN SHARE MODE")
    try:
        yield Locked(committer, pool, lock, watcher)
    finally:
        await locker.close()
        await watcher.close()
        await committer.stop()
        await pool.close()


async def settle() -> None:
    for _ in range(10):  # time enough for a woken writer to take what is queued, were one allowed to
        await asyncio.sleep(0)


async def test_one_writer_until_more_than_a_full_batch_waits(database_url: str) -> None:
    async with locked_committer(database_url, max_batch=8, window=0, flushers=4) as locked:
        committer = locked.committer
        stores = [asyncio.create_task(committer.store(row()))]
        await locked.until_waiting(1)
        stores += [asyncio.create_task(committer.store(row())) for _ in range(5)]
        await settle()
        assert committer.queued == 5  # fewer than a full batch: they wait for the one writer
        assert await locked.waiting() == 1
        stores += [asyncio.create_task(committer.store(row())) for _ in range(20)]
        # 25 queued: a writer joins per full batch waiting (1 + queued // 8). Two more take 8 each;
        # with the 9 left that allows two writers, and three are busy: the 9 wait.
        await locked.until_waiting(3)
        await settle()
        assert committer.queued == 9
        assert await locked.waiting() == 3
        await locked.lock.rollback()
        results = await asyncio.gather(*stores)
        assert all(r.is_new for r in results)
        assert await locked.pool.fetchval("SELECT count(*) FROM hookline.inbox") == len(stores)


async def test_a_store_not_done_in_time_raises_timeout_and_leaves_the_queue(database_url: str) -> None:
    async with locked_committer(database_url, max_batch=8, window=0, flushers=1, store_timeout=0.5) as locked:
        committer = locked.committer
        written = asyncio.create_task(committer.store(row()))
        await locked.until_waiting(1)
        queued = [asyncio.create_task(committer.store(row())) for _ in range(3)]
        for store in (written, *queued):
            with pytest.raises(TimeoutError):
                await store
        assert committer.queued == 0  # the late rows left the queue: they are not written later
        await locked.lock.rollback()
        assert (await committer.store(row())).is_new  # the writer goes on
        # The batch being written when its caller gave up is stored (the sender's retry: a duplicate).
        assert await locked.pool.fetchval("SELECT count(*) FROM hookline.inbox") == 2


async def test_a_task_cancelled_by_someone_else_is_cancelled_not_timed_out(database_url: str) -> None:
    async with locked_committer(database_url, max_batch=8, window=0, flushers=1, store_timeout=30) as locked:
        written = asyncio.create_task(locked.committer.store(row()))
        await locked.until_waiting(1)
        queued = asyncio.create_task(locked.committer.store(row()))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await locked.lock.rollback()
        assert (await written).is_new
