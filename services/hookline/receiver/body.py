"""Reading a request body from a stranger: bounded in size, time and process memory.

Every way a body can go wrong ends in an answer, never in a 500 or a traceback:

* larger than the provider's ``maxBodyBytes`` (as sent, and again once decoded) -> 413;
* not complete within the body deadline (a client that stalls or trickles) -> 408;
* broken framing (bad chunked encoding, a Content-Length the body does not match when the
  client closes early) or a ``Content-Encoding`` we cannot decode -> 400 ``invalid_body``;
* the process already buffers its share of bodies or bytes -> 503 + Retry-After at once;
* the client went away mid-body -> one info line; there is nobody left to answer.

Content-Encoding: every scheme's sender signs the payload itself, before any transport
compression, so ``gzip`` and ``deflate`` bodies are decoded here (bounded, which is what
CVE-2025-69223 was about) and the signature is checked over, and the event stored as, the
decoded bytes. Any other coding is refused rather than stored undecodable.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from dataclasses import dataclass
from typing import Protocol

from aiohttp import StreamReader
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDictProxy

log = logging.getLogger(__name__)

# zlib window bits: 16 + MAX_WBITS reads the gzip wrapper, MAX_WBITS the zlib ("deflate") one.
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPTED_ENCODINGS = "gzip, deflate, identity"


class Incoming(Protocol):
    """What the receiver reads of a request: aiohttp's ``web.Request``, or the parser's output on
    the short lane (``aiohttp_adapter.WholeRequest``)."""

    @property
    def method(self) -> str: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def content(self) -> StreamReader: ...


class Refused(Exception):
    """The body could not be taken; the request is answered with ``status``/``code``."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class ClientGone(Exception):
    """The client closed the connection before its body was complete."""


@dataclass(frozen=True)
class BodyLimits:
    """Per-process limits on reading bodies (``hookline receiver --help`` documents them)."""

    body_timeout: float = 30.0
    max_buffered_bodies: int = 1024
    max_buffered_bytes: int = 256 * 1024 * 1024


class BufferBudget:
    """How many bodies, and bytes of them, this process holds at once (read or waiting to be stored)."""

    def __init__(self, max_bodies: int, max_bytes: int) -> None:
        self.max_bodies = max_bodies
        self.max_bytes = max_bytes
        self.bodies = 0
        self.bytes = 0

    def open(self) -> BodyLease:
        if self.bodies >= self.max_bodies:
            raise Refused(503, "unavailable", "too many requests in progress; retry later", retry_after=True)
        self.bodies += 1
        return BodyLease(self)


class BodyLease:
    """One request's share of the budget; ``close`` returns it (always, via ``with``)."""

    def __init__(self, budget: BufferBudget) -> None:
        self._budget = budget
        self._bytes = 0
        self._open = True

    def grow(self, n: int) -> None:
        if self._budget.bytes + n > self._budget.max_bytes:
            raise Refused(503, "unavailable", "too many bytes buffered; retry later", retry_after=True)
        self._budget.bytes += n
        self._bytes += n

    def close(self) -> None:
        if self._open:
            self._open = False
            self._budget.bodies -= 1
            self._budget.bytes -= self._bytes

    def __enter__(self) -> BodyLease:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _malformed(exc: HttpProcessingError) -> Refused:
    """Bad chunk framing, or a Content-Length the body did not match when the client closed."""
    return Refused(400, "invalid_body", f"malformed body: {exc.message or type(exc).__name__}")


def _too_large(limit: int) -> Refused:
    return Refused(413, "payload_too_large", f"the body exceeds {limit} bytes")


async def read_body(request: Incoming, limit: int, lease: BodyLease, timeout: float) -> bytes:
    """The decoded body; raises :class:`Refused` or :class:`ClientGone`."""
    if request.content.is_eof():  # it all came with the headers (most webhooks): take it as it is
        return take_buffered_body(request, limit, lease)
    reserved = _reserve(request, limit, lease)
    try:
        async with asyncio.timeout(timeout):
            raw = b"".join(await _read_chunks(request, limit, lease, reserved))
    except TimeoutError:
        raise Refused(408, "request_timeout", f"the body was not complete within {timeout:g} s") from None
    except HttpProcessingError as exc:
        raise _malformed(exc) from None
    except (ConnectionError, asyncio.IncompleteReadError):
        raise ClientGone() from None
    return decode(raw, request.headers.get("Content-Encoding"), limit, lease)


def take_buffered_body(request: Incoming, limit: int, lease: BodyLease) -> bytes:
    """The decoded body of a request whose body is complete in aiohttp's buffer already (no read
    loop); raises :class:`Refused`."""
    reserved = _reserve(request, limit, lease)
    try:
        raw = request.content.read_nowait()
    except HttpProcessingError as exc:
        raise _malformed(exc) from None
    if len(raw) > limit:
        raise _too_large(limit)
    if len(raw) > reserved:
        lease.grow(len(raw) - reserved)
    return decode(raw, request.headers.get("Content-Encoding"), limit, lease)


def _reserve(request: Incoming, limit: int, lease: BodyLease) -> int:
    """Bytes taken from the budget up front for a declared Content-Length: a lying client cannot exceed it."""
    if request.content_length is None:
        return 0
    if request.content_length > limit:
        raise _too_large(limit)
    lease.grow(request.content_length)
    return request.content_length


async def _read_chunks(request: Incoming, limit: int, lease: BodyLease, reserved: int) -> list[bytes]:
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        if size > reserved:
            lease.grow(size - reserved)
            reserved = size
        chunks.append(chunk)
    return chunks


def decode(raw: bytes, content_encoding: str | None, limit: int, lease: BodyLease) -> bytes:
    """``raw`` with its content codings undone (last applied first), at most ``limit`` bytes."""
    if content_encoding is None:  # nearly every webhook
        return raw
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if len(codings) > 2:
        raise Refused(400, "invalid_body", "more than two content codings")
    body = raw
    for coding in reversed(codings):
        wbits = _DECODERS.get(coding)
        if wbits is None:
            raise Refused(400, "invalid_body", f"Content-Encoding {coding!r} is not supported; "
                          f"use one of: {ACCEPTED_ENCODINGS}")
        body = _inflate(body, wbits, coding, limit)
        lease.grow(len(body))
    return body


def _inflate(data: bytes, wbits: int, coding: str, limit: int) -> bytes:
    decoder = zlib.decompressobj(wbits)
    try:
        # One byte over the limit is enough to know it is too large: never inflate a bomb.
        out = decoder.decompress(data, limit + 1)
    except zlib.error:
        raise Refused(400, "invalid_body", f"the body is not valid {coding} data") from None
    if len(out) > limit:
        raise _too_large(limit)
    if not decoder.eof or decoder.unused_data or decoder.unconsumed_tail:
        raise Refused(400, "invalid_body", f"the body is not one complete {coding} stream")
    return out
