"""Egress per endpoint (relay/egress.py): client certificates and CA bundles, OAuth2 client
credentials, and a proxy of its own (or none), through one real ``hookline relay`` process against
real local servers: an HTTPS server that demands a client certificate, an OAuth2 token endpoint,
CONNECT proxies (support/proxy.py). Every delivery is verified with ``standardwebhooks``
(support/endpoints.py); the relay's whole output is searched for the secrets and tokens.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from cryptography.hazmat.primitives import serialization

from hookline import outbox
from hookline.core import secrets_at_rest, stored_secrets
from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from hookline.relay.endpoints import ClientTls, EgressConfig, EgressError, OAuth2ClientCredentials, ProxyConfig
from support.endpoints import Answer, TestEndpoint
from support.oauth import TokenServer, token_server
from support.processes import ServiceProcess, hookline_cli
from support.processes import relay as relay_process
from support.proxy import ConnectProxy
from support.tls import issue, make_ca, mtls_server_context, pem
from support.tls_terminator import TlsTerminator
from support.waiting import eventually

PROXY_PASSWORD = "endpoint-proxy-pass-7"
CLIENT_SECRET = "oauth-client-secret-9f2"


@dataclass
class Pki:
    ca: str  # signed the server's and the client's certificates
    other_ca: str  # signed nothing here
    client_cert: str
    client_key: str
    other_key: str  # belongs to no certificate here
    server: ssl.SSLContext  # demands a client certificate signed by ``ca``


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca("egress test CA")
    ca_pem, _ = pem(ca)
    client_cert, client_key = pem(issue(ca, "relay-client", client=True))
    server = mtls_server_context(ca, directory)
    return Pki(ca_pem, pem(make_ca("an unrelated CA"))[0], client_cert, client_key,
               pem(issue(ca, "someone else", client=True))[1], server)


def secret() -> str:
    return get_scheme("standard-webhooks").generate_secret()


async def publish(pool: asyncpg.Pool, endpoint: str, n: int = 1) -> list[str]:
    async with pool.acquire() as conn, conn.transaction():
        return [await outbox.publish(conn, "order.paid", {"n": i}, endpoint=endpoint) for i in range(n)]


async def last_error(pool: asyncpg.Pool, endpoint: str) -> str:
    error = await pool.fetchval("SELECT last_error FROM hookline.deliveries WHERE endpoint = $1 "
                                "AND last_error IS NOT NULL LIMIT 1", endpoint)
    return str(error) if error else ""


@asynccontextmanager
async def running_relay(database_url: str, log_dir: Path, env: dict[str, str] | None = None
                        ) -> AsyncIterator[ServiceProcess]:
    relay = await asyncio.to_thread(relay_process, database_url, log_dir,
                                    env={"HOOKLINE_ALLOW_PRIVATE_NETWORKS": "true", "HOOKLINE_LOG_LEVEL": "DEBUG",
                                         **(env or {})})
    try:
        yield relay
    finally:
        assert relay.stop() == 0, relay.logs()


# -- the configuration and its storage --------------------------------------------------------------


def test_client_tls_is_validated_when_made(pki: Pki) -> None:
    with pytest.raises(EgressError, match="does not belong to the client certificate"):
        ClientTls(pki.client_cert, pki.other_key)
    with pytest.raises(EgressError, match="not a PEM certificate"):
        ClientTls("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n", pki.client_key)
    with pytest.raises(EgressError, match="not a PEM private key"):
        ClientTls(pki.client_cert, "not a key")
    with pytest.raises(EgressError, match="together"):
        ClientTls(pki.client_cert)
    with pytest.raises(EgressError, match="the CA bundle is not a PEM certificate"):
        ClientTls(ca="garbage")
    key = serialization.load_pem_private_key(pki.client_key.encode(), None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"pw")).decode()
    with pytest.raises(EgressError, match="encrypted"):
        ClientTls(pki.client_cert, encrypted)
    tls = ClientTls(pki.client_cert, pki.client_key, pki.ca)
    assert "PRIVATE KEY" not in repr(tls) and tls.subject == "CN=relay-client"


def test_proxy_and_oauth2_are_validated_when_made() -> None:
    with pytest.raises(EgressError, match="must not hold credentials"):
        ProxyConfig(f"http://relay:{PROXY_PASSWORD}@127.0.0.1:3128")
    with pytest.raises(EgressError, match="http:// URL"):
        ProxyConfig("ftp://127.0.0.1:3128")
    with pytest.raises(EgressError, match="user:password"):
        ProxyConfig("http://127.0.0.1:3128", credentials="no-colon")
    with pytest.raises(EgressError, match="token URL"):
        OAuth2ClientCredentials("file:///etc/passwd", "id", CLIENT_SECRET)
    with pytest.raises(EgressError, match="scope"):
        OAuth2ClientCredentials("https://idp.example/token", "id", CLIENT_SECRET, scopes=("two words",))
    with pytest.raises(EgressError, match="client secret"):
        OAuth2ClientCredentials("https://idp.example/token", "id", "")
    with pytest.raises(EgressError, match="not both"):
        EgressConfig(proxy=ProxyConfig("http://127.0.0.1:3128"), direct=True)
    with pytest.raises(EgressError, match="needs a proxy"):
        EgressConfig()
    config = EgressConfig(proxy=ProxyConfig("http://127.0.0.1:3128", f"relay:{PROXY_PASSWORD}"),
                          oauth2=OAuth2ClientCredentials("https://idp.example/token", "id", CLIENT_SECRET))
    assert PROXY_PASSWORD not in repr(config) and CLIENT_SECRET not in repr(config)


async def test_secrets_are_sealed_in_the_row_and_a_rewrite_changes_nothing(pool: asyncpg.Pool, pki: Pki) -> None:
    config = EgressConfig(proxy=ProxyConfig("http://127.0.0.1:3128", f"relay:{PROXY_PASSWORD}", ("localhost",)),
                          tls=ClientTls(pki.client_cert, pki.client_key, pki.ca),
                          oauth2=OAuth2ClientCredentials("https://idp.example/token", "hookline", CLIENT_SECRET,
                                                         ("hooks:write",), "https://api.example"))
    async with pool.acquire() as conn:
        await endpoints.add(conn, "sealed", "https://example.com/hook")
        assert await endpoints.set_egress(conn, "sealed", config)
        row = await conn.fetchval("SELECT egress::text FROM hookline.endpoints WHERE name = 'sealed'")
        for plain in ("PRIVATE KEY", PROXY_PASSWORD, CLIENT_SECRET):
            assert plain not in row
        assert json.loads(row)["tls"]["certificate"] == pki.client_cert  # the public parts in clear
        loaded = {e.name: e for e in await endpoints.load(conn)}["sealed"]
        assert loaded.egress == config
        # The operator re-applies its resources: the same configuration keeps the same ciphertexts.
        assert await endpoints.set_egress(conn, "sealed", config)
        assert await conn.fetchval("SELECT egress::text FROM hookline.endpoints WHERE name = 'sealed'") == row
        # Sealed for this row: copied into another endpoint's row it does not open.
        await endpoints.add(conn, "copy", "https://example.com/hook")
        await conn.execute("UPDATE hookline.endpoints SET egress = $1::text::jsonb WHERE name = 'copy'", row)
        assert "copy" not in {e.name for e in await endpoints.load(conn)}
        assert not await endpoints.set_egress(conn, "missing", config)
        assert await endpoints.set_egress(conn, "sealed", None)
        assert {e.name: e for e in await endpoints.load(conn)}["sealed"].egress is None


async def test_rotate_key_rewraps_the_egress_secrets_too(pool: asyncpg.Pool, pki: Pki, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = secrets_at_rest.new_key_line(), secrets_at_rest.new_key_line()

    def use_keys(*keys: str) -> None:
        path = tmp_path / f"keys-{len(list(tmp_path.glob('keys-*')))}"
        path.write_text("\n".join(keys) + "\n")
        monkeypatch.setenv(secrets_at_rest.KEYS_FILE_ENV, str(path))

    config = EgressConfig(proxy=ProxyConfig("http://127.0.0.1:3128", f"relay:{PROXY_PASSWORD}"),
                          tls=ClientTls(pki.client_cert, pki.client_key),
                          oauth2=OAuth2ClientCredentials("https://idp.example/token", "hookline", CLIENT_SECRET))
    use_keys(old)
    async with pool.acquire() as conn:
        await endpoints.add(conn, "rotated", "https://example.com/hook")
        await endpoints.set_egress(conn, "rotated", config)
        use_keys(new, old)
        report = await stored_secrets.reseal_all(conn, secrets_at_rest.required_ring("test"), rewrap=True)
        assert report.rewrapped == 4  # the signing secret and the three egress secrets
        use_keys(new)  # the old key is gone: everything still opens
        assert {e.name: e for e in await endpoints.load(conn)}["rotated"].egress == config


# -- mTLS ---------------------------------------------------------------------------------------------


async def test_the_relay_presents_the_endpoints_client_certificate(database_url: str, pool: asyncpg.Pool,
                                                                   log_dir: Path, pki: Pki) -> None:
    async with TestEndpoint(secret()) as ep:
        with TlsTerminator(pki.server, ep.port) as front:
            url = f"https://localhost:{front.port}/hook"
            async with pool.acquire() as conn:
                for name, tls in (("with-cert", ClientTls(pki.client_cert, pki.client_key, pki.ca)),
                                  ("no-cert", ClientTls(ca=pki.ca)),
                                  ("wrong-ca", ClientTls(pki.client_cert, pki.client_key, pki.other_ca))):
                    await endpoints.add(conn, name, url, secret=ep.secret, initial_delay=0.2, max_delay=0.5)
                    assert await endpoints.set_egress(conn, name, EgressConfig(tls=tls))
            async with running_relay(database_url, log_dir) as relay:
                delivered = await publish(pool, "with-cert", 5)
                await publish(pool, "no-cert")
                await publish(pool, "wrong-ca")
                await eventually(lambda: len(ep.delivered()) == 5, timeout=20)
                no_cert = await eventually(lambda: last_error(pool, "no-cert"), timeout=20)
                wrong_ca = await eventually(lambda: last_error(pool, "wrong-ca"), timeout=20)
    assert sorted(r.webhook_id for r in ep.delivered()) == sorted(delivered) and ep.invalid == []
    print(f"without a client certificate: {no_cert}\nwith the wrong CA: {wrong_ca}\nthe server saw: {front.failures}")
    assert "TLS:" in no_cert and "CERTIFICATE_REQUIRED" in no_cert, no_cert
    assert any("PEER_DID_NOT_RETURN_A_CERTIFICATE" in f for f in front.failures)
    assert "TLS:" in wrong_ca and "CERTIFICATE_VERIFY_FAILED" in wrong_ca, wrong_ca
    logs = relay.logs()
    assert "PRIVATE KEY" not in logs and pki.client_key.splitlines()[1] not in logs


# -- per-endpoint proxy -------------------------------------------------------------------------------


async def test_an_endpoints_proxy_overrides_the_installs(database_url: str, pool: asyncpg.Pool, log_dir: Path,
                                                         pki: Pki) -> None:
    async with ConnectProxy() as install, ConnectProxy(credentials=f"relay:{PROXY_PASSWORD}") as own, \
            TestEndpoint(secret()) as tls_ep, TestEndpoint(secret()) as plain:
        with TlsTerminator(pki.server, tls_ep.port) as front:
            async with pool.acquire() as conn:
                await endpoints.add(conn, "own-proxy", f"https://localhost:{front.port}/hook", secret=tls_ep.secret)
                await endpoints.set_egress(conn, "own-proxy", EgressConfig(
                    proxy=ProxyConfig(own.url, f"relay:{PROXY_PASSWORD}"),
                    tls=ClientTls(pki.client_cert, pki.client_key, pki.ca)))
                await endpoints.add(conn, "direct", plain.url, secret=plain.secret)
                await endpoints.set_egress(conn, "direct", EgressConfig(direct=True))
            async with running_relay(database_url, log_dir, {"HOOKLINE_EGRESS_PROXY": install.url}) as relay:
                mtls_ids = await publish(pool, "own-proxy", 2)
                direct_ids = await publish(pool, "direct", 2)
                await eventually(lambda: len(tls_ep.delivered()) == 2 and len(plain.delivered()) == 2, timeout=20)
    assert sorted(r.webhook_id for r in tls_ep.delivered()) == sorted(mtls_ids) and tls_ep.invalid == []
    assert sorted(r.webhook_id for r in plain.delivered()) == sorted(direct_ids) and plain.invalid == []
    # mTLS inside the endpoint's own tunnel, to the checked address; the install's proxy saw nothing.
    assert {a.authority for a in own.asked} == {f"127.0.0.1:{front.port}"}
    assert all(a.authorization and a.authorization.startswith("Basic ") for a in own.asked)
    assert install.asked == [] and front.failures == []
    assert PROXY_PASSWORD not in relay.logs()


async def test_a_private_target_is_blocked_through_an_endpoints_proxy(database_url: str, pool: asyncpg.Pool,
                                                                     log_dir: Path) -> None:
    async with ConnectProxy() as own, TestEndpoint(secret()) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "guarded", ep.url, secret=ep.secret, initial_delay=0.2, max_delay=0.5)
            await endpoints.set_egress(conn, "guarded", EgressConfig(proxy=ProxyConfig(own.url)))
        relay = await asyncio.to_thread(relay_process, database_url, log_dir)  # private networks not allowed
        try:
            await publish(pool, "guarded")
            error = await eventually(lambda: last_error(pool, "guarded"), timeout=20)
        finally:
            assert relay.stop() == 0, relay.logs()
    assert "internal address" in error and own.asked == [] and ep.received == []


# -- OAuth2 client credentials ------------------------------------------------------------------------


def oauth2(server: TokenServer, client_id: str, client_secret: str = CLIENT_SECRET) -> EgressConfig:
    return EgressConfig(oauth2=OAuth2ClientCredentials(server.url, client_id, client_secret, ("hooks:write",),
                                                       "https://receiver.example"))


def statuses(ep: TestEndpoint, webhook_id: str) -> list[int]:
    return [r.status for r in ep.received if r.webhook_id == webhook_id]


async def test_one_token_for_many_deliveries_refreshed_once_on_401(database_url: str, pool: asyncpg.Pool,
                                                                   log_dir: Path) -> None:
    async with token_server({"hookline": CLIENT_SECRET}) as tokens:
        async with TestEndpoint(secret(), tokens.answer) as ep:
            async with pool.acquire() as conn:
                await endpoints.add(conn, "oauth", ep.url, secret=ep.secret, initial_delay=0.2, max_delay=0.5)
                await endpoints.set_egress(conn, "oauth", oauth2(tokens, "hookline"))
            async with running_relay(database_url, log_dir) as relay:
                first = await publish(pool, "oauth", 20)  # claimed together: they wait for one fetch
                await eventually(lambda: len(ep.delivered()) == 20, timeout=20)
                assert len(tokens.issued) == 1, tokens.issued
                tokens.revoked.add(tokens.issued[0])  # the receiver stops accepting it
                [refreshed] = await publish(pool, "oauth")
                await eventually(lambda: len(ep.delivered()) == 21, timeout=20)
        assert len(tokens.issued) == 2 and ep.invalid == []
        assert statuses(ep, refreshed) == [401, 200]  # refreshed once, sent again in the same attempt
        assert await pool.fetchval("SELECT d.attempts FROM hookline.deliveries AS d JOIN hookline.outbox AS o "
                                   "ON o.id = d.outbox_id WHERE o.event_id = $1", refreshed) == 1
        assert all(statuses(ep, i) == [200] for i in first)
        assert tokens.forms[0] == {"grant_type": "client_credentials", "scope": "hooks:write",
                                   "audience": "https://receiver.example"}
        logs = relay.logs()
    for text in (CLIENT_SECRET, *tokens.issued):
        assert text not in logs


async def test_a_second_401_fails_the_attempt(database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    async with token_server({"hookline": CLIENT_SECRET}, delay=0.0) as tokens, \
            TestEndpoint(secret(), lambda n, r: Answer(401)) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "refusing", ep.url, secret=ep.secret, max_attempts=1)
            await endpoints.set_egress(conn, "refusing", oauth2(tokens, "hookline"))
        async with running_relay(database_url, log_dir):
            [event_id] = await publish(pool, "refusing")
            await eventually(lambda: pool.fetchval("SELECT status = 'dead' FROM hookline.deliveries "
                                                   "WHERE endpoint = 'refusing'"), timeout=20)
    assert statuses(ep, event_id) == [401, 401] and len(tokens.issued) == 2
    assert (await last_error(pool, "refusing")).startswith("HTTP 401")


async def test_a_token_is_fetched_again_when_it_expires(database_url: str, pool: asyncpg.Pool,
                                                         log_dir: Path) -> None:
    async with token_server({"hookline": CLIENT_SECRET}, expires_in=2, delay=0.0) as tokens, \
            TestEndpoint(secret(), tokens.answer) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "short-lived", ep.url, secret=ep.secret)
            await endpoints.set_egress(conn, "short-lived", oauth2(tokens, "hookline"))
        async with running_relay(database_url, log_dir):
            await publish(pool, "short-lived")
            await eventually(lambda: len(ep.delivered()) == 1, timeout=20)
            await asyncio.sleep(2.5)  # past expires_in: the next delivery needs a new token
            await publish(pool, "short-lived")
            await eventually(lambda: len(ep.delivered()) == 2, timeout=20)
    assert len(tokens.issued) == 2
    assert [r.headers["authorization"] for r in ep.delivered()] == [f"Bearer {t}" for t in tokens.issued]


async def test_a_bad_client_secret_is_a_clear_failure_without_the_secret(database_url: str, pool: asyncpg.Pool,
                                                                         log_dir: Path) -> None:
    wrong = "wrong-client-secret-3c1"
    async with token_server({"hookline": CLIENT_SECRET}, delay=0.0) as tokens, TestEndpoint(secret()) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "bad-secret", ep.url, secret=ep.secret, initial_delay=0.2, max_delay=0.5)
            await endpoints.set_egress(conn, "bad-secret", oauth2(tokens, "hookline", wrong))
        async with running_relay(database_url, log_dir) as relay:
            await publish(pool, "bad-secret")
            error = await eventually(lambda: last_error(pool, "bad-secret"), timeout=20)
        logs = relay.logs()
    print(error)
    assert "OAuth2 token endpoint" in error and "HTTP 401 (invalid_client)" in error and "'hookline'" in error
    assert ep.received == []  # nothing went to the endpoint without a token
    for text in (error, logs):
        assert wrong not in text and CLIENT_SECRET not in text


async def test_the_token_endpoint_is_behind_the_private_address_guard(database_url: str, pool: asyncpg.Pool,
                                                                       log_dir: Path) -> None:
    async with token_server({"hookline": CLIENT_SECRET}, delay=0.0) as tokens:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "guarded-token", "http://127.0.0.1:9/hook", initial_delay=0.2, max_delay=0.5)
            await endpoints.set_egress(conn, "guarded-token", oauth2(tokens, "hookline"))
        relay = await asyncio.to_thread(relay_process, database_url, log_dir)  # private networks not allowed
        try:
            await publish(pool, "guarded-token")
            error = await eventually(lambda: last_error(pool, "guarded-token"), timeout=20)
        finally:
            assert relay.stop() == 0, relay.logs()
    assert "OAuth2 token endpoint" in error and "internal address" in error, error
    assert tokens.forms == []


# -- the command line ---------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path, pki: Pki) -> Iterator[dict[str, Path]]:
    paths = {"cert": tmp_path / "client.pem", "key": tmp_path / "client.key", "ca": tmp_path / "ca.pem",
             "wrong-key": tmp_path / "other.key", "proxy": tmp_path / "proxy-credentials",
             "oauth": tmp_path / "client-secret"}
    for name, text in (("cert", pki.client_cert), ("key", pki.client_key), ("ca", pki.ca),
                       ("wrong-key", pki.other_key), ("proxy", f"relay:{PROXY_PASSWORD}\n"),
                       ("oauth", CLIENT_SECRET + "\n")):
        paths[name].write_text(text)
    yield paths


async def test_the_cli_sets_shows_and_clears_egress(database_url: str, pool: asyncpg.Pool,
                                                    files: dict[str, Path]) -> None:
    async with pool.acquire() as conn:
        await endpoints.add(conn, "cli", "https://example.com/hook")
    run = lambda *args: asyncio.to_thread(hookline_cli, database_url, "endpoints", *args)  # noqa: E731
    done = await run("egress", "cli", "--proxy", "http://127.0.0.1:3128",
                     "--proxy-credentials-file", str(files["proxy"]), "--client-cert", str(files["cert"]),
                     "--client-key", str(files["key"]), "--ca", str(files["ca"]),
                     "--oauth2-token-url", "https://idp.example/token", "--oauth2-client-id", "hookline",
                     "--oauth2-client-secret-file", str(files["oauth"]), "--oauth2-scope", "hooks:write")
    assert done.returncode == 0, done.stderr
    listed = await run("list")
    assert listed.returncode == 0, listed.stderr
    print(listed.stdout)
    line = next(line for line in listed.stdout.splitlines() if line.startswith("cli "))
    assert "proxy 127.0.0.1:3128 (credentials)" in line and "client cert CN=relay-client" in line
    assert "oauth2 hookline@idp.example" in line
    before = await pool.fetchval("SELECT egress::text FROM hookline.endpoints WHERE name = 'cli'")
    bad = await run("egress", "cli", "--client-cert", str(files["cert"]), "--client-key", str(files["wrong-key"]))
    assert bad.returncode != 0 and "does not belong to the client certificate" in bad.stderr, bad.stderr
    both = await run("egress", "cli", "--proxy", "http://127.0.0.1:3128", "--direct")
    assert both.returncode != 0
    assert await pool.fetchval("SELECT egress::text FROM hookline.endpoints WHERE name = 'cli'") == before
    for result in (done, listed, bad, both):
        for text in (PROXY_PASSWORD, CLIENT_SECRET, "PRIVATE KEY"):
            assert text not in result.stdout + result.stderr
    cleared = await run("egress", "cli", "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert await pool.fetchval("SELECT egress FROM hookline.endpoints WHERE name = 'cli'") is None
