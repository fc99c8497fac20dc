"""The attempt log partitioned by time (migration 0017): an upgrade in place keeps every logged
attempt and goes on logging; one event's attempts are read from the partitions since it arrived,
through the row index of each; retention drops whole partitions once older than `retain`."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from hookline.core import db, migrations, partitions
from hookline.core.queue import INBOX
from support.inbox import insert_events
from support.postgres import PgServer
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

ATTEMPTS = "hookline.attempts"
PREVIOUS_SCHEMA = 16
ATTEMPT_COLUMNS = "queue, row_id, part, attempt, worker, outcome, error, http_status, latency_ms, at"


@pytest.fixture
async def old_database(pg_server: PgServer) -> AsyncIterator[str]:
    """A database migrated only up to the previous schema (not from the test template)."""
    name = await pg_server.create_database(template=None)
    try:
        yield pg_server.url_for(name)
    finally:
        await pg_server.drop_database(name)


async def book_outcomes(conn: asyncpg.Connection | asyncpg.Pool, provider: str) -> list[int]:
    """Three events of ``provider`` booked through the queue's statements: done, retry, dead."""
    await insert_events(conn, provider, 3)
    done, retried, buried = await INBOX.claim(conn, provider, 3, "w-1", 60)
    assert await INBOX.complete(conn, [(done["id"], done["attempts"])], "w-1") == {done["id"]}
    assert await INBOX.retry(conn, retried["id"], retried["attempts"], "w-1", 600, "HTTP 503")
    assert await INBOX.bury(conn, buried["id"], buried["attempts"], "w-1", "gave up")
    return [done["id"], retried["id"], buried["id"]]


async def test_upgrade_keeps_every_attempt_and_logging_goes_on(old_database: str) -> None:
    conn = await asyncpg.connect(old_database)
    try:
        await migrations.migrate(conn, up_to=PREVIOUS_SCHEMA)
        old_ids = await book_outcomes(conn, "legacy")
        before = [tuple(r) for r in await conn.fetch(f"SELECT {ATTEMPT_COLUMNS} FROM {ATTEMPTS} ORDER BY row_id")]
        assert [(r[1], r[5]) for r in before] == list(zip(old_ids, ["done", "retry", "dead"], strict=True))

        applied = await migrations.migrate(conn)
        assert applied and applied[0].startswith("0017_")
        assert await conn.fetchval("SELECT relkind::text FROM pg_class WHERE oid = $1::regclass", ATTEMPTS) == "p"
        after = [tuple(r) for r in await conn.fetch(f"SELECT {ATTEMPT_COLUMNS} FROM {ATTEMPTS} ORDER BY row_id")]
        assert after == before
        # The old rows are the legacy partition (attached, not copied); new days have their own.
        legacy = await conn.fetchval(f"SELECT DISTINCT tableoid::regclass::text FROM {ATTEMPTS}")
        assert legacy == "hookline.attempts_legacy"
        names = [r["name"] for r in await conn.fetch(db.query("list_partitions", "partitions.sql"), ATTEMPTS)]
        assert "hookline.attempts_legacy" in names and "hookline.attempts_default" in names
        assert sum(name.startswith("hookline.attempts_p") for name in names) == 3  # the days ahead

        new_ids = await book_outcomes(conn, "fresh")
        logged = {r["row_id"]: r["outcome"] for r in await conn.fetch(
            f"SELECT row_id, outcome FROM {ATTEMPTS} WHERE part = 'fresh'")}
        assert logged == dict(zip(new_ids, ["done", "retry", "dead"], strict=True))
    finally:
        await conn.close()


def plan_nodes(plan: Any) -> list[dict[str, Any]]:
    if isinstance(plan, list):
        return [n for item in plan for n in plan_nodes(item)]
    if not isinstance(plan, dict):
        return []
    found = [plan] if "Node Type" in plan else []
    return found + [n for value in plan.values() if isinstance(value, (list, dict)) for n in plan_nodes(value)]


async def test_one_events_attempts_are_read_from_the_partitions_since_it_arrived(pool: asyncpg.Pool) -> None:
    """Attempts spread over four daily partitions; `events show`'s statement, bound at the day
    the event arrived, skips the partitions before it and reads each other one by its index."""
    await pool.execute(f"""
        INSERT INTO {ATTEMPTS} (at, queue, row_id, part, attempt, outcome)
        SELECT date_bin('1 day', now(), timestamptz '2000-01-01 00:00+00') + (g % 4) * interval '1 day'
               + interval '1 hour', 'inbox', g % 500, 'p',
               g / 500 + 1, 'retry'
        FROM generate_series(0, 19999) AS g;
        ANALYZE {ATTEMPTS};""")
    # The start of the third day's partition (the partition grid is UTC days, migration 0011).
    arrived = await pool.fetchval("SELECT date_bin('1 day', now(), timestamptz '2000-01-01 00:00+00') "
                                  "+ interval '2 days'")
    # The pool decodes json: the plan arrives as a list.
    plan = await pool.fetchval("EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) " + db.query("attempts_of", "history.sql"),
                               "inbox", 42, arrived)
    nodes = plan_nodes(plan)
    # The default partition (rows of times no partition covers) is never pruned; it is empty,
    # so reading it whole costs nothing.
    default = [n for n in nodes if n.get("Relation Name") == "attempts_default"]
    assert all(n["Actual Rows"] == 0 for n in default)
    scans = [n for n in nodes if "Relation Name" in n and n not in default]
    assert {n["Relation Name"] for n in scans} == {"attempts_p" + (arrived + datetime.timedelta(days=d)).strftime(
        "%Y%m%d_%H%M%S") for d in (0, 1)}, scans
    assert all(n["Node Type"] in ("Index Scan", "Bitmap Heap Scan") for n in scans), scans
    indexes = {n["Index Name"] for n in nodes if "Index Name" in n}
    assert indexes and all(name.endswith("row_id_attempt_idx") for name in indexes), indexes
    rows = await pool.fetch(db.query("attempts_of", "history.sql"), "inbox", 42, arrived)
    assert [r["at"] >= arrived for r in rows] == [True] * len(rows) and rows


async def test_retention_drops_whole_partitions_older_than_retain(pool: asyncpg.Pool) -> None:
    for row in await pool.fetch(db.query("list_partitions", "partitions.sql"), ATTEMPTS):
        if not row["is_default"]:
            await pool.execute(f"DROP TABLE {row['name']}")
    await pool.execute("UPDATE hookline.partition_config SET width = '1 second', premake = 5, retain = '1 second' "
                       "WHERE parent = $1", ATTEMPTS)
    await partitions.ensure_partitions(pool, ATTEMPTS)
    old = await book_outcomes(pool, "stripe")
    old_partitions = {r["p"] for r in await pool.fetch(
        f"SELECT DISTINCT tableoid::regclass::text AS p FROM {ATTEMPTS}")}
    assert old_partitions and "hookline.attempts_default" not in old_partitions

    start = await pool.fetchval("SELECT clock_timestamp()")
    await eventually(lambda: pool.fetchval(
        "SELECT clock_timestamp() > $1::timestamptz + interval '2.5 seconds'", start),
                     timeout=10)
    await partitions.ensure_partitions(pool, ATTEMPTS)
    new = await book_outcomes(pool, "stripe")
    dropped: set[str] = set()
    while passed := (await partitions.expire_by_age(pool))["dropped"]:
        dropped |= set(passed)

    assert old_partitions <= dropped
    left = {r["row_id"] for r in await pool.fetch(f"SELECT row_id FROM {ATTEMPTS}")}
    assert left == set(new) and not left & set(old)
    gone = await pool.fetch("SELECT p FROM unnest($1::text[]) AS p WHERE to_regclass(p) IS NOT NULL",
                            sorted(old_partitions))
    assert gone == []
