"""Group commit for the receiver: concurrent requests share one INSERT per batch.

One statement (one transaction, one WAL flush) stores a whole batch with
``INSERT ... ON CONFLICT DO NOTHING``; each request is answered only after that
statement has committed. See ``hookline.core.batching`` for the mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from hookline.core import db, metrics
from hookline.core.batching import Batcher


@dataclass(frozen=True, slots=True)
class InboxRow:
    provider: str
    event_id: str
    event_type: str | None
    entity_key: str | None
    headers: dict[str, str]
    body: bytes
    content_type: str | None


class GroupCommitter:
    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 128, window: float = 0.001, flushers: int = 4
                 ) -> None:
        self._pool = pool
        self._sql = db.query("insert_inbox_batch")
        self._batcher: Batcher[InboxRow, bool] = Batcher(self._write, name="group-commit", max_batch=max_batch,
                                                         window=window, writers=flushers)

    def start(self) -> None:
        self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()

    async def store(self, row: InboxRow) -> bool:
        """Store ``row`` durably; True when it is new, False when (provider, event_id) existed."""
        return await self._batcher.submit(row)

    async def _write(self, rows: list[InboxRow]) -> list[bool]:
        columns: list[list[Any]] = [[], [], [], [], [], [], []]
        for r in rows:
            for column, value in zip(
                columns,
                (r.provider, r.event_id, r.event_type, r.entity_key, r.headers, r.body, r.content_type),
                strict=True,
            ):
                column.append(value)
        records = await self._pool.fetch(self._sql, *columns)
        metrics.receiver_batch_size.observe(len(rows))
        stored = {(rec["provider"], rec["event_id"]) for rec in records}
        # Two requests for the same event in one batch: the first is the one stored.
        seen: set[tuple[str, str]] = set()
        results = []
        for r in rows:
            key = (r.provider, r.event_id)
            results.append(key in stored and key not in seen)
            seen.add(key)
        return results
