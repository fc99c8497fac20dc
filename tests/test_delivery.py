"""The outgoing-HTTP guard (core/delivery.py): which addresses outgoing webhooks may reach.

The unit tests cover every IPv6 form that embeds an IPv4 address; the HTTP tests send
real requests through the one client (core/http_client.py) to a real server on localhost.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from hookline.core import delivery
from hookline.core.delivery import DeliveryErrorKind, DeliveryResult, Outcome, embedded_ipv4, is_internal
from hookline.core.embedded import free_port
from hookline.core.http_client import WebhookClient

# Each form wrapping 10.0.0.5 (private) and 8.8.8.8 (public).
EMBEDDINGS = {
    "NAT64 well-known 64:ff9b::/96": ("64:ff9b::a00:5", "64:ff9b::808:808"),
    "NAT64 local-use 64:ff9b:1::/48, /96 position": ("64:ff9b:1::a00:5", None),
    "NAT64 local-use 64:ff9b:1::/48, /64 position": ("64:ff9b:1:0:a:0:500:0", None),
    "6to4 2002::/16": ("2002:a00:5::1", "2002:808:808::1"),
    # Teredo is refused whatever it embeds (2001::/23 is on the deny list; see the test below).
    "Teredo 2001::/32, client (inverted last 32 bits)": ("2001:0:4136:e378:8000:63bf:f5ff:fffa", None),
    "Teredo 2001::/32, server (bits 32-63)": ("2001:0:a00:5:8000:63bf:f7f7:f7f7", None),
    "IPv4-compatible ::/96": ("::a00:5", "::808:808"),
    "IPv4-mapped ::ffff:0:0/96": ("::ffff:a00:5", "::ffff:808:808"),
    "IPv4-translated ::ffff:0:0:0/96": ("::ffff:0:a00:5", "::ffff:0:808:808"),
}


@pytest.mark.parametrize("form", sorted(EMBEDDINGS))
def test_an_ipv6_address_embedding_a_private_ipv4_is_internal(form: str) -> None:
    private, public = EMBEDDINGS[form]
    assert ipaddress.IPv4Address("10.0.0.5") in embedded_ipv4(ipaddress.IPv6Address(private))
    assert is_internal(private), form
    if public is not None:  # the same form around a public address is public: the check is not "refuse IPv6"
        assert ipaddress.IPv4Address("8.8.8.8") in embedded_ipv4(ipaddress.IPv6Address(public))
        assert not is_internal(public), form


@pytest.mark.parametrize("inner", ["127.0.0.1", "169.254.169.254", "100.64.0.1", "192.168.1.1", "172.16.0.1",
                                   "0.0.0.0", "240.0.0.1", "224.0.0.1"])
def test_every_internal_ipv4_kind_is_refused_through_nat64_and_6to4(inner: str) -> None:
    packed = int(ipaddress.IPv4Address(inner))
    nat64 = ipaddress.IPv6Address((0x64FF9B << 96) | packed)
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (packed << 80))
    assert is_internal(inner) and is_internal(str(nat64)) and is_internal(str(six_to_four))


@pytest.mark.parametrize("address", ["::1", "::", "fe80::1", "fe80::1%lo", "fc00::1", "ff02::1", "2001:db8::1"])
def test_plain_internal_ipv6_addresses_are_internal(address: str) -> None:
    assert is_internal(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"])
def test_public_addresses_are_not_internal(address: str) -> None:
    assert not is_internal(address)


def test_ordinary_ipv6_addresses_embed_nothing() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("2606:4700:4700::1111")) == ()


# Every special-purpose block (IANA registries, RFC 6890), by its first, a middle and its last address.
SPECIAL_PURPOSE = [
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24", "192.168.0.0/16",
    "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "255.255.255.255/32",
    "::/128", "::1/128", "100::/64", "100:0:0:1::/64", "2001::/23", "2001:db8::/32", "2620:4f:8000::/48",
    "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
]


@pytest.mark.parametrize("block", SPECIAL_PURPOSE)
def test_every_special_purpose_block_is_refused(block: str) -> None:
    network = ipaddress.ip_network(block)
    middle = network[network.num_addresses // 2]
    for address in (network[0], middle, network[-1]):
        assert is_internal(str(address)), address


@pytest.mark.parametrize("address", ["fec0::1", "192.0.0.192", "192.0.0.9", "192.31.196.1", "3fff::1", "5f00::1",
                                     "2620:4f:8000::1", "100:0:0:1::1", "4000::1"])
def test_what_python_3_11_calls_global_is_refused_by_the_list(address: str) -> None:
    # Each of these is_global on some supported Python (3.11.7 for all of them); the list decides.
    assert is_internal(address)


@pytest.mark.parametrize("address", ["::ffff:fec0:1", "::ffff:192.0.0.192", "64:ff9b::c000:c0", "2002:c000:c0::1",
                                     "::ffff:198.51.100.7", "64:ff9b::cb00:7101", "2002:c612:1::1",
                                     "64:ff9b:1::c000:2ff", "::ffff:0:c000:c0"])
def test_special_purpose_ipv4_is_refused_through_every_embedding(address: str) -> None:
    assert is_internal(address)


@pytest.mark.parametrize("address", ["2001:0:4136:e378:8000:63bf:f7f7:f7f7", "2001:0:808:808:8000:63bf:f7f7:f7f7"])
def test_teredo_is_refused_even_around_public_addresses(address: str) -> None:
    # Reached only through a Teredo relay, never a webhook receiver: the whole of 2001::/23 is denied.
    assert embedded_ipv4(ipaddress.IPv6Address(address))
    assert is_internal(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "192.0.1.1", "192.0.3.1", "198.20.0.1", "100.128.0.1",
                                     "172.32.0.1", "223.255.255.254", "2606:4700:4700::1111", "2001:4860:4860::8888",
                                     "2001:200::1", "2a00:1450:4001:80b::200e", "2003::1", "::ffff:8.8.8.8",
                                     "64:ff9b::101:101", "2002:101:101::1"])
def test_ordinary_public_addresses_next_to_the_blocks_are_allowed(address: str) -> None:
    assert not is_internal(address)


# --- through the real client -----------------------------------------------------------------


@pytest.fixture
async def local_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    received: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port, received
    await runner.cleanup()


async def _post(url: str, *, allow_private_networks: bool) -> delivery.DeliveryResult:
    client = WebhookClient(allow_private_networks=allow_private_networks)
    try:
        return await client.post(url, b"{}", {"content-type": "application/json"}, timeout=5)
    finally:
        await client.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "[64:ff9b::7f00:1]",
                                  "[2002:7f00:1::1]", "[::127.0.0.1]"])
async def test_the_public_only_client_refuses_before_sending(local_server: tuple[int, list[bytes]],
                                                              host: str) -> None:
    port, received = local_server
    result = await _post(f"http://{host}:{port}/hook", allow_private_networks=False)
    assert result.status is None and result.error_kind is DeliveryErrorKind.BLOCKED, result
    assert result.error is not None and "internal address" in result.error
    assert received == []


async def test_allowing_private_networks_reaches_localhost(local_server: tuple[int, list[bytes]]) -> None:
    port, received = local_server
    result = await _post(f"http://127.0.0.1:{port}/hook", allow_private_networks=True)
    assert result.ok and result.error_kind is None and received == [b"{}"]


async def test_an_unreachable_endpoint_is_a_connection_error_not_a_block() -> None:
    result = await _post(f"http://127.0.0.1:{free_port()}/hook", allow_private_networks=True)
    assert result.status is None and result.error_kind is DeliveryErrorKind.CONNECTION


@pytest.mark.parametrize(("status", "kind", "outcome", "retry"), [
    (200, None, Outcome.DELIVERED, False),
    (204, None, Outcome.DELIVERED, False),
    (410, None, Outcome.GONE, False),
    (429, None, Outcome.RATE_LIMITED, True),
    (500, None, Outcome.SERVER_ERROR, True),
    (503, None, Outcome.SERVER_ERROR, True),
    (408, None, Outcome.CLIENT_ERROR, True),
    (425, None, Outcome.CLIENT_ERROR, True),
    (400, None, Outcome.CLIENT_ERROR, False),
    (302, None, Outcome.CLIENT_ERROR, False),
    (None, DeliveryErrorKind.TIMEOUT, Outcome.NO_RESPONSE, True),
    (None, DeliveryErrorKind.CONNECTION, Outcome.NO_RESPONSE, True),
    (None, DeliveryErrorKind.BLOCKED, Outcome.BLOCKED, True),
])
def test_one_classification_of_answers_for_worker_and_relay(status: int | None, kind: DeliveryErrorKind | None,
                                                            outcome: Outcome, retry: bool) -> None:
    result = DeliveryResult(status, "", 0.01, error=None if status else "no answer", error_kind=kind)
    assert delivery.classify(result) is outcome
    assert delivery.worth_retrying(result) is retry
