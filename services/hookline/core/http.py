"""The HTTP pieces every service shares: health, readiness, metrics, JSON errors, running an app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hookline.core import db
from hookline.core import metrics as hookline_metrics

log = logging.getLogger(__name__)

POOL_KEY: web.AppKey[asyncpg.Pool] = web.AppKey("pool", asyncpg.Pool)
# An answer's outcome for metrics: the error code, or the receiver's accepted/duplicate.
OUTCOME: web.ResponseKey[str] = web.ResponseKey("outcome", str)


def error(status: int, code: str, message: str, **headers: str) -> web.Response:
    """The contract's error shape; ``response[OUTCOME]`` carries the code for metrics."""
    response = web.json_response({"error": code, "message": message}, status=status, headers=headers or None)
    response[OUTCOME] = code
    return response


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL_KEY]
    try:
        async with asyncio.timeout(2.0):
            await pool.fetchval(db.query("ping"))
    except Exception as exc:
        return error(503, "unavailable", f"cannot reach Postgres: {type(exc).__name__}")
    return web.json_response({"status": "ready"})


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_ops_routes(app: web.Application, pool: asyncpg.Pool) -> None:
    """/healthz (alive), /readyz (can reach Postgres), /metrics (Prometheus text)."""
    app[POOL_KEY] = pool
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


def ops_app(pool: asyncpg.Pool) -> web.Application:
    app = web.Application()
    add_ops_routes(app, pool)
    return app


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a connection may take to send request headers, and may sit idle between requests."""

    header_timeout: float = 10.0
    keepalive_timeout: float = 75.0


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler plus a deadline for request headers, and one quiet line
    (no traceback) for requests that are not valid HTTP: on the internet they are routine.

    aiohttp bounds only idleness (keepalive_timeout, and before 3.14 not even for a connection
    that never sends a byte); a client trickling header bytes would hold the connection as long
    as it likes. The deadline starts with the first byte of a request and ends when its headers
    are parsed; the body has its own (the handler's) deadline.
    """

    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _fresh = True  # no byte received yet on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(self.keepalive_timeout)  # a connection that never sends a request

    def data_received(self, data: bytes) -> None:
        parsed_before = self._request_count
        super().data_received(data)
        if self._request_count != parsed_before:
            self._stop_header_timer()
        elif (self._fresh or self._header_timer is None) and not self.answering():
            self._arm(self.header_timeout)
        self._fresh = False

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        # aiohttp's body reader calls this after every read, paused or not, and each call feeds the
        # parser an empty buffer (data_received(b"")): per request, on the receiver's hot path.
        # Only a paused reader has anything to resume.
        if self._reading_paused:
            super().resume_reading(*args, **kwargs)

    def answering(self) -> bool:
        """A request of this connection is being handled (its headers' deadline is over)."""
        return self._request_in_progress

    def _arm(self, timeout: float) -> None:
        self._stop_header_timer()
        if self.transport is not None:
            self._header_timer = asyncio.get_running_loop().call_later(timeout, self._headers_late)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.answering() and not self._messages and self.transport is not None:
            log.info("closing a connection that sent no complete request headers in time")
            hookline_metrics.http_connections_timed_out.inc()
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            log.info("malformed request: %s", exc.message or type(exc).__name__)
        else:
            super().log_exception(*args, **kw)


ConnectionFactory = Callable[..., GuardedHandler]  # (server, *, loop, **aiohttp handler options)


class _GuardedServer(web.Server):
    header_timeout: float = 10.0
    connection_factory: ConnectionFactory = GuardedHandler

    def __call__(self) -> web.RequestHandler:
        handler = self.connection_factory(self, loop=self._loop, **self._kwargs)
        handler.header_timeout = self.header_timeout
        return handler


class _GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, limits: ConnectionLimits, connection_factory: ConnectionFactory,
                 **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.keepalive_timeout, **kwargs)
        self._header_timeout = limits.header_timeout
        self._connection_factory = connection_factory

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp offers no factory hook for the connection handler: the server the app built
        # (with all its settings) becomes the subclass that creates guarded handlers.
        server.__class__ = _GuardedServer
        assert isinstance(server, _GuardedServer)
        server.header_timeout = self._header_timeout
        server.connection_factory = self._connection_factory
        return server


async def serve(app: web.Application, host: str, port: int, limits: ConnectionLimits | None = None,
                connection_factory: ConnectionFactory = GuardedHandler, *, reuse_port: bool = False,
                **handler_options: Any) -> web.AppRunner:
    """Serve ``app``; each connection is handled by what ``connection_factory`` makes (a
    :class:`GuardedHandler`); ``handler_options`` go to it (e.g. auto_decompress)."""
    runner = _GuardedRunner(app, limits or ConnectionLimits(), connection_factory, access_log=None,
                            handle_signals=False, **handler_options)
    await runner.setup()
    # With several processes on one port (hookline receiver --processes N: ``reuse_port``) the kernel
    # spreads connections over them (SO_REUSEPORT); a lone process keeps the port to itself.
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port, backlog=1024)
    await site.start()
    return runner


async def run_until_stopped(
    start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[Any]]
) -> None:
    """Run a service until SIGTERM or SIGINT, then stop it cleanly."""
    import signal

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await start()
    try:
        await stopping.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await stop()
