"""services/hookline/core/sql/schema.sql is what the migrations add up to (tests/support/schema.py)."""

from __future__ import annotations

import uuid

import pytest

from support import schema
from support.postgres import PgServer


async def test_the_schema_file_is_what_the_migrations_make(pg_server: PgServer) -> None:
    written = schema.SCHEMA_FILE.read_text()
    database = f"t_schema_{uuid.uuid4().hex[:10]}"
    try:
        dumped = await schema.migrated_dump(pg_server.admin_url, database)
    finally:
        await pg_server.drop_database(database)
    if schema.major_of(dumped) != schema.major_of(written):
        pytest.skip(f"schema.sql was dumped from PostgreSQL {schema.major_of(written)}, this server is "
                    f"{schema.major_of(dumped)}: pg_dump writes the same schema differently")
    assert dumped == written, "the migrations and schema.sql disagree: run `make schema` (after a new migration)"
