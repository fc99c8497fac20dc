"""The console's reading role (migration 0029) against a real Postgres, logged in as the owners.

Roles are the server's: each database gets a role of its own, which no other database's owner
can switch to, and a console whose role someone else may use refuses to start. An owner without
CREATEROLE migrates all the same (one warning, with the commands that fix it); only the console
waits, and the fix is taken up by the next ``hookline migrate``. A copied database gets its own
role at its first migrate."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hookline.console.access import Access
from hookline.console.store import Store
from hookline.core import db, migrations
from hookline.core.embedded import free_port
from support.postgres import PgServer, with_database
from support.processes import hookline_cli

ONLY_A = Access(subject="team-a", read=frozenset({"a"}), replay=frozenset(), install_wide=False)
RECORDED = "SELECT name FROM hookline.console_role"
PROBLEM = "SELECT hookline.console_role_problem()"


class Owned(NamedTuple):
    database: str
    owner: str
    url: str  # as the owner


@contextlib.asynccontextmanager
async def owned_database(pg_server: PgServer, *, createrole: bool) -> AsyncIterator[Owned]:
    """An empty database owned by a new non-superuser login role, not migrated yet."""
    suffix = uuid.uuid4().hex[:10]
    owner, database = f"owner_{suffix}", f"c_{suffix}"
    admin = await asyncpg.connect(pg_server.admin_url)
    try:
        await admin.execute(f"CREATE ROLE {owner} LOGIN {'CREATEROLE' if createrole else 'NOCREATEROLE'} "
                            f"PASSWORD 'pw-{suffix}'")
        await admin.execute(f'CREATE DATABASE "{database}" OWNER {owner}')
    finally:
        await admin.close()
    parts = urlsplit(with_database(pg_server.admin_url, database))
    url = urlunsplit(parts._replace(netloc=f"{owner}:pw-{suffix}@{parts.netloc.rpartition('@')[2]}"))
    try:
        yield Owned(database, owner, url)
    finally:
        await pg_server.drop_database(database)
        admin = await asyncpg.connect(pg_server.admin_url)
        try:
            await admin.execute(f"DROP OWNED BY {owner} CASCADE; DROP ROLE {owner}")
        finally:
            await admin.close()


async def seed(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    await conn.execute("""
        INSERT INTO hookline.providers (name, spec, secrets) VALUES ('a', '{"signature": {"scheme": "none"}}', '[]'),
                                                                    ('b', '{"signature": {"scheme": "none"}}', '[]');
        INSERT INTO hookline.inbox (provider, event_id, body) VALUES ('a', 'a_1', '\\x7b7d'), ('b', 'b_1', '\\x7b7d');
    """)


async def test_an_owner_without_createrole_migrates_and_only_the_console_waits(pg_server: PgServer) -> None:
    async with owned_database(pg_server, createrole=False) as made:
        migrated = hookline_cli(made.url, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        warnings = [line for line in migrated.stderr.splitlines() if "warning" in line]
        assert len(warnings) == 1, migrated.stderr
        assert "may not create it" in warnings[0] and "only `hookline console` needs it" in warnings[0]
        console = hookline_cli(made.url, "console", "--port", str(free_port()))
        assert console.returncode == 2, console
        assert "does not exist" in console.stderr and "CREATE ROLE" in console.stderr, console.stderr

        # What the warning says to run, run by the server's superuser, then migrate again.
        fix = re.search(r"run: (.*); then `hookline migrate` again", warnings[0])
        assert fix is not None, warnings[0]
        admin = await asyncpg.connect(with_database(pg_server.admin_url, made.database))
        try:
            await admin.execute(fix.group(1))
        finally:
            await admin.close()
        again = hookline_cli(made.url, "migrate")
        assert again.returncode == 0 and "warning" not in again.stderr, again.stderr

        pool = await db.create_pool(made.url, max_size=2)
        try:
            assert await pool.fetchval(PROBLEM) is None
            await seed(pool)
            async with Store(pool).scoped(ONLY_A) as conn:
                assert [r["provider"] for r in await conn.fetch("SELECT provider FROM hookline.inbox")] == ["a"]
        finally:
            await pool.close()


async def _migrated(made: Owned) -> asyncpg.Connection:
    conn = await asyncpg.connect(made.url)
    await migrations.migrate(conn)
    assert await migrations.console_role_setup(conn) is None
    return conn


async def test_each_database_has_its_own_role_and_no_other_owner_can_switch_to_it(pg_server: PgServer) -> None:
    async with (owned_database(pg_server, createrole=True) as made_a,
                owned_database(pg_server, createrole=True) as made_b):
        owner_a, owner_b = await _migrated(made_a), await _migrated(made_b)
        try:
            role_a, role_b = await owner_a.fetchval(RECORDED), await owner_b.fetchval(RECORDED)
            assert role_a != role_b and role_a.startswith("hookline_console_")
            await seed(owner_a)
            # B's owner, logged in to A's database, can neither switch to A's role nor take it.
            b_in_a = await asyncpg.connect(with_database(made_b.url, made_a.database))
            try:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await b_in_a.execute(f"SET ROLE {role_a}")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await b_in_a.execute(f"SELECT set_config('role', '{role_a}', false)")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await b_in_a.fetch("SELECT * FROM hookline.inbox")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await b_in_a.fetchval("SELECT hookline.console_role_setup()")
            finally:
                await b_in_a.close()
        finally:
            await owner_a.close()
            await owner_b.close()


async def test_a_console_whose_role_another_role_may_use_refuses_to_start(pg_server: PgServer) -> None:
    async with owned_database(pg_server, createrole=True) as made:
        owner = await _migrated(made)
        try:
            role = await owner.fetchval(RECORDED)
            admin = await asyncpg.connect(pg_server.admin_url)
            try:
                await admin.execute(f"CREATE ROLE snooper_{made.owner} NOLOGIN; GRANT {role} TO snooper_{made.owner}")
                problem = await owner.fetchval(PROBLEM)
                assert problem is not None and f"snooper_{made.owner}" in problem and "REVOKE" in problem, problem
                console = hookline_cli(made.url, "console", "--port", str(free_port()))
                assert console.returncode == 2 and f"snooper_{made.owner}" in console.stderr, console
                await admin.execute(f"REVOKE {role} FROM snooper_{made.owner}")
                assert await owner.fetchval(PROBLEM) is None
            finally:
                await admin.execute(f"DROP ROLE IF EXISTS snooper_{made.owner}")
                await admin.close()
        finally:
            await owner.close()


async def test_a_copied_database_gets_a_role_of_its_own_at_migrate(pg_server: PgServer) -> None:
    """The suite's databases are copies of one migrated template: the copy starts with the
    template's role, and migrate moves it to its own, taking every grant and policy along."""
    name = await pg_server.create_database()
    try:
        conn = await asyncpg.connect(pg_server.url_for(name))
        try:
            shared = await conn.fetchval(RECORDED)
            own = await conn.fetchval("SELECT hookline.console_role_own_name()")
            assert shared != own
            assert await migrations.console_role_setup(conn) is None
            assert await conn.fetchval(RECORDED) == own
            for role, reads in ((shared, False), (own, True)):
                assert await conn.fetchval("SELECT has_table_privilege($1, 'hookline.inbox', 'SELECT')", role) is reads
            bound = await conn.fetch("SELECT polname FROM pg_policy WHERE polname LIKE 'console\\_%' "
                                     "AND polroles = ARRAY[(SELECT oid FROM pg_roles WHERE rolname = $1)]", own)
            assert len(bound) == 7
            await seed(conn)
        finally:
            await conn.close()
        pool = await db.create_pool(pg_server.url_for(name), max_size=2)
        try:
            async with Store(pool).scoped(ONLY_A) as scoped:
                assert await scoped.fetchval("SELECT current_user") == own
                assert [r["provider"] for r in await scoped.fetch("SELECT provider FROM hookline.inbox")] == ["a"]
        finally:
            await pool.close()
    finally:
        await pg_server.drop_database(name)
