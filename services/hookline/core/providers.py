"""Providers: the parsed WebhookProvider spec, its storage, and an in-memory registry.

A provider is written by ``hookline providers apply`` or by the operator into
``hookline.providers``; every service keeps a parsed copy in memory so that no
request pays for a config query, and re-reads it when Postgres notifies a change
(with a periodic re-read as a fallback for a missed notification).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from hookline.core import db
from hookline.core.queue import RetryPolicy
from hookline.core.signatures import SignatureConfig, get_scheme, validate_config

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DEFAULT_MAX_BODY = 1024 * 1024


class SpecError(ValueError):
    """A provider spec that cannot be used; the message names the field."""


class ProviderOwned(SpecError):
    """The name belongs to a WebhookProvider resource; only the operator may change or delete it."""

    def __init__(self, name: str, namespace: str, resource: str) -> None:
        super().__init__(f"provider {name!r} is managed by WebhookProvider {namespace}/{resource} in Kubernetes; "
                         f"change or delete it there (the CLI never touches a provider the operator owns)")


@dataclass(frozen=True)
class FieldRule:
    """Where a value comes from: a JSON pointer into the body, or a header."""

    source: str  # "json" | "header"
    path: str

    def describe(self) -> str:
        return f"JSON pointer {self.path}" if self.source == "json" else f"header {self.path}"


@dataclass(frozen=True)
class Transition:
    on: str
    from_states: tuple[str | None, ...]
    to: str


@dataclass(frozen=True)
class Ordering:
    entity_key: FieldRule
    max_deferral_seconds: float
    transitions: tuple[Transition, ...]


@dataclass(frozen=True)
class Destination:
    url: str
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class Provider:
    name: str
    signature: SignatureConfig
    event_id: FieldRule
    event_type: FieldRule | None
    max_body_bytes: int = DEFAULT_MAX_BODY
    destination: Destination | None = None
    handler: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_seconds: int = 60
    ordering: Ordering | None = None
    # spec.replayProtection.bodyHashWindowSeconds: a body seen again within this many seconds is
    # a duplicate whatever its event id (for schemes that sign neither the id nor a timestamp).
    replay_window_seconds: float | None = None
    # Signs the worker's calls to `destination` (Standard Webhooks), so the internal
    # service can tell them from anyone else's.
    destination_secret: str | None = field(default=None, repr=False)
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


# --- parsing -------------------------------------------------------------------------------------


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"{where}.{key} must be a number, not {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SpecError(f"{where}.{key} must be {names}, not {type(value).__name__}")
    return value


def _number(obj: Mapping[str, Any], key: str, where: str, default: float, lo: float, hi: float) -> float:
    value = float(_get(obj, key, (int, float), where, default))
    if not lo <= value <= hi:
        raise SpecError(f"{where}.{key} must be between {lo:g} and {hi:g}, not {value:g}")
    return value


def _rule(obj: Any, where: str) -> FieldRule:
    if not isinstance(obj, Mapping):
        raise SpecError(f"{where} must be an object with jsonPointer or header")
    pointer, header = obj.get("jsonPointer"), obj.get("header")
    if (pointer is None) == (header is None):
        raise SpecError(f"{where} needs exactly one of jsonPointer or header")
    if pointer is not None:
        if not isinstance(pointer, str) or not (pointer == "" or pointer.startswith("/")):
            raise SpecError(f"{where}.jsonPointer must be a JSON pointer like /id, not {pointer!r}")
        return FieldRule("json", pointer)
    if not isinstance(header, str) or not header:
        raise SpecError(f"{where}.header must be a header name")
    return FieldRule("header", header)


def parse_provider(name: str, spec: Mapping[str, Any], secrets: Iterable[str] = (),
                   destination_secret: str | None = None) -> Provider:
    """Validate a WebhookProvider ``spec`` and return the typed provider.

    ``secrets`` are the currently valid signing secrets; the spec itself never holds them
    (a providers file's ``signature.secrets`` is split off by ``split_file_secrets``).
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(f"provider name {name!r} must be a DNS label: lower-case letters, digits and '-'")
    if not isinstance(spec, Mapping):
        raise SpecError("spec must be an object")
    sig = spec.get("signature")
    if not isinstance(sig, Mapping):
        raise SpecError("spec.signature is required (at least {scheme: ...})")
    scheme_name = _get(sig, "scheme", str, "spec.signature")
    if scheme_name is None:
        raise SpecError("spec.signature.scheme is required")
    try:
        scheme = get_scheme(scheme_name)
    except ValueError as exc:
        raise SpecError(f"spec.signature.scheme: {exc}") from None
    signature = SignatureConfig(
        scheme=scheme_name,
        secrets=tuple(secrets),
        tolerance_seconds=int(_number(sig, "toleranceSeconds", "spec.signature", 300, 1, 86400)),
        header=_get(sig, "header", str, "spec.signature"),
        encoding=_get(sig, "encoding", str, "spec.signature", "hex"),
        prefix=_get(sig, "prefix", str, "spec.signature", ""),
    )
    try:
        validate_config(signature)
    except ValueError as exc:
        raise SpecError(f"spec.signature: {exc}") from None

    event_id = _rule(spec["eventId"], "spec.eventId") if spec.get("eventId") else FieldRule(*scheme.default_event_id)
    if spec.get("eventType"):
        event_type: FieldRule | None = _rule(spec["eventType"], "spec.eventType")
    else:
        event_type = FieldRule(*scheme.default_event_type) if scheme.default_event_type else None

    destination = None
    if (dest := spec.get("destination")) is not None:
        if not isinstance(dest, Mapping) or not isinstance(dest.get("url"), str):
            raise SpecError("spec.destination needs a url")
        if not dest["url"].startswith(("http://", "https://")):
            raise SpecError(f"spec.destination.url must be an http(s) URL, not {dest['url']!r}")
        destination = Destination(dest["url"], _number(dest, "timeoutSeconds", "spec.destination", 10, 0.1, 300))
    handler = _get(spec, "handler", str, "spec")
    if handler is not None and not HANDLER_RE.match(handler):
        raise SpecError(f"spec.handler must look like 'package.module:function', not {handler!r}")
    if destination and handler:
        raise SpecError("spec.destination and spec.handler are mutually exclusive: choose one")
    if not destination and not handler:
        raise SpecError("spec needs a destination (an internal URL to POST events to) or a handler "
                        "('package.module:function')")

    retry_spec = _get(spec, "retry", Mapping, "spec", {})
    retry = RetryPolicy(
        max_attempts=int(_number(retry_spec, "maxAttempts", "spec.retry", 12, 1, 1000)),
        initial_delay=_number(retry_spec, "initialDelaySeconds", "spec.retry", 5, 0, 86400),
        max_delay=_number(retry_spec, "maxDelaySeconds", "spec.retry", 3600, 0, 7 * 86400),
    )
    if retry.initial_delay > retry.max_delay:
        raise SpecError("spec.retry.initialDelaySeconds must not exceed maxDelaySeconds")

    ordering = None
    if (ord_spec := spec.get("ordering")) is not None:
        if not isinstance(ord_spec, Mapping):
            raise SpecError("spec.ordering must be an object")
        if "entityKey" not in ord_spec:
            raise SpecError("spec.ordering.entityKey is required")
        raw_transitions = ord_spec.get("transitions")
        if not isinstance(raw_transitions, list) or not raw_transitions:
            raise SpecError("spec.ordering.transitions must be a non-empty list")
        transitions = []
        for i, t in enumerate(raw_transitions):
            where = f"spec.ordering.transitions[{i}]"
            if isinstance(t, Mapping):
                # YAML 1.1 reads an unquoted `on:` key as the boolean true (kubectl's parser
                # turns it into "true"); accept both so the contract's examples work as written.
                t = {("on" if k in (True, "true") else k): v for k, v in t.items()}
            if not isinstance(t, Mapping) or not isinstance(t.get("on"), str) or not isinstance(t.get("to"), str):
                raise SpecError(f"{where} needs 'on' (an event type) and 'to' (a state)")
            from_states = t.get("from", [None])
            if not isinstance(from_states, list) or not all(s is None or isinstance(s, str) for s in from_states):
                raise SpecError(f"{where}.from must be a list of states (null for 'no state yet')")
            transitions.append(Transition(t["on"], tuple(from_states), t["to"]))
        ordering = Ordering(
            entity_key=_rule(ord_spec["entityKey"], "spec.ordering.entityKey"),
            max_deferral_seconds=_number(ord_spec, "maxDeferralSeconds", "spec.ordering", 3600, 0, 30 * 86400),
            transitions=tuple(transitions),
        )

    replay_window = None
    if (replay_spec := _get(spec, "replayProtection", Mapping, "spec")) is not None:
        replay_window = _number(replay_spec, "bodyHashWindowSeconds", "spec.replayProtection", 0, 1, 30 * 86400)

    return Provider(
        name=name,
        signature=signature,
        event_id=event_id,
        event_type=event_type,
        max_body_bytes=int(_number(spec, "maxBodyBytes", "spec", DEFAULT_MAX_BODY, 1, 64 * 1024 * 1024)),
        destination=destination,
        handler=handler,
        retry=retry,
        lease_seconds=int(_number(spec, "leaseSeconds", "spec", 60, 1, 3600)),
        ordering=ordering,
        replay_window_seconds=replay_window,
        destination_secret=destination_secret,
        spec=spec,
    )


def split_file_secrets(spec: Mapping[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """Split a providers-file spec into (spec without secrets, secrets or None when absent)."""
    copy: dict[str, Any] = json.loads(json.dumps(spec))  # deep copy, and proves it is plain JSON
    sig = copy.get("signature")
    if not isinstance(sig, dict) or "secrets" not in sig:
        return copy, None
    secrets = sig.pop("secrets")
    if not isinstance(secrets, list) or not all(isinstance(s, str) and s for s in secrets):
        raise SpecError("spec.signature.secrets must be a list of non-empty strings")
    return copy, secrets


def active_secrets(stored: Iterable[Mapping[str, Any]], now: datetime | None = None) -> list[str]:
    """The stored secrets still valid at ``now`` (a rotated-out secret has a notAfter)."""
    now = now or datetime.now(UTC)
    valid = []
    for entry in stored:
        not_after = entry.get("notAfter")
        if not_after is None or datetime.fromisoformat(not_after) > now:
            valid.append(str(entry["value"]))
    return valid


def load_documents(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) of every WebhookProvider document in a YAML providers file."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}") from None
    out = []
    for i, doc in enumerate(docs):
        where = f"document {i + 1}"
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: expected a WebhookProvider object")
        if doc.get("kind", "WebhookProvider") != "WebhookProvider":
            raise SpecError(f"{where}: kind must be WebhookProvider, not {doc.get('kind')!r}")
        name = (doc.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise SpecError(f"{where}: metadata.name is required")
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            raise SpecError(f"{where} ({name}): spec is required")
        out.append((name, spec))
    return out


# --- storage -------------------------------------------------------------------------------------


async def upsert(conn: asyncpg.Connection, name: str, spec: Mapping[str, Any], secrets: list[dict[str, Any]]
                 ) -> str | None:
    """Store a provider; returns the destination secret when this call created it (to show it once)."""
    from hookline.core.signatures import get_scheme

    fresh = get_scheme("standard-webhooks").generate_secret()
    row = await conn.fetchrow(db.query("upsert_provider"), name, spec, secrets, fresh)
    if row is None:
        await _raise_if_owned(conn, name)
    return fresh if row is not None and row["secret_is_new"] else None


async def delete(conn: asyncpg.Connection, name: str) -> bool:
    """Delete a provider the CLI manages; False when there is none, ProviderOwned when a resource owns it."""
    if await conn.fetchval(db.query("delete_provider"), name):
        return True
    await _raise_if_owned(conn, name)
    return False


def manager(row: Mapping[str, Any]) -> str:
    """Who manages a stored provider, for people: the CLI, a WebhookProvider, or unrecorded."""
    if row["owner_namespace"] is not None:
        return f"WebhookProvider {row['owner_namespace']}/{row['owner_name']}"
    return "cli" if row["managed_by"] == "cli" else "unrecorded (before ownership)"


async def _raise_if_owned(conn: asyncpg.Connection, name: str) -> None:
    owner = await conn.fetchrow(db.query("get_provider_owner"), name)
    if owner is not None and owner["owner_uid"] is not None:
        raise ProviderOwned(name, owner["owner_namespace"], owner["owner_name"])


async def load_all(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, Provider]:
    """Every stored provider, parsed; a row that no longer parses is logged and skipped."""
    providers = {}
    for row in await conn.fetch(db.query("list_providers")):
        try:
            providers[row["name"]] = parse_provider(row["name"], row["spec"], active_secrets(row["secrets"]),
                                                    row["destination_secret"])
        except SpecError as exc:
            log.error("stored provider is invalid; ignoring it", extra={"provider": row["name"], "error": str(exc)})
    return providers


class ProviderRegistry:
    """The providers, kept current in memory: LISTEN for changes, re-read every ``refresh`` seconds."""

    def __init__(self, pool: asyncpg.Pool, refresh: float = 30.0) -> None:
        self._pool = pool
        self._refresh = refresh
        self._providers: dict[str, Provider] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.loaded = asyncio.Event()

    def get(self, name: str) -> Provider | None:
        return self._providers.get(name)

    def all(self) -> dict[str, Provider]:
        return dict(self._providers)

    async def reload(self) -> None:
        self._providers = await load_all(self._pool)
        self.loaded.set()

    async def start(self) -> None:
        await self.reload()
        self._task = asyncio.create_task(self._run(), name="provider-registry")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _notify(self, *_: object) -> None:
        self._changed.set()

    async def _run(self) -> None:
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._pool.acquire()
                await conn.add_listener("hookline_providers", self._notify)
                # A change between the last read and LISTEN would be missed: read again.
                await self.reload()
                while True:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), self._refresh)
                    self._changed.clear()
                    await self.reload()
                    if conn.is_closed():
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("provider registry lost Postgres; retrying", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.remove_listener("hookline_providers", self._notify)
                    with contextlib.suppress(Exception):
                        await self._pool.release(conn)
