"""The relay's HTTP/1.1 client (core/http_client.py) against real servers on localhost.

aiohttp's server for ordinary answers (kept-alive, chunked, TLS with a self-signed certificate),
raw asyncio servers for the answers aiohttp would not give: a hang, a close after the answer,
a body without a length, an interim 100 Continue, bytes that are not HTTP.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from hookline.core.delivery import MAX_RESPONSE_BYTES, DeliveryErrorKind
from hookline.core.embedded import free_port
from hookline.core.http_client import WebhookClient
from support.waiting import eventually

HEADERS = {"content-type": "application/json", "webhook-id": "msg_1"}
RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """An aiohttp app on localhost that records what it received, and from which client port."""

    def __init__(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.received: list[tuple[bytes, dict[str, str]]] = []
        self.peers: list[int] = []
        self._handler, self._ssl = handler, ssl_context
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.received.append((await request.read(), dict(request.headers)))
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[1])
        return await self._handler(request)

    async def __aenter__(self) -> Server:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[WebhookClient]:
    client = WebhookClient(allow_private_networks=True)
    yield client
    await client.close()


def answer(status: int = 200, text: str = "ok", **headers: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(status=status, text=text if status != 204 else None, headers=headers)
    return handle


async def raw_server(handle: RawHandler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/hook"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = int(lengths[0])
    return head + await reader.readexactly(length)


async def test_a_post_arrives_with_its_headers_and_body_and_the_answer_comes_back(client: WebhookClient) -> None:
    async with Server(answer(202, "accepted", **{"Retry-After": "7"})) as server:
        result = await client.post(f"http://127.0.0.1:{server.port}/hook?x=1", b'{"a":1}', HEADERS, timeout=5)
    assert result.status == 202 and result.body == "accepted" and result.retry_after == 7.0 and result.ok
    body, headers = server.received[0]
    assert body == b'{"a":1}' and headers["webhook-id"] == "msg_1" and headers["Host"] == f"127.0.0.1:{server.port}"


async def test_a_url_with_spaces_and_non_ascii_is_sent_percent_encoded(client: WebhookClient) -> None:
    request_lines: list[bytes] = []

    async def record_request_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            request_lines.append((await read_request(reader)).split(b"\r\n")[0])
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()

    server, url = await raw_server(record_request_line)
    async with server:
        result = await client.post(url.replace("/hook", "/h%C3%B6ok/café x?q=a b"), b"{}", HEADERS, timeout=5)
    assert result.status == 204
    assert request_lines == [b"POST /h%C3%B6ok/caf%C3%A9%20x?q=a%20b HTTP/1.1"]


async def test_connections_are_kept_alive_and_reused(client: WebhookClient) -> None:
    async with Server(answer(204)) as server:
        for _ in range(5):
            result = await client.post(f"http://127.0.0.1:{server.port}/hook", b"{}", HEADERS, timeout=5)
            assert result.status == 204 and result.body == ""
    assert client.connections_opened == 1 and len(set(server.peers)) == 1 and len(server.peers) == 5


async def test_a_chunked_answer_is_read_whole(client: WebhookClient) -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"first ", b"second ", b"third"):
            await response.write(part)
            await asyncio.sleep(0.01)  # separate segments on the wire
        await response.write_eof()
        return response

    async with Server(chunked) as server:
        first = await client.post(f"http://127.0.0.1:{server.port}/hook", b"{}", HEADERS, timeout=5)
        second = await client.post(f"http://127.0.0.1:{server.port}/hook", b"{}", HEADERS, timeout=5)
    assert first.body == second.body == "first second third"
    assert client.connections_opened == 1  # the final chunk ended the answer; the connection stayed usable


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_oversized_answer_is_cut_at_the_bound_and_its_connection_dropped(client: WebhookClient,
                                                                                 chunked: bool) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500)
        if chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = 1_000_000
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"x" * 10_000)
        return response

    async with Server(huge) as server:
        url = f"http://127.0.0.1:{server.port}/hook"
        result = await client.post(url, b"{}", HEADERS, timeout=5)
        assert result.status == 500 and result.body == "x" * MAX_RESPONSE_BYTES
        again = await client.post(url, b"{}", HEADERS, timeout=5)
    assert again.status == 500 and client.connections_opened == 2  # the unread rest was never drained


async def test_a_server_that_closes_after_answering_gets_a_new_connection_next_time(client: WebhookClient) -> None:
    async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, url = await raw_server(answer_and_close)
    async with server:
        assert (await client.post(url, b"{}", HEADERS, timeout=5)).body == "ok"
        # The close arrives after the answer: the idle connection learns it and is not reused.
        await eventually(lambda: all(c.closed for idle in client._idle.values() for c in idle))
        assert (await client.post(url, b"{}", HEADERS, timeout=5)).body == "ok"
    assert client.connections_opened == 2


async def test_connection_close_and_a_body_without_a_length(client: WebhookClient) -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy, ")
        await writer.drain()
        writer.write(b"come back later")
        writer.close()

    server, url = await raw_server(until_close)
    async with server:
        result = await client.post(url, b"{}", HEADERS, timeout=5)
    assert result.status == 503 and result.body == "busy, come back later"
    assert not client._idle.get(("http", "127.0.0.1", int(url.split(":")[2].split("/")[0])))


async def test_an_interim_100_continue_is_skipped(client: WebhookClient) -> None:
    async def continue_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
        await writer.drain()

    server, url = await raw_server(continue_first)
    async with server:
        result = await client.post(url, b"{}", HEADERS, timeout=5)
    assert result.status == 201 and result.body == "done"


async def test_a_hanging_server_times_out_and_its_connection_is_not_reused(client: WebhookClient) -> None:
    requests = 0

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await read_request(reader)
        requests += 1
        await reader.read()  # never answers; returns when the client gives up and closes

    server, url = await raw_server(hang)
    async with server:
        result = await client.post(url, b"{}", HEADERS, timeout=0.3)
        assert result.status is None and result.error_kind is DeliveryErrorKind.TIMEOUT
        assert result.error == "timed out after 0.3 s"
        await client.post(url, b"{}", HEADERS, timeout=0.3)
    assert requests == 2 and client.connections_opened == 2


async def test_an_answer_that_is_not_http_is_a_connection_error(client: WebhookClient) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()

    server, url = await raw_server(garbage)
    async with server:
        result = await client.post(url, b"{}", HEADERS, timeout=5)
    assert result.status is None and result.error_kind is DeliveryErrorKind.CONNECTION
    assert result.error is not None and "not an HTTP/1.x answer" in result.error


def answering(raw: bytes, *, then_close: bool) -> RawHandler:
    """A server that reads the request, writes ``raw`` and then closes, or waits for the client to."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        if not then_close:
            await reader.read()  # returns when the client gives up and closes
        writer.close()
    return handle


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
MALFORMED = {  # each answer, whether the server closes after it, and the error the client must name
    "garbage status line": (b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", False, "not an HTTP/1.x answer"),
    "not HTTP at all": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" * 10, False, "not an HTTP/1.x answer"),
    "another protocol's status line": (b"RTSP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False,
                                       "not an HTTP/1.x answer: b'RTSP/1.0"),
    "a version we do not speak": (b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", False,
                                  "not an HTTP/1.x answer: version 2.0"),
    "one header over the bound": (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000, False,
                                  "headers are over 65536 bytes"),
    "many headers over the bound": (b"HTTP/1.1 200 OK\r\n" + b"X-Header: some value\r\n" * 4000, False,
                                    "headers are over 65536 bytes"),
    "bad chunk size": (CHUNKED_HEAD + b"zz\r\nab\r\n", False, "not an HTTP/1.x answer"),
    "two different lengths": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", False,
                              "not an HTTP/1.x answer"),
    "closed before any byte": (b"", True, "closed the connection without an answer"),
    "closed after an interim answer": (b"HTTP/1.1 100 Continue\r\n\r\n", True,
                                       "closed the connection without an answer"),
    "closed in the headers": (b"HTTP/1.1 200 OK\r\nContent-Le", True, "in the middle of the answer's headers"),
    "closed in a body with a length": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", True,
                                       "before the answer's body was complete"),
    "closed in a chunked body": (CHUNKED_HEAD + b"5\r\nab", True, "before the answer's body was complete"),
    "closed before the last chunk": (CHUNKED_HEAD + b"2\r\nab\r\n", True, "before the answer's body was complete"),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_a_malformed_answer_is_a_connection_error_named_at_once(client: WebhookClient, case: str) -> None:
    raw, then_close, error = MALFORMED[case]
    server, url = await raw_server(answering(raw, then_close=then_close))
    async with server:
        # A generous timeout: a client that waited for more (a hang) would end as TIMEOUT, not as this.
        result = await client.post(url, b"{}", HEADERS, timeout=30)
        assert result.status is None and result.error_kind is DeliveryErrorKind.CONNECTION, result
        assert result.error is not None and error in result.error, result.error
        assert not any(client._idle.values())  # the connection is not kept for another request


@pytest.mark.parametrize("body", [b"HTTP/1.1 500 Oops\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 10_000,
                                  CHUNKED_HEAD.replace(b"200 OK", b"500 Oops") + b"2710\r\n" + b"x" * 10_000],
                         ids=["length", "chunked"])
async def test_a_body_over_the_bound_that_never_ends_is_cut_without_waiting(client: WebhookClient,
                                                                            body: bytes) -> None:
    server, url = await raw_server(answering(body, then_close=False))
    async with server:
        result = await client.post(url, b"{}", HEADERS, timeout=30)
    assert result.status == 500 and result.body == "x" * MAX_RESPONSE_BYTES
    assert not any(client._idle.values())


async def test_a_chunked_answer_with_extensions_and_trailers_keeps_its_connection(client: WebhookClient) -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            await read_request(reader)
            writer.write(CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nRetry-After: 3\r\n\r\n")
                         + b"3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n")
            await writer.drain()

    server, url = await raw_server(chunked)
    async with server:
        first = await client.post(url, b"{}", HEADERS, timeout=5)
        second = await client.post(url, b"{}", HEADERS, timeout=5)
    assert first.body == second.body == "abcde" and first.retry_after == 3.0
    assert client.connections_opened == 1


async def test_bytes_on_an_idle_connection_end_it(client: WebhookClient) -> None:
    async def answer_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")  # an answer to no request
        await writer.drain()
        await reader.read()

    server, url = await raw_server(answer_twice)
    async with server:
        assert (await client.post(url, b"{}", HEADERS, timeout=5)).body == "ok"
        await eventually(lambda: all(c.closed for idle in client._idle.values() for c in idle))
        assert (await client.post(url, b"{}", HEADERS, timeout=5)).body == "ok"  # not "stale"
    assert client.connections_opened == 2


async def test_a_refused_connection_is_a_connection_error(client: WebhookClient) -> None:
    result = await client.post(f"http://127.0.0.1:{free_port()}/hook", b"{}", HEADERS, timeout=5)
    assert result.status is None and result.error_kind is DeliveryErrorKind.CONNECTION
    assert result.error is not None and "Cannot connect to host 127.0.0.1" in result.error


@pytest.mark.parametrize("headers", [{"x-evil": "a\r\nx-injected: 1"}, {"bad name": "x"}, {"x:y": "z"}])
async def test_a_header_that_would_split_the_request_is_refused_before_sending(client: WebhookClient,
                                                                              headers: dict[str, str]) -> None:
    async with Server(answer()) as server:
        result = await client.post(f"http://127.0.0.1:{server.port}/hook", b"{}", headers, timeout=5)
    assert result.status is None and result.error is not None and "invalid character" in result.error
    assert server.received == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "[64:ff9b::7f00:1]"])
async def test_internal_addresses_are_refused_before_connecting(host: str) -> None:
    client = WebhookClient(allow_private_networks=False)
    try:
        async with Server(answer()) as server:
            result = await client.post(f"http://{host}:{server.port}/hook", b"{}", HEADERS, timeout=5)
    finally:
        await client.close()
    assert result.status is None and result.error_kind is DeliveryErrorKind.BLOCKED, result
    assert result.error is not None and "internal address" in result.error and "allow private networks" in result.error
    assert server.received == [] and client.connections_opened == 0


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_tls_verifies_the_server_certificate(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    trusting = WebhookClient(allow_private_networks=True, ssl_context=ssl.create_default_context(cafile=str(cert)))
    default = WebhookClient(allow_private_networks=True)
    try:
        async with Server(answer(200, "secure"), ssl_context=server_context) as server:
            url = f"https://localhost:{server.port}/hook"
            first = await trusting.post(url, b"{}", HEADERS, timeout=5)
            second = await trusting.post(url, b"{}", HEADERS, timeout=5)
            refused = await default.post(url, b"{}", HEADERS, timeout=5)
    finally:
        await trusting.close()
        await default.close()
    assert first.body == second.body == "secure" and trusting.connections_opened == 1
    assert refused.status is None and refused.error_kind is DeliveryErrorKind.TLS
    assert refused.error is not None and "CERTIFICATE_VERIFY_FAILED" in refused.error
    assert len(server.received) == 2  # the unverified server got nothing
