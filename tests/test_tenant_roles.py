"""Per-provider worker roles with row-level security (migration 0006, operator/tenancy.py), on a real
Postgres that checks passwords (SCRAM), plus the handler-module rules. The operator's side of it
(Secrets in the namespace, owner references) is tested in tests/operator/test_tenancy.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hookline.core import db, migrations
from hookline.core.embedded import EmbeddedPostgres
from hookline_operator import tenancy
from support.inbox import insert_events
from support.postgres import with_database


@pytest.fixture
async def owner(scram_server: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    """A fresh migrated database; the connection of its owner (what the services use)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(scram_server.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(with_database(scram_server.url, name))
    await migrations.migrate(conn)
    try:
        yield conn
    finally:
        # Gone with its roles: the server is the session's (tests/test_tenant_boundary.py drops every
        # worker role it finds, which fails on a role that still has privileges in a database here).
        roles = [r["role_name"] for r in await conn.fetch("SELECT role_name FROM hookline.tenants")]
        await conn.close()
        admin = await asyncpg.connect(scram_server.url)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            for role in roles:
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await admin.close()


async def add_provider(conn: asyncpg.Connection, name: str, namespace: str | None) -> str:
    uid = str(uuid.uuid4())
    spec = '{"signature": {"scheme": "none"}, "destination": {"url": "http://x.invalid/"}}'
    if namespace is None:
        await conn.execute("INSERT INTO hookline.providers (name, spec) VALUES ($1, $2::jsonb)", name, spec)
    else:
        await conn.execute(
            "INSERT INTO hookline.providers (name, spec, secrets, destination_secret, managed_by, owner_namespace, "
            "owner_name, owner_uid) VALUES ($1, $2::jsonb, "
            "jsonb_build_array(jsonb_build_object('value', 'sig-' || $1)), 'dest-' || $1, 'operator', $3, $1, $4)",
            name, spec, namespace, uid)
    await insert_events(conn, name, 3)
    await conn.execute("INSERT INTO hookline.entity_states (provider, entity_key, state) VALUES ($1, 'e1', 's')",
                       name)
    return uid


async def tenant_for(owner: asyncpg.Connection, server: EmbeddedPostgres, namespace: str, uid: str
                     ) -> tuple[str, str]:
    """(role, URL) of the workers of resource ``uid``, made the way the operator makes them."""
    database = await owner.fetchval("SELECT current_database()")
    role = tenancy.role_name(database, uid)
    password = f"pw-{uuid.uuid4().hex}"
    assert await tenancy.ensure_role(owner, role, namespace, uid, password) is None
    return role, tenancy.tenant_url(with_database(server.url, database), role, password)


async def test_a_worker_role_reaches_only_its_namespace(owner: asyncpg.Connection,
                                                        scram_server: EmbeddedPostgres) -> None:
    uid_a = await add_provider(owner, "pay-a", "team-a")
    await add_provider(owner, "pay-a2", "team-a")
    await add_provider(owner, "pay-b", "team-b")
    await add_provider(owner, "cli-made", None)
    _role, url = await tenant_for(owner, scram_server, "team-a", uid_a)

    team_a = await asyncpg.connect(url)
    try:
        assert {r["name"] for r in await team_a.fetch("SELECT name FROM hookline.providers")} == {"pay-a", "pay-a2"}
        assert {r["provider"] for r in await team_a.fetch("SELECT provider FROM hookline.inbox")} == {"pay-a", "pay-a2"}
        assert await team_a.fetchval("SELECT count(*) FROM hookline.entity_states WHERE provider = 'pay-b'") == 0
        # No secret column is readable at all, its own providers' included: signing secrets since
        # migration 0025, destination secrets (mounted into its workers as a file) since 0026.
        for column in ("secrets", "destination_secret"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await team_a.fetch(f"SELECT {column} FROM hookline.providers")
        # Writes to other teams' rows change nothing...
        assert await team_a.execute("UPDATE hookline.inbox SET status = 'dead' WHERE provider = 'pay-b'") == "UPDATE 0"
        assert await team_a.execute("UPDATE hookline.entity_states SET state = 'x' WHERE provider = 'pay-b'") \
            == "UPDATE 0"
        # ...and its own rows cannot be handed to another team's provider (no UPDATE of provider at all).
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await team_a.execute("UPDATE hookline.inbox SET provider = 'pay-b' WHERE provider = 'pay-a'")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await team_a.execute("INSERT INTO hookline.entity_states (provider, entity_key) VALUES ('pay-b', 'x')")
        # Nothing it does not need: no provider changes, no inserts or deletes of events, no operator tables.
        for statement in ("UPDATE hookline.providers SET spec = '{}'",
                          "DELETE FROM hookline.inbox",
                          "INSERT INTO hookline.inbox (provider, event_id, body) VALUES ('pay-a', 'x', '')",
                          "SELECT * FROM hookline.operator_tokens",
                          "SELECT * FROM hookline.tenants",
                          "SELECT * FROM hookline.worker_allocations",
                          "SELECT * FROM hookline.endpoints"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await team_a.execute(statement)
        # What a worker does with its own rows works.
        assert await team_a.execute("UPDATE hookline.inbox SET status = 'done' WHERE provider = 'pay-a'") == "UPDATE 3"
    finally:
        await team_a.close()
    assert await owner.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'pay-b' AND status = 'pending'") \
        == 3
    assert await owner.fetchval("SELECT state FROM hookline.entity_states WHERE provider = 'pay-b'") == "s"


async def test_a_worker_role_logs_attempts_of_its_own_events_only(owner: asyncpg.Connection,
                                                                 scram_server: EmbeddedPostgres) -> None:
    """hookline.log_attempts may be called by any role (migration 0016); a tenant's calls
    append attempts of its own events only (0021), never invented history of another team's."""
    uid_a = await add_provider(owner, "pay-a", "team-a")
    await add_provider(owner, "pay-b", "team-b")
    _role, url = await tenant_for(owner, scram_server, "team-a", uid_a)
    own = await owner.fetchval("SELECT min(id) FROM hookline.inbox WHERE provider = 'pay-a'")
    other = await owner.fetchval("SELECT min(id) FROM hookline.inbox WHERE provider = 'pay-b'")
    log = ("SELECT hookline.log_attempts($1, ARRAY[$2::bigint], ARRAY[$3::text], '{1}', '{w}', '{dead}', "
           "'{invented}', '{NULL}', '{NULL}')")
    team_a = await asyncpg.connect(url)
    try:
        for queue, row_id, part in (("inbox", other, "pay-b"),       # another team's event
                                    ("inbox", other, "pay-a"),       # ... under its own provider's name
                                    ("inbox", own + 10**9, "pay-a"),  # no such event
                                    ("deliveries", own, "pay-a")):   # tenants book no deliveries
            assert await team_a.fetchval(log, queue, row_id, part) == 0, (queue, row_id, part)
        assert await team_a.fetchval(log, "inbox", own, "pay-a") == 1
    finally:
        await team_a.close()
    logged = await owner.fetch("SELECT queue, row_id, part FROM hookline.attempts")
    assert [tuple(r) for r in logged] == [("inbox", own, "pay-a")]


async def test_the_password_is_checked_and_only_its_verifier_is_stored(owner: asyncpg.Connection,
                                                                       scram_server: EmbeddedPostgres) -> None:
    uid = await add_provider(owner, "pw", "team-a")
    role, url = await tenant_for(owner, scram_server, "team-a", uid)
    password = tenancy.password_in(url, role)
    assert password
    stored = await owner.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", role)
    assert stored.startswith("SCRAM-SHA-256$4096:") and password not in stored
    conn = await asyncpg.connect(url)
    await conn.close()
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(url.replace(password, password + "x"))


async def test_the_role_follows_the_password_in_its_secret(owner: asyncpg.Connection,
                                                           scram_server: EmbeddedPostgres) -> None:
    uid = await add_provider(owner, "moved", "team-a")
    role, url = await tenant_for(owner, scram_server, "team-a", uid)
    old = tenancy.password_in(url, role)
    assert old
    ready = db.query("tenant_ready", "tenancy.sql")
    assert await owner.fetchval(ready, role, tenancy.password_digest(old))
    new = "another-password"
    assert not await owner.fetchval(ready, role, tenancy.password_digest(new))  # the Secret changed: re-apply
    assert await tenancy.ensure_role(owner, role, "team-a", uid, new) is None
    assert await owner.fetchval(ready, role, tenancy.password_digest(new))
    (await asyncpg.connect(url.replace(old, new))).terminate()
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(url)
    assert new not in json.dumps([dict(r) for r in await owner.fetch("SELECT * FROM hookline.tenants")], default=str)


async def test_many_roles_made_at_once(scram_server: EmbeddedPostgres, owner: asyncpg.Connection) -> None:
    """The operator reconciles many resources concurrently; GRANTs on one table must not collide."""
    database = await owner.fetchval("SELECT current_database()")
    pool = await asyncpg.create_pool(with_database(scram_server.url, database), min_size=8, max_size=8)
    try:
        uids = [str(uuid.uuid4()) for _ in range(24)]
        outcomes = await asyncio.gather(*(tenancy.ensure_role(pool, tenancy.role_name(database, uid), "team-a", uid,
                                                              f"pw-{uid}") for uid in uids))
        assert outcomes == [None] * len(uids)
        await asyncio.gather(*(tenancy.remove_worker_credentials(pool, uid) for uid in uids))
    finally:
        await pool.close()
    assert await owner.fetchval("SELECT count(*) FROM hookline.tenants") == 0


async def test_our_verifier_is_the_one_postgres_computes(owner: asyncpg.Connection) -> None:
    role = f"verifier_{uuid.uuid4().hex[:8]}"
    await owner.execute(f"CREATE ROLE {role} PASSWORD 'correct horse battery staple'")
    try:
        stored = await owner.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", role)
        iterations, salt = stored.split("$")[1].split(":")
        ours = tenancy.scram_verifier("correct horse battery staple", salt=base64.b64decode(salt),
                                      iterations=int(iterations))
        assert ours == stored
    finally:
        await owner.execute(f"DROP ROLE {role}")


async def test_a_deleted_resource_loses_its_role(owner: asyncpg.Connection, scram_server: EmbeddedPostgres) -> None:
    uid = await add_provider(owner, "gone", "team-a")
    role, url = await tenant_for(owner, scram_server, "team-a", uid)
    await tenancy.remove_worker_credentials(owner, uid)
    assert await owner.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", role) == 0
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        await asyncpg.connect(url)


async def test_roles_that_are_not_tenants_see_what_they_did_before(owner: asyncpg.Connection,
                                                                   scram_server: EmbeddedPostgres) -> None:
    await add_provider(owner, "a", "team-a")
    await add_provider(owner, "b", None)
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    await owner.execute(f"CREATE ROLE {reader} LOGIN PASSWORD 'reader-pw'")
    await owner.execute(f"GRANT USAGE ON SCHEMA hookline TO {reader}; GRANT SELECT ON hookline.inbox TO {reader}")
    database = await owner.fetchval("SELECT current_database()")
    conn = await asyncpg.connect(tenancy.tenant_url(with_database(scram_server.url, database), reader, "reader-pw"))
    try:
        assert await conn.fetchval("SELECT count(*) FROM hookline.inbox") == 6
    finally:
        await conn.close()
        await owner.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA hookline FROM {reader}; "
                            f"REVOKE ALL ON SCHEMA hookline FROM {reader}; DROP ROLE {reader}")


async def test_an_operator_role_without_createrole_is_told_so(owner: asyncpg.Connection,
                                                              scram_server: EmbeddedPostgres) -> None:
    limited = f"limited_{uuid.uuid4().hex[:8]}"
    await owner.execute(f"CREATE ROLE {limited} LOGIN PASSWORD 'limited-pw'")
    await owner.execute(f"GRANT USAGE ON SCHEMA hookline TO {limited}")
    database = await owner.fetchval("SELECT current_database()")
    conn = await asyncpg.connect(tenancy.tenant_url(with_database(scram_server.url, database), limited, "limited-pw"))
    try:
        outcome = await tenancy.ensure_role(conn, "hookline_w_x", "team-a", "uid", "secret-password")
    finally:
        await conn.close()
        await owner.execute(f"REVOKE ALL ON SCHEMA hookline FROM {limited}; DROP ROLE {limited}")
    assert outcome is not None and (outcome.ok, outcome.reason) == (False, "DatabasePermissionDenied")
    assert "CREATEROLE" in outcome.message and "secret-password" not in outcome.message
    assert await owner.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = 'hookline_w_x'") == 0


async def test_a_name_taken_over_gets_a_destination_secret_of_its_own(pool: asyncpg.Pool) -> None:
    """The new owner's namespace receives the destination secret (operator/tenancy.py): it must not be
    the one the previous owner's destination may still trust."""
    from hookline_operator.ownership import Resource
    from hookline_operator.reconcile import claim_row

    spec = {"signature": {"scheme": "standard-webhooks"}, "destination": {"url": "http://d/"}}
    secrets = [{"value": "whsec_x", "notAfter": None}]
    team_a, team_b = Resource("team-a", "shop", "uid-a", 1), Resource("team-b", "shop", "uid-b", 1)
    assert (await claim_row(pool, team_a, spec, secrets)).owned
    first = await pool.fetchval("SELECT destination_secret FROM hookline.providers WHERE name = 'shop'")
    assert (await claim_row(pool, team_a, {**spec, "maxBodyBytes": 10}, secrets)).owned  # a re-sync keeps it
    assert await pool.fetchval("SELECT destination_secret FROM hookline.providers WHERE name = 'shop'") == first
    assert (await claim_row(pool, team_b, spec, secrets, replaces_uid="uid-a")).owned  # owner proven gone
    taken = await pool.fetchval("SELECT destination_secret FROM hookline.providers WHERE name = 'shop'")
    assert taken and taken != first


async def test_a_tenant_worker_signs_with_the_mounted_destination_secret_and_holds_no_key(
        owner: asyncpg.Connection, scram_server: EmbeddedPostgres, tmp_path: Path) -> None:
    """Operator-made workers get no key for secrets at rest: they read their destination signing
    secret from HOOKLINE_DESTINATION_SECRET_FILE (the Secret the operator mirrors it into) and no
    secret column, and their role sees the stored secrets only as ciphertext, if at all."""
    from aiohttp import web
    from standardwebhooks import Webhook

    from hookline.core.embedded import free_port
    from hookline.core.secrets_at_rest import destination_secret_context, provider_secrets_context, required_ring
    from hookline.core.signatures import get_scheme
    from support.processes import worker
    from support.waiting import eventually

    destination_secret = get_scheme("standard-webhooks").generate_secret()
    verified: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        Webhook(destination_secret).verify(body, dict(request.headers))
        verified.append(request.headers["Hookline-Event-Id"])
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    ring = required_ring("test")
    uid = str(uuid.uuid4())
    spec = json.dumps({"signature": {"scheme": "standard-webhooks"},
                       "destination": {"url": f"http://127.0.0.1:{port}/hook"}})
    signing = get_scheme("standard-webhooks").generate_secret()
    await owner.execute(
        "INSERT INTO hookline.providers (name, spec, secrets, destination_secret, managed_by, owner_namespace, "
        "owner_name, owner_uid) VALUES ('pay', $1::jsonb, $2::jsonb, $3, 'operator', 'team-a', 'pay', $4)",
        spec, json.dumps([{"value": ring.seal(signing, provider_secrets_context("pay")), "notAfter": None}]),
        ring.seal(destination_secret, destination_secret_context("pay")), uid)
    _role, url = await tenant_for(owner, scram_server, "team-a", uid)

    team_a = await asyncpg.connect(url)
    try:
        # Whatever a tenant may still select of the row, no secret is readable in it.
        visible = str([dict(r) for r in await team_a.fetch("SELECT name, spec FROM hookline.providers")])
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            visible += str(await team_a.fetch("SELECT secrets FROM hookline.providers"))
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            visible += str(await team_a.fetch("SELECT destination_secret FROM hookline.providers"))
        assert signing not in visible and destination_secret not in visible
        assert signing.removeprefix("whsec_") not in visible
    finally:
        await team_a.close()

    secret_file = tmp_path / "secret"
    secret_file.write_text(destination_secret)
    await insert_events(owner, "pay", 3)
    proc = worker(url, tmp_path, "--provider", "pay", "--poll-interval", "0.05",
                  env={"HOOKLINE_SECRET_KEYS_FILE": "", "HOOKLINE_DESTINATION_SECRET_FILE": str(secret_file)})
    try:
        await eventually(lambda: owner.fetchval(
            "SELECT count(*) FROM hookline.inbox WHERE provider = 'pay' AND status = 'done'"), equals=3, timeout=30)
    finally:
        proc.stop()
        await runner.cleanup()
    assert len(verified) == 3
    assert destination_secret not in proc.logs()


# -- pure rules --------------------------------------------------------------------------------


def test_role_names_are_stable_unique_and_valid() -> None:
    a = tenancy.role_name("hookline", "uid-1")
    assert a == tenancy.role_name("hookline", "uid-1")
    assert a != tenancy.role_name("hookline", "uid-2") != tenancy.role_name("other", "uid-1")
    assert len(a) <= 63 and a.isidentifier() and a == a.lower()


def test_tenant_url_swaps_only_the_credentials() -> None:
    url = tenancy.tenant_url("postgresql://admin:s3cret@db.example:6432/hookline?sslmode=require", "r", "p/w@")
    assert url == "postgresql://r:p%2Fw%40@db.example:6432/hookline?sslmode=require"
    assert tenancy.password_in(url, "r") == "p/w@"
    assert tenancy.password_in(url, "someone-else") is None
    assert tenancy.tenant_url("postgresql://[::1]:5432/db", "r", "p") == "postgresql://r:p@[::1]:5432/db"


def test_behind_a_transaction_pooler_the_workers_secret_holds_the_session_url_of_the_same_role() -> None:
    pooled, direct = "postgresql://op:x@pgbouncer:6432/hookline", "postgresql://op:y@db-direct:5432/hookline"
    assert tenancy._credential_data(pooled, None, "r", "pw") == {"url": "postgresql://r:pw@pgbouncer:6432/hookline"}
    assert tenancy._credential_data(pooled, direct, "r", "pw") == {
        "url": "postgresql://r:pw@pgbouncer:6432/hookline", "session-url": "postgresql://r:pw@db-direct:5432/hookline"}


@pytest.mark.parametrize(("namespace", "handler", "allowed"), [
    ("team-a", "team_a.hooks:f", True),
    ("team-a", "team_a:f", True),
    ("team-a", "team_ab.hooks:f", False),  # a sibling package, not a sub-package
    ("team-a", "team_b.hooks:f", False),
    ("team-b", "shared.webhooks:f", True),  # "*" for namespaces not listed
    ("team-b", "shared.webhooksx:f", False),
    ("team-c", "anything.at_all:f", True),
    ("team-d", "os:system", False),  # an empty list allows no module
])
def test_handler_modules_per_namespace(namespace: str, handler: str, allowed: bool) -> None:
    policy = {"team-a": ["team_a."], "team-c": [""], "team-d": [], "*": ["shared.webhooks"]}
    refusal = tenancy.handler_refusal(namespace, {"handler": handler}, policy)
    assert (refusal is None) is allowed, refusal
    if refusal:
        assert handler.partition(":")[0] in refusal and namespace in refusal


def test_no_policy_and_destinations_are_never_refused() -> None:
    assert tenancy.handler_refusal("x", {"handler": "os:system"}, None) is None
    assert tenancy.handler_refusal("x", {"destination": {"url": "http://a/"}}, {}) is None
    assert tenancy.handler_refusal("x", {"handler": "team_a:f"}, {}) is not None


def test_handler_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tenancy.HANDLER_MODULES_ENV, raising=False)
    assert tenancy.configured_handler_modules() is None
    monkeypatch.setenv(tenancy.HANDLER_MODULES_ENV, '{"team-a": ["team_a"]}')
    assert tenancy.configured_handler_modules() == {"team-a": ["team_a"]}
    monkeypatch.setenv(tenancy.HANDLER_MODULES_ENV, '{"team-a": "team_a"}')
    with pytest.raises(ValueError, match="lists of module prefixes"):
        tenancy.configured_handler_modules()
