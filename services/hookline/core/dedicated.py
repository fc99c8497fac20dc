"""A connection held for one long-lived purpose: LISTEN (``core/listener.py``) or a session
advisory lock (``core/maintenance.py``), and the one way both notice that it is gone.

Always opened from the database URL, a connection of its own outside the pools (the Host,
core/host.py, opens every one; tests and benchmarks run the same layout), and closed, never
handed back with its session state (listeners, locks) still on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncpg

from hookline.core import db

PROBE_INTERVAL = 5.0  # seconds between liveness probes of an idle held connection


class DedicatedConnection:
    def __init__(self, url: str | None = None, probe_interval: float = PROBE_INTERVAL, *,
                 password_file: Path | None = None) -> None:
        """``url``: the database's (None: HOOKLINE_DATABASE_URL); ``password_file``: see db.connect_arguments."""
        self._url = url
        self._password_file = password_file
        self.probe_interval = probe_interval

    async def open(self) -> asyncpg.Connection:
        return await db.connect(self._url, password_file=self._password_file, pinned_search_path=True)

    async def close(self, conn: asyncpg.Connection) -> None:
        # Terminated rather than closed politely: its LISTENs and locks end with the session at once.
        conn.terminate()

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
