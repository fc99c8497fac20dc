"""The HTTP pieces every service shares: health, readiness, metrics, JSON errors, running an app."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

POOL_KEY: web.AppKey[asyncpg.Pool] = web.AppKey("pool", asyncpg.Pool)


def error(status: int, code: str, message: str, **headers: str) -> web.Response:
    """The contract's error shape; ``response["outcome"]`` carries the code for metrics."""
    response = web.json_response({"error": code, "message": message}, status=status, headers=headers or None)
    response["outcome"] = code
    return response


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL_KEY]
    try:
        async with asyncio.timeout(2.0):
            await pool.fetchval("SELECT 1")
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


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    # With several processes on one port (hookline receiver --processes N) the kernel spreads
    # connections over them (SO_REUSEPORT); a lone process keeps the port to itself.
    reuse_port = os.environ.get("HOOKLINE_REUSE_PORT") == "1"
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
