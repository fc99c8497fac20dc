"""The supported Postgres majors (docs/postgres.md): the oldest, Debian's 15, migrates and serves; a
server older than Hookline supports is refused in one line before anything is written."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg
import pytest

from hookline.core import migrations
from hookline.core.embedded import EmbeddedPostgres
from support.engines import postgres_15
from support.processes import hookline_cli

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def server_15(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("postgres-15"), install=postgres_15())
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


async def test_the_oldest_supported_major_migrates(server_15: EmbeddedPostgres) -> None:
    result = hookline_cli(server_15.url, "migrate")
    assert result.returncode == 0, result.stderr
    conn = await asyncpg.connect(server_15.url)
    try:
        assert await migrations.check_server(conn) == migrations.OLDEST_SUPPORTED == 15
        assert await conn.fetchval("SELECT count(*) FROM hookline.schema_migrations") == len(migrations.available())
    finally:
        await conn.close()
    assert hookline_cli(server_15.url, "status").returncode == 0


async def test_an_older_server_is_refused_before_anything_is_written(server_15: EmbeddedPostgres) -> None:
    conn = await asyncpg.connect(server_15.url)
    try:
        await conn.execute("DROP DATABASE IF EXISTS untouched")
        await conn.execute("CREATE DATABASE untouched")
    finally:
        await conn.close()
    untouched = await asyncpg.connect(server_15.url.rsplit("/", 1)[0] + "/untouched")
    try:
        # This server, held to a minimum one above it: the refusal an older one gets.
        with pytest.raises(migrations.UnsupportedServer) as refused:
            await migrations.check_server(untouched, oldest=16)
        assert str(refused.value).startswith("PostgreSQL 15.")
        assert "is too old: Hookline needs PostgreSQL 16 or newer (tested on 16 to 18); nothing was changed" \
            in str(refused.value)
        assert "\n" not in str(refused.value)
        assert await untouched.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = 'hookline'") == 0
    finally:
        await untouched.close()
