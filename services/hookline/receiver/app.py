"""The receiver: POST /webhooks/{provider} -> verified, stored durably, then 2xx.

Per request the path is: look the provider up in memory, take a share of the
process's body budget, read the body (bounded by the provider's maxBodyBytes and
a deadline, decoded per Content-Encoding; see ``intake``), verify the signature
over those bytes, extract and validate the event id/type (``validation``), and
hand the row to the group committer. The answer is sent only after the row's
transaction has committed; if Postgres cannot take it, the answer is 503 with
Retry-After so the sender retries — never a 2xx for an event we do not hold.
Input the sender got wrong is a 4xx and costs no other sender anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web

from hookline.core import http, metrics, tracing
from hookline.core.batching import BatcherFull
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.signatures import SignatureError, signature_headers_for, verify
from hookline.receiver.group_commit import GroupCommitter, InboxRow, is_data_error
from hookline.receiver.intake import BodyLimits, BufferBudget, ClientGone, Refused, read_body
from hookline.receiver.validation import (
    BadEvent,
    JsonBody,
    check_event_id,
    check_field,
    escape_text,
    extract,
    storable_headers,
)

log = logging.getLogger(__name__)

# Headers never stored, whatever the scheme: credentials, hop-by-hop noise, and the framing
# of the body as it travelled (the stored body is the decoded one).
ALWAYS_DROPPED = frozenset({"authorization", "cookie", "proxy-authorization", "connection", "keep-alive",
                            "content-encoding", "content-length", "transfer-encoding"})
RETRY_AFTER_SECONDS = "5"
STORE_TIMEOUT = 10.0


@dataclass(frozen=True)
class ReceiverLimits:
    """Everything that bounds what one receiver process holds at once."""

    connections: http.ConnectionLimits = field(default_factory=http.ConnectionLimits)
    body: BodyLimits = field(default_factory=BodyLimits)
    # Events waiting for a group-commit slot; beyond it requests get 503 at once.
    max_queued_events: int = 4096


REGISTRY_KEY: web.AppKey[ProviderRegistry] = web.AppKey("registry", ProviderRegistry)
COMMITTER_KEY: web.AppKey[GroupCommitter] = web.AppKey("committer", GroupCommitter)
BUDGET_KEY: web.AppKey[BufferBudget] = web.AppKey("budget", BufferBudget)
BODY_LIMITS_KEY: web.AppKey[BodyLimits] = web.AppKey("body_limits", BodyLimits)


def stored_headers(headers: Mapping[str, str], provider: Provider) -> dict[str, str]:
    return storable_headers(headers, ALWAYS_DROPPED | signature_headers_for(provider.signature))


def build_row(provider: Provider, headers: Mapping[str, str], raw: bytes, content_type: str | None) -> InboxRow:
    body = JsonBody(raw)
    event_id = extract(provider.event_id, headers, body)
    if event_id is None:
        raise BadEvent("missing_event_id", f"no event id at {provider.event_id.describe()}")
    check_event_id(event_id)
    event_type = extract(provider.event_type, headers, body) if provider.event_type else None
    entity_key = extract(provider.ordering.entity_key, headers, body) if provider.ordering else None
    window = provider.replay_window_seconds
    return InboxRow(
        provider=provider.name,
        event_id=event_id,
        event_type=check_field(event_type, "event type") if event_type is not None else None,
        entity_key=check_field(entity_key, "entity key") if entity_key is not None else None,
        headers=stored_headers(headers, provider),
        body=raw,
        content_type=escape_text(content_type) if content_type is not None else None,
        body_sha256=hashlib.sha256(raw).digest() if window else None,
        replay_window_seconds=window,
    )


def unavailable(message: str) -> web.Response:
    return http.error(503, "unavailable", message, **{"Retry-After": RETRY_AFTER_SECONDS})


async def receive(request: web.Request) -> web.Response:
    started = time.perf_counter()
    name = request.match_info["provider"]
    provider = request.app[REGISTRY_KEY].get(name)
    label = name if provider else "unknown"
    response = await _receive(request, name, provider)
    metrics.child(metrics.inbox_received, label, response.get("outcome", str(response.status))).inc()
    metrics.child(metrics.receiver_latency, label).observe(time.perf_counter() - started)
    return response


async def _receive(request: web.Request, name: str, provider: Provider | None) -> web.Response:
    if request.method != "POST":
        return http.error(405, "method_not_allowed", "use POST", Allow="POST")
    if provider is None:
        return http.error(404, "unknown_provider", f"no provider named {name!r}")
    try:
        with request.app[BUDGET_KEY].open() as lease:
            raw = await read_body(request, provider.max_body_bytes, lease, request.app[BODY_LIMITS_KEY].body_timeout)
            return await _verify_and_store(request, provider, raw)
    except Refused as refusal:
        response = http.error(refusal.status, refusal.code, refusal.message,
                              **({"Retry-After": RETRY_AFTER_SECONDS} if refusal.retry_after else {}))
        if refusal.status in (400, 408):
            response.force_close()  # the rest of the stream cannot be trusted to frame a next request
        return response
    except ClientGone:
        log.info("client closed the connection before sending its whole body", extra={"provider": name})
        response = http.error(400, "client_gone", "the connection closed before the body was complete")
        response.force_close()
        return response


async def _verify_and_store(request: web.Request, provider: Provider, raw: bytes) -> web.Response:
    if not tracing.enabled():  # the common case: no span to open per request
        return await _store_verified(request, provider, raw, None)
    with tracing.span("hookline.receive", request.headers.get("traceparent"), tracing.SERVER,
                      {"hookline.provider": provider.name}) as traceparent:
        return await _store_verified(request, provider, raw, traceparent)


async def _store_verified(request: web.Request, provider: Provider, raw: bytes,
                          traceparent: str | None) -> web.Response:
    try:
        verify(provider.signature, request.headers, raw, time.time())
    except SignatureError as exc:
        return http.error(401, exc.code, exc.message)
    try:
        row = build_row(provider, request.headers, raw, request.headers.get("Content-Type"))
    except BadEvent as exc:
        return http.error(400, exc.code, exc.message)
    if traceparent is not None:  # the worker continues the receiver's span, as a proxy forwards it
        row = dataclasses.replace(row, headers={**{k: v for k, v in row.headers.items() if k.lower() != "traceparent"},
                                                "traceparent": traceparent})
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            stored = await request.app[COMMITTER_KEY].store(row)
    except BatcherFull:
        log.warning("group-commit queue full; refusing", extra={"provider": provider.name})
        return unavailable("too many events waiting to be stored; retry later")
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, UnicodeError) as exc:
        return _not_stored(provider, exc)
    status = "accepted" if stored.is_new else "duplicate"
    response = stored_answer(status, stored.event_id)
    response["outcome"] = status
    return response


def stored_answer(status: str, event_id: str) -> web.Response:
    """``{"status": ..., "event_id": ...}``, as json_response writes it, without encoding a dict
    per request (the hot path: one per event)."""
    return web.Response(text=f'{{"status": "{status}", "event_id": {json.dumps(event_id)}}}',
                        content_type="application/json")


def _not_stored(provider: Provider, exc: Exception) -> web.Response:
    """400 when Postgres refused this event's data (its batch-mates were stored: see group_commit),
    503 + Retry-After when Postgres could not be reached or was too slow."""
    if is_data_error(exc):
        log.warning("Postgres refused an event", extra={"provider": provider.name, "error": type(exc).__name__})
        return http.error(400, "invalid_event", f"the event cannot be stored ({type(exc).__name__})")
    log.warning("could not store event", extra={"provider": provider.name, "error": type(exc).__name__})
    return unavailable("the event could not be stored; retry later")


def create_app(pool: asyncpg.Pool, registry: ProviderRegistry, committer: GroupCommitter,
               limits: ReceiverLimits | None = None) -> web.Application:
    limits = limits or ReceiverLimits()
    # Bodies are read from the stream with each provider's own limit, not aiohttp's global one.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[REGISTRY_KEY] = registry
    app[COMMITTER_KEY] = committer
    budget = BufferBudget(limits.body.max_buffered_bodies, limits.body.max_buffered_bytes)
    metrics.receiver_buffered_bodies.set_function(lambda: budget.bodies)
    metrics.receiver_buffered_bytes.set_function(lambda: budget.bytes)
    app[BUDGET_KEY] = budget
    app[BODY_LIMITS_KEY] = limits.body
    app.router.add_route("*", "/webhooks/{provider}", receive)
    http.add_ops_routes(app, pool)
    return app


class Receiver:
    """The receiver service: pool, provider registry, group committer and HTTP server."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, host: str, port: int,
                 limits: ReceiverLimits | None = None, **committer_options: Any) -> None:
        self.pool = pool
        self.registry = registry
        self.limits = limits or ReceiverLimits()
        self.committer = GroupCommitter(pool, max_queued=self.limits.max_queued_events, **committer_options)
        self.app = create_app(pool, registry, self.committer, self.limits)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.committer.start()
        # Content codings are decoded by the receiver itself, bounded per provider (see intake).
        self._runner = await http.serve(self.app, self.host, self.port, self.limits.connections,
                                        auto_decompress=False)
        log.info("receiver listening", extra={"url": f"http://{self.host}:{self.port}"})

    async def stop(self) -> None:
        if self._runner:
            await self._runner.shutdown()
        await self.committer.stop()
        if self._runner:
            await self._runner.cleanup()
