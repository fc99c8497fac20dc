"""Hookline behind a real PgBouncer (issue 27, item 5): in transaction mode, with the session URL for
LISTEN, leader election and migrations, events come in, are handled and relayed, none lost and each
effect once; without a session URL it refuses to start; in session mode one URL is enough."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline.core import db
from hookline.core.embedded import free_port
from support.endpoints import TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.pgbouncer import PgBouncer
from support.postgres import PgServer
from support.processes import ServiceProcess, hookline_cli
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

EVENTS = 2000
ENDPOINT_SECRET = "whsec_" + base64.b64encode(b"pooler-test-endpoint-secret-0001").decode()
# No poll in the test's time: an idle worker or relay finds new work by its LISTEN wake-up only.
NO_POLL = "600"


@pytest.fixture(scope="module")
def transaction_bouncer(pg_server: PgServer) -> Iterator[PgBouncer]:
    with PgBouncer(pg_server.admin_url, "transaction", pool_size=10) as bouncer:
        yield bouncer


@pytest.fixture(scope="module")
def session_bouncer(pg_server: PgServer) -> Iterator[PgBouncer]:
    with PgBouncer(pg_server.admin_url, "session", pool_size=40) as bouncer:
        yield bouncer


def _service(command: str, env: dict[str, str], log_dir: Path, *extra: str) -> ServiceProcess:
    port = free_port()
    return ServiceProcess([command, "--host", "127.0.0.1", "--port", str(port), *extra], env["HOOKLINE_DATABASE_URL"],
                          log_dir, port=port, env=env).start("/readyz")


async def _send(receiver: ServiceProcess, count: int, prefix: str) -> None:
    limit = asyncio.Semaphore(32)

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        body = json.dumps({"id": f"{prefix}_{i}", "type": "order.paid"})
        async with limit, http.post(f"{receiver.url}/webhooks/orders", data=body) as r:
            assert r.status == 200, await r.text()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one(http, i) for i in range(count)))


async def test_transaction_mode_ingest_drain_relay(transaction_bouncer: PgBouncer, database_url, pool,
                                                   log_dir) -> None:
    pooled = transaction_bouncer.url_for(database_url)
    env = {"HOOKLINE_DATABASE_URL": pooled, "HOOKLINE_DATABASE_SESSION_URL": database_url,
           "HOOKLINE_DATABASE_POOLING": "transaction"}
    await create_effect_tables(pool)
    apply_provider(database_url, "orders", 'signature: {scheme: none}\nhandler: "support.handlers:publish_shipped"')
    procs: list[ServiceProcess] = []
    async with TestEndpoint(ENDPOINT_SECRET) as endpoint:
        try:
            migrated = hookline_cli(pooled, "migrate", env=env)
            assert migrated.returncode == 0, migrated.stderr
            added = hookline_cli(pooled, "endpoints", "add", "partner", "--url", endpoint.url,
                                 "--event-type", "order.*", "--secret", ENDPOINT_SECRET, env=env)
            assert added.returncode == 0, added.stderr
            receiver = _service("receiver", env, log_dir)
            procs += [receiver, _service("worker", env, log_dir, "--sweep", "--poll-interval", NO_POLL),
                      _service("relay", env, log_dir, "--allow-private-networks", "--poll-interval", NO_POLL)]
            await _send(receiver, EVENTS, "ord")
            await eventually(lambda: len(endpoint.delivered()), equals=EVENTS, timeout=120)
        finally:
            for p in procs:
                p.stop()
        logs = "".join(p.logs() for p in procs)
    assert "prepared statement" not in logs, logs[-4000:]
    # Each event handled once (its effect committed with it), each relayed event's effect applied once.
    effects = await pool.fetch("SELECT event_id, count(*) AS n FROM test_effects GROUP BY event_id")
    assert {r["event_id"] for r in effects} == {f"ord_{i}" for i in range(EVENTS)}
    assert {r["n"] for r in effects} == {1}
    assert len(endpoint.effects) == len(set(endpoint.effects)) == EVENTS
    assert {r.body["data"]["source_event"] for r in endpoint.delivered()} == {f"ord_{i}" for i in range(EVENTS)}
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status <> 'done'") == 0
    # Nothing Hookline ran left session state on the server connections other clients of PgBouncer get.
    conn = await asyncpg.connect(pooled, statement_cache_size=0)
    try:
        paths = {await conn.fetchval("SHOW search_path") for _ in range(20)}
    finally:
        await conn.close()
    assert paths == {'"$user", public'}


@pytest.mark.parametrize("command", [["receiver", "--port", "0"], ["worker", "--port", "0"], ["migrate"]])
async def test_transaction_mode_without_session_url_refuses(transaction_bouncer: PgBouncer, database_url,
                                                            command: list[str]) -> None:
    result = hookline_cli(transaction_bouncer.url_for(database_url), *command,
                          env={"HOOKLINE_DATABASE_POOLING": "transaction"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "hookline: HOOKLINE_DATABASE_POOLING=transaction: set HOOKLINE_DATABASE_SESSION_URL to a direct "
        "(or session-mode) Postgres URL for LISTEN, leader election and migrations")


async def test_session_mode_single_url(session_bouncer: PgBouncer, database_url, pool, log_dir) -> None:
    pooled = session_bouncer.url_for(database_url)
    # The pinned search path and the plan settings reach a session-mode pooler's sessions as SETs
    # (PgBouncer rejects them as start-up parameters).
    pinned = await db.create_pool(pooled, min_size=1, max_size=2, pinned_search_path=True, generic_plans=True)
    try:
        assert await pinned.fetchval("SHOW search_path") == "pg_catalog, pg_temp"
        assert await pinned.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
    finally:
        await pinned.close()
    env = {"HOOKLINE_DATABASE_URL": pooled}
    await create_effect_tables(pool)
    apply_provider(database_url, "orders",
                   'signature: {scheme: none}\nhandler: "support.handlers:record_effect_in_its_transaction"')
    procs: list[ServiceProcess] = []
    try:
        receiver = _service("receiver", env, log_dir)
        procs += [receiver, _service("worker", env, log_dir, "--sweep", "--poll-interval", NO_POLL)]
        await _send(receiver, EVENTS // 4, "s")
        await eventually(lambda: pool.fetchval("SELECT count(*) FROM test_effects"), equals=EVENTS // 4, timeout=60)
    finally:
        for p in procs:
            p.stop()
    effects = await pool.fetch("SELECT event_id, count(*) AS n FROM test_effects GROUP BY event_id")
    assert {r["event_id"] for r in effects} == {f"s_{i}" for i in range(EVENTS // 4)}
    assert {r["n"] for r in effects} == {1}


async def test_transaction_mode_keeps_a_search_path_pinned_on_the_role(transaction_bouncer: PgBouncer,
                                                                       database_url: str, pool: asyncpg.Pool) -> None:
    """What docs/postgres.md recommends for service roles behind a transaction pooler: the role's own
    setting applies to every server session PgBouncer opens, which Hookline's pool (sending no SETs) keeps."""
    database = database_url.rsplit("/", 1)[1]
    await pool.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{database}" SET search_path = pg_catalog, pg_temp')
    pooled = await db.create_pool(transaction_bouncer.url_for(database_url), min_size=4, max_size=4,
                                  pinned_search_path=True, generic_plans=True, transaction_pooling=True)
    try:
        paths = await asyncio.gather(*(pooled.fetchval("SHOW search_path") for _ in range(40)))
        plans = await asyncio.gather(*(pooled.fetchval("SHOW plan_cache_mode") for _ in range(40)))
    finally:
        await pooled.close()
    assert set(paths) == {"pg_catalog, pg_temp"}
    assert set(plans) == {"auto"}  # no generic-plan SETs through a transaction pooler
