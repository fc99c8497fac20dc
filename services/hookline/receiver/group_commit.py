"""Group commit: many concurrent requests, one INSERT per batch.

Each request hands its row to a queue and waits for its own future. A few
flusher tasks (each a connection) take whatever has queued up — at most
``max_batch`` rows, after waiting at most ``window`` seconds for more — and
store it with one INSERT ... ON CONFLICT DO NOTHING, i.e. one transaction and
one WAL flush for the batch. A future resolves only after that statement has
committed, so a 2xx is never sent for a row that is not durable. Under light
load a batch is one row and waits at most ``window``; under heavy load batches
grow by themselves while the previous commit is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg

from hookline.core import db, metrics

log = logging.getLogger(__name__)


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
    def __init__(
        self, pool: asyncpg.Pool, *, max_batch: int = 128, window: float = 0.001, flushers: int = 4
    ) -> None:
        self._pool = pool
        self._max_batch = max_batch
        self._window = window
        self._flushers = flushers
        self._queue: asyncio.Queue[tuple[InboxRow, asyncio.Future[bool]]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._sql = db.query("insert_inbox_batch")

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._flush_loop(), name=f"group-commit-{i}") for i in range(self._flushers)]

    async def stop(self) -> None:
        # Rows already queued are still written: their requests are waiting for an answer.
        await self._queue.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def store(self, row: InboxRow) -> bool:
        """Store ``row`` durably; True when it is new, False when (provider, event_id) existed."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((row, future))
        return await future

    def _take_ready(self, batch: list[tuple[InboxRow, asyncio.Future[bool]]]) -> None:
        while len(batch) < self._max_batch and not self._queue.empty():
            batch.append(self._queue.get_nowait())

    async def _flush_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            self._take_ready(batch)
            if len(batch) < self._max_batch and self._window > 0:
                await asyncio.sleep(self._window)
                self._take_ready(batch)
            try:
                await self._flush(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _flush(self, batch: list[tuple[InboxRow, asyncio.Future[bool]]]) -> None:
        try:
            stored = await self._write([row for row, _ in batch])
        except Exception as exc:
            log.warning("group commit failed", extra={"rows": len(batch), "error": repr(exc)[:300]})
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        seen: set[tuple[str, str]] = set()
        for row, future in batch:
            key = (row.provider, row.event_id)
            # Two requests for the same event in one batch: the first is the one stored.
            is_new = key in stored and key not in seen
            seen.add(key)
            if not future.done():
                future.set_result(is_new)

    async def _write(self, rows: list[InboxRow]) -> set[tuple[str, str]]:
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
        return {(rec["provider"], rec["event_id"]) for rec in records}
