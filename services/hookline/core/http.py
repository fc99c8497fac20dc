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

from hookline.core import aiohttp_adapter, db
from hookline.core import metrics as hookline_metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
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


class HeaderDeadline(asyncio.Protocol):
    """One client connection: aiohttp's protocol for it, plus a deadline for request headers.

    aiohttp bounds only idleness (``keepalive_timeout``, counted from the connection's start or its
    last answer); a client trickling header bytes would hold the connection that long. This deadline
    starts with the first byte of a request and ends when its headers are parsed, which is when
    aiohttp calls the application (:meth:`request_began`); the body has its own (the handler's).
    Everything the event loop tells the connection is passed on to aiohttp's protocol unchanged.
    """

    def __init__(self, protocol: asyncio.Protocol, connections: Connections) -> None:
        self.protocol = protocol
        self.transport: asyncio.BaseTransport | None = None
        self._connections = connections
        self._timer: asyncio.TimerHandle | None = None
        self._requests = 0  # requests of this connection the application is handling

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._connections.by_transport[transport] = self
        self.protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.protocol.data_received(data)
        if self._timer is None and not self._requests and self.transport is not None:
            self._timer = asyncio.get_running_loop().call_later(self._connections.header_timeout,
                                                                self._headers_late)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self.transport is not None:
            self._connections.by_transport.pop(self.transport, None)
            self.transport = None
        self.protocol.connection_lost(exc)

    def request_began(self) -> None:
        self._requests += 1
        self._stop_timer()

    def request_ended(self) -> None:
        self._requests -= 1

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if not self._requests and self.transport is not None:
            log.info("closing a connection that sent no complete request headers in time")
            hookline_metrics.http_connections_timed_out.inc()
            self.transport.close()


class Connections:
    """A server's client connections, each a :class:`HeaderDeadline` around aiohttp's protocol;
    :meth:`track_requests`, a middleware, tells each when a request's headers are in."""

    def __init__(self, header_timeout: float) -> None:
        self.header_timeout = header_timeout
        # aiohttp's protocol factory (the runner's web.Server), or the short lane's; once set up.
        self.protocol_factory: Callable[[], asyncio.Protocol] | None = None
        self.closing = False  # the server is shutting down
        self.by_transport: dict[asyncio.BaseTransport, HeaderDeadline] = {}

    def __call__(self) -> HeaderDeadline:
        """The listener's protocol factory."""
        assert self.protocol_factory is not None
        return HeaderDeadline(self.protocol_factory(), self)

    @web.middleware
    async def track_requests(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        connection = self.by_transport.get(transport) if transport is not None else None
        if connection is not None:
            connection.request_began()
        try:
            response = await handler(request)
        finally:
            if connection is not None:
                connection.request_ended()
        if self.closing:  # aiohttp ends the connection after this answer: the answer says so
            response.force_close()
        return response


class GuardedSite(web.BaseSite):
    """aiohttp's TCP site, its connections made by :class:`Connections`."""

    def __init__(self, runner: web.AppRunner, connections: Connections, host: str, port: int, *,
                 reuse_port: bool, backlog: int) -> None:
        super().__init__(runner)
        self.connections = connections
        self._host, self._port, self._reuse_port, self._listen_backlog = host, port, reuse_port, backlog
        self._listener: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._listener = await asyncio.get_running_loop().create_server(
            self.connections, self._host, self._port, reuse_address=True, reuse_port=self._reuse_port,
            backlog=self._listen_backlog)

    async def stop(self) -> None:
        self.connections.closing = True
        if self._listener is not None:
            self._listener.close()  # no new connections; the runner then closes the open ones
        await super().stop()


class MalformedRequestsQuietly(logging.Filter):
    """aiohttp logs a request that is not valid HTTP with its traceback; on the internet that is
    routine, so it becomes one info line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "malformed request: %s", (exc.message or type(exc).__name__,)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


logging.getLogger("aiohttp.server").addFilter(MalformedRequestsQuietly())


async def serve(app: web.Application, host: str, port: int, limits: ConnectionLimits | None = None,
                short_lane: aiohttp_adapter.ShortLane | None = None, reuse_port: bool = False,
                **handler_options: Any) -> web.AppRunner:
    """Serve ``app`` on aiohttp's public server: a header deadline per connection (:class:`HeaderDeadline`)
    and the idle one (aiohttp's ``keepalive_timeout``); ``handler_options`` are aiohttp's (e.g. auto_decompress).
    Requests ``short_lane`` takes are answered by it where aiohttp allows (``aiohttp_adapter``)."""
    limits = limits or ConnectionLimits()
    runner = web.AppRunner(app, keepalive_timeout=limits.keepalive_timeout, access_log=None,
                           handle_signals=False, **handler_options)
    connections = Connections(limits.header_timeout)
    app.middlewares.append(connections.track_requests)
    await runner.setup()
    assert runner.server is not None
    connections.protocol_factory = aiohttp_adapter.protocol_factory(runner.server, short_lane,
                                                                    connections.by_transport)
    # With several processes on one port (hookline receiver --processes N: ``reuse_port``) the kernel
    # spreads connections over them (SO_REUSEPORT); a lone process keeps the port to itself.
    await GuardedSite(runner, connections, host, port, reuse_port=reuse_port, backlog=1024).start()
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
