"""The operator's statistics: one query for every provider, signals that mean what they say.

Real Postgres; the status numbers derived from them are checked against the CRD's own
validation by test_status_validation.py (real API server).
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from hookline.core import db
from hookline.core.inbox_stats import ProviderStats, provider_stats
from hookline_operator.stats import status_fields
from support.inbox import insert_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_no_events_no_rows(pool) -> None:
    assert await provider_stats(pool) == {}


async def test_future_retries_are_not_backlog_and_never_make_the_age_negative(pool) -> None:
    await insert_events(pool, "p", 3)
    await pool.execute("UPDATE hookline.inbox SET attempts = 2, next_attempt_at = now() + interval '1 hour'")
    stats = (await provider_stats(pool))["p"]
    assert stats == ProviderStats(retrying=3)
    assert stats.backlog == 0
    assert status_fields(stats)["oldestPendingSeconds"] == 0


async def test_each_state_is_counted_once_where_it_belongs(pool) -> None:
    await insert_events(pool, "p", 10)
    ids = [r["id"] for r in await pool.fetch("SELECT id FROM hookline.inbox ORDER BY id")]
    # 0-1 due (one of them waiting 100 s), 2-3 in flight (3 with an expired lease), 4 retrying,
    # 5 deferred and not due, 6 deferred and due again, 7 dead, 8 done, 9 a future first attempt
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() - interval '100 seconds' WHERE id = $1",
                       ids[0])
    await pool.execute("UPDATE hookline.inbox SET status = 'processing', attempts = 1, locked_by = 'w', "
                       "lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1)", ids[2:4])
    await pool.execute("UPDATE hookline.inbox SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
                       ids[3])
    await pool.execute("UPDATE hookline.inbox SET attempts = 1, next_attempt_at = now() + interval '1 minute' "
                       "WHERE id = $1", ids[4])
    await pool.execute("UPDATE hookline.inbox SET deferred_since = now(), next_attempt_at = now() + interval "
                       "'1 minute' WHERE id = $1", ids[5])
    await pool.execute("UPDATE hookline.inbox SET deferred_since = now() - interval '1 minute' WHERE id = $1", ids[6])
    await pool.execute("UPDATE hookline.inbox SET status = 'dead' WHERE id = $1", ids[7])
    await pool.execute("UPDATE hookline.inbox SET status = 'done' WHERE id = $1", ids[8])
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() + interval '1 minute' WHERE id = $1",
                       ids[9])
    stats = (await provider_stats(pool))["p"]
    assert (stats.due, stats.in_flight, stats.expired_leases, stats.retrying, stats.deferred, stats.dead) == \
        (3, 2, 1, 1, 2, 1)
    assert stats.backlog == 5
    assert 100 <= stats.oldest_due_seconds < 1000


async def test_providers_are_reported_apart_in_one_statement(pool) -> None:
    await insert_events(pool, "a", 2)
    await insert_events(pool, "b", 1)
    await pool.execute("UPDATE hookline.inbox SET status = 'dead' WHERE provider = 'b'")
    stats = await provider_stats(pool)
    assert (stats["a"].due, stats["a"].dead, stats["b"].due, stats["b"].dead) == (2, 0, 0, 1)


async def test_every_part_of_the_query_can_be_served_by_an_index(pool) -> None:
    # With sequential scans priced out, a plan without a Seq Scan of the inbox (or of any of its
    # partitions) proves that each part's WHERE matches a partial index (the tables here are too
    # small to show it otherwise); the indexes' own predicates say which part each one serves.
    await insert_events(pool, "p", 50)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = await conn.fetchval("EXPLAIN (FORMAT JSON) " + db.query("provider_stats").rstrip(";"))
    scans = _scans(plan if isinstance(plan, list) else json.loads(plan))
    inbox_scans = [s for s in scans if str(s[1]).startswith("inbox")]
    assert inbox_scans and all(s[0] in ("Index Only Scan", "Index Scan", "Bitmap Index Scan")
                               for s in inbox_scans), scans
    used = [s[2] for s in scans if s[2]]
    definitions = " ".join(r["indexdef"] for r in await pool.fetch(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'hookline' AND indexname = ANY($1)", used))
    for predicate in ("status = 'pending'", "attempts > 0", "deferred_since IS NOT NULL", "status = 'dead'"):
        assert predicate in definitions, (predicate, definitions)


def _scans(plan: list[dict[str, object]]) -> list[tuple[str, str | None, str | None]]:
    found: list[tuple[str, str | None, str | None]] = []

    def walk(node: dict[str, object]) -> None:
        kind = str(node.get("Node Type"))
        if "Scan" in kind and kind not in ("CTE Scan", "Subquery Scan"):
            found.append((kind, node.get("Relation Name"), node.get("Index Name")))  # type: ignore[arg-type]
        for child in node.get("Plans", []) or []:  # type: ignore[attr-defined]
            walk(child)

    walk(plan[0]["Plan"])  # type: ignore[arg-type]
    return found


async def test_status_numbers_round_trip_from_real_statistics(pool: asyncpg.Pool) -> None:
    await insert_events(pool, "p", 1)
    fields = status_fields((await provider_stats(pool))["p"])
    assert fields["backlog"] == 1 and fields["oldestPendingSeconds"] >= 0


async def test_suspects_are_counted_and_stay_pending_work(pool) -> None:
    await insert_events(pool, "p", 2)
    await pool.execute("UPDATE hookline.inbox SET suspect = true, attempts = 1")
    stats = (await provider_stats(pool))["p"]
    assert (stats.suspects, stats.due, stats.backlog) == (2, 2, 2)
