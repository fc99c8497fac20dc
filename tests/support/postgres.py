"""Test databases on one Postgres server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from hookline.core.embedded import EmbeddedPostgres

TEMPLATE = "hookline_test_template"


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


class PgServer:
    def __init__(self, admin_url: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_url = admin_url
        self.embedded = embedded

    def url_for(self, name: str) -> str:
        return with_database(self.admin_url, name)

    async def create_database(self, template: str | None = TEMPLATE) -> str:
        """A new database: a copy of the migrated template, or empty with ``template=None``."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        finally:
            await conn.close()
        return name

    async def drop_database(self, name: str) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def lock_waiters(conn: asyncpg.Connection | asyncpg.Pool, query_like: str = "%") -> int:
    """Sessions of this database waiting on a lock, running a statement LIKE ``query_like``: what
    a test waits for before asserting that a statement is held, instead of sleeping."""
    count: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND query LIKE $1", query_like)
    return count


@asynccontextmanager
async def database_with_providers(server: PgServer, providers_yaml: str) -> AsyncIterator[str]:
    """A fresh database with ``providers_yaml`` applied through the real CLI; dropped afterwards."""
    from support.processes import hookline_cli

    name = await server.create_database()
    url = server.url_for(name)
    try:
        result = hookline_cli(url, "providers", "apply", "-f", "-", stdin=providers_yaml)
        assert result.returncode == 0, result.stderr
        yield url
    finally:
        await server.drop_database(name)


def start_standby(primary: EmbeddedPostgres, data_dir: Path) -> EmbeddedPostgres:
    """A streaming standby of ``primary`` (pg_basebackup -R), started on a port of its own; it connects
    as application ``walreceiver``. Uses EmbeddedPostgres's internals: a standby is a test's need only."""
    standby = EmbeddedPostgres(data_dir, install=primary._install_source)
    standby.data_dir.mkdir(parents=True, exist_ok=True)
    standby._choose_home()
    standby._run("pg_basebackup", "-d", primary.url, "-D", str(standby.pgdata), "-R", "-X", "stream",
                 "--no-sync", "-c", "fast")
    standby._save_password(primary.password)  # a copy of the primary: the same roles and passwords
    standby.start()
    return standby
