"""One LISTEN connection per process, shared by every part that waits for NOTIFY.

The consumer (``core/consumer.py``: new rows to claim) and the provider registry
(``core/providers.py``: a provider changed) subscribe to channels here instead of
each holding a connection of their own. The listener holds one dedicated connection
(``core/dedicated.py``), notices its loss one way (``DedicatedConnection.wait_lost``),
reconnects, LISTENs again, and then tells every subscriber to *resync*: notifications
sent while it was away are lost, so each re-reads what it would have been told about.
NOTIFY stays a hint to look sooner; every subscriber also polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import asyncpg

from hookline.core import db
from hookline.core.dedicated import DedicatedConnection
from hookline.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0  # seconds between attempts to get the LISTEN connection back


@dataclass(eq=False)
class Subscription:
    channels: frozenset[str]
    on_notify: Callable[[str, str], None]  # (channel, payload)
    on_resync: Callable[[], None]  # after a (re)connect: notifications may have been missed


class Listener:
    """``start`` connects in the background; ``subscribe`` works before or after that."""

    def __init__(self, connection: DedicatedConnection, reconnect_delay: float = RECONNECT_DELAY) -> None:
        self._connection = connection
        self._reconnect_delay = reconnect_delay
        self._subscriptions: list[Subscription] = []
        self._conn: asyncpg.Connection | None = None
        self._listening: set[str] = set()
        self._busy = asyncio.Lock()  # one statement at a time on the connection
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()  # set while LISTENing (tests wait on it)

    @property
    def backend_pid(self) -> int | None:
        """The server process LISTENing for us, while connected."""
        return self._conn.get_server_pid() if self._conn is not None else None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="listener")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def subscribe(self, channels: Iterable[str], on_notify: Callable[[str, str], None],
                        on_resync: Callable[[], None]) -> Subscription:
        subscription = Subscription(frozenset(channels), on_notify, on_resync)
        self._subscriptions.append(subscription)
        await self._listen_all()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        # The channel stays LISTENed until the next reconnect; nobody is told about it meanwhile.
        with contextlib.suppress(ValueError):
            self._subscriptions.remove(subscription)

    def _wanted(self) -> set[str]:
        return {channel for s in self._subscriptions for channel in s.channels}

    async def _listen_all(self) -> None:
        conn = self._conn
        if conn is None:
            return  # the connection loop LISTENs to everything wanted when it connects
        async with self._busy:
            for channel in sorted(self._wanted() - self._listening):
                try:
                    await conn.add_listener(channel, self._dispatch)
                except db.DATABASE_ERRORS:
                    return  # lost: the connection loop reconnects, LISTENs to all, and resyncs
                self._listening.add(channel)

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        for subscription in list(self._subscriptions):
            if channel in subscription.channels:
                subscription.on_notify(channel, payload)

    def _resync(self) -> None:
        for subscription in list(self._subscriptions):
            subscription.on_resync()

    async def _run(self) -> None:
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._connection.open()
                self._conn, self._listening = conn, set()
                await self._listen_all()
                self.connected.set()
                self._resync()  # whatever changed before LISTEN took effect
                await self._connection.wait_lost(conn, self._busy)
                log.warning("LISTEN connection lost; reconnecting (polling meanwhile)")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection failed; retrying (polling meanwhile)", extra={"error": str(exc)})
            finally:
                self.connected.clear()
                self._conn = None
                if conn is not None:
                    await self._connection.close(conn)
            await asyncio.sleep(self._reconnect_delay)
