"""The process's one LISTEN connection (core/listener.py): it comes back after its backend is
killed, notifications arrive again, and subscribers are told to resync what they missed."""

from __future__ import annotations

import asyncpg
import pytest

from hookline.core.listener import Listener
from hookline.core.providers import ProviderRegistry, apply_providers
from support.dedicated import GatedConnection
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: late}
spec:
  signature: {scheme: none}
  destination: {url: "http://127.0.0.1:9/late"}
"""


class Recorder:
    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.resyncs = 0

    def notified(self, _channel: str, payload: str) -> None:
        self.payloads.append(payload)

    def resync(self) -> None:
        self.resyncs += 1


async def kill(pool: asyncpg.Pool, pid: int | None) -> None:
    assert pid is not None
    assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)


async def test_notifications_arrive_again_after_the_listener_backend_is_killed(
        database_url: str, pool: asyncpg.Pool) -> None:
    connection = GatedConnection(database_url)
    listener = Listener(connection, reconnect_delay=0.1)
    recorder = Recorder()
    await listener.subscribe(["hookline_test"], recorder.notified, recorder.resync)
    await listener.start()
    try:
        await eventually(listener.connected.is_set)
        await pool.execute("SELECT pg_notify('hookline_test', 'before')")
        await eventually(lambda: "before" in recorder.payloads)
        resyncs = recorder.resyncs

        first = listener.backend_pid
        await kill(pool, first)
        await eventually(lambda: recorder.resyncs > resyncs and listener.connected.is_set())
        assert listener.backend_pid != first
        await pool.execute("SELECT pg_notify('hookline_test', 'after')")
        await eventually(lambda: "after" in recorder.payloads)
        assert connection.opened == 2
    finally:
        await listener.stop()


async def test_a_change_missed_while_disconnected_reaches_the_registry_by_resync(
        database_url: str, pool: asyncpg.Pool) -> None:
    connection = GatedConnection(database_url)
    listener = Listener(connection, reconnect_delay=0.1)
    await listener.start()
    registry = ProviderRegistry(pool, refresh=3600, listener=listener)  # no periodic re-read in this test
    await registry.start()
    try:
        await eventually(listener.connected.is_set)
        connection.gate.clear()  # Postgres "out of reach" for the listener
        await kill(pool, listener.backend_pid)
        await eventually(lambda: not listener.connected.is_set())
        async with pool.acquire() as conn:
            await apply_providers(conn, PROVIDER)  # its NOTIFY reaches nobody
        assert registry.get("late") is None
        connection.gate.set()
        await eventually(lambda: registry.get("late") is not None)
    finally:
        await registry.stop()
        await listener.stop()


async def test_subscribers_share_one_connection(database_url: str, pool: asyncpg.Pool) -> None:
    connection = GatedConnection(database_url)
    listener = Listener(connection)
    first, second = Recorder(), Recorder()
    await listener.subscribe(["hookline_a"], first.notified, first.resync)
    await listener.start()
    await listener.subscribe(["hookline_b"], second.notified, second.resync)
    try:
        await eventually(listener.connected.is_set)
        await pool.execute("SELECT pg_notify('hookline_a', 'one'), pg_notify('hookline_b', 'two')")
        await eventually(lambda: first.payloads == ["one"] and second.payloads == ["two"])
        assert connection.opened == 1
    finally:
        await listener.stop()
