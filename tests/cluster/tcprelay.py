"""A TCP relay from an address pods can reach to a server that listens on loopback only.

The tests' embedded Postgres listens on 127.0.0.1 (tests/conftest.py); pods reach the node at its own
address. The relay accepts there and copies bytes both ways, so Postgres sees a loopback client and its
authentication (SCRAM password) is unchanged.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit, urlunsplit


class TcpRelay:
    """``with TcpRelay(host, upstream_url) as relay``: listens on ``host`` at a free port until closed."""

    def __init__(self, host: str, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL needs a host and a port: {parts.scheme}://{parts.hostname}")
        self.upstream = (parts.hostname, parts.port)
        self.listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self._closed = threading.Event()

    def rewrite(self, url: str) -> str:
        """``url`` with its host and port replaced by the relay's (user, password and path kept)."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.address[0]}:{self.address[1]}"))

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side closes, then close both (the other thread's recv then ends too)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
