"""The operator's one statistics query per tick (queries.sql: provider_stats) at a million events.

Fills the inbox of a throwaway embedded Postgres with ``--events`` rows over ``--providers``
providers in two shapes, vacuums (as autovacuum would: index-only scans need the visibility
map), and times the query the operator runs once per tick for every provider together:

- steady: 90 % done, 4 % due, 2 % retrying, 1 % deferred, 1 % in flight, 2 % dead;
- outage: the destination is down: 40 % retrying, 30 % due, 25 % done, 5 % dead.

Every part reads a partial index, so the cost follows the unfinished events, not the table;
when a large share of the whole table is due (the outage shape), the planner rightly prefers
one sequential pass for that part.

Usage: python -m benchmarks.operator_stats [--events 1000000] [--providers 200] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg

from benchmarks.common import BenchDatabase, percentile
from hookline.core import db

# Per 100 rows: (share, status, attempts, next_attempt_at offset in seconds, deferred).
SHAPES: dict[str, list[tuple[int, str, int, int, bool]]] = {
    "steady": [(90, "done", 1, 0, False), (4, "pending", 0, -30, False), (2, "pending", 2, 600, False),
               (1, "pending", 0, 60, True), (1, "processing", 1, 0, False), (2, "dead", 12, 0, False)],
    "outage": [(25, "done", 1, 0, False), (30, "pending", 0, -120, False), (40, "pending", 3, 900, False),
               (5, "dead", 12, 0, False)],
}

FILL = """
INSERT INTO hookline.inbox (provider, event_id, body, status, attempts, next_attempt_at, deferred_since,
                            lease_expires_at, locked_by, received_at)
SELECT 'provider-' || ((i / 100) % $2), 'evt-' || i, '\\x7b7d'::bytea, s.status, s.attempts,
       now() + make_interval(secs => s.offset_seconds), CASE WHEN s.deferred THEN now() END,
       CASE WHEN s.status = 'processing' THEN now() + interval '60 seconds' END,
       CASE WHEN s.status = 'processing' THEN 'bench' END,
       now() - interval '1 hour'
FROM generate_series(0, $1 - 1) AS i
JOIN LATERAL (
    SELECT * FROM unnest($3::int[], $4::int[], $5::text[], $6::int[], $7::int[], $8::bool[])
        AS s(lo, hi, status, attempts, offset_seconds, deferred)
    WHERE i % 100 >= s.lo AND i % 100 < s.hi
) AS s ON true
"""


async def fill(conn: asyncpg.Connection, shape: str, events: int, providers: int) -> None:
    lo, hi, statuses, attempts, offsets, deferred = [], [], [], [], [], []
    start = 0
    for share, status, tries, offset, is_deferred in SHAPES[shape]:
        lo.append(start)
        hi.append(start + share)
        start += share
        statuses.append(status)
        attempts.append(tries)
        offsets.append(offset)
        deferred.append(is_deferred)
    await conn.execute("TRUNCATE hookline.inbox")
    await conn.execute(FILL, events, providers, lo, hi, statuses, attempts, offsets, deferred)
    await conn.execute("VACUUM (ANALYZE) hookline.inbox")


def scans(plan: dict[str, Any]) -> list[str]:
    found = []
    if "Scan" in plan["Node Type"] and str(plan.get("Relation Name", "")).startswith("inbox"):  # or a partition
        index = plan.get("Index Name")
        found.append(f"{plan['Node Type']} using {index}" if index else plan["Node Type"])
    for child in plan.get("Plans", []):
        found.extend(scans(child))
    return found


async def measure(conn: asyncpg.Connection, runs: int) -> tuple[list[float], int]:
    sql = db.query("provider_stats")
    rows = await conn.fetch(sql)  # warm-up: plan cached, pages in shared buffers
    durations = []
    for _ in range(runs):
        started = time.perf_counter()
        await conn.fetch(sql)
        durations.append((time.perf_counter() - started) * 1000)
    return durations, len(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--providers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    database = BenchDatabase()
    url = await database.start()
    try:
        conn = await asyncpg.connect(url)
        print(f"provider_stats over {args.events:,} inbox events, {args.providers} providers "
              f"({args.runs} runs after a warm-up)")
        for shape in SHAPES:
            started = time.perf_counter()
            await fill(conn, shape, args.events, args.providers)
            filled = time.perf_counter() - started
            durations, providers = await measure(conn, args.runs)
            plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + db.query("provider_stats").rstrip(";")))
            unfinished = await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE status <> 'done'")
            print(f"\n{shape}: {unfinished:,} unfinished or dead events (filled in {filled:.0f} s), "
                  f"{providers} providers in the result")
            print(f"  median {percentile(durations, 50):.1f} ms, p95 {percentile(durations, 95):.1f} ms, "
                  f"max {max(durations):.1f} ms")
            print("  reads: " + "; ".join(scans(plan[0]["Plan"])))
        await conn.close()
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
