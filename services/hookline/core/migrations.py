"""Versioned schema migrations, applied in order and recorded in hookline.schema_migrations.

A lock on hookline.schema_migrations serializes concurrent runs: N processes starting at
once all call ``migrate``; the first applies, the others wait and then find nothing left
to do. It is a table lock, not an advisory key, so that no tenant role can hold it.
"""

from __future__ import annotations

import importlib.resources
import logging

import asyncpg

from hookline.core import db
from hookline.core.config import ConfigError

log = logging.getLogger(__name__)

# Serializes only the very first run on a database (schema_migrations.sql, lock_bootstrap);
# "hookline" as a 64-bit integer.
_BOOTSTRAP_LOCK_KEY = 0x686F6F6B6C696E65 - 2**63

# The Postgres majors the suite runs on (the embedded 18 and Debian's 15: docs/postgres.md). An older
# server is refused before anything is written: a migration failing half-way through on a missing
# feature would say less, and a schema that migrated but behaves differently would say nothing.
OLDEST_SUPPORTED = 15
NEWEST_TESTED = 18
STANDBY = ("is a read-only standby: point HOOKLINE_DATABASE_URL at the primary, or list every node "
           "(postgresql://user@host1,host2/db) with ?target_session_attrs=read-write (docs/postgres.md)")


class UnsupportedServer(ConfigError):
    """The server cannot hold Hookline's schema: too old, or a standby."""


async def check_server(conn: asyncpg.Connection | asyncpg.Pool, oldest: int = OLDEST_SUPPORTED) -> int:
    """The server's major version; raises UnsupportedServer (one line) when it is older than ``oldest``
    or is a standby (every statement that writes would fail, one by one)."""
    facts = await conn.fetchrow(_query("server_facts"))
    assert facts is not None
    major = int(facts["version_num"]) // 10000
    if major < oldest:
        raise UnsupportedServer(f"PostgreSQL {facts['version']} is too old: Hookline needs PostgreSQL {oldest} or "
                                f"newer (tested on {oldest} to {NEWEST_TESTED}); nothing was changed")
    if facts["standby"]:
        raise UnsupportedServer(f"the database server {STANDBY}")
    if major > NEWEST_TESTED:
        log.warning("this PostgreSQL is newer than any Hookline was tested on",
                    extra={"major": major, "newest_tested": NEWEST_TESTED})
    return major


def _query(name: str) -> str:
    return db.query(name, "schema_migrations.sql")


def available() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration shipped in the package, in order."""
    folder = importlib.resources.files("hookline.core").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(conn: asyncpg.Connection, up_to: int | None = None) -> list[str]:
    """Apply every migration not applied yet (up to version ``up_to`` when given: upgrade tests
    populate the schema as it was); return the names applied."""
    applied_now: list[str] = []
    await check_server(conn)
    async with conn.transaction():
        await conn.execute(_query("pin_search_path"))
        if not await conn.fetchval(_query("schema_migrations_exists")):
            await conn.execute(_query("lock_bootstrap"), _BOOTSTRAP_LOCK_KEY)
            await conn.execute(_query("create_schema"))
            await conn.execute(_query("create_schema_migrations"))
        await conn.execute(_query("lock_migrations"))
        done = {r["version"] for r in await conn.fetch(_query("applied_migrations"))}
        for version, name, sql in available():
            if version in done or (up_to is not None and version > up_to):
                continue
            log.info("applying migration", extra={"migration": name})
            await conn.execute(sql)
            await conn.execute(_query("record_migration"), version, name)
            applied_now.append(name)
    return applied_now


PUBLIC_SCHEMA_WARNING = (
    "every role may create objects in schema public, so a role could plant a function there that "
    "shadows a built-in one for whoever has public on its search path; Hookline's own statements and "
    "functions do not, but your handlers and other applications may. Fix it once, as the database "
    "owner: REVOKE CREATE ON SCHEMA public FROM PUBLIC;")


async def public_schema_warning(conn: asyncpg.Connection) -> str | None:
    """The warning to show when PUBLIC may create in schema public (None when it may not)."""
    return PUBLIC_SCHEMA_WARNING if await conn.fetchval(_query("public_schema_creatable")) else None


async def console_role_setup(conn: asyncpg.Connection) -> str | None:
    """Make (or converge) the console's reading role; why `hookline console` cannot run yet, or None.
    An owner without CREATEROLE migrates all the same: only the console waits for the role."""
    problem: str | None = await conn.fetchval(_query("console_role_setup"))
    return None if problem is None else f"{problem} (only `hookline console` needs it)"
