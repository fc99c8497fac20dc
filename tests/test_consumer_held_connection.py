"""HeldConnection (core/consumer.py): the claim loop's pool connection, kept between back-to-back
statements and given back when the loop goes idle or a statement fails. Real pool, real Postgres."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from hookline.core import db
from hookline.core.consumer import HeldConnection
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKEND = "SELECT pg_backend_pid() AS pid"


@contextlib.asynccontextmanager
async def held_on(database_url: str, size: int, max_size: int
                  ) -> AsyncIterator[tuple[asyncpg.Pool, HeldConnection]]:
    pool = await db.create_pool(database_url, min_size=size, max_size=max_size, lean=True)
    held = HeldConnection(pool)
    try:
        yield pool, held
    finally:
        await held.release()
        await pool.close()


async def test_kept_between_statements_and_given_back(database_url: str) -> None:
    async with held_on(database_url, 2, 3) as (pool, held):
        first = await held.fetch(BACKEND)
        async with pool.acquire() as other:  # one more in use: the pool could still open a third
            assert await other.fetchval(BACKEND) != first[0]["pid"]
            assert (await held.fetch(BACKEND))[0]["pid"] == first[0]["pid"]  # the same connection, kept
        assert held.held and pool.get_idle_size() == 1
        await held.release()
        assert not held.held and pool.get_idle_size() == 2
        await held.release()  # nothing held: nothing to do


async def test_a_failed_statement_gives_the_connection_back(database_url: str) -> None:
    async with held_on(database_url, 2, 2) as (pool, held):
        await held.fetch(BACKEND)
        with pytest.raises(asyncpg.DivisionByZeroError):
            await held.fetch("SELECT 1 / 0")
        assert not held.held and pool.get_idle_size() == 2
        assert (await held.fetch("SELECT 2 AS n"))[0]["n"] == 2 and held.held


async def test_given_back_when_the_pool_has_no_other_connection(database_url: str) -> None:
    async with held_on(database_url, 2, 2) as (pool, held):
        await held.fetch(BACKEND)
        assert held.held
        async with pool.acquire() as other:  # e.g. a handler's transaction: now nothing is left for others
            await held.fetch(BACKEND)
            assert not held.held and pool.get_idle_size() == 1  # given back after its statement
            assert await other.fetchval("SELECT 1") == 1


async def test_a_kept_connection_the_server_ended_is_replaced_before_the_next_statement(database_url: str,
                                                                                       pool: asyncpg.Pool) -> None:
    # A failover or a restart ends every backend: the loop's next statement must run on a new
    # connection, not fail once on the dead one (a failed claim costs the loop a second's pause).
    async with held_on(database_url, 2, 3) as (_, held):
        [before] = await held.fetch(BACKEND)
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", before["pid"])
        await eventually(lambda: pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                                               before["pid"]), equals=0)
        await eventually(lambda: held.lost)  # the client reads the server's goodbye a moment later
        [after] = await held.fetch(BACKEND)
        assert after["pid"] != before["pid"] and held.held

