"""The receiver: POST /webhooks/{provider} -> verified, stored durably, then 2xx.

Per request the path is: look the provider up in memory, take a share of the
process's body budget, read the body (bounded by the provider's maxBodyBytes and
a deadline, decoded per Content-Encoding; see ``intake``), verify the signature
over those bytes, extract and validate the event id/type (``validation``), and
hand the row to the group committer. The answer is sent only after the row's
transaction has committed; if Postgres cannot take it, the answer is 503 with
Retry-After so the sender retries — never a 2xx for an event we do not hold.
Input the sender got wrong is a 4xx and costs no other sender anything.

A request that arrives whole on an idle connection reaches :meth:`Intake.receive` straight from
the connection handler (``connection``); the rest through aiohttp and the dispatcher below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg
from aiohttp import web

from hookline.core import db, http, metrics, pools, tracing
from hookline.core.batching import BatcherFull
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.host import Connections, RegistryUse, Wiring
from hookline.core.maintenance import Job
from hookline.core.providers import Provider, ProviderRegistry
from hookline.core.settings import ReceiverSettings, Settings
from hookline.core.signatures import SignatureError, signature_headers_for, verify
from hookline.receiver.connection import WEBHOOKS_PREFIX, WebhookConnection, internal_error
from hookline.receiver.group_commit import GroupCommitter, InboxRow, Stored, is_data_error
from hookline.receiver.intake import (
    BodyLimits,
    BufferBudget,
    ClientGone,
    Incoming,
    Refused,
    read_body,
    take_buffered_body,
)
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

RequestHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

# Headers never stored, whatever the scheme: credentials, hop-by-hop noise, and the framing
# of the body as it travelled (the stored body is the decoded one).
ALWAYS_DROPPED = frozenset({"authorization", "cookie", "proxy-authorization", "connection", "keep-alive",
                            "content-encoding", "content-length", "transfer-encoding"})
RETRY_AFTER_SECONDS = "5"
JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}
STORE_TIMEOUT = 10.0


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

    def __init__(self, registry: ProviderRegistry, committer: GroupCommitter, limits: ReceiverLimits) -> None:
        self.registry = registry
        self.committer = committer
        self.body_timeout = limits.body.body_timeout
        self.budget = BufferBudget(limits.body.max_buffered_bodies, limits.body.max_buffered_bytes)
        metrics.receiver_buffered_bodies.set_function(lambda: self.budget.bodies)
        metrics.receiver_buffered_bytes.set_function(lambda: self.budget.bytes)

    def dispatcher(self, app_handler: RequestHandler) -> RequestHandler:
        """The server's request handler: webhook requests straight to :meth:`receive`, the rest
        (ops routes, anything unusual) to the application's router, ``app_handler``.

        aiohttp's Application layer (router, match info, middleware handling) measured about 15 %
        of aiohttp's per-request cost for an empty handler here; the receiver's one hot route needs
        none of it. Only a path whose provider segment the router would match the same way takes
        the short cut, and a request with ``Expect`` goes to the router, whose expect handler
        answers 100-continue."""

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            path = request.path
            if path.startswith(WEBHOOKS_PREFIX) and "Expect" not in request.headers:
                name = path[len(WEBHOOKS_PREFIX):]
                if name and "/" not in name and "{" not in name and "}" not in name:
                    return await self.receive(request, name)
            return await app_handler(request)

        return dispatch

    async def routed(self, request: web.Request) -> web.Response:
        """The router's handler for /webhooks/{provider} (requests the dispatcher passed on)."""
        return await self.receive(request, request.match_info["provider"])

    async def receive(self, request: Incoming, name: str) -> web.Response:
        started = time.perf_counter()
        provider = self.registry.get(name)
        response = await self._receive(request, name, provider)
        self._count(name if provider else "unknown", response, started)
        return response

    def receive_now(self, request: Incoming, name: str, respond: Callable[[web.Response], None]) -> None:
        """:meth:`receive` without a task of its own, for a request whose body came whole with its
        headers (the short lane, ``connection``): everything up to the group commit runs now, and
        ``respond`` gets the answer at once when it is a refusal, else once the batch has committed.
        A task per request, with its chain of coroutines, was 8 % of the instructions from parsed
        request to rendered answer (callgrind)."""
        started = time.perf_counter()
        provider = self.registry.get(name)
        label = name if provider else "unknown"

        def answer(response: web.Response) -> None:
            self._count(label, response, started)
            respond(response)

        wrong_target = self._wrong_target(request, name, provider)
        if wrong_target is not None:
            return answer(wrong_target)
        assert provider is not None
        try:
            lease = self.budget.open()
        except Refused as exc:
            return answer(self._refused(exc))
        future: asyncio.Future[Stored] | None = None
        try:
            row = self._admit(request, provider, take_buffered_body(request, provider.max_body_bytes, lease), None)
            if isinstance(row, InboxRow):
                future = self.committer.submit(row)
        except Refused as exc:
            row = self._refused(exc)
        except BatcherFull:
            row = self._full(name)
        finally:
            if future is None:
                lease.close()
        if future is None:
            assert isinstance(row, web.Response)
            return answer(row)

        def stored(future: asyncio.Future[Stored]) -> None:
            lease.close()
            try:
                response = self._stored_answer(provider, future.exception() or future.result())
            except Exception:  # as aiohttp answers a handler that raises: 500, logged, connection closed
                log.exception("unexpected error receiving a webhook")
                response = internal_error()
            answer(response)

        future.add_done_callback(stored)
        return None

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
    def _admit(request: Incoming, provider: Provider, raw: bytes, traceparent: str | None) -> InboxRow | web.Response:
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
        self.intake = Intake(registry, self.committer, self.limits)
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
        # Content codings are decoded by the receiver itself, bounded per provider (see intake).
        self._runner = await http.serve(self.app, self.host, self.port, self.limits.connections,
                                        functools.partial(WebhookConnection, intake=self.intake),
                                        reuse_port=self.reuse_port, auto_decompress=False)
        server = self._runner.server
        assert server is not None
        # Connections accepted before this line use the router alone, which answers the same.
        server.request_handler = self.intake.dispatcher(server.request_handler)
        tune_gc_for_serving()
        log.info("receiver listening", extra={"url": f"http://{self.host}:{self.port}"})

    async def stop(self) -> None:
        # First no new connections, idle ones closed, and every request in progress answered (which
        # needs the committer), then the committer. aiohttp's runner.shutdown() only runs hooks.
        if self._runner:
            await self._runner.cleanup()
        await self.committer.stop()
