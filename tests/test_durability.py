"""What a failover or crash can lose (core/durability.py): read from a real primary with a real
streaming standby, as `hookline status`, a service's start-up line and its metrics report it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline.core import durability, migrations
from hookline.core.embedded import EmbeddedPostgres
from support.postgres import start_standby, with_database
from support.processes import hookline_cli, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A server of its own: its replication settings are changed, which would stall other tests' commits."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("durability-primary"))
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


@pytest.fixture
async def admin(primary: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(primary.url)
    try:
        yield conn
    finally:
        await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        await conn.execute("ALTER SYSTEM RESET synchronous_commit")
        await conn.execute("SELECT pg_reload_conf()")
        await conn.close()


async def _set(admin: asyncpg.Connection, **settings: str) -> None:
    """ALTER SYSTEM and reload; each session applies it a moment later (the postmaster signals it)."""
    for name, value in settings.items():
        await admin.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    await admin.execute("SELECT pg_reload_conf()")

    async def in_effect() -> bool:
        return all([await admin.fetchval("SELECT current_setting($1)", name) == value
                    for name, value in settings.items()])

    await eventually(in_effect, what=f"{settings} in effect")


async def test_a_lone_server_warns_that_a_failover_can_lose_events(admin: asyncpg.Connection) -> None:
    found = await durability.read(admin)
    assert found.synchronous_standby_names == "" and found.standbys == 0
    assert set(found.warnings()) == {"no_synchronous_standby"}

    await _set(admin, synchronous_commit="off")
    assert set((await durability.read(admin)).warnings()) == {"no_synchronous_standby", "synchronous_commit_off"}


async def test_a_connected_synchronous_standby_clears_the_warning_and_its_loss_brings_it_back(
        primary: EmbeddedPostgres, admin: asyncpg.Connection, tmp_path: Path) -> None:
    standby = start_standby(primary, tmp_path / "standby")
    try:
        await _set(admin, synchronous_standby_names="*")

        async def synchronous() -> bool:
            return (await durability.read(admin)).synchronous_standbys == 1

        await eventually(synchronous, what="the standby streaming synchronously")
        found = await durability.read(admin)
        assert found.warnings() == {} and found.standbys == 1

        # Commits that do not wait for the standby it has lose its protection.
        await _set(admin, synchronous_commit="local")
        assert set((await durability.read(admin)).warnings()) == {"standby_not_awaited"}
        await _set(admin, synchronous_commit="on")

        # A role without pg_monitor sees a standby but not how it streams: a note, not a false warning.
        await admin.execute("DROP ROLE IF EXISTS plain; CREATE ROLE plain LOGIN PASSWORD 'plain-pw'")
        plain = await asyncpg.connect(f"postgresql://plain:plain-pw@127.0.0.1:{primary.port}/postgres")
        try:
            seen = await durability.read(plain)
        finally:
            await plain.close()
        assert seen.unseen_standbys == 1 and seen.synchronous_standbys == 0
        assert seen.warnings() == {} and "pg_monitor" in seen.notes()[0]
    finally:
        standby.stop("immediate")

    async def gone() -> bool:
        return (await durability.read(admin)).standbys == 0

    await eventually(gone, what="the standby's walsender gone")
    assert set((await durability.read(admin)).warnings()) == {"synchronous_standby_disconnected"}


async def test_status_and_a_service_report_it_and_neither_refuses(
        primary: EmbeddedPostgres, admin: asyncpg.Connection, log_dir: Path) -> None:
    await admin.execute("DROP DATABASE IF EXISTS durability WITH (FORCE)")
    await admin.execute("CREATE DATABASE durability")
    url = with_database(primary.url, "durability")
    conn = await asyncpg.connect(url)
    try:
        await migrations.migrate(conn)
    finally:
        await conn.close()

    result = hookline_cli(url, "status")
    assert result.returncode == 0, result.stdout + result.stderr  # a warning, not unhealthy
    assert "DATABASE  synchronous_commit=on, synchronous_standby_names='', standbys: 0 synchronous of 0" \
        in result.stdout
    assert "warning: no synchronous standby" in result.stdout
    as_json = json.loads(hookline_cli(url, "status", "-o", "json").stdout)
    assert as_json["healthy"] is True and as_json["database"]["synchronous_standbys"] == 0
    assert as_json["database"]["warnings"][0].startswith("no synchronous standby")

    service = worker(url, log_dir, "--concurrency", "1")
    try:
        assert "database durability: acknowledged events can be lost: no synchronous standby" in service.logs()
        async with aiohttp.ClientSession() as http, http.get(f"{service.url}/metrics") as answer:
            text = await answer.text()
        assert 'hookline_database_durability_warning{reason="no_synchronous_standby"} 1.0' in text
        assert 'hookline_database_durability_warning{reason="fsync_off"} 0.0' in text
        assert "hookline_database_synchronous_standbys 0.0" in text
    finally:
        assert service.stop() == 0
