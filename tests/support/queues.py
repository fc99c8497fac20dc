"""Rows in either queue (inbox events, outbox deliveries), for tests of the queue mechanics."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from hookline import outbox
from hookline.core.queue import INBOX, OUTBOX, Queue
from hookline.relay import endpoints
from support.inbox import insert_events


@dataclass(frozen=True)
class QueueCase:
    """One queue and how to fill one of its partitions (a provider, or an endpoint)."""

    name: str
    queue: Queue

    async def add(self, pool: asyncpg.Pool, partition: str, count: int, *, key: str | None = None) -> list[int]:
        """``count`` pending rows in ``partition`` (of one order key when given); their ids, oldest first."""
        before = set(await self.ids(pool, partition))
        if self.queue is INBOX:
            await insert_events(pool, partition, count, entity_key=key)
        else:
            async with pool.acquire() as conn, conn.transaction():
                if not await conn.fetchval("SELECT 1 FROM hookline.endpoints WHERE name = $1", partition):
                    await endpoints.add(conn, partition, f"https://{partition}.example.com/hook", ordered=True)
                for _ in range(count):
                    await outbox.publish(conn, "test.event", {}, aggregate_type=key and "k", aggregate_id=key,
                                         endpoint=partition)
        return [id for id in await self.ids(pool, partition) if id not in before]

    async def ids(self, pool: asyncpg.Pool, partition: str, status: str = "pending") -> list[int]:
        return [r["id"] for r in await pool.fetch(
            f"SELECT id FROM {self.queue.table} WHERE {self.queue.partition} = $1 AND status = $2 ORDER BY id",
            partition, status)]

    async def row(self, pool: asyncpg.Pool, id: int) -> asyncpg.Record:
        row = await pool.fetchrow(f"SELECT * FROM {self.queue.table} WHERE id = $1", id)
        assert row is not None, f"no row {id} in {self.queue.table}"
        return row


QUEUES = [QueueCase("inbox", INBOX), QueueCase("outbox", OUTBOX)]
