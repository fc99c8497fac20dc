"""The receiver's group committer: how many writers it keeps busy (on a real Postgres)."""

from __future__ import annotations

import asyncio
import uuid

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


async def until(conn: asyncpg.Connection, waiting: int) -> None:
    for _ in range(500):
        if await conn.fetchval(WAITING_INSERTS) == waiting:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"never {waiting} batches waiting (now {await conn.fetchval(WAITING_INSERTS)})")


async def test_one_writer_until_more_than_a_full_batch_waits(database_url: str) -> None:
    pool = await db.create_pool(database_url, max_size=4)
    committer = GroupCommitter(pool, max_batch=8, window=0, flushers=4)
    committer.start()
    locker = await asyncpg.connect(database_url)
    # pg_stat_activity is read outside the locker's transaction, whose view of it stays put.
    watcher = await asyncpg.connect(database_url)
    tx = locker.transaction()
    await tx.start()
    await locker.execute("LOCK TABLE hookline.inbox_keys IN SHARE MODE")  # every batch waits
    try:
        stores = [asyncio.create_task(committer.store(row()))]
        await until(watcher, 1)
        stores += [asyncio.create_task(committer.store(row())) for _ in range(5)]
        for _ in range(10):  # time enough for another writer to take them, were one allowed to
            await asyncio.sleep(0)
        assert committer.queued == 5  # fewer than a full batch: they wait for the one writer
        assert await watcher.fetchval(WAITING_INSERTS) == 1
        stores += [asyncio.create_task(committer.store(row())) for _ in range(20)]
        # 25 queued: a writer joins per full batch waiting (1 + queued // 8). Two more take 8 each;
        # with the 9 left that allows two writers, and three are busy: the 9 wait.
        await until(watcher, 3)
        for _ in range(10):
            await asyncio.sleep(0)
        assert committer.queued == 9
        assert await watcher.fetchval(WAITING_INSERTS) == 3
        await tx.rollback()
        results = await asyncio.gather(*stores)
        assert all(r.is_new for r in results)
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == len(stores)
    finally:
        await locker.close()
        await watcher.close()
        await committer.stop()
        await pool.close()


async def test_a_store_not_done_in_time_raises_timeout_and_leaves_the_queue(database_url: str) -> None:
    pool = await db.create_pool(database_url, max_size=2)
    committer = GroupCommitter(pool, max_batch=8, window=0, flushers=1, store_timeout=0.5)
    committer.start()
    locker = await asyncpg.connect(database_url)
    watcher = await asyncpg.connect(database_url)
    tx = locker.transaction()
    await tx.start()
    await locker.execute("LOCK TABLE hookline.inbox_keys IN SHARE MODE")
    try:
        written = asyncio.create_task(committer.store(row()))
        await until(watcher, 1)
        queued = [asyncio.create_task(committer.store(row())) for _ in range(3)]
        for store in (written, *queued):
            with pytest.raises(TimeoutError):
                await store
        assert committer.queued == 0  # the late rows left the queue: they are not written later
        await tx.rollback()
        assert (await committer.store(row())).is_new  # the writer goes on
        # The batch being written when its caller gave up is stored (the sender's retry: a duplicate).
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == 2
    finally:
        await locker.close()
        await watcher.close()
        await committer.stop()
        await pool.close()


async def test_a_task_cancelled_by_someone_else_is_cancelled_not_timed_out(database_url: str) -> None:
    pool = await db.create_pool(database_url, max_size=2)
    committer = GroupCommitter(pool, max_batch=8, window=0, flushers=1, store_timeout=30)
    committer.start()
    locker = await asyncpg.connect(database_url)
    watcher = await asyncpg.connect(database_url)
    tx = locker.transaction()
    await tx.start()
    await locker.execute("LOCK TABLE hookline.inbox_keys IN SHARE MODE")
    try:
        written = asyncio.create_task(committer.store(row()))
        await until(watcher, 1)
        queued = asyncio.create_task(committer.store(row()))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await tx.rollback()
        assert (await written).is_new
    finally:
        await locker.close()
        await watcher.close()
        await committer.stop()
        await pool.close()
