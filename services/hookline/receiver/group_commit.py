"""Group commit for the receiver: concurrent requests share one INSERT per batch.

One statement (one transaction, one WAL flush) stores a whole batch: it claims each
event's dedup key (``hookline.inbox_keys``, ``INSERT ... ON CONFLICT DO NOTHING``) and
stores the events whose key it claimed, so duplicates stay duplicates after retention
dropped their payloads (migration 0011); each request is answered only after that
statement has committed. See ``hookline.core.batching`` for the mechanism.

One sender's bad bytes never cost another sender's event: rows are validated
before they are queued, and should Postgres still refuse a batch for a reason in
the data (:func:`is_data_error`), the batch is bisected until only the offending
rows fail. Only an unavailable database fails everyone (503, and they retry).

Providers with ``replayProtection`` also claim a hash of their body for a window
in the same statement; a body seen within the window is a duplicate of the first
event that carried it, whatever (unsigned) id the replay claims.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg

from hookline.core import db, metrics
from hookline.core.batching import Batcher
from hookline.core.tasks import cancel_and_wait
from hookline.receiver.deadlines import Deadlines

log = logging.getLogger(__name__)

PRUNE_INTERVAL = 60.0


def is_data_error(exc: BaseException) -> bool:
    """Postgres refused the rows themselves (bad values, constraints, an index entry too large),
    as opposed to being unreachable or overloaded."""
    return isinstance(exc, (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError,
                            asyncpg.ProgramLimitExceededError, UnicodeError))


# The group commit's statement (queries.sql insert_inbox_batch), without and with its replay protection.
INSERT_BATCH = db.query("insert_inbox_batch", replay_protected=False, rows="input")
INSERT_BATCH_REPLAY_PROTECTED = db.query("insert_inbox_batch", replay_protected=True, rows="admitted")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field the slow way, per event
class InboxRow:
    provider: str
    event_id: str
    event_type: str | None
    entity_key: str | None
    headers: dict[str, str]
    body: bytes
    content_type: str | None
    # sha256 of the body and the window to remember it, for providers with replayProtection.
    body_sha256: bytes | None = None
    replay_window_seconds: float | None = None


@dataclass(slots=True)  # one per event: not frozen, whose __init__ is slower
class Stored:
    """The answer for one row: new or not, and the event id the sender is told."""

    is_new: bool
    event_id: str


class GroupCommitter:
    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 32, window: float = 0.001, flushers: int = 4,
                 max_queued: int | None = None, store_timeout: float = 10.0) -> None:
        self._pool = pool
        self._deadlines = Deadlines(store_timeout)
        self._sql = INSERT_BATCH
        self._sql_replay = INSERT_BATCH_REPLAY_PROTECTED
        self._max_batch = max_batch
        self._batcher: Batcher[InboxRow, Stored] = Batcher(
            self._write, name="group-commit", max_batch=max_batch, window=window, writers=flushers,
            max_queued=max_queued, isolate=is_data_error, active=self._writers_needed)
        self._pruner: asyncio.Task[None] | None = None

    def _writers_needed(self) -> int:
        """One writer while one batch can take everything queued, another per further full batch.

        Under load it is CPU, not round trips, that runs out: a writer per request burst made
        batches of ~10 where one writer makes them of everything that arrived during the last
        write, and each transaction costs Postgres and this process the same whatever its size.
        But one batch must not take every request in flight either: then a lone process waits
        idle for its commit, and Postgres for the next requests to be read. bench-receiver, 64
        connections: with 1 process, 128 gave 0.60 of the ceiling, 16 0.79-0.83 and 32 0.69-0.83;
        with 2 processes (one reads while the other commits) 32 gave 0.86-1.00 (137-176 us of
        CPU per event) against 16's 0.74-0.92 (147-240 us), alternating, 8 rounds each.
        """
        return 1 + self._batcher.queued // self._max_batch

    def start(self) -> None:
        self._deadlines.start()
        self._batcher.start()
        self._pruner = asyncio.create_task(self._prune_body_hashes(), name="body-hash-pruner")

    async def stop(self) -> None:
        await cancel_and_wait(self._pruner)
        await self._batcher.stop()
        await self._deadlines.stop()

    @property
    def queued(self) -> int:
        """Rows waiting for a writer."""
        return self._batcher.queued

    def submit(self, row: InboxRow) -> asyncio.Future[Stored]:
        """Queue ``row`` to be stored durably; its future is set once it is (see :meth:`store`)."""
        future = self._batcher.enqueue(row)
        self._deadlines.watch(future, self._batcher.withdraw)
        return future

    async def store(self, row: InboxRow) -> Stored:
        """Store ``row`` durably. Raises ``BatcherFull`` when too many rows wait already, a data
        error (:func:`is_data_error`) when Postgres refuses this row, ``TimeoutError`` when it is
        not stored within ``store_timeout`` seconds (a row whose batch was being written by then
        may still be stored: the sender's retry is then a duplicate), anything else when Postgres
        is unavailable."""
        return await self._batcher.wait(self.submit(row))

    async def _write(self, rows: list[InboxRow]) -> list[Stored]:
        columns: list[list[Any]] = [
            [r.provider for r in rows], [r.event_id for r in rows], [r.event_type for r in rows],
            [r.entity_key for r in rows], [r.headers for r in rows], [r.body for r in rows],
            [r.content_type for r in rows]]
        if any(r.body_sha256 is not None for r in rows):
            records = await self._pool.fetch(self._sql_replay, *columns, [r.body_sha256 for r in rows],
                                             [r.replay_window_seconds for r in rows])
        else:
            records = await self._pool.fetch(self._sql, *columns)
        metrics.receiver_batch_size.observe(len(rows))
        stored = {(rec["provider"], rec["event_id"]) for rec in records if rec.get("body_sha256") is None}
        claims = {(rec["provider"], rec["body_sha256"]): rec["event_id"]
                  for rec in records if rec.get("body_sha256") is not None}
        originals = await self._originals(rows, claims)
        # Two requests for the same event in one batch: the first is the one stored.
        seen: set[tuple[str, str]] = set()
        results = []
        for r in rows:
            key = (r.provider, r.event_id)
            if r.body_sha256 is not None and claims.get((r.provider, r.body_sha256)) != r.event_id:
                # A body already seen within the window under another id: a replay.
                results.append(Stored(False, originals.get((r.provider, r.body_sha256), r.event_id)))
                continue
            results.append(Stored(key in stored and key not in seen, r.event_id))
            seen.add(key)
        return results

    async def _originals(self, rows: list[InboxRow], claims: dict[tuple[str, bytes], str]
                         ) -> dict[tuple[str, bytes], str]:
        """The event id that first carried each replayed body (claimed in this batch or before)."""
        wanted = {(r.provider, r.body_sha256) for r in rows
                  if r.body_sha256 is not None and (r.provider, r.body_sha256) not in claims}
        found = dict(claims)
        if wanted:
            # A separate statement: a claim committed by a concurrent batch after our statement's
            # snapshot is visible only to a new one.
            providers, hashes = zip(*wanted, strict=True)
            for rec in await self._pool.fetch(db.query("find_body_hashes"), list(providers), list(hashes)):
                found[(rec["provider"], rec["body_sha256"])] = rec["event_id"]
        return found

    async def _prune_body_hashes(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_INTERVAL)
            try:
                await self._pool.execute(db.query("prune_body_hashes"))
            except db.DATABASE_ERRORS as exc:
                log.info("could not prune expired body hashes", extra={"error": type(exc).__name__})
