"""Handlers for the batch tests (tests/test_worker_batches.py), imported by real worker processes.

Every call is recorded on a separate connection with the transaction id of the handler's own
transaction (``txid_current()`` is the top-level transaction's id inside a savepoint too), so a
test can tell which events shared a batch even when an attempt's effect was rolled back.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import asyncpg

TABLES = """
CREATE TABLE batch_effects (n bigserial PRIMARY KEY, event_id text, event_type text, entity_key text,
                            attempt int, txid bigint DEFAULT txid_current());
CREATE TABLE batch_calls (event_id text, event_type text, attempt int, txid bigint);
"""

_side: asyncpg.Pool | None = None


async def _side_pool() -> asyncpg.Pool:
    """Another connection than the handler's: what it writes commits whatever the batch does."""
    global _side
    if _side is None:
        _side = await asyncpg.create_pool(os.environ["HOOKLINE_DATABASE_URL"], min_size=1, max_size=2)
    return _side


async def _record(event: Any, conn: asyncpg.Connection) -> None:
    txid = await conn.fetchval("SELECT txid_current()")
    await (await _side_pool()).execute("INSERT INTO batch_calls VALUES ($1, $2, $3, $4)",
                                       event.event_id, event.event_type, event.attempts, txid)
    await conn.execute("INSERT INTO batch_effects (event_id, event_type, entity_key, attempt) VALUES ($1, $2, $3, $4)",
                       event.event_id, event.event_type, event.entity_key, event.attempts)


async def effect_or_trouble(event: Any, conn: asyncpg.Connection) -> None:
    """Writes its effect row; then, on a first attempt, by event type:

    * ``boom``: raises (its effect must roll back to its savepoint, its batch-mates' must not);
    * ``thief``: from another connection, takes the leases of the ``victim`` events in flight,
      as a sweep followed by another worker's claim would (expired, another holder);
    * ``kill``: SIGKILLs its own worker, in the middle of its batch's transaction;
    * ``swallow``: a statement of it fails and it catches the error, returning normally with
      its transaction aborted;
    * ``terminate``: from another connection, ends its own connection's backend
      (``pg_terminate_backend``), as a failover or a server restart does mid-batch.
    """
    await _record(event, conn)
    if event.attempts > 1:
        return
    if event.event_type == "boom":
        raise RuntimeError("boom on purpose")
    if event.event_type == "thief":
        await (await _side_pool()).execute(
            "UPDATE hookline.inbox SET locked_by = 'another-worker', lease_expires_at = now() - interval '1 second' "
            "WHERE event_type = 'victim' AND status = 'processing'")
    if event.event_type == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if event.event_type == "swallow":
        # A statement fails and the handler catches the error: its transaction is left aborted.
        with contextlib.suppress(asyncpg.DataError):
            await conn.execute("SELECT 1 / 0")
    if event.event_type == "terminate":
        await (await _side_pool()).execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())


async def record_plan_cache_mode(event: Any, conn: asyncpg.Connection) -> None:
    """What a handler's statements are planned under (the worker's own pool forces generic plans)."""
    await conn.execute("INSERT INTO batch_effects (event_id, event_type, attempt) "
                       "VALUES ($1, current_setting('plan_cache_mode'), $2)", event.event_id, event.attempts)
