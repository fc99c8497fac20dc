"""``hookline console`` as a component of a Host (core/host.py): the console's web application on
its own port, reading through the Host's pool. Part of ``hookline dev`` too.

``--auth token`` (the default): one token guards everything, HOOKLINE_CONSOLE_TOKEN or one made at
start and printed once to stderr (never logged). ``--auth kubernetes``: console/kube.py's
KubernetesAuthorizer asks the API server who the token is and what it may see."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TextIO

import asyncpg
from aiohttp import web

from hookline.console.access import Access, Authorizer, TokenAuthorizer
from hookline.console.app import create_app
from hookline.console.store import Store
from hookline.core import http, pools
from hookline.core.config import ConfigError
from hookline.core.host import Connections, Wiring
from hookline.core.maintenance import Job
from hookline.core.settings import ConsoleSettings, Settings

log = logging.getLogger(__name__)

POOL_CONNECTIONS = pools.CONSOLE  # the chart's database.maxConnections counts it per replica


class ConsoleUnavailable(ConfigError):
    """The console cannot run as configured (the message says what to do)."""


def authorizer_for(settings: ConsoleSettings) -> Authorizer:
    if settings.auth == "token":
        return TokenAuthorizer(settings.token)
    try:
        kube = importlib.import_module("hookline.console.kube")
    except ModuleNotFoundError as exc:
        raise ConsoleUnavailable(f"--auth kubernetes needs hookline.console.kube ({exc.name} is missing): "
                                 "pip install 'hookline[operator]', or use --auth token") from None
    authorizer: Authorizer = kube.KubernetesAuthorizer(audiences=settings.audiences)
    return authorizer


class Console:
    """The console component: ``start`` serves it, ``stop`` stops serving."""

    def __init__(self, pool: asyncpg.Pool, settings: ConsoleSettings, authorizer: Authorizer | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.authorizer = authorizer or authorizer_for(settings)
        self.store = Store(pool, statement_timeout=settings.statement_timeout)
        self.app = create_app(self.store, self.authorizer, pool, csrf_key=settings.csrf_key)
        if hasattr(self.authorizer, "record_replay"):  # Kubernetes: who may see what comes from the providers
            self.authorizer.provider_source = self._owners  # type: ignore[attr-defined]
            self.authorizer.endpoint_source = self._endpoints  # type: ignore[attr-defined]
            self.store.replay_hooks.append(self._record_replay)
        self._runner: web.AppRunner | None = None

    async def _owners(self) -> list[tuple[str, str | None, str | None]]:
        return [(name, namespace, owner) for name, namespace, owner, _ in await self.store.provider_owners()]

    async def _endpoints(self) -> list[tuple[str, str, str]]:
        return [(name, namespace, resource) for name, namespace, resource, _ in await self.store.endpoint_owners()]

    async def _record_replay(self, access: Access, what: dict[str, dict[str, int]]) -> None:
        """A Kubernetes Event on each WebhookProvider whose events were replayed, and on each
        WebhookEndpoint whose deliveries were (the attempt log has the rows); what no resource owns
        has nowhere to put one."""
        owners: dict[str, tuple[str, str | None, str | None, str | None]] = {}
        if what.get("providers"):
            owners.update({name: ("WebhookProvider", ns, owner, uid)
                           for name, ns, owner, uid in await self.store.provider_owners()})
        if what.get("endpoints"):
            owners.update({name: ("WebhookEndpoint", ns, resource, uid)
                           for name, ns, resource, uid in await self.store.endpoint_owners()})
        for name, count in {**(what.get("providers") or {}), **(what.get("endpoints") or {})}.items():
            kind, ns, owner, uid = owners.get(name, ("", None, None, None))
            if ns and owner and uid:
                await self.authorizer.record_replay(  # type: ignore[attr-defined]
                    ns, owner, uid, access.subject, count, kind=kind)

    @property
    def url(self) -> str:
        host = self.settings.host if ":" not in self.settings.host else f"[{self.settings.host}]"
        return f"http://{host}:{self.settings.port}"

    @property
    def token(self) -> str | None:
        """The shared token (--auth token), for the banner; None with Kubernetes."""
        return self.authorizer.token if isinstance(self.authorizer, TokenAuthorizer) else None

    @classmethod
    def connections(cls, settings: Settings) -> Connections:
        return Connections(POOL_CONNECTIONS, min_pool=1)

    @classmethod
    def create(cls, wiring: Wiring) -> Console:
        return cls(wiring.pool, wiring.settings.console)

    def jobs(self) -> Sequence[tuple[str, Job]]:
        return []

    async def start(self) -> None:
        problem = await self.pool.fetchval("SELECT hookline.console_role_problem()")
        if problem is not None:
            raise ConsoleUnavailable(problem)
        self._runner = await http.serve(self.app, self.settings.host, self.settings.port)
        # Whether other replicas exist is not knowable here: the chart always gives a shared key.
        log.info("console started", extra={"url": self.url, "auth": self.settings.auth,
                                           "csrf_key": "shared" if self.settings.csrf_key else "per-process"})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def announce_token(console: Console, stream: TextIO | None = None) -> None:
    """Print the generated (or given) token once, to stderr, not through the log."""
    token = console.token
    shown = f"  token: {token}" if token is not None and console.settings.token is None else ""
    print(f"hookline console: {console.url}{shown}", file=stream or sys.stderr, flush=True)
