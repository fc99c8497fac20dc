"""Providers: their storage and an in-memory registry (the spec and its parser: provider_spec.py,
re-exported here).

A provider is written by ``hookline providers apply`` or by the operator into
``hookline.providers``; every service keeps a parsed copy in memory so that no
request pays for a config query, and re-reads it when Postgres notifies a change
(with a periodic re-read as a fallback for a missed notification).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from hookline.core import db
from hookline.core import secrets_at_rest as sealing
from hookline.core.listener import Listener, Subscription
from hookline.core.provider_spec import DEFAULT_MAX_BODY as DEFAULT_MAX_BODY
from hookline.core.provider_spec import HANDLER_RE as HANDLER_RE
from hookline.core.provider_spec import NAME_RE as NAME_RE
from hookline.core.provider_spec import Destination as Destination
from hookline.core.provider_spec import FieldRule as FieldRule
from hookline.core.provider_spec import Ordering as Ordering
from hookline.core.provider_spec import Provider as Provider
from hookline.core.provider_spec import SpecError as SpecError
from hookline.core.provider_spec import Transition as Transition
from hookline.core.provider_spec import load_documents as load_documents
from hookline.core.provider_spec import parse_provider as parse_provider
from hookline.core.provider_spec import split_file_secrets as split_file_secrets
from hookline.core.signatures import get_scheme
from hookline.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class ProviderOwned(SpecError):
    """The name belongs to a WebhookProvider resource; only the operator may change or delete it."""

    def __init__(self, name: str, namespace: str, resource: str) -> None:
        super().__init__(f"provider {name!r} is managed by WebhookProvider {namespace}/{resource} in Kubernetes; "
                         f"change or delete it there (the CLI never touches a provider the operator owns)")


def active_secrets(stored: Iterable[Mapping[str, Any]], now: datetime | None = None) -> list[str]:
    """The stored secrets still valid at ``now`` (a rotated-out secret has a notAfter)."""
    now = now or datetime.now(UTC)
    valid = []
    for entry in stored:
        not_after = entry.get("notAfter")
        if not_after is None or datetime.fromisoformat(not_after) > now:
            valid.append(str(entry["value"]))
    return valid


# --- storage -------------------------------------------------------------------------------------


async def upsert(conn: asyncpg.Connection, name: str, spec: Mapping[str, Any], secrets: list[dict[str, Any]]
                 ) -> str | None:
    """Store a provider, its secrets sealed (encrypted at rest); returns the destination secret when
    this call created it (to show it once)."""
    from hookline.core.signatures import get_scheme

    ring = sealing.required_ring("storing a provider's signing secrets")
    stored = _jsonb(await conn.fetchval(db.query("get_provider_secrets"), name))
    # An unchanged secret keeps its ciphertext: re-applying the same file rewrites nothing secret.
    sealed = sealing.seal_entries(ring, secrets, sealing.provider_secrets_context(name), stored or [])
    fresh = get_scheme("standard-webhooks").generate_secret()
    row = await conn.fetchrow(db.query("upsert_provider"), name, spec, sealed,
                              ring.seal(fresh, sealing.destination_secret_context(name)))
    if row is None:
        await _raise_if_owned(conn, name)
    return fresh if row is not None and row["secret_is_new"] else None


def _jsonb(value: Any) -> Any:
    # The pool's connections decode jsonb; a bare asyncpg connection returns text.
    return json.loads(value) if isinstance(value, str) else value


def stored_secrets(ring: sealing.KeyRing | None, name: str, stored: Any) -> list[dict[str, Any]]:
    """A provider's stored ``secrets`` column, opened: [{"value", "notAfter"}] in plaintext."""
    return sealing.open_entries(ring, _jsonb(stored) or [], sealing.provider_secrets_context(name))


def stored_destination_secret(ring: sealing.KeyRing | None, name: str, stored: str | None) -> str | None:
    """A provider's stored ``destination_secret`` column, opened."""
    return sealing.open_value(ring, stored, sealing.destination_secret_context(name)) if stored else None


async def delete(conn: asyncpg.Connection, name: str) -> bool:
    """Delete a provider the CLI manages; False when there is none, ProviderOwned when a resource owns it."""
    if await conn.fetchval(db.query("delete_provider"), name):
        return True
    await _raise_if_owned(conn, name)
    return False


async def apply_providers(conn: asyncpg.Connection, text: str,
                          handler_problem: Callable[[str], str | None] | None = None) -> list[str]:
    """Store every WebhookProvider document of a providers file, all or none.

    Every document is validated before the transaction commits; with ``handler_problem``
    (the CLI's import check: why a ``module:function`` cannot run, or None) a handler that
    cannot run is refused too. Returns lines to show the user. A document without
    ``signature.secrets`` keeps the provider's stored secrets, or gets a generated one
    (shown once) when it has none.
    """
    docs = load_documents(text)
    if not docs:
        raise SpecError("the file holds no WebhookProvider documents")
    report: list[str] = []
    async with conn.transaction():
        for name, raw_spec in docs:
            report += await _apply_document(conn, name, raw_spec, handler_problem)
    return report


async def _apply_document(conn: asyncpg.Connection, name: str, raw_spec: Mapping[str, Any],
                          handler_problem: Callable[[str], str | None] | None) -> list[str]:
    report: list[str] = []
    spec, secrets = split_file_secrets(raw_spec)
    if secrets is None:
        stored, generated = await _kept_or_generated_secrets(conn, name, spec)
        if generated:
            report.append(f"{name}: generated secret (shown once): {generated}")
    else:
        stored = [{"value": s, "notAfter": None} for s in secrets]
    try:
        provider = parse_provider(name, spec, active_secrets(stored))
    except SpecError as exc:
        raise SpecError(f"{name}: {exc}") from None
    if provider.handler and handler_problem and (problem := handler_problem(provider.handler)):
        raise SpecError(f"{name}: spec.handler {provider.handler!r} cannot be run by the worker: {problem}")
    destination_secret = await upsert(conn, name, spec, stored)
    report.append(f"provider/{name} applied")
    if destination_secret and spec.get("destination"):
        report.append(f"{name}: destination calls are signed (Standard Webhooks) with this secret, "
                      f"shown once: {destination_secret}")
    return report


async def _kept_or_generated_secrets(conn: asyncpg.Connection, name: str, spec: Mapping[str, Any]
                                     ) -> tuple[list[dict[str, Any]], str | None]:
    """The provider's stored secrets; else a new one for schemes that sign (returned to show once)."""
    existing = await conn.fetchval(db.query("get_provider_secrets"), name)
    if existing:
        return stored_secrets(sealing.required_ring("reading a provider's signing secrets"), name, existing), None
    signature = spec.get("signature")
    scheme = signature.get("scheme") if isinstance(signature, dict) else None
    if scheme in (None, "none"):
        return [], None
    try:
        value = get_scheme(scheme).generate_secret()
    except ValueError:
        return [], None  # an unknown scheme: parse_provider says so
    return [{"value": value, "notAfter": None}], value


def manager(row: Mapping[str, Any]) -> str:
    """Who manages a stored provider, for people: the CLI, a WebhookProvider, or unrecorded."""
    if row["owner_namespace"] is not None:
        return f"WebhookProvider {row['owner_namespace']}/{row['owner_name']}"
    return "cli" if row["managed_by"] == "cli" else "unrecorded (before ownership)"


async def _raise_if_owned(conn: asyncpg.Connection, name: str) -> None:
    owner = await conn.fetchrow(db.query("get_provider_owner"), name)
    if owner is not None and owner["owner_uid"] is not None:
        raise ProviderOwned(name, owner["owner_namespace"], owner["owner_name"])


async def load_all(conn: asyncpg.Connection | asyncpg.Pool, *, signing_secrets: bool = True,
                   destination_secret_file: Path | None = None) -> dict[str, Provider]:
    """Every stored provider, parsed, its secrets opened (core/secrets_at_rest.py); a row that no
    longer parses or whose secrets do not open is logged (without them) and skipped. A bad key file
    is a SecretKeyError.

    Without ``signing_secrets`` (workers, which never verify a signature) the signing secrets are
    not read: a tenant's worker role may not read them (migration 0025). With
    ``destination_secret_file`` (a tenant's worker: it has no key) no secret column is read at all:
    the destination secret is that file's (migration 0026)."""
    if destination_secret_file is not None:
        return await _load_for_tenant_worker(conn, destination_secret_file)
    ring = sealing.configured_ring()
    providers = {}
    query = "list_providers" if signing_secrets else "list_provider_specs"
    try:
        rows = await conn.fetch(db.query(query))
    except asyncpg.InsufficientPrivilegeError:
        if signing_secrets:
            raise
        return await _load_for_tenant_worker(conn, None)  # a tenant's role, run without the file
    for row in rows:
        name = row["name"]
        try:
            secrets = active_secrets(stored_secrets(ring, name, row["secrets"])) if signing_secrets else None
            provider = parse_provider(name, row["spec"], secrets)
            if provider.destination is not None:  # only a destination's calls are signed with it
                provider = dataclasses.replace(provider, destination_secret=stored_destination_secret(
                    ring, name, row["destination_secret"]))
            providers[name] = provider
        except SpecError as exc:
            log.error("stored provider is invalid; ignoring it", extra={"provider": name, "error": str(exc)})
        except (sealing.SecretKeyError, sealing.SealedValueError) as exc:
            log.error("stored provider's secrets do not open; ignoring it", extra={"provider": name, "error": str(exc)})
    return providers


async def _load_for_tenant_worker(conn: asyncpg.Connection | asyncpg.Pool, destination_secret_file: Path | None
                                  ) -> dict[str, Provider]:
    destination_secret: str | None = None
    problem: str | None = "HOOKLINE_DESTINATION_SECRET_FILE is not set"
    if destination_secret_file is not None:
        try:  # re-read at every load: the mounted Secret is updated in place when the secret rotates
            destination_secret = destination_secret_file.read_text().strip() or None
            problem = None if destination_secret else f"{destination_secret_file} is empty"
        except OSError as exc:
            problem = f"{destination_secret_file} cannot be read: {exc.strerror}"
    providers = {}
    for row in await conn.fetch(db.query("list_provider_specs_without_secrets")):
        name = row["name"]
        try:
            provider = parse_provider(name, row["spec"], None, destination_secret)
        except SpecError as exc:
            log.error("stored provider is invalid; ignoring it", extra={"provider": name, "error": str(exc)})
            continue
        if provider.destination is not None and problem:
            # Fail closed: no destination call leaves unsigned; the events wait for the secret.
            log.error("no destination secret (%s); not working for this provider", problem, extra={"provider": name})
            continue
        providers[name] = provider
    return providers


class ProviderRegistry:
    """The providers, kept current in memory: re-read after the listener reconnects, every
    ``refresh`` seconds (a rotated-out secret expires without a change of its row), and on
    NOTIFY once the rows' fingerprint shows a change.

    Any role may NOTIFY hookline_providers, so a notification is only a hint: it costs a
    fingerprint query (names and update times, no parsing), and notifications that arrive
    within ``debounce`` seconds of a look are answered by one look after it. A flood costs
    at most 1 / ``debounce`` cheap queries a second. The payload is never read; the
    trigger's own carries the provider name only (migration 0001)."""

    def __init__(self, pool: asyncpg.Pool, refresh: float = 30.0, *, listener: Listener,
                 signing_secrets: bool = True, debounce: float = 0.25,
                 destination_secret_file: Path | None = None) -> None:
        self._pool = pool
        self._destination_secret_file = destination_secret_file
        self._refresh = refresh
        self._signing_secrets = signing_secrets
        self._debounce = debounce
        self._providers: dict[str, Provider] = {}
        self._fingerprint: str | None = None
        self._changed = asyncio.Event()
        self._resync = False
        self.reloads = 0  # full re-reads, for tests and curious operators
        self._task: asyncio.Task[None] | None = None
        self.loaded = asyncio.Event()
        # The process's shared LISTEN connection, started and stopped by its owner (core/host.py).
        self._listener = listener
        self._subscription: Subscription | None = None

    def get(self, name: str) -> Provider | None:
        return self._providers.get(name)

    def all(self) -> dict[str, Provider]:
        return dict(self._providers)

    async def reload(self) -> None:
        fingerprint = await self._pool.fetchval(db.query("providers_fingerprint"))
        self._providers = await load_all(self._pool, signing_secrets=self._signing_secrets,
                                         destination_secret_file=self._destination_secret_file)
        self._fingerprint = fingerprint
        self.reloads += 1
        self.loaded.set()

    def _resynced(self) -> None:
        self._resync = True
        self._changed.set()

    async def start(self) -> None:
        self._subscription = await self._listener.subscribe(
            ("hookline_providers",), lambda _channel, _payload: self._changed.set(), self._resynced)
        await self.reload()
        self._task = asyncio.create_task(self._run(), name="provider-registry")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self._subscription is not None:
            self._listener.unsubscribe(self._subscription)

    async def _run(self) -> None:
        while True:
            notified = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._refresh)
                notified = not self._resync
            self._changed.clear()
            self._resync = False
            try:
                if not notified or await self._pool.fetchval(db.query("providers_fingerprint")) != self._fingerprint:
                    await self.reload()
                if notified:
                    await asyncio.sleep(self._debounce)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("provider registry could not re-read providers; retrying", extra={"error": str(exc)})
                self._changed.set()
                await asyncio.sleep(1.0)
