"""The receiver's connections (aiohttp's server, core/http.py), as a real process on a real Postgres.

These tests hold the receiver to what a client relies on: answers in request order while one is
pending, the idle deadline counted from the last answer, and a graceful shutdown that answers a
request before closing its connection. To keep an answer pending, a test holds a lock that the
receiver's INSERT waits for, and watches Postgres until the INSERT is waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hookline.core.embedded import free_port
from support import senders
from support.postgres import lock_waiters
from support.processes import TESTS_DIR, ServiceProcess, hookline_cli, receiver
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=senders.PROVIDERS_YAML).returncode == 0
    c = await asyncpg.connect(database_url)
    yield c
    await c.close()


def webhook(event_id: str, *, close: bool = False) -> bytes:
    body = json.dumps({"type": "order.paid", "data": {"id": event_id}}).encode()
    headers = {**senders.standard_webhooks(body, event_id), "Content-Length": str(len(body))}
    lines = ["POST /webhooks/sw HTTP/1.1", "Host: hookline.test", *(f"{k}: {v}" for k, v in headers.items())]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: hookline.test\r\n\r\n"


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], dict[str, object]]:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)).decode("latin-1")
    status_line, *lines = head.rstrip("\r\n").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split(" ")[1]), headers, json.loads(body)


def accepted(event_id: str) -> dict[str, object]:
    return {"status": "accepted", "event_id": event_id}


@contextlib.asynccontextmanager
async def inbox_locked(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The inbox locked against INSERTs until the block ends: answers stay pending meanwhile."""
    locker = await asyncpg.connect(database_url)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE hookline.inbox IN SHARE ROW EXCLUSIVE MODE")
            yield locker
    finally:
        await locker.close()


async def wait_for_blocked_insert(conn: asyncpg.Connection) -> None:
    await eventually(lambda: lock_waiters(conn), timeout=30, what="the receiver's INSERT waiting for the lock")


async def stored(conn: asyncpg.Connection, event_ids: list[str]) -> dict[str, int]:
    rows = await conn.fetch("SELECT event_id, count(*) AS n FROM hookline.inbox WHERE provider = 'sw' "
                            "AND event_id = ANY($1::text[]) GROUP BY event_id", event_ids)
    return {r["event_id"]: r["n"] for r in rows}


async def assert_closed_and_stored(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                   conn: asyncpg.Connection, event_ids: list[str]) -> None:
    """The server has closed the connection, and every event is stored once."""
    assert await asyncio.wait_for(reader.read(), 60) == b""
    writer.close()
    assert await stored(conn, event_ids) == {event_id: 1 for event_id in event_ids}


@pytest.mark.parametrize("first_on_connection", [True, False], ids=["new-connection", "kept-alive"])
async def test_requests_sent_while_an_answer_is_pending_are_answered_in_order(
        database_url: str, log_dir: Path, conn: asyncpg.Connection, first_on_connection: bool) -> None:
    ids = [f"evt_{uuid.uuid4().hex}" for _ in range(3)]
    proc = receiver(database_url, log_dir)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
        if not first_on_connection:  # one request answered first: the connection waits for the next
            writer.write(HEALTHZ)
            assert (await read_answer(reader))[0] == 200
        async with inbox_locked(database_url):
            writer.write(webhook(ids[0]))  # alone on a new or idle connection
            await wait_for_blocked_insert(conn)
            # Pipelined behind it: an ops route (answerable at once), a webhook, and one that ends the connection.
            writer.write(HEALTHZ + webhook(ids[1]) + webhook(ids[2], close=True))
            await asyncio.sleep(0.5)  # time to (wrongly) answer any of them out of turn
        answers = [await read_answer(reader) for _ in range(4)]
        assert [(status, body) for status, _, body in answers] == [
            (200, accepted(ids[0])), (200, {"status": "ok"}), (200, accepted(ids[1])), (200, accepted(ids[2]))]
        assert answers[3][1].get("connection", "").lower() == "close"
        await assert_closed_and_stored(reader, writer, conn, ids)
    finally:
        proc.stop()


async def test_each_answer_moves_the_idle_deadline_on(database_url: str, log_dir: Path,
                                                      conn: asyncpg.Connection) -> None:
    proc = receiver(database_url, log_dir, "--keepalive-timeout", "1")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
        ids = [f"evt_{uuid.uuid4().hex}" for _ in range(8)]
        for event_id in ids:  # 8 requests 0.3 s apart: the connection lives well past 1 s, never idle 1 s
            writer.write(webhook(event_id))
            status, headers, body = await read_answer(reader)
            assert (status, body) == (200, accepted(event_id))
            assert "date" in headers and "connection" not in headers
            await asyncio.sleep(0.3)
        # Then idle for 1 s: closed.
        await assert_closed_and_stored(reader, writer, conn, ids)
    finally:
        proc.stop()


async def test_graceful_shutdown_answers_a_pending_request_first(database_url: str, log_dir: Path,
                                                                 conn: asyncpg.Connection) -> None:
    event_id = f"evt_{uuid.uuid4().hex}"
    proc: ServiceProcess = receiver(database_url, log_dir)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
        async with inbox_locked(database_url):
            writer.write(webhook(event_id))
            await wait_for_blocked_insert(conn)
            proc.signal(signal.SIGTERM)
            await asyncio.sleep(0.5)  # the receiver is shutting down, its answer still pending
            assert proc.proc is not None and proc.proc.poll() is None
        status, headers, body = await read_answer(reader)
        assert (status, body) == (200, accepted(event_id))
        assert headers.get("connection", "").lower() == "close"
        await assert_closed_and_stored(reader, writer, conn, [event_id])
        assert await asyncio.to_thread(proc.proc.wait, 60) == 0  # the first SIGTERM's clean exit
    finally:
        proc.stop()


# The short lane (core/aiohttp_adapter.py) writes its answers itself, without aiohttp's Server header:
# whether that header is there says which lane answered.
MISSING_INTERNAL = """
import hookline.core.aiohttp_adapter as adapter
adapter.HANDLER_INTERNALS = (*adapter.HANDLER_INTERNALS, "_gone_in_a_newer_aiohttp")
"""


async def send_whole_webhook(port: int) -> tuple[str, int, dict[str, str], dict[str, object]]:
    event_id = f"evt_{uuid.uuid4().hex}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(webhook(event_id))  # headers and body in one write, on a new connection
        return (event_id, *await read_answer(reader))
    finally:
        writer.close()


async def test_the_short_lane_answers_a_whole_webhook_when_aiohttp_has_its_internals(
        database_url: str, log_dir: Path, conn: asyncpg.Connection) -> None:
    proc = receiver(database_url, log_dir)
    try:
        event_id, status, headers, body = await send_whole_webhook(proc.port)
        assert (status, body) == (200, accepted(event_id))
        assert "server" not in headers  # the short lane's answer, not aiohttp's
        assert "short lane on" in proc.logs() and "the short lane is off" not in proc.logs()
    finally:
        proc.stop()


async def test_without_an_internal_the_receiver_serves_on_aiohttps_public_path_and_warns_once(
        database_url: str, log_dir: Path, conn: asyncpg.Connection, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(MISSING_INTERNAL)  # a newer aiohttp, as the check sees it
    port = free_port()
    proc = ServiceProcess(["receiver", "--host", "127.0.0.1", "--port", str(port)], database_url, log_dir, port=port,
                          env={"PYTHONPATH": os.pathsep.join([str(tmp_path), TESTS_DIR])}).start("/readyz")
    try:
        for _ in range(2):
            event_id, status, headers, body = await send_whole_webhook(proc.port)
            assert (status, body) == (200, accepted(event_id))
            assert "aiohttp" in headers["server"]  # answered by aiohttp's path
        assert await stored(conn, [event_id]) == {event_id: 1}
        warnings = [line for line in proc.logs().splitlines() if "the short lane is off" in line]
        assert len(warnings) == 1 and "RequestHandler._gone_in_a_newer_aiohttp" in warnings[0], warnings
    finally:
        proc.stop()
