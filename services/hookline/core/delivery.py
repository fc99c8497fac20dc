"""What every outgoing webhook shares, whoever sends it (``core/http_client.py`` is the one client:
the worker's destination calls and the relay's deliveries): the private-address guard, the result
of an attempt and its classification, and Retry-After.

The guard refuses loopback, private, link-local or otherwise internal addresses; the client applies
it to the resolved address right before it dials that address, so DNS cannot be used to slip past it.
IPv6 addresses that carry an IPv4 address (NAT64, 6to4, Teredo, IPv4-mapped and
-compatible) are judged by the IPv4 address they lead to: ``64:ff9b::a00:5``
reaches 10.0.0.5 through a NAT64 gateway, so it is as internal as 10.0.0.5. Python's
``ipaddress`` flags alone are not trusted (their tables differ between versions: on 3.11.7
``fec0::/10`` and ``192.0.0.192`` are "global"), so an explicit deny list is checked as well.
"""

from __future__ import annotations

import enum
import ipaddress
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

MAX_RESPONSE_BYTES = 4096


class BlockedAddress(ConnectionError):
    """The URL resolves to an address that outgoing webhooks may not reach."""


class DeliveryErrorKind(enum.StrEnum):
    """Why a delivery got no HTTP answer, for callers that act on the reason (not on the message)."""

    BLOCKED = "blocked"  # the private-address guard refused the address: nothing was sent
    TIMEOUT = "timeout"
    CONNECTION = "connection"  # refused, reset, DNS or TLS failure: the endpoint was not reached
    PROXY = "proxy"  # the egress proxy refused the tunnel, or could not be reached: the endpoint was not reached
    TLS = "tls"  # the TLS handshake failed (certificate not trusted, client certificate refused): nothing was sent
    OAUTH2 = "oauth2"  # no OAuth2 token (the token endpoint refused or was not reached): nothing was sent


# Prefixes whose addresses carry an IPv4 address in their last 32 bits.
_LAST_32_BITS = (
    IPv6Network("::ffff:0:0/96"),  # IPv4-mapped
    IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT)
    IPv6Network("::/96"),  # IPv4-compatible (deprecated; also holds :: and ::1)
    IPv6Network("64:ff9b::/96"),  # NAT64 well-known prefix (RFC 6052)
)
_NAT64_LOCAL_USE = IPv6Network("64:ff9b:1::/48")  # RFC 8215: the operator picks the prefix length
_SIX_TO_FOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")


def _rfc6052_ipv4(ip: IPv6Address, prefix_length: int) -> IPv4Address:
    """The IPv4 address embedded after a NAT64 prefix of this length (RFC 6052 section 2.2):
    bits 64-71 are the reserved "u" octet and never carry address bits."""
    packed = ip.packed
    if prefix_length == 96:
        return IPv4Address(packed[12:])
    without_u = packed[:8] + packed[9:]
    start = prefix_length // 8
    return IPv4Address(without_u[start:start + 4])


def embedded_ipv4(ip: IPv6Address) -> tuple[IPv4Address, ...]:
    """The IPv4 addresses a packet sent to ``ip`` may be delivered to by a translator or tunnel
    (empty for an ordinary IPv6 address). Where the embedding is ambiguous (a local-use NAT64
    prefix of unknown length) every candidate is returned, so the caller can fail closed; as
    some candidate nearly always falls in 0.0.0.0/8, that refuses almost all of 64:ff9b:1::/48,
    which is meant for translators inside one's own network anyway (RFC 8215)."""
    if any(ip in network for network in _LAST_32_BITS):
        return (IPv4Address(int(ip) & 0xFFFFFFFF),)
    if ip in _NAT64_LOCAL_USE:
        return tuple(_rfc6052_ipv4(ip, length) for length in (48, 56, 64, 96))
    if ip in _SIX_TO_FOUR:
        return (IPv4Address((int(ip) >> 80) & 0xFFFFFFFF),)
    if ip in _TEREDO:  # server in bits 32-63; client in the last 32 bits, inverted
        return (IPv4Address((int(ip) >> 64) & 0xFFFFFFFF), IPv4Address(~int(ip) & 0xFFFFFFFF))
    return ()


# Every block of the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and its
# updates, as of 2025), plus multicast and the deprecated site-local fec0::/10 (RFC 3879), refused
# whatever Python's flags say. The few registry blocks that are globally reachable are anycast
# services (PCP, TURN, AS112, AMT), never a webhook receiver, so they are refused too. Prefixes
# that embed an IPv4 address (in _LAST_32_BITS, NAT64 local use, 6to4) are not listed: an address
# in them is judged by the IPv4 address it leads to (see is_internal).
DENIED_IPV4 = tuple(IPv4Network(n) for n in (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared address space (carrier-grade NAT)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local (cloud metadata services)
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments (DS-Lite, PCP and TURN anycast, NAT64 discovery)
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.31.196.0/24",  # AS112-v4
    "192.52.193.0/24",  # AMT
    "192.88.99.0/24",  # deprecated 6to4 relay anycast
    "192.168.0.0/16",  # private
    "192.175.48.0/24",  # AS112 direct delegation
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and 255.255.255.255 (limited broadcast) in it
))
DENIED_IPV6 = tuple(IPv6Network(n) for n in (
    "::/128",  # unspecified
    "::1/128",  # loopback
    "100::/64",  # discard-only
    "100:0:0:1::/64",  # dummy prefix
    "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID, AMT, AS112
    "2001:db8::/32",  # documentation
    "2620:4f:8000::/48",  # AS112 direct delegation
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing (SRv6) SIDs
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated; Python 3.11.7 calls it global)
    "ff00::/8",  # multicast
))
# Where IANA allocates global unicast IPv6 at all; everything outside it is reserved.
_IPV6_GLOBAL_UNICAST = IPv6Network("2000::/3")
# Prefixes judged by their embedded IPv4 address, not by the prefix (which may be reachable).
_JUDGED_BY_IPV4 = (*_LAST_32_BITS, _NAT64_LOCAL_USE, _SIX_TO_FOUR)


def _not_public(ip: IPv4Address | IPv6Address) -> bool:
    """Denied by the list above, or not public by Python's own tables."""
    if isinstance(ip, IPv4Address):
        denied = any(ip in network for network in DENIED_IPV4)
    else:
        denied = ip not in _IPV6_GLOBAL_UNICAST or any(ip in network for network in DENIED_IPV6)
    return denied or not ip.is_global or ip.is_multicast


def is_internal(address: str) -> bool:
    """Whether outgoing webhooks must not reach ``address``: loopback, private, link-local,
    shared, reserved, special-purpose, multicast — directly or through an IPv6 form that embeds
    such an IPv4."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, IPv6Address) and any(ip in network for network in _JUDGED_BY_IPV4):
        # Judged by where the packet ends up; the prefixes themselves are not private
        # (Python's verdict on them also differs between versions).
        return any(_not_public(v4) for v4 in embedded_ipv4(ip))
    return _not_public(ip)


@dataclass(slots=True)  # one per attempt: not frozen, whose __init__ costs three times as much
class DeliveryResult:
    status: int | None  # None: no HTTP answer (timeout, refused, blocked)
    body: str
    latency: float
    error: str | None = None
    retry_after: float | None = None
    error_kind: DeliveryErrorKind | None = None  # set when status is None and the cause is known

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is None:
            return f"no response: {self.error}"
        return f"HTTP {self.status}: {self.body[:500]}" if self.body else f"HTTP {self.status}"


class Outcome(enum.StrEnum):
    """What an attempt's answer says, for the worker's destinations and the relay's endpoints alike
    (the values are the relay's ``result`` metric labels)."""

    DELIVERED = "delivered"  # 2xx
    GONE = "gone"  # 410: the receiver is gone for good
    RATE_LIMITED = "rate_limited"  # 429
    SERVER_ERROR = "server_error"  # 5xx
    CLIENT_ERROR = "client_error"  # other 4xx (and stray 1xx/3xx): the receiver is likely misconfigured
    NO_RESPONSE = "no_response"  # timeout, refused, reset, DNS or TLS failure
    BLOCKED = "blocked"  # the private-address guard refused the address: nothing was sent


# Client errors that ask for the same request again later: 408 Request Timeout, 425 Too Early.
_TRY_AGAIN = frozenset({408, 425})


def classify(result: DeliveryResult) -> Outcome:
    """The outcome of one attempt, from its status or, without one, from its error kind."""
    if result.status is None:
        return Outcome.BLOCKED if result.error_kind is DeliveryErrorKind.BLOCKED else Outcome.NO_RESPONSE
    if result.ok:
        return Outcome.DELIVERED
    if result.status == 410:
        return Outcome.GONE
    if result.status == 429:
        return Outcome.RATE_LIMITED
    if result.status >= 500:
        return Outcome.SERVER_ERROR
    return Outcome.CLIENT_ERROR


def worth_retrying(result: DeliveryResult) -> bool:
    """Whether the same request may succeed later: no answer, 408, 425, 429 or 5xx. Other 4xx
    (410 included) are refusals: the worker buries them at once (the relay retries them anyway,
    and disables an endpoint on 410)."""
    outcome = classify(result)
    return outcome in (Outcome.NO_RESPONSE, Outcome.BLOCKED, Outcome.RATE_LIMITED, Outcome.SERVER_ERROR) or (
        outcome is Outcome.CLIENT_ERROR and result.status in _TRY_AGAIN)


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
