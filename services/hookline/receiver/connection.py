"""The receiver's connection handler: aiohttp's, plus a short lane for the request that matters.

Nearly every request a receiver sees is the same: one ``POST /webhooks/<provider>`` whose headers
and body arrive together, on a new connection or an idle keep-alive one, with nothing else queued. aiohttp serves it
through its general machinery: it wakes the connection's task, starts a task per request, and
builds request, response and writer objects. On this machine that is 90-110 µs of CPU per request
for an empty handler under wrk, against 32-39 µs for the same request parsed by aiohttp's own
parser and answered straight from the protocol, about a quarter of what a stored event costs.

So this handler takes such a request from aiohttp's parser straight to :meth:`Intake.receive_now`
(no task, no coroutine: the answer comes by callback once the batch has committed) and writes the
answer itself. Everything else stays on aiohttp's path, which answers as it always has:
ops routes, unknown providers, ``Expect``, bodies still arriving (with their deadline), pipelined
requests, HTTP/1.0, upgrades, malformed input, and a client that does not read its answers.

Order is kept: a connection has one request answered at a time. While a short-lane answer is
pending, whatever else arrives waits in aiohttp's queue, and aiohttp is woken for it only once the
answer is written (for a new connection, aiohttp's task begins only then). aiohttp's idle deadline
(keepalive_timeout) is pushed on as aiohttp would push it, and a graceful shutdown waits for a
pending answer before closing the connection.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDictProxy

from hookline.core import http, tracing

if TYPE_CHECKING:
    from hookline.receiver.app import Intake

log = logging.getLogger(__name__)

WEBHOOKS_PREFIX = "/webhooks/"


class ParsedRequest:
    """What :class:`Intake` reads of a request, taken from aiohttp's parser output."""

    __slots__ = ("content", "headers", "method")

    def __init__(self, message: RawRequestMessage, payload: StreamReader) -> None:
        self.method: str = message.method
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None else None  # the parser has checked it is digits


class WebhookConnection(http.GuardedHandler):
    """One client connection of the receiver (aiohttp's ``RequestHandler`` with a short lane)."""

    def __init__(self, manager: web.Server, *, intake: Intake, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._intake = intake
        # Set while the short lane owes an answer; done once it is written.
        self._short_lane: asyncio.Future[None] | None = None
        self._shutting_down = False
        # aiohttp's task for the connection is created with it but (before Python 3.12) first runs
        # an iteration later, and the request a new connection brings usually comes before that.
        self._task_not_begun = True

    def answering(self) -> bool:
        return self._short_lane is not None or super().answering()

    async def start(self) -> None:
        """aiohttp's task for this connection, begun after any answer the short lane owes already
        (a request that came with the connection): what queued behind it is answered after it."""
        self._task_not_begun = False
        while self._short_lane is not None:  # one answer may queue the next on the short lane
            await asyncio.wait([self._short_lane])
        if self._force_close:  # the connection has ended already (that answer closed it, or the client left)
            return
        await super().start()

    def data_received(self, data: bytes) -> None:
        if self._shutting_down:  # as aiohttp does once shutting down: nothing new is started
            return
        waiter = self._waiter
        parked = waiter is not None and not waiter.done()
        if not parked and not self._task_not_begun:  # aiohttp is handling a request: its queue keeps the order
            super().data_received(data)
            return
        # aiohttp's task is idle, waiting for a request (or not begun): let it parse, but look first.
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        if self._force_close or self._close:
            if parked and waiter is not None:
                waiter.cancel()  # what close() would have done to the waiter it could not see
            return
        self._take_next()

    def _take_next(self) -> None:
        """Answer the one queued request on the short lane if it qualifies, else wake aiohttp for the queue."""
        if self._short_lane is not None or not self._messages or self.transport is None:
            return
        message, payload = self._messages[0]
        if len(self._messages) == 1 and isinstance(message, RawRequestMessage) and self._qualifies(message, payload):
            self._messages.popleft()
            if self._parser is not None:
                self._parser.message_consumed()  # the parser bounds the requests queued unanswered
            self._push_idle_deadline()
            pending: asyncio.Future[None] = self._loop.create_future()
            self._short_lane = pending
            respond = functools.partial(self._respond, message, pending)
            try:
                self._intake.receive_now(ParsedRequest(message, payload),
                                         message.path[len(WEBHOOKS_PREFIX):], respond)
            except Exception:  # what aiohttp does for a handler that raises: 500, logged, connection closed
                log.exception("unexpected error receiving a webhook")
                respond(internal_error())
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _qualifies(self, message: RawRequestMessage, payload: StreamReader) -> bool:
        return (message.method == "POST" and message.version == HttpVersion11 and not message.upgrade
                and payload.is_eof() and not self.writing_paused and "Expect" not in message.headers
                and not tracing.enabled()  # a span is opened around the whole request, on aiohttp's path
                and message.path.startswith(WEBHOOKS_PREFIX)
                # a provider's exact name: no query, no percent-encoding, nothing the router would read otherwise
                and self._intake.registry.get(message.path[len(WEBHOOKS_PREFIX):]) is not None)

    def _respond(self, message: RawRequestMessage, pending: asyncio.Future[None], response: web.Response) -> None:
        """Write the short lane's answer to ``message``, then take what queued behind it."""
        if pending.done():  # answered already (respond raised after writing, and the 500 came too)
            return
        self._short_lane = None
        pending.set_result(None)
        if self.transport is None:  # the client left; what was stored stays stored
            return
        # A server closing (aiohttp's close(), then shutdown()) ends the connection after this answer.
        close = message.should_close or response.keep_alive is False or self._close or self._shutting_down
        self.transport.write(render(response, close))
        if close:
            self.force_close()
            return
        self._push_idle_deadline()
        self._take_next()

    def _push_idle_deadline(self) -> None:
        """aiohttp's keep-alive close time, moved on after a request as aiohttp moves it after its own."""
        if self._keepalive_timeout <= 0:
            return
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(self._next_keepalive_close_time, self._process_keepalive)

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        self._shutting_down = True
        if self._short_lane is not None:  # answered (with Connection: close) before aiohttp closes
            await asyncio.wait([self._short_lane], timeout=timeout)
        await super().shutdown(timeout)


def internal_error() -> web.Response:
    """What aiohttp answers a handler that raised: 500, and the connection closed."""
    response = http.error(500, "internal_error", "the event could not be received")
    response.force_close()
    return response


def render(response: web.Response, close: bool) -> bytes:
    """``response`` as HTTP/1.1 bytes: the status line, its headers, Content-Length and Date."""
    body = response.body
    assert isinstance(body, bytes)
    lines = [f"HTTP/1.1 {response.status} {response.reason}"]
    lines += [f"{name}: {value}" for name, value in response.headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    lines.append(f"Date: {http_date()}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


_date_second = 0
_date_text = ""


def http_date() -> str:
    """The Date header's value, formatted once a second."""
    global _date_second, _date_text
    now = int(time.time())
    if now != _date_second:
        _date_second, _date_text = now, formatdate(now, usegmt=True)
    return _date_text
