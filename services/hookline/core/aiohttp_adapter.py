"""The one module that uses aiohttp's internals, for one hook worth its speed: the short lane.

Nearly every request a receiver sees is one ``POST`` whose headers and body arrive together on a
new or idle keep-alive connection. aiohttp serves it through its general machinery (a request,
a writer, the router and middleware, a response prepared and written); the short lane takes it
from aiohttp's parser (``RequestHandler._messages``) and writes the answer itself. What answers it
is the caller's (``short_lane``: the receiver's one request path, run as a task); everything else
(ops routes, ``Expect``, bodies still arriving, pipelining, HTTP/1.0, upgrades, malformed input, a
client that does not read its answers) stays on aiohttp's public path. bench-receiver, 2026-12-02:
without it the receiver did about half the events per second.

Order is kept: a connection has one request answered at a time. While a short-lane answer is
pending, whatever else arrives waits in aiohttp's queue, and aiohttp is woken for it only once the
answer is written. aiohttp's idle deadline is pushed on as aiohttp pushes it, and a graceful
shutdown waits for a pending answer before closing the connection.

:func:`protocol_factory` checks at start-up that every internal the lane uses exists in the aiohttp
installed; if one is missing it logs one warning and serves on the public path (``web.Server``,
aiohttp's documented protocol factory) alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.http_parser import HttpRequestParser
from aiohttp.streams import StreamReader
from multidict import CIMultiDictProxy

log = logging.getLogger(__name__)

# What the short lane reads or calls of aiohttp beyond its public API (aiohttp 3.14).
HANDLER_INTERNALS = ("_waiter", "_messages", "_parser", "_force_close", "_close", "_loop", "_keepalive_timeout",
                     "_next_keepalive_close_time", "_keepalive_handle", "_process_keepalive")
SERVER_INTERNALS = ("_kwargs", "_loop")
PARSER_INTERNALS = ("message_consumed",)


class WholeRequest:
    """A request whose body came whole with its headers, as aiohttp's parser left it."""

    __slots__ = ("content", "headers", "method", "path")

    def __init__(self, message: RawRequestMessage, payload: StreamReader) -> None:
        self.method: str = message.method
        self.path: str = message.path
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None else None  # the parser has checked it is digits


# The answer for a request the lane takes, or None: aiohttp's path answers it.
ShortLane = Callable[[WholeRequest], Awaitable[web.Response] | None]


class RequestTracker(Protocol):
    """A connection's header deadline (core/http.py): told when a request is being answered."""

    def request_began(self) -> None: ...

    def request_ended(self) -> None: ...


def missing_internals(server: web.Server) -> list[str]:
    """The internals the short lane needs that this aiohttp does not have."""
    return ([f"RequestHandler.{n}" for n in HANDLER_INTERNALS if not hasattr(web.RequestHandler, n)]
            + [f"Server.{n}" for n in SERVER_INTERNALS if not hasattr(server, n)]
            + [f"HttpRequestParser.{n}" for n in PARSER_INTERNALS if not hasattr(HttpRequestParser, n)])


def protocol_factory(server: web.Server, short_lane: ShortLane | None,
                     trackers: Mapping[Any, RequestTracker]) -> Callable[[], asyncio.Protocol]:
    """What makes each connection's protocol: aiohttp's own, or one with the short lane."""
    if short_lane is None:
        return server
    missing = missing_internals(server)
    if missing:
        log.warning("aiohttp %s lacks %s: the short lane is off, every request takes aiohttp's public path",
                    aiohttp.__version__, ", ".join(missing))
        return server
    log.info("short lane on", extra={"aiohttp": aiohttp.__version__})
    options: dict[str, Any] = server._kwargs
    return functools.partial(ShortLaneConnection, server, short_lane=short_lane, trackers=trackers,
                             loop=server._loop, **options)


class ShortLaneConnection(web.RequestHandler):
    """aiohttp's connection handler with a short lane for requests that arrive whole."""

    def __init__(self, manager: web.Server, *, short_lane: ShortLane, trackers: Mapping[Any, RequestTracker],
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._lane = short_lane
        self._trackers = trackers
        # Set while the short lane owes an answer; done once it is written.
        self._pending: asyncio.Future[None] | None = None
        self._shutting_down = False
        # aiohttp's task for the connection is created with it but (before Python 3.12) first runs
        # an iteration later, and the request a new connection brings usually comes before that.
        self._task_not_begun = True

    async def start(self) -> None:
        """aiohttp's task for this connection, begun after any answer the short lane owes already."""
        self._task_not_begun = False
        while self._pending is not None:  # one answer may queue the next on the short lane
            await asyncio.wait([self._pending])
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
        """Answer the one queued request on the short lane if it takes it, else wake aiohttp for the queue."""
        if self._pending is not None or not self._messages or self.transport is None:
            return
        message, payload = self._messages[0]
        answer = None
        if len(self._messages) == 1 and isinstance(message, RawRequestMessage) and self._whole(message, payload):
            answer = self._lane(WholeRequest(message, payload))
        if answer is None or not isinstance(message, RawRequestMessage):
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
            return
        self._messages.popleft()
        if self._parser is not None:
            self._parser.message_consumed()  # the parser bounds the requests queued unanswered
        self._push_idle_deadline()
        pending: asyncio.Future[None] = self._loop.create_future()
        self._pending = pending
        tracker = self._trackers.get(self.transport)
        if tracker is not None:
            tracker.request_began()
        task = asyncio.ensure_future(answer)
        task.add_done_callback(functools.partial(self._answered, message, pending, tracker))

    def _whole(self, message: RawRequestMessage, payload: StreamReader) -> bool:
        return (message.method == "POST" and message.version == HttpVersion11 and not message.upgrade
                and payload.is_eof() and not self.writing_paused and "Expect" not in message.headers)

    def _answered(self, message: RawRequestMessage, pending: asyncio.Future[None], tracker: RequestTracker | None,
                  task: asyncio.Future[web.Response]) -> None:
        if tracker is not None:
            tracker.request_ended()
        if task.cancelled() or task.exception() is not None:  # as aiohttp answers a handler that raised
            log.error("unexpected error answering a request", exc_info=None if task.cancelled() else task.exception())
            response = web.json_response({"error": "internal_error", "message": "the request could not be answered"},
                                         status=500)
            response.force_close()
        else:
            response = task.result()
        self._respond(message, pending, response)

    def _respond(self, message: RawRequestMessage, pending: asyncio.Future[None], response: web.Response) -> None:
        """Write the short lane's answer to ``message``, then take what queued behind it."""
        self._pending = None
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
        if self._pending is not None:  # answered (with Connection: close) before aiohttp closes
            await asyncio.wait([self._pending], timeout=timeout)
        await super().shutdown(timeout)


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
