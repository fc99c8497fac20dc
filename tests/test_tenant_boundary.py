"""The tenant boundary from the attacker's seat (issue 23, migration 0025).

Set up as production is: the schema is owned and migrated by a non-superuser role with CREATEROLE,
and the attacker logs in as a WebhookProvider's worker role made by the operator's own code
(``hookline_operator.tenancy``). The cluster lets every role create in schema public, as PostgreSQL
14 and clusters upgraded from it do. The attacker, team A, tries everything the review of issue 23
found, and more; the victim, team B, must keep its events, dedup answers, entity states, ownership,
secrets and housekeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline.core import db, maintenance, migrations, partitions
from hookline.core.dedicated import DedicatedConnection
from hookline.core.embedded import EmbeddedPostgres
from hookline.core.listener import Listener
from hookline.core.maintenance import Job, Maintainer
from hookline.core.providers import ProviderRegistry
from hookline.core.queue import RetryPolicy
from hookline_operator import budget, tenancy
from hookline_operator.ownership import Resource
from support.dedicated import GatedConnection
from support.postgres import with_database
from support.processes import hookline_cli, receiver
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

# What a worker role may call: the lookups row-level security policies make (every role's, as the
# policies run them for whoever reads), the attempt log and its handlers' import problems (tenants only).
POLICY_FUNCTIONS = {"hookline.tenant_namespace()", "hookline.tenant_providers()"}
# publish: into the tenant's own namespace only (tests/test_outbox_namespaces.py, migration 0030).
TENANT_FUNCTIONS = {"tenant_namespace", "tenant_providers", "log_attempts", "report_handler_problem", "publish"}
# Inbox columns a worker writes (queue.sql); everything else was received and stays as it was.
WORKER_COLUMNS = {"status", "attempts", "next_attempt_at", "lease_expires_at", "locked_by", "last_error",
                  "processed_at", "deferred_since", "suspect", "claimed_at"}
# Trojans a tenant plants in schema public: each is a better match than the built-in for some call
# (an exact type where the built-in needs a cast, or is variadic "any" or polymorphic), and each
# records that it ran and as whom before it does what the built-in would.
TROJANS = {
    "hashtextextended(v text, seed integer) RETURNS bigint": "pg_catalog.hashtextextended(v, seed::bigint)",
    "format(f text, a text) RETURNS text": "pg_catalog.format(f, a)",
    "format(f text, a text, b text) RETURNS text": "pg_catalog.format(f, a, b)",
    "unnest(a bigint[]) RETURNS SETOF bigint": "pg_catalog.unnest(a)",
    "unnest(a text[]) RETURNS SETOF text": "pg_catalog.unnest(a)",
    "make_interval(secs integer) RETURNS interval": "pg_catalog.make_interval(secs => secs::float8)",
    "left(t text, n bigint) RETURNS text": "pg_catalog.left(t, n::integer)",
    "pg_advisory_xact_lock(k integer) RETURNS void": "pg_catalog.pg_advisory_xact_lock(k::bigint)",
    "to_regclass(t text) RETURNS regclass": "pg_catalog.to_regclass(t)",
}


@dataclass
class Install:
    """One database: its owner, team A's tenant (the attacker) and team B's (the victim)."""

    server: EmbeddedPostgres
    database: str
    owner_url: str
    owner: asyncpg.Connection
    attacker_url: str
    victim_role: str
    victim_uid: str

    async def attacker(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.attacker_url)

    async def victim_state(self) -> dict[str, object]:
        """Everything team B would lose, as the owner sees it."""
        o = self.owner
        return {
            "events": [tuple(r) for r in await o.fetch(
                "SELECT event_id, status, attempts, body, received_at FROM hookline.inbox "
                "WHERE provider = 'pay-b' ORDER BY event_id")],
            "keys": await o.fetchval("SELECT count(*) FROM hookline.inbox_keys WHERE provider = 'pay-b'"),
            "states": await o.fetchval("SELECT state FROM hookline.entity_states WHERE provider = 'pay-b'"),
            "owner": tuple(await o.fetchrow("SELECT owner_namespace, owner_uid, secrets, destination_secret "
                                            "FROM hookline.providers WHERE name = 'pay-b'")),
            "role": await o.fetchval("SELECT count(*) FROM hookline.tenants WHERE role_name = $1", self.victim_role),
            "archived": await o.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider LIKE 'pay-b@%'"),
            "handler problems": [tuple(r) for r in await o.fetch(
                "SELECT handler, problem, worker, since FROM hookline.handler_problems WHERE provider = 'pay-b'")],
        }


async def _receive(owner: asyncpg.Connection, provider: str, event_id: str) -> None:
    """Store an event as the receiver does: the row and its dedup key."""
    await owner.execute(
        "WITH e AS (INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, body) "
        "VALUES ($1, $2, 'payment.created', 'pi_1', '{}'::bytea) RETURNING received_at) "
        "INSERT INTO hookline.inbox_keys (provider, event_id, received_at) SELECT $1, $2, received_at FROM e",
        provider, event_id)


async def _add_operator_provider(owner: asyncpg.Connection, name: str, namespace: str) -> str:
    uid = str(uuid.uuid4())
    spec = json.dumps({"signature": {"scheme": "none"}, "destination": {"url": "http://x.invalid/"}})
    await owner.execute(
        "INSERT INTO hookline.providers (name, spec, secrets, destination_secret, managed_by, owner_namespace, "
        "owner_name, owner_uid) VALUES ($1, $2::jsonb, jsonb_build_array(jsonb_build_object('value', "
        "'sig-secret-' || $1)), 'dest-secret-' || $1, 'operator', $3, $1, $4)", name, spec, namespace, uid)
    for n in range(3):
        await _receive(owner, name, f"evt-{n}")
    await owner.execute("INSERT INTO hookline.entity_states (provider, entity_key, state) VALUES ($1, 'pi_1', 'paid')",
                        name)
    return uid


async def _tenant(owner: asyncpg.Connection, server_url: str, database: str, namespace: str, uid: str
                  ) -> tuple[str, str]:
    role = tenancy.role_name(database, uid)
    password = f"pw-{uuid.uuid4().hex}"
    assert await tenancy.ensure_role(owner, role, namespace, uid, password) is None
    return role, tenancy.tenant_url(with_database(server_url, database), role, password)


@contextlib.asynccontextmanager
async def _install(server: EmbeddedPostgres, up_to: int | None = None) -> AsyncIterator[Install]:
    """A database owned and migrated (``up_to`` a version, when given) by a non-superuser with
    CREATEROLE, with team A's and team B's providers, events and worker roles."""
    suffix = uuid.uuid4().hex[:10]
    owner_role, database, owner_password = f"owner_{suffix}", f"b_{suffix}", f"owner-pw-{suffix}"
    admin = await asyncpg.connect(server.url)
    await admin.execute(f"CREATE ROLE {owner_role} LOGIN CREATEROLE PASSWORD '{owner_password}'")
    await admin.execute(f'CREATE DATABASE "{database}" OWNER {owner_role}')
    await admin.close()
    # As on PostgreSQL 14 and clusters upgraded from it: every role may create in schema public.
    admin = await asyncpg.connect(with_database(server.url, database))
    await admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    await admin.close()
    owner_url = tenancy.tenant_url(with_database(server.url, database), owner_role, owner_password)
    owner = await asyncpg.connect(owner_url)
    assert not await owner.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    await migrations.migrate(owner, up_to=up_to)
    attacker_uid = await _add_operator_provider(owner, "pay-a", "team-a")
    victim_uid = await _add_operator_provider(owner, "pay-b", "team-b")
    _role, attacker_url = await _tenant(owner, server.url, database, "team-a", attacker_uid)
    victim_role, _url = await _tenant(owner, server.url, database, "team-b", victim_uid)
    try:
        yield Install(server, database, owner_url, owner, attacker_url, victim_role, victim_uid)
    finally:
        await owner.close()
        admin = await asyncpg.connect(server.url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        for role in await admin.fetch("SELECT rolname FROM pg_roles WHERE rolname LIKE 'hookline_w_%'"):
            await admin.execute(f'DROP ROLE IF EXISTS "{role["rolname"]}"')
        await admin.execute(f"DROP ROLE {owner_role}")
        await admin.close()


@pytest.fixture
async def install(scram_server: EmbeddedPostgres) -> AsyncIterator[Install]:
    async with _install(scram_server) as made:
        yield made


async def _hookline_functions(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT p.proname, p.oid::regprocedure::text AS signature, p.prorettype = 'trigger'::regtype AS trigger, "
        "coalesce((SELECT array_agg(format('NULL::%s', t::regtype)) FROM unnest(p.proargtypes) AS t), '{}') AS args "
        "FROM pg_proc AS p WHERE p.pronamespace = 'hookline'::regnamespace ORDER BY 1")


async def test_no_function_is_public_and_every_one_binds_its_names(install: Install) -> None:
    """Default-deny for every function, whatever migration made it: a later migration that forgets
    to revoke EXECUTE from PUBLIC or to pin a function's names fails here."""
    rows = await install.owner.fetch(
        "SELECT p.oid::regprocedure::text AS f, has_function_privilege('public', p.oid, 'EXECUTE') AS public, "
        "p.prosqlbody IS NOT NULL OR 'search_path=pg_catalog, pg_temp' = ANY (coalesce(p.proconfig, '{}')) AS pinned "
        "FROM pg_proc AS p WHERE p.pronamespace = 'hookline'::regnamespace")
    assert len(rows) > 30
    assert {r["f"] for r in rows if r["public"]} == POLICY_FUNCTIONS
    assert [r["f"] for r in rows if not r["pinned"]] == []


async def test_a_tenant_can_call_only_its_own_lookups(install: Install) -> None:
    """Row 1: archive_provider_events('pay-b', ...) erased team B's inbox and dedup keys. Every
    function is called with another team's names (or NULLs where a name makes no sense)."""
    await install.owner.execute("SELECT hookline.report_handler_problem('pay-b', 'b.hooks:on', 'real', 'wb')")
    before = await install.victim_state()
    attacker = await install.attacker()
    try:
        refused = []
        for f in await _hookline_functions(install.owner):
            if f["proname"] in TENANT_FUNCTIONS:
                continue
            args = ["'pay-b'::text" if i == 0 and a == "NULL::text" else a for i, a in enumerate(f["args"])]
            with pytest.raises((asyncpg.InsufficientPrivilegeError, asyncpg.FeatureNotSupportedError)) as caught:
                await attacker.execute(f"SELECT hookline.{f['proname']}({', '.join(args)})")
            # Trigger functions cannot be called at all; every other one is refused for want of EXECUTE.
            assert f["trigger"] or isinstance(caught.value, asyncpg.InsufficientPrivilegeError), f["signature"]
            refused.append(f["signature"])
        assert "hookline.archive_provider_events(text,text)" in refused
        assert "hookline.drop_tenant(text)" in refused
        # What it may call works, and only for its own rows.
        assert await attacker.fetchval("SELECT hookline.tenant_namespace()") == "team-a"
        assert await attacker.fetchval("SELECT hookline.tenant_providers()") == ["pay-a"]
        victim_event = await install.owner.fetchval("SELECT min(id) FROM hookline.inbox WHERE provider = 'pay-b'")
        assert await attacker.fetchval(
            "SELECT hookline.log_attempts('inbox', ARRAY[$1::bigint], '{pay-b}', '{1}', '{w}', '{dead}', '{forged}', "
            "'{NULL}', '{NULL}')", victim_event) == 0
        # A worker reports its own handler's import problem (hookline status reads it), not another team's,
        # and clears only its own: the victim's report stays.
        report = "SELECT hookline.report_handler_problem($1, 'x:y', $2, 'forger')"
        assert await attacker.fetchval(report, "pay-b", "ModuleNotFoundError: forged") is False
        assert await attacker.fetchval(report, "pay-b", None) is False
        assert await attacker.fetchval(report, "pay-a", "ModuleNotFoundError: No module named 'x'") is True
        assert await install.owner.fetchval("SELECT problem FROM hookline.handler_problems WHERE provider = 'pay-a'") \
            == "ModuleNotFoundError: No module named 'x'"
        for statement in ("DELETE FROM hookline.handler_problems",
                          "INSERT INTO hookline.handler_problems VALUES ('pay-b', 'x:y', 'forged', 'w')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attacker.execute(statement)
    finally:
        await attacker.close()
    assert await install.victim_state() == before


async def test_a_tenant_writes_only_what_a_worker_writes(install: Install) -> None:
    """Row 4: received_at moved an event into the default partition and pinned the dedup horizon;
    body could be rewritten. Every inbox column outside the worker's set is refused, on its own rows."""
    columns = {r["attname"]: r["typ"] for r in await install.owner.fetch(
        "SELECT attname, format_type(atttypid, atttypmod) AS typ FROM pg_attribute "
        "WHERE attrelid = 'hookline.inbox'::regclass AND attnum > 0 AND NOT attisdropped")}
    assert set(columns) > WORKER_COLUMNS
    own_before = [tuple(r) for r in await install.owner.fetch(
        "SELECT id, provider, event_id, received_at, body, headers FROM hookline.inbox WHERE provider = 'pay-a'")]
    attacker = await install.attacker()
    try:
        for column, typ in columns.items():
            if column in WORKER_COLUMNS:
                continue
            value = {"received_at": "now() + interval '10 days'", "body": "repeat('x', 1000)::bytea",
                     "id": "DEFAULT"}.get(
                column, f"NULL::{typ}")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attacker.execute(f"UPDATE hookline.inbox SET {column} = {value} WHERE provider = 'pay-a'")
        for statement in ("INSERT INTO hookline.inbox (provider, event_id, body) VALUES ('pay-a', 'x', '')",
                          "DELETE FROM hookline.inbox",
                          "UPDATE hookline.providers SET spec = '{}'",
                          "DELETE FROM hookline.entity_states",
                          "TRUNCATE hookline.inbox",
                          "UPDATE hookline.inbox_keys SET received_at = '2001-01-01'",
                          "INSERT INTO hookline.maintenance_leaders VALUES ('inbox', 'me', 'infinity')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attacker.execute(statement)
        # The worker's own columns it may write, on its own rows only.
        assert await attacker.execute("UPDATE hookline.inbox SET status = 'done', processed_at = now() "
                                      "WHERE provider = 'pay-a'") == "UPDATE 3"
        assert await attacker.execute("UPDATE hookline.inbox SET status = 'dead' WHERE provider = 'pay-b'") \
            == "UPDATE 0"
    finally:
        await attacker.close()
    assert [tuple(r) for r in await install.owner.fetch(
        "SELECT id, provider, event_id, received_at, body, headers FROM hookline.inbox WHERE provider = 'pay-a'")] \
        == own_before


async def test_a_tenant_reads_no_secret_and_no_other_tenant(install: Install) -> None:
    """Row 6 (its SQL half) and row 10: no signing secret through any table or view the tenant can
    read, its own provider's included, and no other tenant's namespace or resource in pg_roles."""
    relations = [r["rel"] for r in await install.owner.fetch(
        "SELECT c.oid::regclass::text AS rel FROM pg_class AS c "
        "WHERE c.relnamespace = 'hookline'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')")]
    attacker = await install.attacker()
    try:
        readable = {}
        for rel in relations:
            try:
                readable[rel] = json.dumps([dict(r) for r in await attacker.fetch(f"SELECT * FROM {rel}")],
                                           default=str)
            except asyncpg.InsufficientPrivilegeError:
                continue
        # Whole rows are readable only where nothing secret is in them (the outbox's events and
        # deliveries of its namespace since migration 0030; endpoints only without their secrets).
        assert set(readable) <= {"hookline.inbox", "hookline.entity_states", "hookline.outbox",
                                 "hookline.deliveries"}, set(readable)
        assert all("secret" not in text for text in readable.values())
        for statement in ("SELECT secrets FROM hookline.providers",
                          "SELECT destination_secret FROM hookline.providers",
                          "SELECT row_to_json(p) FROM hookline.providers AS p",
                          "SELECT * FROM hookline.tenants",
                          "SELECT * FROM hookline.operator_tokens"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attacker.fetch(statement)
        # What a worker reads of its providers it reads, of its own namespace only.
        own = await install.owner.fetch("SELECT name, spec FROM hookline.providers WHERE name = 'pay-a'")
        assert [tuple(r) for r in await attacker.fetch(db.query("list_provider_specs_without_secrets"))] == [
            tuple(r) for r in own]
        comments = await attacker.fetch("SELECT rolname, shobj_description(oid, 'pg_authid') AS comment "
                                        "FROM pg_roles WHERE rolname LIKE 'hookline_w_%'")
        assert len(comments) >= 2 and all(r["comment"] is None for r in comments)
    finally:
        await attacker.close()


async def test_trojans_in_public_never_run(install: Install) -> None:
    """Row 2: a tenant's public.hashtextextended(text, integer) was an exact match for the operator's
    unqualified call and ran with the operator's rights. The attacker plants trojans for what the
    code calls; the owner, whose search path includes public, then does all of its housekeeping."""
    migrate = await asyncio.to_thread(hookline_cli, install.owner_url, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC;" in migrate.stderr
    attacker = await install.attacker()
    try:
        await attacker.execute("CREATE TABLE public.trojan_calls (called text, caller text); "
                               "GRANT SELECT, INSERT ON public.trojan_calls TO PUBLIC")
        for signature, body in TROJANS.items():
            name = signature.split("(")[0]
            returns = signature.split(" RETURNS ")[1]
            result = f"RETURN QUERY SELECT {body}" if returns.startswith("SETOF") else (
                f"PERFORM {body}; RETURN" if returns == "void" else f"RETURN {body}")
            await attacker.execute(
                f"CREATE FUNCTION public.{signature} LANGUAGE plpgsql AS $$ BEGIN "
                f"INSERT INTO public.trojan_calls VALUES ('{name}', current_user); {result}; END $$; "
                f"GRANT EXECUTE ON FUNCTION public.{signature.split(' RETURNS ')[0]} TO PUBLIC")
    finally:
        await attacker.close()
    owner = install.owner
    assert "public" in await owner.fetchval("SHOW search_path")
    # The operator's work: a new tenant, a removed one, a budget decision, an archival on handover.
    uid = str(uuid.uuid4())
    await _tenant(owner, install.server.url, install.database, "team-c", uid)
    await tenancy.remove_worker_credentials(owner, uid)
    pool = await db.create_pool(install.owner_url, min_size=1, max_size=2)
    try:
        await budget.grant(pool, Resource("team-c", "c", uid, 1), 2, 0, 3, 30, 600)
        await maintenance.sweep_once(pool, {"pay-a": RetryPolicy()})
        await partitions.manage_partitions(pool, partitions.Retention())
    finally:
        await pool.close()
    await owner.execute("INSERT INTO hookline.providers (name, spec) VALUES ('cli-made', '{}'); "
                        "DELETE FROM hookline.providers WHERE name = 'cli-made'")
    await owner.execute("SELECT hookline.publish('order.paid', '{}'::jsonb, 'order', '1', NULL)")
    assert await migrations.migrate(owner) == []
    assert await owner.fetch("SELECT * FROM public.trojan_calls") == []


async def test_housekeeping_goes_on_while_a_tenant_holds_every_lock_it_can(install: Install) -> None:
    """Row 3: the leader-election keys, the tenancy, budget and migration locks were advisory keys any
    role could take. The attacker takes every key the code used and tries every table lock; lease
    rescue, leader election, partition creation, a new tenant, a budget decision and migrate go on."""
    attacker = await install.attacker()
    try:
        keys = [f"hashtext('hookline.maintenance'), hashtext('{scope}')" for scope in ("inbox", "outbox",
                                                                                      "partitions")]
        keys += ["hashtextextended('hookline.tenants', 0)", "hashtextextended('hookline.worker_allocations', 0)",
                 str(0x686F6F6B6C696E65 - 2**63)]
        for key in keys:
            assert await attacker.fetchval(f"SELECT pg_try_advisory_lock({key})")
        for table in ("maintenance_leaders", "tenants", "worker_allocations", "schema_migrations", "inbox",
                      "providers"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with attacker.transaction():
                    await attacker.execute(f"LOCK TABLE hookline.{table} IN ACCESS EXCLUSIVE MODE")
        # And it keeps what it may legitimately hold: a reading transaction on the inbox.
        reading = attacker.transaction()
        await reading.start()
        await attacker.fetch("SELECT id FROM hookline.inbox FOR UPDATE")

        owner = install.owner
        await owner.execute("UPDATE hookline.inbox SET status = 'processing', locked_by = 'crashed', "
                            "lease_expires_at = now() - interval '1 second' "
                            "WHERE provider = 'pay-b' AND event_id = 'evt-0'")
        pool = await db.create_pool(install.owner_url, min_size=1, max_size=3)
        ran: list[str] = []

        async def rescue() -> None:
            await maintenance.sweep_once(pool, {"pay-b": RetryPolicy()})
            ran.append("rescue")

        leader = Maintainer("inbox", [Job("rescue", rescue, 0.05)], GatedConnection(install.owner_url),
                            election_interval=0.1)
        try:
            async with asyncio.timeout(20):
                await leader.start()
                await eventually(lambda: "rescue" in ran)
                assert await owner.fetchval("SELECT status FROM hookline.inbox WHERE provider = 'pay-b' "
                                            "AND event_id = 'evt-0'") == "pending"
                await owner.execute("SET lock_timeout = '5s'")
                assert await partitions.ensure_partitions(owner) == []  # premade already; it did not wait
                await _tenant(owner, install.server.url, install.database, "team-c", str(uuid.uuid4()))
                grant = await budget.grant(pool, Resource("team-c", "c", str(uuid.uuid4()), 1), 1, 0, 3, 30, 600)
                assert grant.replicas == 1
                assert await migrations.migrate(owner) == []
        finally:
            await leader.stop()
            await pool.close()
            await reading.rollback()
    finally:
        await attacker.close()


async def test_a_notify_flood_costs_a_few_cheap_looks(install: Install) -> None:
    """Row 7: any role may NOTIFY hookline_providers, and every notification re-read and re-parsed
    every provider. Now a forged notification costs a fingerprint query, a few a second at most."""
    pool = await db.create_pool(install.owner_url, min_size=1, max_size=4)
    listener = Listener(DedicatedConnection(install.owner_url))
    await listener.start()
    registry = ProviderRegistry(pool, refresh=3600, debounce=0.25, listener=listener)  # no timed re-read meanwhile
    await registry.start()
    attacker = await install.attacker()
    try:
        # One read at start, one more when its listener's first connect asks for a resync.
        settled = await eventually(lambda: registry.reloads, equals=2, what="the registry's two first reads")
        async with asyncio.timeout(30):
            for _ in range(20):
                await attacker.execute("; ".join(["NOTIFY hookline_providers, 'pay-b'"] * 100))
                await asyncio.sleep(0.05)
        # A real change still reaches it; its notification comes after every forged one, so once it
        # is seen they have all been looked at.
        await install.owner.execute("UPDATE hookline.providers SET spec = spec || '{\"maxBodyBytes\": 2048}', "
                                    "updated_at = now() WHERE name = 'pay-b'")
        await eventually(lambda: (p := registry.get("pay-b")) is not None and p.max_body_bytes == 2048)
        assert registry.reloads == settled + 1  # 2,000 notifications, nothing changed: only the change re-read
    finally:
        await attacker.close()
        await registry.stop()
        await listener.stop()
        await pool.close()


async def test_retention_no_provider_can_switch_off(install: Install) -> None:
    """Row 5: a spec with doneHours 87,600 kept every team's events, as whole-partition drops waited
    for the longest retention. Now the install's maximum bounds it, and the default partition, which
    no drop reaches, is cleaned by the same rule."""
    owner = install.owner
    await owner.execute("UPDATE hookline.providers SET spec = spec || '{\"retention\": {\"doneHours\": 87600}}' "
                        "WHERE name = 'pay-a'")
    # Done long ago: before every partition, so in the default one.
    await owner.execute("INSERT INTO hookline.inbox (provider, event_id, body, status, received_at, processed_at) "
                        "VALUES ('pay-a', 'ancient', '', 'done', now() - interval '400 days', "
                        "now() - interval '400 days')")
    assert await owner.fetchval("SELECT count(*) FROM hookline.inbox_default WHERE event_id = 'ancient'") == 1
    pool = await db.create_pool(install.owner_url, min_size=1, max_size=2)
    try:
        report = await partitions.expire_inbox(pool, partitions.Retention(max_done_hours=720))
    finally:
        await pool.close()
    assert report.deleted >= 1
    assert await owner.fetchval("SELECT count(*) FROM hookline.inbox WHERE event_id = 'ancient'") == 0
    assert await owner.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'pay-b'") == 3


async def test_the_victims_partner_still_gets_duplicate(install: Install, log_dir: Path) -> None:
    """After every attack above the victim's partner retries an event: still answered duplicate,
    never stored twice."""
    attacker = await install.attacker()
    try:
        for statement in ("SELECT hookline.archive_provider_events('pay-b', 'x')",
                          "DELETE FROM hookline.inbox_keys WHERE provider = 'pay-b'",
                          "UPDATE hookline.inbox SET event_id = 'gone' WHERE provider = 'pay-b'"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attacker.execute(statement)
    finally:
        await attacker.close()
    service = receiver(install.owner_url, log_dir)
    try:
        async with aiohttp.ClientSession() as http, http.post(
                f"{service.url}/webhooks/pay-b", data=b'{"id": "evt-1"}',
                headers={"Content-Type": "application/json"}) as answer:
            status, body = answer.status, await answer.json()
    finally:
        service.stop()
    assert (status, body) == (200, {"status": "duplicate", "event_id": "evt-1"})
    assert await install.owner.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'pay-b'") == 3


async def test_an_upgrade_converges_the_tenant_roles_it_finds(scram_server: EmbeddedPostgres) -> None:
    """A database of version 24 whose tenants were made by that version's ensure_tenant (whole-table
    grants, namespace and uid in COMMENT ON ROLE): after migrate, the same roles have exactly the
    new privileges, and the worker's own path still works."""
    async with _install(scram_server, up_to=24) as old:
        comment = "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1"
        assert "team-b" in await old.owner.fetchval(comment, old.victim_role)
        attacker = await old.attacker()
        try:  # what version 24 let it do
            assert await attacker.fetchval("SELECT count(*) FROM hookline.providers WHERE secrets IS NOT NULL") == 1
            assert await attacker.execute("UPDATE hookline.inbox SET received_at = received_at "
                                          "WHERE provider = 'pay-a'") == "UPDATE 3"
        finally:
            await attacker.close()
        applied = await migrations.migrate(old.owner)
        assert "0025_tenant_boundary.sql" in applied
        assert await old.owner.fetchval(comment, old.victim_role) is None
        attacker = await old.attacker()
        try:
            for statement in ("SELECT secrets FROM hookline.providers",
                              "SELECT destination_secret FROM hookline.providers",
                              "UPDATE hookline.inbox SET received_at = received_at WHERE provider = 'pay-a'",
                              "SELECT hookline.archive_provider_events('pay-b', 'x')"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await attacker.execute(statement)
            assert [r["name"] for r in await attacker.fetch(db.query("list_provider_specs_without_secrets"))] \
                == ["pay-a"]
            assert await attacker.execute("UPDATE hookline.inbox SET status = 'done' WHERE provider = 'pay-a'") \
                == "UPDATE 3"
        finally:
            await attacker.close()


async def test_migrate_warns_only_where_every_role_may_create_in_public(database_url: str) -> None:
    """PostgreSQL 15 and newer let no role but the owner create in public: nothing to warn about."""
    migrate = await asyncio.to_thread(hookline_cli, database_url, "migrate")
    assert (migrate.returncode, migrate.stdout.strip(), migrate.stderr) == (0, "schema is up to date", "")
