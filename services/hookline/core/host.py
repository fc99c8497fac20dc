"""One way to run a process: a ``Host`` owns what its components share, and the order of start and stop.

``hookline receiver``, ``worker``, ``relay`` and ``dev`` are each ``Host(settings, [components...]).run()``
(River's ``Client`` in the manner of one object that owns producers, maintainers and elector). The
Host owns:

- the pool, sized from its components' needs by core/pools.py (the arithmetic the chart and the
  operator count with): the sum of their totals, less the connections the Host holds outside it;
- the process's one ``Listener`` and, when a component asks for it, the ``ProviderRegistry``;
- one ``Maintainer`` per scope (``inbox``, ``outbox``, ``partitions``) running the jobs its components
  contribute; a job two components contribute under one name (the partition manager of a worker
  that sweeps and of a relay, in ``hookline dev``) runs once;
- every dedicated connection (LISTEN, one election lease per scope), each opened from the session URL
  (HOOKLINE_DATABASE_SESSION_URL) when one is set, else from the pool's database URL (and password file);
- the ops HTTP server (/healthz, /readyz, /metrics) at ``settings.ops``, when set;
- the durability watch (core/durability.py): a log line at start, and whenever what a failover can
  lose changes.

Start: pool, listener, registry, ops server, components in order, maintainers. Stop: the reverse (the
ops server answers /healthz while the components drain).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import asyncpg
from aiohttp import web

from hookline.core import db, durability, http, migrations, pools
from hookline.core.dedicated import DedicatedConnection
from hookline.core.listener import Listener
from hookline.core.maintenance import Job, Maintainer
from hookline.core.providers import ProviderRegistry
from hookline.core.settings import Settings
from hookline.core.tasks import cancel_and_wait

C = TypeVar("C")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryUse:
    """A component reads providers: the registry, with (or without) their signing secrets."""

    signing_secrets: bool = True
    destination_secret_file: Path | None = None  # a tenant's worker: its destination secret's file


@dataclass(frozen=True)
class Connections:
    """What a component needs of Postgres, known before anything is opened."""

    total: int  # its connections as a process of its own (core/pools.py), dedicated ones included
    scopes: tuple[str, ...] = ()  # the maintenance scopes it takes part in: an election lease connection each
    min_pool: int | None = None  # pool connections opened at start (None: all of them)
    generic_plans: bool = False  # see db.create_pool; the pool plans generically if every component wants it
    registry: RegistryUse | None = None


@dataclass(frozen=True)
class Wiring:
    """What the Host has opened, handed to each component it creates."""

    settings: Settings
    pool: asyncpg.Pool
    listener: Listener
    registry: ProviderRegistry | None


class Component(Protocol):
    """A service a Host runs (Receiver, Worker, Relay): its needs, its housekeeping jobs by scope, its lifecycle."""

    @classmethod
    def connections(cls, settings: Settings) -> Connections: ...

    @classmethod
    def create(cls, wiring: Wiring) -> Component: ...

    def jobs(self) -> Sequence[tuple[str, Job]]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Host:
    def __init__(self, settings: Settings, components: Sequence[type[Component]]) -> None:
        self.settings = settings
        self._kinds = tuple(components)
        self.needs = [kind.connections(settings) for kind in self._kinds]
        self.scopes = tuple(dict.fromkeys(scope for need in self.needs for scope in need.scopes))
        self.pool_size = pools.pool_size(sum(need.total for need in self.needs), locks=len(self.scopes))
        mins = [need.min_pool for need in self.needs if need.min_pool is not None]
        self.pool_min = min(mins, default=self.pool_size)
        self.generic_plans = all(need.generic_plans for need in self.needs)
        self.components: list[Component] = []
        self.maintainers: list[Maintainer] = []
        self._running: list[Component | Maintainer] = []  # what has started, in order
        self.pool: asyncpg.Pool | None = None
        self.listener: Listener | None = None
        self.registry: ProviderRegistry | None = None
        self._ops: web.AppRunner | None = None
        self._durability: asyncio.Task[None] | None = None

    def component(self, kind: type[C]) -> C:
        """The running component of class ``kind`` (for tests that look inside)."""
        return next(c for c in self.components if isinstance(c, kind))

    async def run(self, started: Callable[[Host], None] | None = None) -> int:
        """Start, run until SIGTERM or SIGINT, stop; ``started`` is called once everything runs."""

        async def start() -> None:
            await self.start()
            if started is not None:
                started(self)

        await http.run_until_stopped(start, self.stop)
        return 0

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()  # what was opened is closed again, then the reason is told
            raise

    async def _start(self) -> None:
        settings = self.settings
        self.pool = await db.create_pool(settings.database_url, password_file=settings.database_password_file,
                                         min_size=self.pool_min, max_size=self.pool_size, lean=True,
                                         generic_plans=self.generic_plans, pinned_search_path=True,
                                         transaction_pooling=settings.transaction_pooling)
        await migrations.check_server(self.pool)
        if settings.transaction_pooling:
            await self._warn_unpinned()
        self._durability = asyncio.create_task(
            durability.watch(self.pool, await durability.check_at_start(self.pool)), name="durability")
        self.listener = Listener(self._dedicated())
        await self.listener.start()
        uses = [need.registry for need in self.needs if need.registry is not None]
        if uses:
            self.registry = ProviderRegistry(
                self.pool, listener=self.listener, signing_secrets=any(use.signing_secrets for use in uses),
                destination_secret_file=next((u.destination_secret_file for u in uses if u.destination_secret_file),
                                             None))
            await self.registry.start()
        wiring = Wiring(settings, self.pool, self.listener, self.registry)
        self.components = [kind.create(wiring) for kind in self._kinds]
        self.maintainers = self._maintainers()
        if settings.ops is not None:
            self._ops = await http.serve(http.ops_app(self.pool), settings.ops.host, settings.ops.port)
        parts: list[Component | Maintainer] = [*self.components, *self.maintainers]
        for part in parts:
            await part.start()
            self._running.append(part)

    def _maintainers(self) -> list[Maintainer]:
        by_scope: dict[str, dict[str, Job]] = {scope: {} for scope in self.scopes}
        for component in self.components:
            for scope, job in component.jobs():
                # A leader's job in a scope nobody counted a lease connection for would be a bug.
                assert scope in by_scope, f"{type(component).__name__} has a job in undeclared scope {scope!r}"
                by_scope[scope].setdefault(job.name, job)
        return [Maintainer(scope, list(jobs.values()), self._dedicated()) for scope, jobs in by_scope.items() if jobs]

    async def _warn_unpinned(self) -> None:
        # Through a transaction-mode pooler the pool's search path is the role's, not pinned: say so
        # where a role could plant a function in schema public that shadows a built-in one.
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            warning = await migrations.public_schema_warning(conn)
        if warning:
            log.warning("HOOKLINE_DATABASE_POOLING=transaction: the pool's search path is not pinned, and %s",
                        warning)

    def _dedicated(self) -> DedicatedConnection:
        """A connection of its own (a session: LISTEN, a leader's lease), from the session URL when one is set."""
        return DedicatedConnection(self.settings.session_url, password_file=self.settings.session_password_file)

    async def stop(self) -> None:
        # One part that fails to stop must not keep the others (and the pool) open.
        while self._running:
            part = self._running.pop()
            try:
                await part.stop()
            except Exception:
                log.exception("stopping failed; stopping the rest", extra={"part": type(part).__name__})
        if self._durability is not None:
            await cancel_and_wait(self._durability)
            self._durability = None
        if self._ops is not None:
            await self._ops.cleanup()
            self._ops = None
        if self.registry is not None:
            await self.registry.stop()
            self.registry = None
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
