"""Storage that does not decay (issue 13): the queue's speed with history present, with an old
snapshot held open, the statistics query's cost, and dropping a partition under ingest.

On a throwaway embedded Postgres with the migrated (partitioned) inbox:

1. drain: ``--pending`` events claimed and completed in batches of 32 by ``--consumers``
   concurrent loops through the queue's own statements (claim, complete), the database side of a
   worker with a no-op handler. Measured on an empty inbox, then with ``--done`` million done events
   in yesterday's partition (the table's history), then again while another session holds a
   REPEATABLE READ snapshot open for the whole run.
2. statistics: the operator's provider_stats with that history present (target <= 50 ms).
3. drop: yesterday's partition dropped by the partition manager's retention pass while the
   receiver's insert statement runs in a loop; the drop's time and the inserts' p99 during it.

Usage: python -m benchmarks.storage [--done 1.0] [--pending 20000] [--consumers 16]
(``--done`` in millions; the issue asks for 10: use ``--done 10`` on a machine with time for it.)
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from benchmarks.common import BenchDatabase, percentile, record
from hookline.core import db, partitions
from hookline.core.queue import INBOX

PROVIDER = "bench"
YESTERDAY = "now() - interval '1 day'"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--done", type=float, default=1.0, help="millions of done events of history (default 1)")
    p.add_argument("--pending", type=int, default=20000, help="events drained per run (default 20000)")
    p.add_argument("--consumers", type=int, default=16, help="concurrent claim/complete loops (default 16)")
    p.add_argument("--results", help="append figures for make bench's summary to this file")
    return p.parse_args()


async def yesterdays_partition(conn: asyncpg.Connection) -> str:
    """A partition for yesterday (a new install's partitions start today)."""
    name = "hookline.inbox_bench_yesterday"
    await conn.execute(f"CREATE TABLE {name} PARTITION OF hookline.inbox FOR VALUES FROM "
                       f"(date_trunc('day', now()) - interval '1 day') TO (date_trunc('day', now()))")
    return name


async def fill_history(conn: asyncpg.Connection, millions: float) -> None:
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        await conn.execute(
            "INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, processed_at, "
            f"received_at) SELECT $1, 'old_' || g, 't', '\\x7b7d', 'done', 1, {YESTERDAY}, {YESTERDAY} "
            "FROM generate_series($2::bigint, $3::bigint) AS g", PROVIDER, start, min(start + step, rows) - 1)
    await conn.execute("VACUUM ANALYZE hookline.inbox")


async def drain(pool: asyncpg.Pool, pending: int, consumers: int) -> float:
    """Events per second: ``pending`` new events claimed and completed by ``consumers`` loops."""
    await pool.execute("INSERT INTO hookline.inbox (provider, event_id, event_type, body) "
                       "SELECT $1, 'new_' || gen_random_uuid(), 't', '\\x7b7d' FROM generate_series(1, $2)",
                       PROVIDER, pending)
    await pool.execute("ANALYZE hookline.inbox")

    async def consume(worker: str) -> None:
        while True:
            async with pool.acquire() as conn:
                rows = await INBOX.claim(conn, PROVIDER, 32, worker, 60)
                if not rows:
                    return
                await INBOX.complete(conn, [(r["id"], r["attempts"]) for r in rows], worker)

    started = time.perf_counter()
    await asyncio.gather(*(consume(f"bench-{i}") for i in range(consumers)))
    return pending / (time.perf_counter() - started)


async def stats_ms(pool: asyncpg.Pool, runs: int = 10) -> float:
    sql = db.query("provider_stats")
    await pool.fetch(sql)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await pool.fetch(sql)
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50)


async def drop_under_ingest(pool: asyncpg.Pool) -> tuple[float, float, int]:
    """(seconds the retention pass took, p99 ms of the receiver's inserts meanwhile, inserts)."""
    latencies: list[float] = []
    stop = asyncio.Event()
    sql = db.query("insert_inbox_batch")

    async def ingest() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.perf_counter()
            await pool.fetch(sql, [PROVIDER], [f"live_{time.time_ns()}_{n}"], ["t"], [None], [{}], [b"{}"], [None])
            latencies.append((time.perf_counter() - started) * 1000)

    tasks = [asyncio.create_task(ingest()) for _ in range(4)]
    await asyncio.sleep(1.0)
    before = len(latencies)
    started = time.perf_counter()
    async with pool.acquire() as conn:
        report = await partitions.expire_inbox(conn, partitions.Retention(done_hours=1.0, dead_days=14, dedup_days=30))
    took = time.perf_counter() - started
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*tasks)
    during = latencies[before:]
    assert report.dropped, f"nothing was dropped: {report}"
    return took, percentile(during, 99), len(during)


async def sizes(pool: asyncpg.Pool) -> str:
    rows = await pool.fetch(db.query("list_partitions", "partitions.sql"), "hookline.inbox")
    total = sum(r["bytes"] for r in rows)
    keys = await pool.fetchval("SELECT pg_total_relation_size('hookline.inbox_keys')")
    return f"inbox {total / 2**20:,.1f} MiB in {len(rows)} partitions, keys {keys / 2**20:,.1f} MiB"


async def main() -> None:
    args = parse_args()
    database = BenchDatabase()
    url = await database.start()
    try:
        pool = await db.create_pool(url, min_size=args.consumers + 4, max_size=args.consumers + 4)
        async with pool.acquire() as conn:
            await yesterdays_partition(conn)
        empty = await drain(pool, args.pending, args.consumers)
        print(f"drain, empty inbox:                  {empty:,.0f} events/s")
        started = time.perf_counter()
        async with pool.acquire() as conn:
            await fill_history(conn, args.done)
        print(f"history: {args.done:g} million done events in yesterday's partition "
              f"({time.perf_counter() - started:,.0f} s to load); {await sizes(pool)}")
        with_history = await drain(pool, args.pending, args.consumers)
        print(f"drain, with history:                 {with_history:,.0f} events/s  "
              f"ratio {with_history / empty:.2f} (target >= 0.9)")
        holder = await asyncpg.connect(url)
        try:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM hookline.providers")  # takes the snapshot
            held = await drain(pool, args.pending, args.consumers)
        finally:
            await holder.close()
        print(f"drain, snapshot held open:           {held:,.0f} events/s  "
              f"ratio {held / with_history:.2f} (report; target >= 0.7)")
        stats = await stats_ms(pool)
        print(f"provider_stats with history:         {stats:,.1f} ms median (target <= 50)")
        took, p99, inserts = await drop_under_ingest(pool)
        print(f"drop of yesterday's partition:       {took * 1000:,.0f} ms; receiver inserts during it: "
              f"{inserts}, p99 {p99:,.1f} ms")
        print(f"after retention: {await sizes(pool)}")
        record(args.results, "storage", "drain with history / empty", with_history / empty, ">= 0.9")
        record(args.results, "storage", "drain with snapshot held / normal", held / with_history, ">= 0.7")
        record(args.results, "storage", "provider_stats with history", stats, "<= 50", "ms")
        await pool.close()
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
