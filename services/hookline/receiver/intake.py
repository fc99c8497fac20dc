"""POST /webhooks/{provider}: the receiver's one request path.

Per request: look the provider up in memory, take a share of the process's body budget, read the
body (bounded by the provider's maxBodyBytes and a deadline, decoded per Content-Encoding; see
``body``), verify the signature over those bytes, extract and validate the event id/type
(``validation``), and hand the row to the group committer, inside a span when tracing is on. The
answer is sent only after the row's transaction has committed; if Postgres cannot take it, the
answer is 503 with Retry-After so the sender retries — never a 2xx for an event we do not hold.
Input the sender got wrong is a 4xx and costs no other sender anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Mapping

from aiohttp import web

from hookline.core import db, http, metrics, tracing
from hookline.core.aiohttp_adapter import WholeRequest
from hookline.core.batching import BatcherFull
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.signatures import SignatureError, signature_headers_for, verify
from hookline.receiver.body import BodyLimits, BufferBudget, ClientGone, Incoming, Refused, read_body
from hookline.receiver.group_commit import GroupCommitter, InboxRow, Stored, is_data_error
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
JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}
STORE_TIMEOUT = 10.0
WEBHOOKS_PREFIX = "/webhooks/"


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


class Intake:
    """POST /webhooks/{provider}: one receiver process's request path and what it holds."""

    def __init__(self, registry: ProviderRegistry, committer: GroupCommitter, limits: BodyLimits) -> None:
        self.registry = registry
        self.committer = committer
        self.body_timeout = limits.body_timeout
        self.budget = BufferBudget(limits.max_buffered_bodies, limits.max_buffered_bytes)
        metrics.receiver_buffered_bodies.set_function(lambda: self.budget.bodies)
        metrics.receiver_buffered_bytes.set_function(lambda: self.budget.bytes)

    async def routed(self, request: web.Request) -> web.Response:
        """The router's handler for /webhooks/{provider}."""
        return await self.receive(request, request.match_info["provider"])

    def short_lane(self, request: WholeRequest) -> Awaitable[web.Response] | None:
        """:meth:`receive` for a request to a provider's exact path whose body came whole with its
        headers (``aiohttp_adapter``); None for anything else, which the router answers."""
        if not request.path.startswith(WEBHOOKS_PREFIX):
            return None
        # a provider's exact name: no query, no percent-encoding, nothing the router would read otherwise
        name = request.path[len(WEBHOOKS_PREFIX):]
        return self.receive(request, name) if self.registry.get(name) is not None else None

    async def receive(self, request: Incoming, name: str) -> web.Response:
        """Every webhook request, whatever lane it came by: counted by provider and outcome."""
        started = time.perf_counter()
        provider = self.registry.get(name)
        response = await self._receive(request, name, provider)
        self._count(name if provider else "unknown", response, started)
        return response

    @staticmethod
    def _count(label: str, response: web.Response, started: float) -> None:
        metrics.child(metrics.inbox_received, label, response.get(http.OUTCOME, str(response.status))).inc()
        metrics.child(metrics.receiver_latency, label).observe(time.perf_counter() - started)

    @staticmethod
    def _wrong_target(request: Incoming, name: str, provider: Provider | None) -> web.Response | None:
        if request.method != "POST":
            return http.error(405, "method_not_allowed", "use POST", Allow="POST")
        if provider is None:
            return http.error(404, "unknown_provider", f"no provider named {name!r}")
        return None

    @staticmethod
    def _refused(refusal: Refused) -> web.Response:
        response = http.error(refusal.status, refusal.code, refusal.message,
                              **({"Retry-After": RETRY_AFTER_SECONDS} if refusal.retry_after else {}))
        if refusal.status in (400, 408):
            response.force_close()  # the rest of the stream cannot be trusted to frame a next request
        return response

    @staticmethod
    def _full(name: str) -> web.Response:
        log.warning("group-commit queue full; refusing", extra={"provider": name})
        return unavailable("too many events waiting to be stored; retry later")

    async def _receive(self, request: Incoming, name: str, provider: Provider | None) -> web.Response:
        wrong_target = self._wrong_target(request, name, provider)
        if wrong_target is not None:
            return wrong_target
        assert provider is not None
        try:
            with self.budget.open() as lease:
                raw = await read_body(request, provider.max_body_bytes, lease, self.body_timeout)
                return await self._verify_and_store(request, provider, raw)
        except Refused as refusal:
            return self._refused(refusal)
        except ClientGone:
            log.info("client closed the connection before sending its whole body", extra={"provider": name})
            response = http.error(400, "client_gone", "the connection closed before the body was complete")
            response.force_close()
            return response

    async def _verify_and_store(self, request: Incoming, provider: Provider, raw: bytes) -> web.Response:
        if not tracing.enabled():  # the common case: no span to open per request
            return await self._store_verified(request, provider, raw, None)
        with tracing.span("hookline.receive", request.headers.get("traceparent"), tracing.SERVER,
                          {"hookline.provider": provider.name}) as traceparent:
            return await self._store_verified(request, provider, raw, traceparent)

    async def _store_verified(self, request: Incoming, provider: Provider, raw: bytes,
                              traceparent: str | None) -> web.Response:
        row = self._admit(request, provider, raw, traceparent)
        if not isinstance(row, InboxRow):
            return row
        try:
            stored = await self.committer.store(row)
        except BatcherFull:
            return self._full(provider.name)
        except Exception as exc:  # _stored_answer answers what it knows and raises the rest
            return self._stored_answer(provider, exc)
        return self._stored_answer(provider, stored)

    @staticmethod
    def _admit(request: Incoming, provider: Provider, raw: bytes,
               traceparent: str | None) -> InboxRow | web.Response:
        """The row to store for a verified, well-formed event; else the answer that refuses it."""
        try:
            verify(provider.signature, request.headers, raw, time.time())
        except SignatureError as exc:
            return http.error(401, exc.code, exc.message)
        try:
            row = build_row(provider, request.headers, raw, request.headers.get("Content-Type"))
        except BadEvent as exc:
            return http.error(400, exc.code, exc.message)
        if traceparent is not None:  # the worker continues the receiver's span, as a proxy forwards it
            row = dataclasses.replace(row, headers={**{k: v for k, v in row.headers.items()
                                                       if k.lower() != "traceparent"},
                                                    "traceparent": traceparent})
        return row

    @staticmethod
    def _stored_answer(provider: Provider, outcome: Stored | BaseException) -> web.Response:
        """The answer for a row's group commit: stored (new or duplicate), or why not; an
        exception it does not expect is raised."""
        if isinstance(outcome, Stored):
            return stored_answer("accepted" if outcome.is_new else "duplicate", outcome.event_id)
        if isinstance(outcome, (*db.DATABASE_ERRORS, UnicodeError)):
            return _not_stored(provider, outcome)
        raise outcome


def stored_answer(status: str, event_id: str) -> web.Response:
    """``{"status": ..., "event_id": ...}``, as json_response writes it, without encoding a dict
    per request (the hot path: one per event); ``response[http.OUTCOME]`` is the status."""
    response = web.Response(body=f'{{"status": "{status}", "event_id": {json.dumps(event_id)}}}'.encode(),
                            headers=JSON_HEADERS)
    response[http.OUTCOME] = status
    return response


def _not_stored(provider: Provider, exc: BaseException) -> web.Response:
    """400 when Postgres refused this event's data (its batch-mates were stored: see group_commit),
    503 + Retry-After when Postgres could not be reached or was too slow."""
    if is_data_error(exc):
        log.warning("Postgres refused an event", extra={"provider": provider.name, "error": type(exc).__name__})
        return http.error(400, "invalid_event", f"the event cannot be stored ({type(exc).__name__})")
    log.warning("could not store event", extra={"provider": provider.name, "error": type(exc).__name__})
    return unavailable("the event could not be stored; retry later")


