"""The receiver: POST /webhooks/{provider} -> verified, stored durably, then 2xx.

Per request the path is: look the provider up in memory, read the body (bounded
by the provider's maxBodyBytes before it is buffered), verify the signature over
the raw bytes, extract the event id/type, and hand the row to the group
committer. The answer is sent only after the row's transaction has committed;
if Postgres cannot take it, the answer is 503 with Retry-After so the sender
retries — never a 2xx for an event we do not hold.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import asyncpg
from aiohttp import web

from hookline.core import http, metrics
from hookline.core.jsonpointer import resolve
from hookline.core.providers import FieldRule, Provider, ProviderRegistry
from hookline.core.signatures import SignatureError, signature_headers_for, verify
from hookline.receiver.group_commit import GroupCommitter, InboxRow

log = logging.getLogger(__name__)

# Headers never stored, whatever the scheme: credentials and hop-by-hop noise.
ALWAYS_DROPPED = frozenset({"authorization", "cookie", "proxy-authorization", "connection", "keep-alive"})
RETRY_AFTER_SECONDS = "5"
STORE_TIMEOUT = 10.0

REGISTRY_KEY: web.AppKey[ProviderRegistry] = web.AppKey("registry", ProviderRegistry)
COMMITTER_KEY: web.AppKey[GroupCommitter] = web.AppKey("committer", GroupCommitter)


class BadEvent(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed ``limit`` bytes."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class _Body:
    """The body parsed as JSON at most once, and only if a rule needs it."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._parsed: Any = None
        self._done = False

    def json(self) -> Any:
        if not self._done:
            try:
                self._parsed = json.loads(self.raw)
            except (ValueError, UnicodeDecodeError):
                raise BadEvent("invalid_json", "the body is not valid JSON") from None
            self._done = True
        return self._parsed


def extract(rule: FieldRule, headers: Mapping[str, str], body: _Body) -> str | None:
    value = headers.get(rule.path) if rule.source == "header" else resolve(body.json(), rule.path)
    if value is None or isinstance(value, (dict, list, bool)):
        return None
    text = str(value)
    return text or None


def stored_headers(headers: Mapping[str, str], provider: Provider) -> dict[str, str]:
    dropped = ALWAYS_DROPPED | signature_headers_for(provider.signature)
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def build_row(provider: Provider, headers: Mapping[str, str], raw: bytes, content_type: str | None) -> InboxRow:
    body = _Body(raw)
    event_id = extract(provider.event_id, headers, body)
    if event_id is None:
        raise BadEvent("missing_event_id", f"no event id at {provider.event_id.describe()}")
    event_type = extract(provider.event_type, headers, body) if provider.event_type else None
    entity_key = extract(provider.ordering.entity_key, headers, body) if provider.ordering else None
    return InboxRow(
        provider=provider.name,
        event_id=event_id,
        event_type=event_type,
        entity_key=entity_key,
        headers=stored_headers(headers, provider),
        body=raw,
        content_type=content_type,
    )


async def receive(request: web.Request) -> web.Response:
    started = time.perf_counter()
    name = request.match_info["provider"]
    provider = request.app[REGISTRY_KEY].get(name)
    label = name if provider else "unknown"
    response = await _receive(request, name, provider)
    metrics.inbox_received.labels(label, response.get("outcome", str(response.status))).inc()
    metrics.receiver_latency.labels(label).observe(time.perf_counter() - started)
    return response


async def _receive(request: web.Request, name: str, provider: Provider | None) -> web.Response:
    if request.method != "POST":
        return http.error(405, "method_not_allowed", "use POST", Allow="POST")
    if provider is None:
        return http.error(404, "unknown_provider", f"no provider named {name!r}")
    raw = await read_bounded(request, provider.max_body_bytes)
    if raw is None:
        return http.error(413, "payload_too_large", f"the body exceeds {provider.max_body_bytes} bytes")
    try:
        verify(provider.signature, request.headers, raw, time.time())
    except SignatureError as exc:
        return http.error(401, exc.code, exc.message)
    try:
        row = build_row(provider, request.headers, raw, request.headers.get("Content-Type"))
    except BadEvent as exc:
        return http.error(400, exc.code, exc.message)
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            is_new = await request.app[COMMITTER_KEY].store(row)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        log.warning("could not store event", extra={"provider": name, "error": type(exc).__name__})
        return http.error(503, "unavailable", "the event could not be stored; retry later",
                          **{"Retry-After": RETRY_AFTER_SECONDS})
    status = "accepted" if is_new else "duplicate"
    response = web.json_response({"status": status, "event_id": row.event_id})
    response["outcome"] = status
    return response


def create_app(pool: asyncpg.Pool, registry: ProviderRegistry, committer: GroupCommitter) -> web.Application:
    # Bodies are read from the stream with each provider's own limit, not aiohttp's global one.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[REGISTRY_KEY] = registry
    app[COMMITTER_KEY] = committer
    app.router.add_route("*", "/webhooks/{provider}", receive)
    http.add_ops_routes(app, pool)
    return app


class Receiver:
    """The receiver service: pool, provider registry, group committer and HTTP server."""

    def __init__(self, pool: asyncpg.Pool, registry: ProviderRegistry, host: str, port: int,
                 **committer_options: Any) -> None:
        self.pool = pool
        self.registry = registry
        self.committer = GroupCommitter(pool, **committer_options)
        self.app = create_app(pool, registry, self.committer)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.committer.start()
        self._runner = await http.serve(self.app, self.host, self.port)
        log.info("receiver listening", extra={"url": f"http://{self.host}:{self.port}"})

    async def stop(self) -> None:
        if self._runner:
            await self._runner.shutdown()
        await self.committer.stop()
        if self._runner:
            await self._runner.cleanup()
