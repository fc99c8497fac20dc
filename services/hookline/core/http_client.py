"""The one client for outgoing webhooks: the relay's deliveries and the worker's destination calls,
one POST each, on kept-alive connections. Answers are read by llhttp (``httptools``).

Why not aiohttp's client: it was the largest part of the relay's CPU per delivery (a request
object, header multidicts, a connector with waiters, a timer and a send task per request, a
stream reader per response). A webhook POST needs much less: one write of prebuilt bytes, a
status, Retry-After and a bounded body.

Careful means: a connect timeout and a total timeout (the total one checked every
``TIMEOUT_CHECK_SECONDS`` by one timer per client, not a timer per request), no redirects (a 3xx
is an answer, not an instruction to send a signed payload elsewhere), at most
``max_response_bytes`` of the answer's body read (a longer answer closes its connection instead of
being drained) and at most ``MAX_HEAD_BYTES`` of its headers, and without
``allow_private_networks`` no connection to an internal address: every address is checked after
resolution, right before it is dialled (``delivery.is_internal``), and the connection is made to
that checked address, so DNS cannot slip past the check. Connections are kept per origin (scheme,
host, port) while their server keeps them open and for at most ``IDLE_SECONDS`` idle; TLS verifies
the server's certificate and name with ``ssl_context``.

With an egress proxy (``EgressProxy``, for deliveries that must leave from the proxy's static
addresses), a target not in its ``no_proxy`` is resolved and checked exactly as without one (the
guard applies to the final target), then reached through a tunnel: ``CONNECT <checked address>:<port>``
to the proxy, so the proxy cannot resolve the name to another address, then TLS over the tunnel with
the target's name (its certificate and SNI). The proxy's own address is not checked: it is the
operator's own infrastructure. A tunnel is a connection: kept per origin like any other.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import re
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlsplit

import httptools

from hookline.core.delivery import (
    MAX_RESPONSE_BYTES,
    BlockedAddress,
    DeliveryErrorKind,
    DeliveryResult,
    is_internal,
    parse_retry_after,
)

IDLE_SECONDS = 15.0  # an idle connection older than this is closed rather than reused (servers drop them)
TIMEOUT_CHECK_SECONDS = 0.1  # how late past its timeout a request may fail
MAX_HEAD_BYTES = 65536  # status line and headers of an answer; more is not an HTTP answer we accept
_AddrInfo = TypeVar("_AddrInfo", bound=tuple[Any, ...])  # one getaddrinfo entry


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x as we read it."""


class ProxyError(Exception):
    """The egress proxy did not open the tunnel (its status, or why it could not be asked)."""


@dataclass(frozen=True)
class EgressProxy:
    """An HTTP CONNECT proxy deliveries go through, and the hosts that go direct (``no_proxy``:
    names, ``.suffix`` domains, IP addresses, CIDRs, or ``*``). A value, not a global: a client is
    given one, and a per-endpoint proxy can be another value later."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # the Proxy-Authorization value; never logged
    no_proxy: tuple[str, ...] = ()

    @classmethod
    def parse(cls, url: str, *, credentials: str | None = None, no_proxy: str = "") -> EgressProxy:
        """ValueError (naming no secret) when ``url`` is not ``http://host:port`` or ``credentials``
        is not ``user:password``."""
        parts = urlsplit(url.strip())
        if parts.scheme.lower() != "http" or not parts.hostname:
            raise ValueError("the egress proxy must be an http:// URL of host:port")
        if parts.username is not None or parts.password is not None:
            raise ValueError("the egress proxy URL must not hold credentials: "
                             "put user:password in the credentials file")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("the egress proxy URL is host:port only, without a path")
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError("the egress proxy URL's port is not a port number") from None
        authorization = None
        if credentials is not None:
            if ":" not in credentials or "\n" in credentials or "\r" in credentials or not credentials.split(":")[0]:
                raise ValueError("the egress proxy credentials must be one line user:password")
            authorization = "Basic " + base64.b64encode(credentials.encode("utf-8")).decode("ascii")
        entries = tuple(entry.strip().lower() for entry in no_proxy.split(",") if entry.strip())
        for entry in entries:
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"the egress no-proxy entry {entry!r} is not a CIDR") from None
        return cls(parts.hostname, port, authorization, entries)

    def bypasses(self, host: str) -> bool:
        """Whether ``host`` (a URL's host: a name or an address) goes direct."""
        host = host.lower().rstrip(".")
        try:
            address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
        except ValueError:
            address = None
        for entry in self.no_proxy:
            if entry == "*":
                return True
            if "/" in entry:
                if address is not None and address in ipaddress.ip_network(entry, strict=False):
                    return True
            elif entry.startswith("."):
                if host.endswith(entry) or host == entry[1:]:
                    return True
            elif host == entry or (address is None and host.endswith("." + entry)):
                return True  # as the common no_proxy convention: a name covers its subdomains
        return False


@dataclass(frozen=True)
class Target:
    """What a URL means for a request: where to connect and what to put on the request line."""

    origin: tuple[str, str, int]  # scheme, host, port: connections are pooled per origin
    head: bytes  # "POST /path HTTP/1.1\r\nHost: ...\r\n"

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default_port = 443 if scheme == "https" else 80
        port = parts.port or default_port
        # As aiohttp (yarl) sends them: non-ASCII and spaces percent-encoded, escapes kept, IDNA hosts.
        path = quote(parts.path or "/", safe=_PATH_SAFE) + (f"?{quote(parts.query, safe=_PATH_SAFE)}"
                                                            if parts.query else "")
        host = parts.hostname.encode("idna").decode("ascii") if not parts.hostname.isascii() else parts.hostname
        host_header = f"[{host}]" if ":" in host else host
        if port != default_port:
            host_header += f":{port}"
        _check_value("Host", host_header)
        _check_value("path", path)
        return cls((scheme, host, port), f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1"))


_PATH_SAFE = "/%:@!$&'()*+,;=-._~?"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field names
_valid_names: set[str] = set()  # names checked once (a relay sends the same few)


def _check_name(name: str) -> None:
    if name not in _valid_names:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"invalid character in HTTP header name {name[:40]!r}")
        if len(_valid_names) < 1000:
            _valid_names.add(name)


def _check_value(name: str, value: str) -> None:
    if "\n" in value or "\r" in value or "\0" in value:  # would end the header and start another
        raise ValueError(f"invalid character in HTTP header {name!r}")


def encode_request(target: Target, headers: dict[str, str], body: bytes) -> bytes:
    """The whole request as one buffer (one write, one syscall)."""
    lines = []
    for name, value in headers.items():
        if name not in _valid_names:
            _check_name(name)
        if "\n" in value or "\r" in value or "\0" in value:
            _check_value(name, value)  # raises
        lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    return b"".join((target.head, "".join(lines).encode("latin-1"), body))


@dataclass
class Answer:
    status: int
    retry_after: str | None  # the Retry-After header as sent (the last one, if repeated)
    body: bytes  # at most the request's bound
    reusable: bool  # the connection may carry another request


class _Connection(asyncio.Protocol):
    """One connection; one request at a time. Bytes arrive in ``data_received`` and go to llhttp
    (``httptools``), whose callbacks (``on_*`` below) collect the answer and wake the waiting request
    once the answer is complete, its body has passed the bound, or the connection ends."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._limit = MAX_RESPONSE_BYTES
        self._reset()

    def _reset(self) -> None:
        """Forget the last answer: a new request, or a real answer after an interim one."""
        self._head_bytes = 0  # bytes received while the answer's headers were incomplete
        self._begun = False  # the answer's first byte has arrived
        self._headers_complete = False
        self._framed = False  # Content-Length or chunked: the body does not end with the connection
        self._retry_after: str | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None:
            return
        if self._headers_complete and not self._framed:  # a body without a length ends with the connection
            self._answer(reusable=False)
        elif self._headers_complete:
            self._settle(ProtocolError("the connection closed before the answer's body was complete"))
        elif self._begun:
            self._settle(ProtocolError("the connection closed in the middle of the answer's headers"))
        else:
            self._settle(exc or ConnectionResetError("the server closed the connection without an answer"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost decides what was read

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: what follows on this stream can't be trusted
            self.close()
            return
        if not self._begun and not b"HTTP/".startswith(data[:5]):  # llhttp also reads RTSP/ and ICE/ answers
            self._settle(ProtocolError(f"not an HTTP/1.x answer: {bytes(data[:20])!r}"))
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
            self._settle(ProtocolError(f"not an HTTP/1.x answer: {error}"))
            self.close()  # the parser is spent with it
            return
        if not self._headers_complete and self._waiter is not None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._settle(ProtocolError(f"the answer's headers are over {MAX_HEAD_BYTES} bytes"))
                self.close()

    def send(self, request: bytes, limit: int) -> asyncio.Future[Answer]:
        """Send ``request``; the future of its answer (a method, not a coroutine: one layer less per request)."""
        assert self.transport is not None
        self._reset()
        self._limit = limit
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(request)
        return waiter

    # llhttp's callbacks, made from inside feed_data.

    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer behind the first: the server is out of step with us
            self.close()
            return
        head_bytes = self._head_bytes
        self._reset()
        self._head_bytes, self._begun = head_bytes, True

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_complete = True
        if self._parser.get_http_version() not in ("1.1", "1.0"):  # llhttp also reads 0.9 and 2.0 lines
            self._settle(ProtocolError(f"not an HTTP/1.x answer: version {self._parser.get_http_version()}"))
            self.close()

    def on_body(self, body: bytes) -> None:
        if self._waiter is None:
            return
        self._body.append(body)
        self._body_bytes += len(body)
        if self._body_bytes > self._limit:  # enough read; the rest is not waited for, so the connection is spent
            self._answer(reusable=False)

    def on_message_complete(self) -> None:
        if self._waiter is None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue): the real one follows
            self._reset()
            return
        self._answer(reusable=self._parser.should_keep_alive() and status != 101)

    def _answer(self, *, reusable: bool) -> None:
        body = b"".join(self._body)[:self._limit] if self._body else b""
        self._settle(Answer(self._parser.get_status_code(), self._retry_after, body, reusable))

    def _settle(self, outcome: Answer | BaseException) -> None:
        """End the waiting request with its answer or its error (once; later outcomes are dropped)."""
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if isinstance(outcome, Answer):
            waiter.set_result(outcome)
        else:
            waiter.set_exception(outcome)

    def expire(self) -> None:
        """The waiting request's time is up."""
        self._settle(TimeoutError())

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _ProxyHandshake(asyncio.Protocol):
    """The proxy's answer to CONNECT: its head (up to the blank line) in ``answer``, and any bytes after it."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.extra = b""
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            self.extra += data
            return
        self._buffer += data
        head, found, rest = self._buffer.partition(b"\r\n\r\n")
        if found:
            self.answer.set_result(head)
            self.extra = rest
        elif len(self._buffer) > MAX_HEAD_BYTES:
            self.answer.set_exception(ProxyError("its answer to CONNECT has headers too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(ProxyError("it closed the connection without answering CONNECT"))


def _public_only(host: str, infos: list[_AddrInfo]) -> list[_AddrInfo]:
    """The resolved addresses outgoing webhooks may reach; BlockedAddress when there is none."""
    public = [info for info in infos if not is_internal(str(info[4][0]))]
    if public:
        return public
    literal = bool(infos) and str(infos[0][4][0]) == host  # the URL named the address itself
    what = f"{host} is an internal address" if literal else f"{host} resolves to an internal address"
    raise BlockedAddress(f"{what}; outgoing webhooks may only reach public addresses "
                         "(allow private networks to change this)")


class WebhookClient:
    """Kept-alive connections per origin, at most ``connections`` of them kept idle per origin. The
    caller bounds how many requests run at once (the relay: its concurrency); each has its own connection."""

    def __init__(self, *, allow_private_networks: bool, connections: int = 100,
                 ssl_context: ssl.SSLContext | None = None, proxy: EgressProxy | None = None) -> None:
        self.allow_private_networks = allow_private_networks
        self.proxy = proxy
        self._ssl = ssl_context  # the default one is made at the first https connection: it costs ~50 ms of CPU
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._max_idle = connections
        self._targets: dict[str, Target] = {}  # parsed URLs (an install has few endpoints)
        self.connections_opened = 0  # for tests: keep-alive reuse is observable
        # Connections waiting for an answer, with their deadlines (the loop's clock), and the timer that
        # fails the late ones: it runs while any request waits.
        self._waiting: dict[_Connection, float] = {}
        self._checker: asyncio.TimerHandle | None = None
        self._checker_loop: asyncio.AbstractEventLoop | None = None

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            self._checker = None
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, timeout: float,
                   connect_timeout: float | None = None,
                   max_response_bytes: int = MAX_RESPONSE_BYTES) -> DeliveryResult:
        started = time.perf_counter()
        try:
            answer = await self._exchange(url, body, headers, timeout, connect_timeout or min(timeout, 5.0),
                                          max_response_bytes)
            return DeliveryResult(answer.status, answer.body.decode("utf-8", "replace") if answer.body else "",
                                  time.perf_counter() - started,
                                  retry_after=parse_retry_after(answer.retry_after) if answer.retry_after else None)
        except TimeoutError:
            error, kind = f"timed out after {timeout:g} s", DeliveryErrorKind.TIMEOUT
        except BlockedAddress as exc:
            error, kind = str(exc), DeliveryErrorKind.BLOCKED
        except ProxyError as exc:
            error, kind = f"egress proxy: {exc}", DeliveryErrorKind.PROXY
        except ssl.SSLError as exc:  # an OSError: caught first. Certificate not trusted, client certificate refused
            error, kind = f"TLS: {exc}", DeliveryErrorKind.TLS
        except ValueError as exc:  # a URL or header we refuse to send: nothing was sent
            error, kind = f"{type(exc).__name__}: {exc}", DeliveryErrorKind.CONNECTION
        except (OSError, ProtocolError) as exc:
            error, kind = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}", DeliveryErrorKind.CONNECTION
        return DeliveryResult(status=None, body="", latency=time.perf_counter() - started, error=error,
                              error_kind=kind)

    async def _exchange(self, url: str, body: bytes, headers: dict[str, str], timeout: float,
                        connect_timeout: float, limit: int) -> Answer:
        target = self._targets.get(url) or self._parse_target(url)
        request = encode_request(target, headers, body)
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + timeout  # the whole request: connecting included
        connection = self._idle_connection(target.origin, now)
        if connection is None:
            try:
                async with asyncio.timeout_at(min(deadline, now + connect_timeout)):
                    connection = await self._connect(target.origin)
            except TimeoutError:
                if self.proxy is None or self.proxy.bypasses(target.origin[1]):
                    raise
                raise ProxyError(f"no tunnel through {self.proxy.host}:{self.proxy.port} within "
                                 f"{min(timeout, connect_timeout):g} s") from None
        self._waiting[connection] = deadline
        if self._checker is None or self._checker_loop is not loop:
            self._checker, self._checker_loop = loop.call_later(TIMEOUT_CHECK_SECONDS, self._expire_late), loop
        try:
            answer = await connection.send(request, limit)
        except BaseException:
            connection.close()  # mid-request (timeout, cancel, error): its state is unknown
            raise
        finally:
            del self._waiting[connection]
        idle = self._idle.get(target.origin)
        if idle is None:
            idle = self._idle[target.origin] = deque()
        if answer.reusable and not connection.closed and len(idle) < self._max_idle:
            connection.idle_since = loop.time()
            idle.append(connection)
        else:
            connection.close()
        return answer

    def _expire_late(self) -> None:
        """Fail the requests past their deadline; again in ``TIMEOUT_CHECK_SECONDS`` while any request waits."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in [c for c, deadline in self._waiting.items() if deadline <= now]:
            connection.expire()
        self._checker = loop.call_later(TIMEOUT_CHECK_SECONDS, self._expire_late) if self._waiting else None

    def _parse_target(self, url: str) -> Target:
        target = Target.parse(url)
        if len(self._targets) < 10_000:
            self._targets[url] = target
        return target

    def _idle_connection(self, origin: tuple[str, str, int], now: float) -> _Connection | None:
        """The most recently used idle connection to ``origin`` (the least likely to have been dropped)."""
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not self.allow_private_networks:
            infos = _public_only(host, infos)
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        proxy = self.proxy if self.proxy is not None and not self.proxy.bypasses(host) else None
        if proxy is not None:
            return await self._tunnel(proxy, scheme, host, port, infos)
        last_error: OSError | None = None
        for family, type_, proto, _, address in infos:
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _, connection = await loop.create_connection(
                    _Connection, sock=sock, ssl=self._ssl if scheme == "https" else None,
                    server_hostname=host if scheme == "https" else None)
            except ssl.SSLError:  # the handshake failed: another address of the name would fail it too
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                last_error = exc
                continue
            except BaseException:
                sock.close()
                raise
            self.connections_opened += 1
            return connection
        reason = f"{type(last_error).__name__}: {last_error}" if last_error else "no address"
        raise ConnectionError(f"Cannot connect to host {host}:{port} ({reason})") from last_error

    async def _tunnel(self, proxy: EgressProxy, scheme: str, host: str, port: int,
                      infos: list[Any]) -> _Connection:
        """A connection to the first checked address of ``infos`` through ``proxy``'s CONNECT tunnel."""
        loop = asyncio.get_running_loop()
        address = str(infos[0][4][0])
        authority = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if proxy.authorization is not None:
            head += f"Proxy-Authorization: {proxy.authorization}\r\n"
        try:
            transport, handshake = await loop.create_connection(_ProxyHandshake, proxy.host, proxy.port)
        except OSError as exc:
            raise ProxyError(f"cannot connect to {proxy.host}:{proxy.port} "
                             f"({type(exc).__name__}: {exc.strerror or exc})") from None
        try:
            transport.write((head + "\r\n").encode("latin-1"))
            answer = await handshake.answer
            status_line = answer.split(b"\r\n", 1)[0].decode("latin-1", "replace")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ProxyError(f"not an HTTP/1.x answer to CONNECT: {status_line[:40]!r}")
            if not 200 <= int(parts[1]) < 300:
                raise ProxyError(f"{proxy.host}:{proxy.port} refused the tunnel to {host}:{port}: "
                                 f"{status_line[len(parts[0]) + 1:][:80]}")
            if handshake.extra:  # the target spoke before our request: what follows can't be trusted
                raise ProxyError("bytes followed its answer to CONNECT before our request")
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection()
            transport.set_protocol(connection)
            if scheme == "https":
                assert self._ssl is not None
                tls = await loop.start_tls(transport, connection, self._ssl, server_hostname=host)
                assert tls is not None
                transport = tls
            connection.connection_made(transport)
        except BaseException:
            transport.close()
            raise
        self.connections_opened += 1
        return connection
