"""Outbox endpoints: where the relay delivers, and with which secret.

Secrets are stored like provider secrets (``[{"value", "notAfter"}]``, each value
sealed: core/secrets_at_rest.py; every secret still valid signs, so a rotation
sends both signatures) and are only ever opened to sign: ``repr``, listings and
errors show a fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import asyncpg

from hookline import outbox
from hookline.core import secrets_at_rest as sealing
from hookline.core.providers import active_secrets
from hookline.core.queue import RetryPolicy
from hookline.core.signatures import get_scheme, sign_standard_webhooks
from hookline.relay import egress as egress_mod
from hookline.relay.breaker import Circuit
from hookline.relay.egress import ClientTls, EgressConfig, EgressError, OAuth2ClientCredentials, ProxyConfig

__all__ = ["ClientTls", "EgressConfig", "EgressError", "OAuth2ClientCredentials", "ProxyConfig"]  # set_egress's

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
EVENT_TYPE = re.compile(r"^(\*|[A-Za-z0-9_.:/-]+(\.\*)?)$")


class EndpointError(ValueError):
    """An endpoint definition that cannot be stored; the message says why."""


@dataclass(frozen=True)
class RateLimit:
    """At most ``burst`` deliveries at once and ``per_second`` on average (None: no rate), and at most
    ``max_in_flight`` unanswered (None: no such limit), over all relays together (migration 0031)."""

    per_second: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if (self.per_second is None) != (self.burst is None):
            raise EndpointError("give the rate and its burst together (--rate-per-second with --rate-burst)")
        if self.per_second is not None and not 0 < self.per_second <= 100_000:
            raise EndpointError(f"the rate must be greater than 0 and at most 100000 per second, "
                                f"not {self.per_second:g}")
        for label, value in (("the burst", self.burst), ("max in flight", self.max_in_flight)):
            if value is not None and not 1 <= value <= 100_000:
                raise EndpointError(f"{label} must be a whole number from 1 to 100000, not {value}")
        if self.per_second is None and self.max_in_flight is None:
            raise EndpointError("a rate limit needs a rate (with its burst) or a max in flight")

    def __str__(self) -> str:
        parts = [f"{self.per_second:g}/s burst {self.burst}"] if self.per_second is not None else []
        if self.max_in_flight is not None:
            parts.append(f"{self.max_in_flight} in flight")
        return ", ".join(parts)


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    event_types: tuple[str, ...]
    ordered: bool
    secrets: tuple[str, ...] = field(repr=False)
    retry: RetryPolicy
    timeout: float
    enabled: bool
    circuit: Circuit
    # Retention of its delivered events (hours) and dead letters (days); None: the install's
    # default (chart retention.endpoints; applied by the partition manager, core/partitions.py).
    done_hours: float | None = None
    dead_days: float | None = None
    # A WebhookEndpoint's namespace (its name is then 'namespace/name'); None: install-wide.
    namespace: str | None = None
    # The user's pause (spec.paused, `hookline endpoints pause`): its deliveries wait unclaimed.
    paused: bool = False
    rate_limit: RateLimit | None = None
    # Its own proxy, client TLS and OAuth2 (relay/egress.py), secrets opened; None: the install's egress.
    egress: EgressConfig | None = None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Endpoint:
        return cls(
            name=row["name"], url=row["url"], event_types=tuple(row["event_types"]), ordered=row["ordered"],
            secrets=opened_secrets(row["name"], row["secrets"]),
            retry=RetryPolicy(row["max_attempts"], row["initial_delay_seconds"], row["max_delay_seconds"]),
            timeout=row["timeout_seconds"], enabled=row["enabled"], circuit=Circuit.from_row(row),
            done_hours=row["retention_done_hours"], dead_days=row["retention_dead_days"],
            namespace=row["namespace"], paused=row["paused"],
            rate_limit=None if row["rate_per_second"] is None and row["max_in_flight"] is None else RateLimit(
                row["rate_per_second"], row["rate_burst"], row["max_in_flight"]),
            egress=egress_mod.load(row["name"], row["egress"]),
        )

    @property
    def claimable(self) -> bool:
        """Its deliveries may be claimed: not disabled by a 410, not paused by the user."""
        return self.enabled and not self.paused


def _json(value: object) -> list[dict[str, object]]:
    # The pool's connections decode jsonb; a bare asyncpg connection returns text.
    return json.loads(value) if isinstance(value, str) else value  # type: ignore[return-value]


def opened_secrets(name: str, stored: object) -> tuple[str, ...]:
    """The endpoint's stored ``secrets`` column (jsonb, or its text), opened: the ones still valid."""
    entries = json.loads(stored) if isinstance(stored, str) else _json(stored)
    return tuple(active_secrets(sealing.open_entries(sealing.configured_ring(), entries,
                                                     sealing.endpoint_secrets_context(name))))


def fingerprint(secret: str) -> str:
    """A short, non-reversible name for a secret, safe to print."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


# Upper limits of an endpoint's retention, as for providers (core/provider_spec.py): ten years.
MAX_DONE_HOURS, MAX_DEAD_DAYS = 87600.0, 3650.0


def validate_retention(done_hours: float | None, dead_days: float | None) -> None:
    """None keeps the install's default; otherwise a positive number up to ten years."""
    for flag, value, limit in (("--done-hours", done_hours, MAX_DONE_HOURS),
                               ("--dead-days", dead_days, MAX_DEAD_DAYS)):
        if value is not None and not 0 < value <= limit:
            raise EndpointError(f"{flag} must be greater than 0 and at most {limit:g}, not {value:g}")


def validate(name: str, url: str, event_types: Sequence[str], secret: str | None) -> None:
    if not NAME.match(name):
        raise EndpointError(f"invalid endpoint name {name!r}: use lower-case letters, digits, '.', '_' and '-'")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError("the URL must be an absolute http:// or https:// URL")
    if parts.username or parts.password:
        raise EndpointError("the URL must not carry credentials (the signature authenticates the relay)")
    for event_type in event_types:
        if not EVENT_TYPE.match(event_type):
            raise EndpointError(f"invalid event type {event_type!r}: use an exact type, 'prefix.*' or '*'")
    if secret is not None:
        try:  # signing once is the check: it decodes the key exactly as the relay will
            sign_standard_webhooks([secret], "msg_check", 0, b"")
        except ValueError:
            raise EndpointError("the secret must be a Standard Webhooks secret: whsec_ + base64") from None


async def add(conn: asyncpg.Connection, name: str, url: str, *, event_types: Sequence[str] = (),
              ordered: bool = False, secret: str | None = None, max_attempts: int = 12,
              initial_delay: float = 5.0, max_delay: float = 3600.0, timeout_seconds: float = 10.0,
              done_hours: float | None = None, dead_days: float | None = None) -> str:
    """Create an endpoint; return its secret (generated unless given)."""
    validate(name, url, event_types, secret)
    validate_retention(done_hours, dead_days)
    ring = sealing.required_ring("storing an endpoint's signing secret")
    secret = secret or get_scheme("standard-webhooks").generate_secret()

    stored = await conn.fetchval(
        outbox.query("insert_endpoint"), name, url, list(event_types) or ["*"], ordered,
        json.dumps([{"value": ring.seal(secret, sealing.endpoint_secrets_context(name)), "notAfter": None}]),
        max_attempts, initial_delay, max_delay, timeout_seconds,
        done_hours, dead_days,
    )
    if stored is None:
        raise EndpointError(f"an endpoint named {name!r} exists already (delete it first)")
    return secret


async def update(conn: asyncpg.Connection, name: str, *, url: str | None = None,
                 event_types: Sequence[str] | None = None, ordered: bool | None = None,
                 max_attempts: int | None = None, initial_delay: float | None = None, max_delay: float | None = None,
                 timeout_seconds: float | None = None) -> bool:
    """Change an endpoint in place (None keeps a value), validated as ``add`` validates; its
    deliveries, secrets and circuit stay. False when there is no such endpoint."""
    validate(name, url or "https://placeholder.invalid/", event_types or (), None)
    if event_types is not None and not event_types:
        raise EndpointError("give at least one --event-type ('*' for all)")
    async with conn.transaction():
        sane = await conn.fetchval(outbox.query("update_endpoint"), name, url,
                                   list(event_types) if event_types is not None else None, ordered, max_attempts,
                                   initial_delay, max_delay, timeout_seconds)
        if sane is False:
            raise EndpointError("the first retry delay would exceed the longest: give --retry-max-delay "
                                "at least --retry-initial-delay (nothing was changed)")
    return sane is not None


async def load(conn: asyncpg.Connection | asyncpg.Pool) -> list[Endpoint]:
    """Every endpoint; one whose secrets do not open (its key is not in the key file) is logged, without
    them, and left out: its deliveries wait rather than fail. A bad key file is a SecretKeyError."""
    loaded = []
    for row in await conn.fetch(outbox.query("list_endpoints")):
        try:
            loaded.append(Endpoint.from_row(row))
        except (sealing.SealedValueError, EgressError) as exc:
            log.error("endpoint's secrets do not open; ignoring it", extra={"endpoint": row["name"], "error": str(exc)})
    return loaded


async def set_retention(conn: asyncpg.Connection, name: str, done_hours: float | None,
                        dead_days: float | None) -> bool:
    """Set an endpoint's retention (None: the install's default); False when there is no such endpoint."""
    validate_retention(done_hours, dead_days)
    return await conn.fetchval(outbox.query("set_endpoint_retention"), name, done_hours, dead_days) is not None


async def managed_by(conn: asyncpg.Connection, name: str) -> str | None:
    """The WebhookEndpoint an endpoint is (``namespace/name``), None for an install-wide one: the
    operator owns such a row and would undo a change made behind the resource's back."""
    namespace: str | None = await conn.fetchval(outbox.query("endpoint_namespace"), name)
    return name if namespace else None


async def set_rate_limit(conn: asyncpg.Connection, name: str, limit: RateLimit | None) -> bool:
    """Limit an endpoint (None: no limit; its bucket starts full); False when there is no such endpoint."""
    values = (None, None, None) if limit is None else (limit.per_second, limit.burst, limit.max_in_flight)
    return await conn.fetchval(outbox.query("set_rate_limit"), name, *values) is not None


async def set_egress(conn: asyncpg.Connection, name: str, egress: EgressConfig | None) -> bool:
    """Give an endpoint its own egress (None: the install's again); False when there is no such
    endpoint. Checked as the relay will use it first (an SSL context is made): on an error
    (EgressError, SecretKeyError) nothing is stored. An unchanged configuration changes nothing."""
    if egress is not None and egress.tls is not None:
        egress.tls.ssl_context()
    async with conn.transaction():
        row = await conn.fetchrow(outbox.query("endpoint_egress_for_update"), name)
        if row is None:
            return False
        stored = json.loads(row["egress"]) if row["egress"] else None
        ring = sealing.configured_ring()
        value = None if egress is None else egress_mod.seal(name, egress, ring, stored)
        if value != stored:  # else not even a statement: its trigger would make every relay re-read
            await conn.execute(outbox.query("set_endpoint_egress"), name, None if value is None else json.dumps(value))
    return True


async def set_paused(conn: asyncpg.Connection, name: str, paused: bool) -> bool:
    """Pause or resume an endpoint; False when there is no such endpoint."""
    return await conn.fetchval(outbox.query("set_endpoint_paused"), name, paused) is not None


async def delete(conn: asyncpg.Connection, name: str) -> bool:
    return await conn.fetchval(outbox.query("delete_endpoint"), name) is not None


async def enable(conn: asyncpg.Connection, name: str) -> int | None:
    """Re-enable an endpoint; return how many parked deliveries were requeued (None: no such endpoint)."""
    row = await conn.fetchrow(outbox.query("enable_endpoint"), name)
    return int(row["unparked"]) if row and row["found"] else None


async def rotate_secret(conn: asyncpg.Connection, name: str, overlap: timedelta, secret: str | None = None
                        ) -> str | None:
    """Start signing with a new secret (returned; None: no such endpoint); the old ones keep
    signing for ``overlap``, so each delivery carries both signatures meanwhile."""
    if secret is not None:
        validate(name, "https://placeholder.invalid/", (), secret)
    ring = sealing.required_ring("storing an endpoint's signing secret")
    secret = secret or get_scheme("standard-webhooks").generate_secret()
    until = datetime.now(UTC) + overlap
    found = await conn.fetchval(outbox.query("rotate_endpoint_secret"), name,
                                ring.seal(secret, sealing.endpoint_secrets_context(name)), until)
    return secret if found else None
