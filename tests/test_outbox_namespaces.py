"""The outbox per namespace (migration 0030): two real tenants, each logged in with its own
password-checked role, publish and read only their namespace's events, endpoints and deliveries;
the platform's login keeps its install-wide endpoints and may publish into a namespace."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from hookline import outbox
from hookline.core import migrations
from hookline.core.embedded import EmbeddedPostgres
from hookline_operator import tenancy
from support.postgres import with_database
from support.processes import hookline_cli


@pytest.fixture
async def owner(scram_server: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    name = f"ns_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(scram_server.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(with_database(scram_server.url, name))
    await migrations.migrate(conn)
    try:
        yield conn
    finally:
        roles = [r["role_name"] for r in await conn.fetch("SELECT role_name FROM hookline.tenants")]
        await conn.close()
        admin = await asyncpg.connect(scram_server.url)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            for role in roles:
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await admin.close()


async def add_endpoint(conn: asyncpg.Connection, namespace: str | None, name: str, event_types: list[str]) -> str:
    stored = name if namespace is None else f"{namespace}/{name}"
    await conn.execute(
        "INSERT INTO hookline.endpoints (name, url, event_types, secrets, namespace, resource_name, owner_uid) "
        "VALUES ($1, 'https://x.invalid/', $2, '[]'::jsonb, $3, $4, $5)",
        stored, event_types, namespace, None if namespace is None else name,
        None if namespace is None else str(uuid.uuid4()))
    return stored


async def login(owner: asyncpg.Connection, server: EmbeddedPostgres, namespace: str) -> asyncpg.Connection:
    """A tenant of ``namespace``, made the way the operator makes one, logged in with its password."""
    database = await owner.fetchval("SELECT current_database()")
    uid = str(uuid.uuid4())
    role = tenancy.role_name(database, uid)
    password = f"pw-{uuid.uuid4().hex}"
    assert await tenancy.ensure_role(owner, role, namespace, uid, password) is None
    return await asyncpg.connect(tenancy.tenant_url(with_database(server.url, database), role, password))


async def deliveries_of(conn: asyncpg.Connection, event_id: str) -> set[str]:
    rows = await conn.fetch("SELECT d.endpoint FROM hookline.deliveries AS d JOIN hookline.outbox AS o "
                            "ON o.id = d.outbox_id WHERE o.event_id = $1", event_id)
    return {r["endpoint"] for r in rows}


async def test_each_tenant_publishes_to_and_reads_only_its_own_namespace(owner: asyncpg.Connection,
                                                                        scram_server: EmbeddedPostgres) -> None:
    # Both teams have an endpoint called "partner"; "team" is a prefix of "team-a".
    a_partner = await add_endpoint(owner, "team-a", "partner", ["*"])
    b_partner = await add_endpoint(owner, "team-b", "partner", ["*"])
    await add_endpoint(owner, "team", "partner", ["*"])
    await add_endpoint(owner, None, "platform", ["*"])
    team_a = await login(owner, scram_server, "team-a")
    team_b = await login(owner, scram_server, "team-b")
    try:
        from_a = await outbox.publish(team_a, "invoice.paid", {"n": 1}, aggregate_type="invoice", aggregate_id="1")
        from_b = await outbox.publish(team_b, "invoice.paid", {"n": 2})
        only_a = await outbox.publish(team_a, "invoice.paid", {"n": 3}, endpoint="partner")

        assert await deliveries_of(owner, from_a) == {a_partner}
        assert await deliveries_of(owner, from_b) == {b_partner}
        assert await deliveries_of(owner, only_a) == {a_partner}
        assert await owner.fetchval("SELECT namespace FROM hookline.outbox WHERE event_id = $1", from_a) == "team-a"

        # Reads: its own namespace's rows only, and no secret column even of its own endpoints.
        assert {r["name"] for r in await team_a.fetch("SELECT name FROM hookline.endpoints")} == {a_partner}
        assert {r["event_id"] for r in await team_a.fetch("SELECT event_id FROM hookline.outbox")} == {from_a, only_a}
        assert {r["endpoint"] for r in await team_a.fetch("SELECT endpoint FROM hookline.deliveries")} == {a_partner}
        assert {r["event_id"] for r in await team_b.fetch("SELECT event_id FROM hookline.outbox")} == {from_b}
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await team_a.fetch("SELECT secrets FROM hookline.endpoints")
        # The seed of the aggregate locks is the owner's alone.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await team_a.fetch("SELECT * FROM hookline.outbox_lock_seed")

        # Publishing into the other namespace, or to its endpoint by its full name: refused.
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="publishes in namespace team-a, not team-b"):
            await outbox.publish(team_a, "invoice.paid", {}, namespace="team-b")
        with pytest.raises(asyncpg.InvalidParameterValueError, match="no endpoint named team-b/partner"):
            await outbox.publish(team_a, "invoice.paid", {}, endpoint="team-b/partner")
        with pytest.raises(asyncpg.InvalidParameterValueError, match="no endpoint named platform"):
            await outbox.publish(team_a, "invoice.paid", {}, endpoint="platform")

        # Nothing of the outbox is writable: no replay, no disabling, no pausing, no forged delivery,
        # not even of its own rows (the console and `kubectl annotate` do that, with Kubernetes' RBAC).
        for statement in ("UPDATE hookline.deliveries SET status = 'pending'",
                          "UPDATE hookline.endpoints SET enabled = false",
                          "UPDATE hookline.endpoints SET paused = true",
                          "DELETE FROM hookline.deliveries",
                          "DELETE FROM hookline.endpoints",
                          "INSERT INTO hookline.outbox (event_id, event_type, payload) VALUES ('x', 't', '{}')",
                          f"INSERT INTO hookline.deliveries (outbox_id, endpoint) VALUES (1, '{b_partner}')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await team_a.execute(statement)
    finally:
        await team_a.close()
        await team_b.close()
    assert await owner.fetchval("SELECT count(*) FROM hookline.deliveries WHERE status = 'pending'") == 3
    assert await owner.fetchval("SELECT bool_and(enabled AND NOT paused) FROM hookline.endpoints")


async def test_the_platform_keeps_its_endpoints_and_may_publish_into_a_namespace(owner: asyncpg.Connection) -> None:
    a_partner = await add_endpoint(owner, "team-a", "partner", ["invoice.*"])
    await add_endpoint(owner, "team-b", "partner", ["*"])
    platform = await add_endpoint(owner, None, "platform", ["*"])

    install_wide = await outbox.publish(owner, "invoice.paid", {})
    assert await deliveries_of(owner, install_wide) == {platform}
    into_a = await outbox.publish(owner, "invoice.paid", {}, namespace="team-a")
    assert await deliveries_of(owner, into_a) == {a_partner}
    assert await deliveries_of(owner, await outbox.publish(owner, "order.made", {}, namespace="team-a")) == set()
    targeted = await outbox.publish(owner, "x", {}, namespace="team-a", endpoint="partner")
    assert await deliveries_of(owner, targeted) == {a_partner}
    with pytest.raises(asyncpg.InvalidParameterValueError, match="no endpoint named partner in the install-wide"):
        await outbox.publish(owner, "x", {}, endpoint="partner")


async def test_a_producer_granted_the_old_publish_keeps_its_grant(scram_server: EmbeddedPostgres) -> None:
    """Migration 0030 replaces publish (a new argument): the roles granted EXECUTE on it keep it."""
    name = f"ns_{uuid.uuid4().hex[:10]}"
    producer = f"producer_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(scram_server.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.execute(f"CREATE ROLE {producer} LOGIN PASSWORD 'pw'")
    conn = await asyncpg.connect(with_database(scram_server.url, name))
    try:
        await migrations.migrate(conn, up_to=29)
        await conn.execute(f"GRANT USAGE ON SCHEMA hookline TO {producer}; "
                           f"GRANT EXECUTE ON FUNCTION hookline.publish(text, jsonb, text, text, text) TO {producer}")
        await migrations.migrate(conn)
        await add_endpoint(conn, None, "platform", ["*"])
        as_producer = await asyncpg.connect(tenancy.tenant_url(with_database(scram_server.url, name), producer, "pw"))
        try:
            event_id = await as_producer.fetchval("SELECT hookline.publish('t', $1::jsonb)", json.dumps({}))
        finally:
            await as_producer.close()
        assert await deliveries_of(conn, event_id) == {"platform"}
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.execute(f"DROP ROLE {producer}")
        await admin.close()


async def test_the_cli_leaves_a_webhook_endpoints_row_to_the_operator(owner: asyncpg.Connection,
                                                                     scram_server: EmbeddedPostgres) -> None:
    a_partner = await add_endpoint(owner, "team-a", "partner", ["*"])
    url = with_database(scram_server.url, await owner.fetchval("SELECT current_database()"))
    before = await owner.fetchrow("SELECT * FROM hookline.endpoints WHERE name = $1", a_partner)
    for action in (["update", a_partner, "--url", "https://elsewhere.invalid/"], ["delete", a_partner],
                   ["pause", a_partner], ["rotate-secret", a_partner]):
        done = await asyncio.to_thread(hookline_cli, url, "endpoints", *action)
        assert done.returncode == 2, done  # a usage error, as every refusal of _fail
        assert "is the WebhookEndpoint 'partner' in namespace 'team-a'" in done.stderr
        assert "kubectl edit whe partner -n team-a" in done.stderr
    assert await owner.fetchrow("SELECT * FROM hookline.endpoints WHERE name = $1", a_partner) == before
    # Install-wide endpoints are the CLI's own; a namespaced name cannot be made with it.
    assert (await asyncio.to_thread(hookline_cli, url, "endpoints", "add", "team-a/other", "--url",
                                    "https://x.invalid/")).returncode != 0
    listed = await asyncio.to_thread(hookline_cli, url, "endpoints", "list")
    assert a_partner in listed.stdout
    published = await asyncio.to_thread(hookline_cli, url, "publish", "t", "--data", "{}", "--namespace", "team-a")
    assert published.returncode == 0 and a_partner in published.stdout, published
