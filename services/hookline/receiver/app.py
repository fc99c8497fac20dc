"""The receiver service: POST /webhooks/{provider} -> verified, stored durably, then 2xx.

The request path is :class:`~hookline.receiver.intake.Intake`'s; this module wires it to a pool,
a group committer and aiohttp's server (``core.http.serve``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
from aiohttp import web

from hookline.core import http, pools
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.host import Connections, RegistryUse, Wiring
from hookline.core.maintenance import Job
from hookline.core.providers import ProviderRegistry
from hookline.core.settings import ReceiverSettings, Settings
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


def receiver_limits(settings: ReceiverSettings) -> ReceiverLimits:
    return ReceiverLimits(
        connections=http.ConnectionLimits(header_timeout=settings.header_timeout,
                                          keepalive_timeout=settings.keepalive_timeout),
        body=BodyLimits(body_timeout=settings.body_timeout, max_buffered_bodies=settings.max_buffered_bodies,
                        max_buffered_bytes=settings.max_buffered_bytes),
        max_queued_events=settings.max_queued_events,
    )


def create_app(pool: asyncpg.Pool, intake: Intake) -> web.Application:
    # Bodies are read from the stream with each provider's own limit, not aiohttp's global one.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/webhooks/{provider}", intake.routed)
    http.add_ops_routes(app, pool)
    return app


class Receiver:
    """The receiver service, a component of a Host (core/host.py): group committer and HTTP server
    (its /healthz, /readyz and /metrics on the same port), on the Host's pool and provider registry."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry,
                 settings: ReceiverSettings | None = None) -> None:
        settings = settings or ReceiverSettings()
        self.pool = pool
        self.registry = registry
        self.limits = receiver_limits(settings)
        self.committer = GroupCommitter(pool, max_queued=self.limits.max_queued_events, store_timeout=STORE_TIMEOUT,
                                        max_batch=settings.max_batch, window=settings.batch_window,
                                        flushers=settings.db_connections)
        self.intake = Intake(registry, self.committer, self.limits.body)
        self.app = create_app(pool, self.intake)
        self.host, self.port, self.reuse_port = settings.host, settings.port, settings.reuse_port
        self._runner: web.AppRunner | None = None

    @classmethod
    def connections(cls, settings: Settings) -> Connections:
        # Its batch writers, the registry's LISTEN and /readyz (pools.receiver), opened at start.
        return Connections(pools.receiver(settings.receiver.db_connections), registry=RegistryUse())

    @classmethod
    def create(cls, wiring: Wiring) -> Receiver:
        assert wiring.registry is not None  # connections() asks for it
        return cls(wiring.pool, wiring.registry, wiring.settings.receiver)

    def jobs(self) -> Sequence[tuple[str, Job]]:
        return []

    async def start(self) -> None:
        self.committer.start()
        # Content codings are decoded by the receiver itself, bounded per provider (see body).
        self._runner = await http.serve(self.app, self.host, self.port, self.limits.connections,
                                        short_lane=self.intake.short_lane, reuse_port=self.reuse_port,
                                        auto_decompress=False)
        tune_gc_for_serving()
        log.info("receiver listening", extra={"url": f"http://{self.host}:{self.port}"})

    async def stop(self) -> None:
        # First no new connections, idle ones closed, and every request in progress answered (which
        # needs the committer), then the committer. aiohttp's runner.shutdown() only runs hooks.
        if self._runner:
            await self._runner.cleanup()
        await self.committer.stop()
