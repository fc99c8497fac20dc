"""A multi-host URL with ``target_session_attrs=read-write`` (what HA Postgres hands out: each node's
address, the primary the one that takes writes) reaches the primary from every connection Hookline
opens: the CLI and migrations, the services' pools, their LISTEN and leader connections, and the
tenant URLs the operator writes. Here the first host is a real streaming standby."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline.core.embedded import EmbeddedPostgres
from hookline_operator import tenancy
from support.endpoints import TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.postgres import start_standby, with_database
from support.processes import ServiceProcess, hookline_cli, receiver, relay, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio

SECRET = "whsec_" + base64.b64encode(b"multi-host-endpoint-secret-00001").decode()


class Pair:
    def __init__(self, primary: EmbeddedPostgres, standby: EmbeddedPostgres) -> None:
        self.primary, self.standby = primary, standby

    def url(self, database: str, attrs: str | None = "read-write") -> str:
        """The standby's address first, as a node list in no particular order has it half the time."""
        query = f"?target_session_attrs={attrs}" if attrs else ""
        return (f"postgresql://postgres:{self.primary.password}@127.0.0.1:{self.standby.port},"
                f"127.0.0.1:{self.primary.port}/{database}{query}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    primary = EmbeddedPostgres(tmp_path_factory.mktemp("multi-host-primary"))
    primary.start()
    standby = None
    try:
        standby = start_standby(primary, tmp_path_factory.mktemp("multi-host-standby"))
        yield Pair(primary, standby)
    finally:
        if standby is not None:
            standby.stop("immediate")
        primary.stop("immediate")


@pytest.fixture
async def database(pair: Pair) -> AsyncIterator[str]:
    """An empty database on the primary, streamed to the standby."""
    admin = await asyncpg.connect(pair.primary.url)
    try:
        await admin.execute("DROP DATABASE IF EXISTS multihost WITH (FORCE)")
        await admin.execute("CREATE DATABASE multihost")
        yield "multihost"
    finally:
        await admin.close()


async def test_without_the_attribute_the_standby_refuses_and_with_it_the_primary_migrates(
        pair: Pair, database: str) -> None:
    refused = hookline_cli(pair.url(database, attrs=None), "migrate")
    assert refused.returncode != 0
    assert refused.returncode == 2 and refused.stderr.startswith("hookline: the database server is a read-only "
                                                                 "standby: point HOOKLINE_DATABASE_URL at the primary")
    assert len(refused.stderr.strip().splitlines()) == 1
    # A service says the same at start and exits: every write would fail, one by one.
    service = hookline_cli(pair.url(database, attrs=None), "worker", "--port", "0")
    assert service.returncode == 2 and "is a read-only standby" in service.stderr, service.stderr

    migrated = hookline_cli(pair.url(database), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("applied: 0001_")
    status = hookline_cli(pair.url(database), "status")
    assert status.returncode == 0, status.stdout + status.stderr


async def test_services_ingest_drain_and_deliver_through_it(pair: Pair, database: str, log_dir: Path) -> None:
    url = pair.url(database)
    assert hookline_cli(url, "migrate").returncode == 0
    primary = await asyncpg.connect(with_database(pair.primary.url, database))
    procs: list[ServiceProcess] = []
    try:
        await create_effect_tables(primary)
        apply_provider(url, "orders", 'signature: {scheme: none}\nhandler: "support.handlers:publish_shipped"')
        async with TestEndpoint(SECRET) as endpoint:
            added = hookline_cli(url, "endpoints", "add", "partner", "--url", endpoint.url,
                                 "--event-type", "order.*", "--secret", SECRET)
            assert added.returncode == 0, added.stderr
            ours = receiver(url, log_dir)
            procs.append(ours)
            # The worker waits on NOTIFY (its LISTEN connection) and elects a leader (the sweeper's).
            procs.append(worker(url, log_dir, "--sweep"))
            procs.append(relay(url, log_dir, "--allow-private-networks"))
            async with aiohttp.ClientSession() as http:
                for i in range(20):
                    body = json.dumps({"id": f"ord_{i}", "type": "order.paid"})
                    async with http.post(f"{ours.url}/webhooks/orders", data=body) as r:
                        assert r.status == 200
            await eventually(lambda: len({d.webhook_id for d in endpoint.delivered()}), equals=20, timeout=60)
            leaders = await primary.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                                             "AND query LIKE '%LISTEN%'", database)
            assert leaders >= 1  # the worker's LISTEN session lives on the primary
    finally:
        for p in procs:
            p.stop()
    try:
        assert await primary.fetchval("SELECT count(*) FROM test_effects") == 20
        assert await primary.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'") == 20
        assert {r["event_id"] for r in await primary.fetch("SELECT event_id FROM hookline.outbox")} \
            == {d.webhook_id for d in endpoint.delivered()}
    finally:
        await primary.close()


async def _caught_up(pair: Pair, lsn: str) -> None:
    standby = await asyncpg.connect(pair.standby.url)
    try:
        await eventually(lambda: standby.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", lsn),
                         what="the standby replaying the primary's WAL")
    finally:
        await standby.close()


async def test_the_operators_tenant_urls_keep_every_host(pair: Pair, database: str) -> None:
    url = pair.url(database)
    assert hookline_cli(url, "migrate").returncode == 0
    role = tenancy.role_name(database, "5f0c7a52-0000-4000-8000-000000000001")
    tenant = tenancy.tenant_url(url, role, "tenant-password")
    assert tenant == (f"postgresql://{role}:tenant-password@127.0.0.1:{pair.standby.port},"
                      f"127.0.0.1:{pair.primary.port}/{database}?target_session_attrs=read-write")
    owner = await asyncpg.connect(url)
    try:
        assert await tenancy.ensure_role(owner, role, "team-a", "5f0c7a52-0000-4000-8000-000000000001",
                                         "tenant-password") is None
        # The first host tried is the standby, and a login that fails there is not tried elsewhere
        # (libpq does the same): the role must have reached it.
        await _caught_up(pair, await owner.fetchval("SELECT pg_current_wal_lsn()::text"))
    finally:
        await owner.close()
    conn = await asyncpg.connect(tenant)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
        assert await conn.fetchval("SELECT current_user") == role
    finally:
        await conn.close()
