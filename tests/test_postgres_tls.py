"""Every connection Hookline opens, over TLS with sslmode=verify-full (issue 27): the CLI, the receiver,
a worker (its pool, LISTEN connection and leader lease), the relay and the operator's pool, checked on
the server's side in pg_stat_ssl; and the clear one-line failures of a wrong CA and a wrong host name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import kopf
import pytest

from support.endpoints import TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.processes import ServiceProcess, hookline_cli, receiver, relay, worker
from support.senders import STRIPE_SECRET, stripe_sig
from support.tls import CERT_ROLE, PASSWORD_ROLE, TLSServer, tls_server
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

PARTNER_SECRET = "whsec_dGxzLXRlc3QtcGFydG5lci1zZWNyZXQtMDAwMQ=="


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    server = tls_server(tmp_path_factory.mktemp("tls"))
    try:
        yield server
    finally:
        server.server.stop("immediate")


@pytest.fixture
async def admin(tls: TLSServer) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(tls.superuser_url())
    try:
        yield conn
    finally:
        await conn.close()


async def backends(conn: asyncpg.Connection, role: str) -> list[asyncpg.Record]:
    """Every other session of ``role``, with its TLS state as the server sees it."""
    return await conn.fetch("""
        SELECT a.pid, s.ssl, s.version, s.client_dn FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
        WHERE a.usename = $1 AND a.pid <> pg_backend_pid()""", role)


async def test_the_cli_and_every_service_work_over_verify_full(tls: TLSServer, admin: asyncpg.Connection,
                                                               log_dir: Path) -> None:
    migrated = hookline_cli(tls.password_url(), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    owner = await asyncpg.connect(tls.password_url())
    try:
        await create_effect_tables(owner)  # the services' role is a member of the owner's
    finally:
        await owner.close()
    # The services log in with a client certificate and no password.
    url = tls.cert_url()
    apply_provider(url, "orders", f'signature: {{scheme: stripe, secrets: ["{STRIPE_SECRET}"]}}\n'
                                  'handler: "support.handlers:publish_shipped"')
    procs: list[ServiceProcess] = []
    async with TestEndpoint(PARTNER_SECRET) as endpoint:
        try:
            added = hookline_cli(url, "endpoints", "add", "partner", "--url", endpoint.url, "--event-type",
                                 "order.*", "--secret", PARTNER_SECRET)
            assert added.returncode == 0, added.stderr
            ours = receiver(url, log_dir)
            procs += [ours, worker(url, log_dir, "--sweep"), relay(url, log_dir, "--allow-private-networks")]
            async with aiohttp.ClientSession() as http:
                for i in range(10):
                    body = json.dumps({"id": f"ord_{i}", "type": "order.paid"}).encode()
                    async with http.post(f"{ours.url}/webhooks/orders", data=body, headers=stripe_sig(body)) as r:
                        assert r.status == 200, await r.text()
            await eventually(lambda: len({r.webhook_id for r in endpoint.received}), equals=10, timeout=60)
            # The sweeping worker and the relay hold the leases of their scopes, on their lease connections.
            await eventually(lambda: admin.fetchval(
                "SELECT array_agg(scope ORDER BY scope) FROM hookline.maintenance_leaders WHERE expires_at > now()"),
                equals=["inbox", "outbox", "partitions"], timeout=30)
            sessions = await backends(admin, CERT_ROLE)
            # Three pools, the worker's and relay's LISTEN connections and the lease, at least.
            assert len(sessions) >= 6
            assert all(s["ssl"] and s["version"].startswith("TLSv1.") for s in sessions), sessions
            assert {s["client_dn"] for s in sessions} == {f"/CN={CERT_ROLE}"}
        finally:
            for p in procs:
                p.stop()
    assert await admin.fetchval("SELECT count(*) FROM test_effects") == 10
    status = hookline_cli(url, "status")
    assert status.returncode == 0, status.stderr
    assert "orders" in status.stdout


async def test_the_operators_pool_connects_over_tls(tls: TLSServer, admin: asyncpg.Connection,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from hookline_operator import handlers

    assert hookline_cli(tls.password_url(), "migrate").returncode == 0
    monkeypatch.setenv("HOOKLINE_DATABASE_URL", tls.password_url())
    pool = await handlers.open_pool()
    try:
        assert await pool.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
        assert all(s["ssl"] for s in await backends(admin, PASSWORD_ROLE))
    finally:
        await pool.close()
    # A wrong CA ends the operator's startup for good (kopf would retry any other error), with the line.
    monkeypatch.setenv("HOOKLINE_DATABASE_URL", tls.password_url(ca=tls.other_ca))
    with pytest.raises(kopf.PermanentError, match="certificate verify failed"):
        await handlers.open_pool()


def _failed_handshakes(tls: TLSServer) -> int:
    """Connections the server saw end during the TLS handshake (the client refused its certificate)."""
    return tls.log.read_text(errors="replace").count("could not accept SSL connection")


async def _settled_handshakes(tls: TLSServer) -> int:
    """_failed_handshakes once the server's log stopped growing: it writes the line a moment after the
    handshake failed, so an earlier test's refusal can land after a count taken at once."""
    count = _failed_handshakes(tls)
    while True:
        await asyncio.sleep(0.5)
        now = _failed_handshakes(tls)
        if now == count:
            return count
        count = now


def _assert_one_clear_line(output: str, tls: TLSServer) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    line = lines[0]
    assert line.startswith("hookline: cannot connect to postgresql://"), line
    assert "certificate verify failed" in line and "host 127.0.0.1" in line, line
    assert f"sslrootcert {tls.other_ca}" in line, line
    assert tls.password not in line, line


async def test_a_wrong_ca_fails_once_with_one_clear_line(tls: TLSServer, log_dir: Path) -> None:
    url = tls.password_url(ca=tls.other_ca)
    before = await _settled_handshakes(tls)
    migrated = hookline_cli(url, "migrate")
    assert migrated.returncode == 2
    _assert_one_clear_line(migrated.stderr, tls)
    assert await _settled_handshakes(tls) == before + 1  # one attempt, no retry

    # A service exits at once, status 2, rather than retrying: a certificate that does not verify is
    # configuration, and a restarting pod shows the line under its orchestrator's back-off.
    before = await _settled_handshakes(tls)
    service = worker(url, log_dir, wait=False)
    try:
        assert service.proc is not None
        assert service.proc.wait(60) == 2
    finally:
        service.stop()
    _assert_one_clear_line(service.logs(), tls)
    # The pool's first connection (asyncpg opens the rest only once it is up), and nothing after it.
    assert await _settled_handshakes(tls) == before + 1


async def test_a_multi_host_url_names_every_host_it_tried(tls: TLSServer) -> None:
    # asyncpg tries each host in turn and raises the last one's error: the line names them all.
    port = tls.server.port
    url = tls.password_url(ca=tls.other_ca).replace(f"@127.0.0.1:{port}/", f"@localhost:{port},127.0.0.1:{port}/")
    before = await _settled_handshakes(tls)
    migrated = hookline_cli(url, "migrate")
    assert migrated.returncode == 2
    _assert_one_clear_line(migrated.stderr, tls)
    assert "host 127.0.0.1 (the last of localhost, 127.0.0.1 tried)" in migrated.stderr, migrated.stderr
    assert await _settled_handshakes(tls) == before + 2  # each host once, no retry


async def test_a_host_the_certificate_does_not_name_fails_clearly(tmp_path: Path) -> None:
    other = tls_server(tmp_path, names=("db.internal.example",))
    try:
        result = hookline_cli(other.password_url(), "migrate")
    finally:
        other.server.stop("immediate")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "not valid for host 127.0.0.1" in lines[0] and other.password not in lines[0], lines[0]

