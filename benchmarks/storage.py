"""Storage that does not decay (issues 13 and 26): the queue's speed with history present, with an
old snapshot held open and over successive drains, the statistics queries' cost, dropping a
partition under ingest, and table sizes under steady load once retention kicks in.

On a throwaway embedded Postgres with the migrated (partitioned) inbox and outbox:

1. drain: ``--pending`` rows claimed and completed in batches of 32 by ``--consumers`` concurrent
   loops through the statements the services run, on three paths: the inbox with a no-op handler
   (claim, complete), the inbox with an exactly-once handler (each event's effect and completion
   in one transaction), and the relay's deliveries (claim with due retries first, complete). For
   each: five successive drains in today's partitions with no vacuum between (ratio: the slowest
   of the last four to the first); a drain with ``--done`` million done rows in an old day's
   partition; one with as many in today's partition (where a busy day's completed events are
   until retention drops them), then again while another session holds a REPEATABLE READ snapshot
   open. Ratios are to the mean of two drains on emptied tables, before and after the history.
2. statistics, with that history present and as many done deliveries in an old day's outbox
   partitions (``--outbox-done``): the operator's provider_stats, and per endpoint the relay's
   gauges (the queue's stats, undelivered_age) and `hookline status`'s endpoint_status
   (target <= 50 ms each).
3. drop: an old day's inbox partition dropped by the partition manager's retention pass while the
   receiver's insert statement runs in a loop; the drop's time and the inserts' p99 during it;
   then an old day's outbox pair (events and deliveries).
4. steady load: partitions of ``--width`` seconds, retention of a few of them, events received
   and drained, published and delivered at a fixed rate for ``--steady`` seconds while the partition
   manager runs every second; the tables' size (with indexes) sampled every ``--sample`` seconds
   goes flat once retention starts dropping partitions.

Usage: python -m benchmarks.storage [--done 1.0] [--pending 20000] [--consumers 16] [--steady 60]
(``--done`` in millions; the issue asks for 10: use ``--done 10`` on a machine with time for it;
``--quick`` is make bench's short mode.)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg

from benchmarks.common import BenchDatabase, percentile, record
from hookline import outbox
from hookline.core import db, partitions
from hookline.core.queue import INBOX, OUTBOX
from hookline.receiver.group_commit import INSERT_BATCH

PROVIDER = "bench"
ENDPOINTS = [f"bench-{n}" for n in range(10)]
# History lives on the day before yesterday: retention drops a partition only once its end is past the
# done limit (1 hour here), so yesterday's could not be dropped in the first hour after midnight UTC.
OLD_DAY = "date_trunc('day', now()) - interval '36 hours'"
STEADY_ENDPOINT = "steady"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--done", type=float, default=1.0, help="millions of done events of history (default 1)")
    p.add_argument("--pending", type=int, default=20000, help="events drained per run (default 20000)")
    p.add_argument("--consumers", type=int, default=16, help="concurrent claim/complete loops (default 16)")
    p.add_argument("--outbox-done", type=float, help="millions of done deliveries of history (default: --done)")
    p.add_argument("--steady", type=float, default=60.0, help="seconds of steady load (default 60)")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between size samples (default 5)")
    p.add_argument("--width", type=float, default=2.0, help="seconds per partition under steady load (default 2)")
    p.add_argument("--rate", type=int, default=400, help="events/s received and published under steady load")
    p.add_argument("--quick", action="store_true", help="make bench's short mode: 0.2 million done events, "
                   "5000 drained, 20 s of steady load")
    p.add_argument("--results", help="append figures for make bench's summary to this file")
    args = p.parse_args()
    if args.quick:
        args.done, args.pending, args.steady, args.sample = 0.2, 5000, 20.0, 2.0
    if args.outbox_done is None:
        args.outbox_done = args.done
    return args


async def old_days_partition(conn: asyncpg.Connection, table: str = "hookline.inbox") -> str:
    """A partition for the day before yesterday (a new install's partitions start today)."""
    name = f"{table}_bench_old_day"
    await conn.execute(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM (date_trunc('day', now()) "
                       "- interval '2 days') TO (date_trunc('day', now()) - interval '1 day')")
    return name


async def fill_history(conn: asyncpg.Connection, millions: float) -> None:
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        await conn.execute(
            "INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, processed_at, "
            f"received_at) SELECT $1, 'old_' || g, 't', '\\x7b7d', 'done', 1, {OLD_DAY}, {OLD_DAY} "
            "FROM generate_series($2::bigint, $3::bigint) AS g", PROVIDER, start, min(start + step, rows) - 1)
    await conn.execute("VACUUM ANALYZE hookline.inbox")


async def fill_outbox_history(conn: asyncpg.Connection, millions: float) -> None:
    """Done deliveries (one per event, spread over the endpoints) in an old day's outbox partitions,
    and a few thousand pending ones published today: what the per-endpoint statistics count."""
    for name in ENDPOINTS:
        await conn.execute("INSERT INTO hookline.endpoints (name, url) VALUES ($1, 'https://bench.invalid/')", name)
    for table in ("hookline.outbox", "hookline.deliveries"):
        await old_days_partition(conn, table)
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        await conn.execute(
            "WITH events AS (INSERT INTO hookline.outbox (event_id, event_type, payload, created_at) "
            f"SELECT 'msg_old_' || g, 't', '{{}}', {OLD_DAY} FROM generate_series($1::bigint, $2::bigint) AS g "
            "RETURNING id, created_at) "
            "INSERT INTO hookline.deliveries (outbox_id, endpoint, status, attempts, processed_at, created_at) "
            "SELECT id, 'bench-' || id % 10, 'done', 1, created_at, created_at FROM events",
            start, min(start + step, rows) - 1)
    await conn.execute("SELECT hookline.publish('t', '{}', NULL, NULL, e) FROM unnest($1::text[]) AS e, "
                       "generate_series(1, 50)", ENDPOINTS)
    await conn.execute("VACUUM ANALYZE hookline.outbox")
    await conn.execute("VACUUM ANALYZE hookline.deliveries")


@dataclass(frozen=True)
class DrainPath:
    """One way rows are drained, at the database: new pending rows (``add``) taken by concurrent
    consumer loops (``consume``) through the statements the service runs, in the tables ``tables``."""

    name: str
    tables: tuple[str, ...]
    add: Callable[[asyncpg.Pool, int], Awaitable[object]]
    consume: Callable[[asyncpg.Pool, str], Awaitable[None]]


async def add_events(pool: asyncpg.Pool, count: int) -> None:
    await pool.execute("INSERT INTO hookline.inbox (provider, event_id, event_type, body) "
                       "SELECT $1, 'new_' || gen_random_uuid(), 't', '\\x7b7d' FROM generate_series(1, $2)",
                       PROVIDER, count)


async def consume_no_op(pool: asyncpg.Pool, worker: str) -> None:
    """A worker with a one-parameter no-op handler, at the database: claim 32, complete them."""
    while True:
        async with pool.acquire() as conn:
            rows = await INBOX.claim(conn, PROVIDER, 32, worker, 60)
            if not rows:
                return
            await INBOX.complete(conn, [(r["id"], r["attempts"]) for r in rows], worker)


async def consume_exactly_once(pool: asyncpg.Pool, worker: str) -> None:
    """The exactly-once path: each event's effect and its completion in one transaction."""
    while True:
        async with pool.acquire() as conn:
            rows = await INBOX.claim(conn, PROVIDER, 32, worker, 60)
            if not rows:
                return
            for row in rows:
                async with conn.transaction():
                    await conn.execute("INSERT INTO bench_effects (event) VALUES ($1)", row["id"])
                    await INBOX.complete(conn, [(row["id"], row["attempts"])], worker)


async def add_deliveries(pool: asyncpg.Pool, count: int) -> None:
    await pool.execute("SELECT hookline.publish('t', '{\"n\": 1}', NULL, NULL, $2) FROM generate_series(1, $1)",
                       count, DRAIN_ENDPOINT)


async def consume_deliveries(pool: asyncpg.Pool, worker: str) -> None:
    """The relay at the database: claim 32 deliveries of an endpoint (due retries first), complete them."""
    while True:
        async with pool.acquire() as conn:
            rows = await OUTBOX.claim(conn, DRAIN_ENDPOINT, 32, worker, 60)
            if not rows:
                return
            await OUTBOX.complete(conn, [(r["id"], r["attempts"]) for r in rows], worker)


DRAIN_ENDPOINT = "bench-drain"
INBOX_TABLES = ("hookline.inbox",)
OUTBOX_TABLES = ("hookline.outbox", "hookline.deliveries")
PATHS = [DrainPath("inbox, no-op handler", INBOX_TABLES, add_events, consume_no_op),
         DrainPath("inbox, exactly-once handler", INBOX_TABLES, add_events, consume_exactly_once),
         DrainPath("relay deliveries", OUTBOX_TABLES, add_deliveries, consume_deliveries)]


async def drain(pool: asyncpg.Pool, path: DrainPath, pending: int, consumers: int) -> float:
    """Rows per second: ``pending`` new rows claimed and completed by ``consumers`` loops."""
    await path.add(pool, pending)
    started = time.perf_counter()
    await asyncio.gather(*(path.consume(pool, f"bench-{i}") for i in range(consumers)))
    return pending / (time.perf_counter() - started)


async def todays_partitions(pool: asyncpg.Pool, tables: Sequence[str]) -> list[str]:
    names = []
    for table in tables:
        names.append(await pool.fetchval("SELECT name FROM hookline.partitions($1) WHERE lower_bound <= now() "
                                         "AND upper_bound > now()", table))
    return names


async def empty_today(pool: asyncpg.Pool, tables: Sequence[str]) -> None:
    """Today's partitions of ``tables`` emptied, dead rows and index entries with them (TRUNCATE)."""
    await pool.execute(f"TRUNCATE {', '.join(await todays_partitions(pool, tables))}")


async def fill_today(pool: asyncpg.Pool, tables: Sequence[str], millions: float) -> None:
    """Done rows in today's partitions, where a busy day's completed events are until retention drops
    them; then VACUUM ANALYZE and a checkpoint, so the drain after starts on settled tables."""
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        end = min(start + step, rows) - 1
        if tables == INBOX_TABLES:
            await pool.execute(
                "INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, processed_at) "
                "SELECT $1, 'today_' || g, 't', '\\x7b7d', 'done', 1, now() FROM generate_series($2::bigint, "
                "$3::bigint) AS g", PROVIDER, start, end)
        else:
            await pool.execute(
                "WITH events AS (INSERT INTO hookline.outbox (event_id, event_type, payload) "
                "SELECT 'msg_today_' || g, 't', '{}' FROM generate_series($1::bigint, $2::bigint) AS g "
                "RETURNING id, created_at) "
                "INSERT INTO hookline.deliveries (outbox_id, endpoint, status, attempts, processed_at, created_at) "
                "SELECT id, $3, 'done', 1, created_at, created_at FROM events", start, end, DRAIN_ENDPOINT)
    for table in tables:
        await pool.execute(f"VACUUM ANALYZE {table}")
    await pool.execute("CHECKPOINT")


@dataclass
class DrainFigures:
    successive: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)
    old_history: float = 0.0
    today_history: float = 0.0
    held: float = 0.0

    def ratios(self) -> dict[str, float]:
        empty = sum(self.empty) / len(self.empty)
        return {"successive": min(later / self.successive[0] for later in self.successive[1:]),
                "today": self.today_history / empty, "held": self.held / empty, "old": self.old_history / empty}


RATIOS = {  # what each ratio compares, and its target
    "successive": ("slowest of 4 drains after a first, no vacuum between / the first", ">= 0.9"),
    "today": ("drain with history in today's partition / empty", ">= 0.9"),
    "held": ("drain with history today and a snapshot held / empty", ">= 0.7"),
    "old": ("drain with history in an old partition / empty", ">= 0.9"),
}


async def held_snapshot_drain(pool: asyncpg.Pool, url: str, path: DrainPath, pending: int, consumers: int) -> float:
    """A drain while another session holds a REPEATABLE READ snapshot open: nothing dead since can be
    vacuumed or marked dead in the indexes."""
    holder = await asyncpg.connect(url)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM hookline.providers")  # takes the snapshot
        return await drain(pool, path, pending, consumers)
    finally:
        await holder.close()


def show(path: DrainPath, what: str, rate: float) -> None:
    print(f"  {path.name + ',':<30} {what:<44} {rate:9,.0f} rows/s", flush=True)


async def drains_on_empty_tables(pool: asyncpg.Pool, args: argparse.Namespace,
                                 figures: dict[str, DrainFigures]) -> None:
    """Per path: a warm-up drain, five successive drains without a vacuum, one on emptied tables."""
    for path in PATHS:
        await empty_today(pool, path.tables)
        await drain(pool, path, args.pending, args.consumers)  # warms the caches and the plans
        await empty_today(pool, path.tables)
        for n in range(5):
            figures[path.name].successive.append(rate := await drain(pool, path, args.pending, args.consumers))
            show(path, f"drain {n + 1} of 5, no vacuum between", rate)
        await empty_today(pool, path.tables)
        figures[path.name].empty.append(rate := await drain(pool, path, args.pending, args.consumers))
        show(path, "drain, emptied tables", rate)


async def drains_with_history_today(pool: asyncpg.Pool, url: str, args: argparse.Namespace,
                                    figures: dict[str, DrainFigures]) -> None:
    """Per table group: --done million done rows in today's partitions; each path drains with them,
    then again with a snapshot held open."""
    for tables in (INBOX_TABLES, OUTBOX_TABLES):
        await empty_today(pool, tables)
        started = time.perf_counter()
        await fill_today(pool, tables, args.done)
        print(f"  {args.done:g} million done rows in today's partition of {tables[-1]} "
              f"({time.perf_counter() - started:,.0f} s to load)", flush=True)
        for path in (p for p in PATHS if p.tables == tables):
            figures[path.name].today_history = rate = await drain(pool, path, args.pending, args.consumers)
            show(path, "drain, history in today's partition", rate)
            figures[path.name].held = rate = await held_snapshot_drain(pool, url, path, args.pending, args.consumers)
            show(path, "the same, snapshot held open", rate)
        await empty_today(pool, tables)


async def median_ms(pool: asyncpg.Pool, sql: str, runs: int = 10) -> float:
    """Median time of a statement, after one run to warm the cache and the plan."""
    await pool.fetch(sql)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await pool.fetch(sql)
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50)


# Every statistics query that must stay cheap as history grows (issue 13), by what runs it.
STATISTICS = {
    "provider_stats (operator, worker gauges)": db.query("provider_stats"),
    "endpoint stats (relay gauges)": OUTBOX.sql("stats"),
    "undelivered_age (relay gauges)": outbox.query("undelivered_age"),
    "endpoint_status (hookline status)": db.query("endpoint_status", "status.sql"),
}


async def drop_under_ingest(pool: asyncpg.Pool, expire: Callable[[asyncpg.Connection], Awaitable[partitions.PassReport]]
                            ) -> tuple[float, float, int]:
    """(seconds the retention pass took, p99 ms of the receiver's inserts meanwhile, inserts)."""
    latencies: list[float] = []
    stop = asyncio.Event()
    sql = INSERT_BATCH

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
        report = await expire(conn)
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


SIZED = ("hookline.inbox", "hookline.outbox", "hookline.deliveries")


async def table_sizes(pool: asyncpg.Pool) -> dict[str, float]:
    """MiB of each partitioned table (every partition with its indexes) and of the dedup keys."""
    found = {"hookline.inbox_keys": await pool.fetchval("SELECT pg_total_relation_size('hookline.inbox_keys')")}
    for table in SIZED:
        # By oid: a partition the manager drops meanwhile counts as nothing instead of failing.
        found[table] = await pool.fetchval("SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint "
                                           "FROM pg_inherits WHERE inhparent = $1::regclass", table)
    return {table: size / 2**20 for table, size in found.items()}


async def narrow_partitions(pool: asyncpg.Pool, width: float) -> None:
    """Replace every partition by ones of ``width`` seconds (the rows of the phases before go)."""
    for table in SIZED:
        for row in await pool.fetch(db.query("list_partitions", "partitions.sql"), table):
            if not row["is_default"]:
                await pool.execute(f"DROP TABLE {row['name']}")
    premake = max(3, int(10 / width))
    await pool.execute(db.query("set_partition_width", "partitions.sql"), "hookline.inbox",
                       datetime.timedelta(seconds=width), premake)
    await pool.execute(db.query("set_outbox_partition_width", "partitions.sql"), datetime.timedelta(seconds=width),
                       premake)
    for table in SIZED:
        await partitions.ensure_partitions(pool, table)


async def steady_load(pool: asyncpg.Pool, seconds: float, sample: float, width: float,
                      rate: int) -> list[tuple[float, dict[str, float]]]:
    """Receive, drain, publish and deliver ``rate`` events/s each for ``seconds`` with retention of
    a few partitions, the partition manager passing every second; the sizes every ``sample`` s."""
    await narrow_partitions(pool, width)
    await pool.execute("INSERT INTO hookline.endpoints (name, url) VALUES ($1, 'https://bench.invalid/')",
                       STEADY_ENDPOINT)
    keep = 2 * width  # done rows live two partitions, dedup keys four
    retention = partitions.Retention(done_hours=keep / 3600, dead_days=1, dedup_days=2 * keep / 86400,
                                     endpoint_done_hours=keep / 3600, endpoint_dead_days=1)
    stop = asyncio.Event()
    batch, tick = max(1, rate // 10), 0.1
    received = delivered = 0

    async def receive() -> None:
        n = 0
        while not stop.is_set():
            ids = [f"steady_{n + i}" for i in range(batch)]
            n += batch
            await pool.fetch(INSERT_BATCH, [PROVIDER] * batch, ids, ["t"] * batch, [None] * batch,
                             [{}] * batch, [b"{}"] * batch, [None] * batch)
            await asyncio.sleep(tick)

    async def drain_inbox() -> None:
        nonlocal received
        while not stop.is_set():
            rows = await INBOX.claim(pool, PROVIDER, 200, "steady", 60)
            await INBOX.complete(pool, [(r["id"], r["attempts"]) for r in rows], "steady")
            received += len(rows)
            if not rows:
                await asyncio.sleep(tick)

    async def publish() -> None:
        while not stop.is_set():
            # To the steady endpoint only: the history's endpoints have no relay and would keep
            # every partition back with their pending deliveries (retention must not drop those).
            await pool.execute("SELECT hookline.publish('t', '{\"n\": 1}', NULL, NULL, $2) FROM generate_series(1, $1)",
                               batch, STEADY_ENDPOINT)
            await asyncio.sleep(tick)

    async def deliver() -> None:
        nonlocal delivered
        while not stop.is_set():
            rows = await OUTBOX.claim(pool, STEADY_ENDPOINT, 200, "steady", 60)
            await OUTBOX.complete(pool, [(r["id"], r["attempts"]) for r in rows], "steady")
            delivered += len(rows)
            if not rows:
                await asyncio.sleep(tick)

    async def manage() -> None:
        while not stop.is_set():
            await partitions.manage_partitions(pool, retention)
            await asyncio.sleep(1.0)

    samples: list[tuple[float, dict[str, float]]] = []
    tasks = [asyncio.create_task(job()) for job in (receive, drain_inbox, publish, deliver, manage)]
    started = time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            samples.append((elapsed, await table_sizes(pool)))
            print(f"  {elapsed:6.1f} s  " + "  ".join(f"{t.removeprefix('hookline.')} {mib:7.2f}"
                                                   for t, mib in samples[-1][1].items())
                  + f"  total {sum(samples[-1][1].values()):7.2f} MiB", flush=True)
            await asyncio.sleep(sample)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    took = time.perf_counter() - started
    print(f"  steady load: {received / took:,.0f} events/s received and drained, "
          f"{delivered / took:,.0f} deliveries/s published and delivered")
    return samples


async def main() -> None:
    args = parse_args()
    database = BenchDatabase()
    url = await database.start()
    try:
        pool = await db.create_pool(url, min_size=args.consumers + 4, max_size=args.consumers + 4)
        async with pool.acquire() as conn:
            await old_days_partition(conn)
            await conn.execute("CREATE TABLE bench_effects (event bigint PRIMARY KEY)")
            await conn.execute("INSERT INTO hookline.endpoints (name, url) VALUES ($1, 'https://bench.invalid/')",
                               DRAIN_ENDPOINT)
        figures = {path.name: DrainFigures() for path in PATHS}
        print(f"drains of {args.pending:,} rows by {args.consumers} consumers, at the database:")
        await drains_on_empty_tables(pool, args, figures)
        started = time.perf_counter()
        async with pool.acquire() as conn:
            await fill_history(conn, args.done)
            await fill_outbox_history(conn, args.outbox_done)
        print(f"history: {args.done:g} million done events in an old day's partition, {args.outbox_done:g} million "
              f"done deliveries in an old day's outbox partitions ({time.perf_counter() - started:,.0f} s to load); "
              f"{await sizes(pool)}")
        stats = {name: await median_ms(pool, sql) for name, sql in STATISTICS.items()}
        for name, ms in stats.items():
            print(f"{name + ' with history:':<55} {ms:8,.1f} ms median (target <= 50)")
        for path in PATHS:
            await empty_today(pool, path.tables)
            figures[path.name].old_history = rate = await drain(pool, path, args.pending, args.consumers)
            show(path, "drain, history in an old partition", rate)
        took, p99, inserts = await drop_under_ingest(pool, lambda conn: partitions.expire_inbox(
            conn, partitions.Retention(done_hours=1.0, dead_days=14, dedup_days=30)))
        print(f"drop of an old day's partition:      {took * 1000:,.0f} ms; receiver inserts during it: "
              f"{inserts}, p99 {p99:,.1f} ms")
        took, p99, inserts = await drop_under_ingest(pool, lambda conn: partitions.expire_outbox(
            conn, partitions.Retention(endpoint_done_hours=1.0)))
        print(f"drop of an old day's outbox pair:    {took * 1000:,.0f} ms; receiver inserts during it: "
              f"{inserts}, p99 {p99:,.1f} ms")
        await drains_with_history_today(pool, url, args, figures)
        for path in PATHS:
            await empty_today(pool, path.tables)
            figures[path.name].empty.append(rate := await drain(pool, path, args.pending, args.consumers))
            show(path, "drain, emptied tables again", rate)
        worst: dict[str, tuple[float, str]] = {}
        for path in PATHS:
            ratios = figures[path.name].ratios()
            print(f"  {path.name}: " + ", ".join(f"{key} {value:.2f}" for key, value in ratios.items()))
            for key, value in ratios.items():
                worst[key] = min(worst.get(key, (value, path.name)), (value, path.name))
        for key, (what, target) in RATIOS.items():
            value, name = worst[key]
            print(f"{what}: worst {value:.2f} ({name}; target {target})")
        print(f"after retention: {await sizes(pool)}")
        print(f"steady load, {args.rate} events/s, partitions of {args.width:g} s, done rows kept "
              f"{2 * args.width:g} s; sizes in MiB (tables with their indexes):")
        samples = await steady_load(pool, args.steady, args.sample, args.width, args.rate)
        middle = sum(samples[len(samples) // 2][1].values())
        end = sum(samples[-1][1].values())
        print(f"size at the end / at half time:      {end / middle:.2f} (flat: about 1)")
        for key, (what, target) in RATIOS.items():
            value, name = worst[key]
            record(args.results, "storage", f"{what} (worst: {name})", value, target)
        record(args.results, "storage", "provider_stats with history", stats[next(iter(STATISTICS))], "<= 50", "ms")
        record(args.results, "storage", "slowest endpoint statistic with history",
               max(ms for name, ms in stats.items() if "provider_stats" not in name), "<= 50", "ms")
        record(args.results, "storage", "steady-load size, end / half time", end / middle, "<= 1.2")
        await pool.close()
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
