"""A TLS terminator on localhost in front of a plain HTTP server, as a sidecar (envoy, nginx) fronts
a receiver: OpenSSL on blocking sockets, so a failed handshake sends its alert (certificate required,
unknown CA) as such servers do; asyncio's TLS servers close without one. It records why handshakes
failed and splices bytes both ways otherwise.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from types import TracebackType


class TlsTerminator:
    """``with TlsTerminator(context, upstream_port) as t``: ``t.port`` speaks TLS (``context``, a server
    context), ``t.failures`` holds each failed handshake's reason."""

    def __init__(self, context: ssl.SSLContext, upstream_port: int) -> None:
        self.context, self.upstream_port = context, upstream_port
        self.failures: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closing = False

    def __enter__(self) -> TlsTerminator:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._closing = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(10)
        try:
            tls = self.context.wrap_socket(client, server_side=True)  # the handshake; its alert on failure
        except (ssl.SSLError, OSError) as exc:
            self.failures.append(str(exc))
            client.close()
            return
        try:
            with tls, socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                _splice(tls, upstream)
        except OSError as exc:
            if not isinstance(exc, ssl.SSLError) or "certificate" in str(exc).lower():
                self.failures.append(str(exc))  # TLS 1.3 checks the client's certificate after the handshake


def _splice(tls: ssl.SSLSocket, upstream: socket.socket) -> None:
    while True:
        readable = [tls] if tls.pending() else select.select([tls, upstream], [], [], 10)[0]
        if not readable:
            return
        for source, sink in ((tls, upstream), (upstream, tls)):
            if source in readable:
                with contextlib.suppress(ssl.SSLWantReadError):
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
