"""HeldConnection (core/consumer.py): the claim loop's pool connection, kept between back-to-back
statements and given back when the loop goes idle or a statement fails. Real pool, real Postgres."""

from __future__ import annotations

import asyncpg
import pytest

from hookline.core import db
from hookline.core.consumer import HeldConnection

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKEND = "SELECT pg_backend_pid() AS pid"


async def test_kept_between_statements_and_given_back(database_url: str) -> None:
    pool = await db.create_pool(database_url, min_size=2, max_size=2, lean=True)
    held = HeldConnection(pool)
    try:
        first = await held.fetch(BACKEND)
        async with pool.acquire() as other:  # the pool's other connection is the only one left
            assert await other.fetchval(BACKEND) != first[0]["pid"]
            assert (await held.fetch(BACKEND))[0]["pid"] == first[0]["pid"]  # the same connection, kept
        assert held.held and pool.get_idle_size() == 1
        await held.release()
        assert not held.held and pool.get_idle_size() == 2
        await held.release()  # nothing held: nothing to do
    finally:
        await held.release()
        await pool.close()


async def test_a_failed_statement_gives_the_connection_back(database_url: str) -> None:
    pool = await db.create_pool(database_url, min_size=1, max_size=1, lean=True)
    held = HeldConnection(pool)
    try:
        await held.fetch(BACKEND)
        with pytest.raises(asyncpg.DivisionByZeroError):
            await held.fetch("SELECT 1 / 0")
        assert not held.held
        # The pool's only connection is free again: another user gets it, and the next fetch takes it back.
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
        assert (await held.fetch("SELECT 2 AS n"))[0]["n"] == 2 and held.held
    finally:
        await held.release()
        await pool.close()
