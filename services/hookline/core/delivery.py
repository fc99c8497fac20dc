"""Outgoing HTTP for destinations (worker) and endpoints (relay): one careful POST.

Careful means: a connect timeout and a total timeout, no redirects (a 3xx is an
answer, not an instruction to send a signed payload elsewhere), at most
``max_response_bytes`` of the answer read, and optionally no connections to
loopback, private, link-local or otherwise internal addresses — checked on the
resolved address at connect time, so DNS cannot be used to slip past the check.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

MAX_RESPONSE_BYTES = 4096


class BlockedAddress(aiohttp.ClientConnectionError):
    """The URL resolves to an address that outgoing webhooks may not reach."""


def is_internal(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


class PublicOnlyResolver(AbstractResolver):
    """Resolves like the default resolver, then refuses internal addresses."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if not is_internal(r["host"])]
        if not allowed:
            raise BlockedAddress(f"{host} resolves to an internal address; outgoing webhooks may only reach "
                                 "public addresses (allow private networks to change this)")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def public_only_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's socket factory for every connection attempt: the last check before connect.

    The resolver never sees IP-literal URLs (``http://10.0.0.1/``, ``http://[::1]/``):
    aiohttp skips resolution for them. This sees the address actually dialled, whatever
    the URL spelled."""
    family, type_, proto, _, address = addr_info
    if is_internal(address[0]):
        raise BlockedAddress(f"{address[0]} is an internal address; outgoing webhooks may only reach "
                             "public addresses (allow private networks to change this)")
    return socket.socket(family=family, type=type_, proto=proto)


def create_session(*, allow_private_networks: bool, connections: int = 100) -> aiohttp.ClientSession:
    resolver = None if allow_private_networks else PublicOnlyResolver()
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections, resolver=resolver,
                                     ttl_dns_cache=30,
                                     socket_factory=None if allow_private_networks else public_only_socket)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False,
                                 cookie_jar=aiohttp.DummyCookieJar())


@dataclass(frozen=True)
class DeliveryResult:
    status: int | None  # None: no HTTP answer (timeout, refused, blocked)
    body: str
    latency: float
    error: str | None = None
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is None:
            return f"no response: {self.error}"
        return f"HTTP {self.status}: {self.body[:500]}" if self.body else f"HTTP {self.status}"


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


async def post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], *,
               timeout: float, connect_timeout: float | None = None,
               max_response_bytes: int = MAX_RESPONSE_BYTES) -> DeliveryResult:
    started = time.perf_counter()
    client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout or min(timeout, 5.0))
    try:
        async with session.post(url, data=body, headers=headers, timeout=client_timeout,
                                allow_redirects=False) as response:
            raw = await response.content.read(max_response_bytes)
            return DeliveryResult(
                status=response.status,
                body=raw.decode("utf-8", "replace"),
                latency=time.perf_counter() - started,
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
    except TimeoutError:
        error = f"timed out after {timeout:g} s"
    except BlockedAddress as exc:
        error = str(exc)
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror or exc}"
    return DeliveryResult(status=None, body="", latency=time.perf_counter() - started, error=error)
