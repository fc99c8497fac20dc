"""hookline_db_pool_* read every open pool of the process at scrape time, and forget closed ones."""

from __future__ import annotations

from prometheus_client import REGISTRY

from hookline.core import db


def _sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def test_pool_gauges_follow_a_real_pool(database_url: str) -> None:
    in_use_before = _sample("hookline_db_pool_connections", state="in_use")
    max_before = _sample("hookline_db_pool_max_connections")
    pool = await db.create_pool(database_url, min_size=1, max_size=3)
    try:
        assert _sample("hookline_db_pool_max_connections") == max_before + 3
        async with pool.acquire():
            assert _sample("hookline_db_pool_connections", state="in_use") == in_use_before + 1
        assert _sample("hookline_db_pool_connections", state="in_use") == in_use_before
        assert _sample("hookline_db_pool_connections", state="idle") >= 1
    finally:
        await pool.close()
    assert _sample("hookline_db_pool_max_connections") == max_before
