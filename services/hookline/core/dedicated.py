"""A connection held for one long-lived purpose: LISTEN (``core/listener.py``) or a session
advisory lock (``core/maintenance.py``), and the one way both notice that it is gone.

Opened from the database URL (services started by the CLI: a connection of its own, outside
the pools), or taken out of a pool for as long as it is needed (services built on a pool
alone, as tests and benchmarks build them). Either way it is closed, never handed back
with its session state (listeners, locks) still on it.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from hookline.core import db

PROBE_INTERVAL = 5.0  # seconds between liveness probes of an idle held connection


class DedicatedConnection:
    def __init__(self, source: asyncpg.Pool | str | None = None, probe_interval: float = PROBE_INTERVAL) -> None:
        """``source``: a pool to take the connection from, or a database URL (None: HOOKLINE_DATABASE_URL)."""
        self._source = source
        self.probe_interval = probe_interval

    async def open(self) -> asyncpg.Connection:
        if isinstance(self._source, asyncpg.Pool):
            return await self._source.acquire()
        return await db.connect(self._source, pinned_search_path=True)

    async def close(self, conn: asyncpg.Connection) -> None:
        # Terminated rather than reset: its LISTENs and locks end with the session.
        conn.terminate()
        if isinstance(self._source, asyncpg.Pool):
            with contextlib.suppress(Exception):
                await self._source.release(conn)

    async def wait_lost(self, conn: asyncpg.Connection, busy: asyncio.Lock | None = None) -> None:
        """Return once ``conn`` is gone: closed under us, or a liveness probe fails. The probe also
        finds a connection whose server went away without a word (a network partition).
        ``busy`` is held by whoever else runs statements on ``conn``, one at a time."""
        lost = asyncio.Event()

        def on_lost(_conn: object) -> None:
            lost.set()

        conn.add_termination_listener(on_lost)
        try:
            while not conn.is_closed():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), self.probe_interval)
                if lost.is_set():
                    return
                try:
                    async with busy or contextlib.nullcontext():
                        await conn.fetchval(db.query("ping"), timeout=self.probe_interval)
                except db.DATABASE_ERRORS:
                    return
        finally:
            conn.remove_termination_listener(on_lost)
