"""Deliveries through an egress proxy (HTTP CONNECT): a real proxy on localhost (support/proxy.py),
real HTTP and TLS servers, and one real ``hookline relay`` process delivering a signed outbox event.

The proxy records what it was asked: the tunnel must go to the address the private-address guard
checked (not to a name the proxy would resolve itself), and a target in no-proxy or a blocked one
must never reach it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web

from hookline import outbox
from hookline.core.delivery import DeliveryErrorKind
from hookline.core.http_client import EgressProxy, WebhookClient
from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from support.endpoints import TestEndpoint
from support.processes import hookline_cli
from support.processes import relay as relay_process
from support.proxy import ConnectProxy
from support.tls import issue, make_ca, write_pem
from support.waiting import eventually

HEADERS = {"content-type": "application/json", "webhook-id": "msg_1"}
PASSWORD = "s3cret-proxy-pass"  # the test proxy's own


@asynccontextmanager
async def server(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """An HTTP(S) server on 127.0.0.1 answering every POST with 200 "ok"; yields its port."""
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    try:
        assert site._server is not None
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_http_goes_through_a_tunnel_to_the_checked_address() -> None:
    async with ConnectProxy() as proxy, server() as port:
        client = WebhookClient(allow_private_networks=True, proxy=EgressProxy.parse(proxy.url))
        try:
            first = await client.post(f"http://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
            second = await client.post(f"http://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await client.close()
    assert (first.status, first.body, second.status) == (200, "ok", 200), first.error
    # The resolved and checked address, not the name: the proxy cannot resolve it elsewhere.
    assert [a.authority for a in proxy.asked] == [f"127.0.0.1:{port}"]
    assert client.connections_opened == 1  # the tunnel was kept alive for the second delivery


async def test_https_through_the_tunnel_verifies_the_target_certificate(tmp_path: Path) -> None:
    ca = make_ca("egress test CA")
    write_pem(ca, tmp_path / "ca.pem")
    write_pem(issue(ca, "localhost", names=("localhost",)), tmp_path / "cert.pem", tmp_path / "key.pem")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    trusting = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    async with ConnectProxy() as proxy, server(server_context) as port:
        client = WebhookClient(allow_private_networks=True, ssl_context=trusting,
                               proxy=EgressProxy.parse(proxy.url))
        untrusting = WebhookClient(allow_private_networks=True, proxy=EgressProxy.parse(proxy.url))
        try:
            secure = await client.post(f"https://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
            refused = await untrusting.post(f"https://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await client.close()
            await untrusting.close()
    assert (secure.status, secure.body) == (200, "ok"), secure.error
    assert [a.authority for a in proxy.asked] == [f"127.0.0.1:{port}"] * 2
    # The certificate checked is the target's (for its name), through the tunnel.
    assert refused.status is None and refused.error is not None and "CERTIFICATE_VERIFY_FAILED" in refused.error


async def test_credentials_are_sent_and_wrong_ones_fail_without_showing_them(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with ConnectProxy(credentials=f"relay:{PASSWORD}") as proxy, server() as port:
        right = WebhookClient(allow_private_networks=True,
                              proxy=EgressProxy.parse(proxy.url, credentials=f"relay:{PASSWORD}"))
        wrong = WebhookClient(allow_private_networks=True,
                              proxy=EgressProxy.parse(proxy.url, credentials="relay:not-the-password"))
        try:
            ok = await right.post(f"http://127.0.0.1:{port}/hook", b"{}", HEADERS, timeout=5)
            failed = await wrong.post(f"http://127.0.0.1:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await right.close()
            await wrong.close()
    assert ok.status == 200, ok.error
    assert proxy.asked[0].authorization is not None and proxy.asked[0].authorization.startswith("Basic ")
    assert failed.status is None and failed.error_kind is DeliveryErrorKind.PROXY
    assert failed.error is not None and "407 Proxy Authentication Required" in failed.error, failed.error
    assert f"127.0.0.1:{proxy.port}" in failed.error  # it names the proxy
    for text in (failed.error, caplog.text, repr(wrong.proxy)):
        assert "not-the-password" not in text and PASSWORD not in text and "Basic" not in text


@pytest.mark.parametrize("refuse", [403, 502])
async def test_a_refused_tunnel_is_a_proxy_failure_naming_the_status(refuse: int) -> None:
    async with ConnectProxy(refuse=refuse) as proxy, server() as port:
        client = WebhookClient(allow_private_networks=True, proxy=EgressProxy.parse(proxy.url))
        try:
            failed = await client.post(f"http://127.0.0.1:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await client.close()
    assert failed.status is None and failed.error_kind is DeliveryErrorKind.PROXY
    assert failed.error is not None and f"refused the tunnel to 127.0.0.1:{port}: {refuse}" in failed.error


async def test_a_hanging_proxy_is_a_proxy_failure() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads CONNECT, never answers
        writer.close()

    hanging = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = hanging.sockets[0].getsockname()[1]
    client = WebhookClient(allow_private_networks=True, proxy=EgressProxy.parse(f"http://127.0.0.1:{port}"))
    try:
        failed = await client.post("http://127.0.0.1:9/hook", b"{}", HEADERS, timeout=5, connect_timeout=0.5)
    finally:
        await client.close()
        hanging.close()
    assert failed.status is None and failed.error_kind is DeliveryErrorKind.PROXY
    assert failed.error is not None and f"no tunnel through 127.0.0.1:{port}" in failed.error


async def test_a_target_in_no_proxy_goes_direct() -> None:
    async with ConnectProxy() as proxy, server() as port:
        proxied = EgressProxy.parse(proxy.url, no_proxy="example.com, localhost")
        client = WebhookClient(allow_private_networks=True, proxy=proxied)
        try:
            direct = await client.post(f"http://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await client.close()
    assert direct.status == 200 and proxy.asked == []


def test_no_proxy_matches_names_suffixes_addresses_and_cidrs() -> None:
    proxy = EgressProxy.parse("http://proxy:3128", no_proxy="internal.example,.corp.example,10.0.0.0/8,2001:db8::1")
    assert proxy.bypasses("internal.example") and proxy.bypasses("a.internal.example")
    assert proxy.bypasses("corp.example") and proxy.bypasses("x.corp.example")
    assert proxy.bypasses("10.1.2.3") and proxy.bypasses("2001:db8::1")
    assert not proxy.bypasses("external.example") and not proxy.bypasses("notinternal.example")
    assert not proxy.bypasses("11.0.0.1") and not proxy.bypasses("2001:db8::2")
    assert EgressProxy.parse("http://proxy:3128", no_proxy="*").bypasses("anything.example")


async def test_a_private_target_is_still_blocked_with_a_proxy() -> None:
    async with ConnectProxy() as proxy, server() as port:
        client = WebhookClient(allow_private_networks=False, proxy=EgressProxy.parse(proxy.url))
        try:
            blocked = await client.post(f"http://localhost:{port}/hook", b"{}", HEADERS, timeout=5)
        finally:
            await client.close()
    assert blocked.error_kind is DeliveryErrorKind.BLOCKED and blocked.error is not None
    assert "localhost resolves to an internal address" in blocked.error
    assert proxy.asked == []


@pytest.mark.parametrize(("env", "says"), [
    ({"HOOKLINE_EGRESS_PROXY": f"http://relay:{PASSWORD}@127.0.0.1:3128"}, "credentials file"),
    ({"HOOKLINE_EGRESS_PROXY": "https://127.0.0.1:3128"}, "http:// URL"),
    ({"HOOKLINE_EGRESS_PROXY": "http://127.0.0.1:3128", "HOOKLINE_EGRESS_NO_PROXY": "10.0.0.0/33"},
     "HOOKLINE_EGRESS_NO_PROXY"),
    ({"HOOKLINE_EGRESS_PROXY": "http://127.0.0.1:3128",
      "HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE": "/nonexistent/credentials"}, "cannot read"),
    ({"HOOKLINE_EGRESS_NO_PROXY": "localhost"}, "need HOOKLINE_EGRESS_PROXY"),
])
def test_bad_egress_settings_are_one_line_and_exit_2(database_url: str, env: dict[str, str], says: str) -> None:
    result = hookline_cli(database_url, "relay", env=env)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert PASSWORD not in result.stderr + result.stdout


async def test_the_relay_delivers_a_signed_event_through_the_proxy(database_url: str, pool: asyncpg.Pool,
                                                                  log_dir: Path, tmp_path: Path) -> None:
    credentials = tmp_path / "proxy-credentials"
    credentials.write_text(f"relay:{PASSWORD}\n")
    async with ConnectProxy(credentials=f"relay:{PASSWORD}") as proxy, \
            TestEndpoint(get_scheme("standard-webhooks").generate_secret()) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "proxied", ep.url, secret=ep.secret, initial_delay=0.1, max_delay=0.5)
        relay = await asyncio.to_thread(relay_process, database_url, log_dir, env={
            "HOOKLINE_ALLOW_PRIVATE_NETWORKS": "true", "HOOKLINE_EGRESS_PROXY": proxy.url,
            "HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE": str(credentials)})
        try:
            async with pool.acquire() as conn, conn.transaction():
                event_id = await outbox.publish(conn, "order.paid", {"id": 7})
            await eventually(lambda: bool(ep.delivered()), timeout=15)
        finally:
            assert relay.stop() == 0, relay.logs()
    assert [r.webhook_id for r in ep.delivered()] == [event_id] and ep.invalid == []  # verified by standardwebhooks
    assert ep.delivered()[0].body["data"] == {"id": 7}
    assert [a.authority for a in proxy.asked] == [f"127.0.0.1:{ep.port}"]
    assert PASSWORD not in relay.logs()
