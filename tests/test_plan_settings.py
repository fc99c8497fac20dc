"""The worker's and relay's generic-plan pools (db.GENERIC_PLAN_SETTINGS) on a Postgres built with
LLVM (Debian's Postgres 15; the embedded one has no JIT): a plan left with a disabled scan carries
its "disabled" cost of 1e10, far past jit_above_cost, and was JIT-compiled at every run (the relay's
claim took 4.4 s on a pg_auto_failover node). Such a pool never JIT-compiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookline.core import db
from hookline.core.embedded import EmbeddedPostgres
from support.engines import postgres_15

pytestmark = pytest.mark.asyncio(loop_scope="session")

JIT_ABOVE_COST = 100_000  # Postgres's default jit_above_cost


async def test_a_generic_plan_pool_never_jit_compiles(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg15", install=postgres_15())
    url = server.start()
    try:
        pool = await db.create_pool(url, generic_plans=True, min_size=1, max_size=1)
        try:
            assert await pool.fetchval("SELECT count(*) FROM pg_available_extensions") > 0
            await pool.execute("CREATE TABLE unindexed (x int)")
            plan = (await pool.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM unindexed"))[0]
            assert plan["Plan"]["Total Cost"] > JIT_ABOVE_COST  # the disabled sequential scan's cost
            assert "JIT" not in plan, plan["JIT"]
            # A handler's transaction gets Postgres's default back (worker/processing.py).
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(db.DEFAULT_PLAN_SETTINGS_LOCAL)
                assert await conn.fetchval("SHOW jit") == "on"
        finally:
            await pool.close()
    finally:
        server.stop()
