"""Handlers the worker tests configure (imported by real worker processes)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import asyncpg

_calls: asyncpg.Pool | None = None


async def _record_call(event: Any) -> None:
    """Count every invocation on a separate connection: a rolled-back attempt still counts here."""
    global _calls
    if _calls is None:
        _calls = await asyncpg.create_pool(os.environ["HOOKLINE_DATABASE_URL"], min_size=1, max_size=4)
    await _calls.execute("INSERT INTO test_calls (provider, event_id, pid) VALUES ($1, $2, $3)",
                         event.provider, event.event_id, os.getpid())


async def record_effect(event: Any, conn: asyncpg.Connection) -> None:
    """The business effect: a row in the same transaction that marks the event done."""
    await _record_call(event)
    await conn.execute("INSERT INTO test_effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
                       event.provider, event.event_id, event.event_type)


async def record_effect_in_its_transaction(event: Any, conn: asyncpg.Connection) -> None:
    """The effect alone, with no count on a connection of its own (which would need the password in
    HOOKLINE_DATABASE_URL): for workers that log in with a password file."""
    await conn.execute("INSERT INTO test_effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
                       event.provider, event.event_id, event.event_type)


async def record_effect_slowly(event: Any, conn: asyncpg.Connection) -> None:
    await _record_call(event)
    await asyncio.sleep(float(os.environ.get("TEST_HANDLER_SLEEP", "0.3")))
    await conn.execute("INSERT INTO test_effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
                       event.provider, event.event_id, event.event_type)


async def kill_my_worker(event: Any, conn: asyncpg.Connection) -> None:
    await _record_call(event)
    os.kill(os.getpid(), signal.SIGKILL)


async def kill_my_worker_on_crash_events(event: Any, conn: asyncpg.Connection) -> None:
    """Events of type "crash" end the worker's process; every other event is recorded slowly, so
    that several are in flight in the worker when it dies."""
    if event.event_type == "crash":
        await kill_my_worker(event, conn)
    await record_effect_slowly(event, conn)


async def fail_until_third(event: Any, conn: asyncpg.Connection) -> None:
    await _record_call(event)
    if event.attempts < 3:
        raise RuntimeError(f"failing attempt {event.attempts} on purpose")
    await conn.execute("INSERT INTO test_effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
                       event.provider, event.event_id, event.event_type)


async def always_fail(event: Any, conn: asyncpg.Connection) -> None:
    await _record_call(event)
    event.json()["data"]["missing"]  # a poison payload: KeyError


async def external_effect(event: Any) -> None:
    """One parameter: no transaction; blocks while the file named by TEST_GATE exists."""
    await _record_call(event)
    gate = os.environ.get("TEST_GATE")
    while gate and os.path.exists(gate):  # noqa: ASYNC110 - the gate is a file another process removes
        await asyncio.sleep(0.05)


async def publish_shipped(event: Any, conn: asyncpg.Connection) -> None:
    """An inbox handler that notifies a partner in the same transaction: inbox -> outbox."""
    import hookline.outbox

    order = event.json()
    await conn.execute("INSERT INTO test_effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
                       event.provider, event.event_id, event.event_type)
    await hookline.outbox.publish(conn, "order.shipped", {"order": order["id"], "source_event": event.event_id},
                                  aggregate_type="order", aggregate_id=order["id"])


async def fail_deep_down(event: Any, conn: asyncpg.Connection) -> None:
    """Fails 150 calls deep: a traceback far over the attempt log's 8 KB."""
    await _record_call(event)
    _down(150, event.event_id)


# Two functions calling each other: Python folds a run of identical frames into one line.
def _down(depth: int, event_id: str) -> None:
    if depth == 0:
        raise ValueError(f"nothing at the bottom for {event_id}")
    _further_down(depth - 1, event_id)


def _further_down(depth: int, event_id: str) -> None:
    _down(depth, event_id)


async def cancelled_by_itself(event: Any, conn: asyncpg.Connection) -> None:
    """A handler whose own work was cancelled (a task it awaited, say): a failure of its event."""
    await _record_call(event)
    raise asyncio.CancelledError()


async def cancelled_by_itself_outside(event: Any) -> None:
    raise asyncio.CancelledError()


async def fail_until_fixed(event: Any, conn: asyncpg.Connection) -> None:
    """Fails until the test has "deployed a fix" for the event (a row in test_fixes): a dead letter
    that its replay then gets done, as in real life."""
    fixed = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM test_fixes WHERE event_id = $1)", event.event_id)
    if not fixed:
        raise RuntimeError(f"no fix deployed yet for {event.event_id}")
