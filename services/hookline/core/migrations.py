"""Versioned schema migrations, applied in order and recorded in hookline.schema_migrations.

A transaction-level advisory lock serializes concurrent runs: N processes starting
at once all call ``migrate``; the first applies, the others wait and then find
nothing left to do.
"""

from __future__ import annotations

import importlib.resources
import logging

import asyncpg

from hookline.core import db

log = logging.getLogger(__name__)

# Any constant shared by every Hookline process; "hookline" as a 64-bit integer.
_ADVISORY_LOCK_KEY = 0x686F6F6B6C696E65 - 2**63


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
    async with conn.transaction():
        await conn.execute(_query("lock_migrations"), _ADVISORY_LOCK_KEY)
        await conn.execute(_query("create_schema"))
        await conn.execute(_query("create_schema_migrations"))
        done = {r["version"] for r in await conn.fetch(_query("applied_migrations"))}
        for version, name, sql in available():
            if version in done or (up_to is not None and version > up_to):
                continue
            log.info("applying migration", extra={"migration": name})
            await conn.execute(sql)
            await conn.execute(_query("record_migration"), version, name)
            applied_now.append(name)
    return applied_now
