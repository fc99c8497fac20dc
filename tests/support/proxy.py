"""A small HTTP CONNECT proxy on localhost for the relay's egress tests.

It records every CONNECT it was asked for (the request line's authority and its Proxy-Authorization),
can require Basic credentials (407 without them), can refuse every tunnel with a given status, and
otherwise splices bytes both ways between the client and the asked address.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class Asked:
    authority: str  # what followed CONNECT: host:port
    authorization: str | None  # the Proxy-Authorization header as sent


@dataclass
class ConnectProxy:
    credentials: str | None = None  # user:password it requires, or None: any client
    refuse: int | None = None  # answer every CONNECT with this status
    asked: list[Asked] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.split("\r\n")
        method, authority, _ = lines[0].split(" ", 2)
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:] if line)}
        self.asked.append(Asked(authority, headers.get("proxy-authorization")))
        expected = None if self.credentials is None else "Basic " + base64.b64encode(self.credentials.encode()).decode()
        if method != "CONNECT":
            status = "405 Method Not Allowed"
        elif self.refuse is not None:
            status = f"{self.refuse} Refused"
        elif expected is not None and headers.get("proxy-authorization") != expected:
            status = "407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"egress\""
        else:
            status = ""
        if status:
            writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode("latin-1"))
            await writer.drain()
            writer.close()
            return
        host, _, port = authority.rpartition(":")
        try:
            target_reader, target_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for source, sink in ((reader, target_writer), (target_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()
