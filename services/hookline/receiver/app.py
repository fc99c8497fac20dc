"""The receiver service: POST /webhooks/{provider} -> verified, stored durably, then 2xx.

The request path is :class:`~hookline.receiver.intake.Intake`'s; this module wires it to a pool,
a group committer and aiohttp's server (``core.http.serve``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web

from hookline.core import http
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.providers import ProviderRegistry
from hookline.receiver.body import BodyLimits
from hookline.receiver.group_commit import GroupCommitter
from hookline.receiver.intake import STORE_TIMEOUT, Intake

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverLimits:
    """Everything that bounds what one receiver process holds at once."""

    connections: http.ConnectionLimits = field(default_factory=http.ConnectionLimits)
    body: BodyLimits = field(default_factory=BodyLimits)
    # Events waiting for a group-commit slot; beyond it requests get 503 at once.
    max_queued_events: int = 4096


def create_app(pool: asyncpg.Pool, intake: Intake) -> web.Application:
    # Bodies are read from the stream with each provider's own limit, not aiohttp's global one.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/webhooks/{provider}", intake.routed)
    http.add_ops_routes(app, pool)
    return app


class Receiver:
    """The receiver service: pool, provider registry, group committer and HTTP server."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, host: str, port: int,
                 limits: ReceiverLimits | None = None, **committer_options: Any) -> None:
        self.pool = pool
        self.registry = registry
        self.limits = limits or ReceiverLimits()
        self.committer = GroupCommitter(pool, max_queued=self.limits.max_queued_events, store_timeout=STORE_TIMEOUT,
                                        **committer_options)
        self.intake = Intake(registry, self.committer, self.limits.body)
        self.app = create_app(pool, self.intake)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.committer.start()
        # Content codings are decoded by the receiver itself, bounded per provider (see body).
        self._runner = await http.serve(self.app, self.host, self.port, self.limits.connections,
                                        short_lane=self.intake.short_lane, auto_decompress=False)
        tune_gc_for_serving()
        log.info("receiver listening", extra={"url": f"http://{self.host}:{self.port}"})

    async def stop(self) -> None:
        # First no new connections, idle ones closed, and every request in progress answered (which
        # needs the committer), then the committer. aiohttp's runner.shutdown() only runs hooks.
        if self._runner:
            await self._runner.cleanup()
        await self.committer.stop()
