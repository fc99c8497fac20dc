"""Storage that does not decay (issues 13 and 26): the queue's speed with history present, with an
old snapshot held open and over successive drains, the statistics queries' cost, dropping a
partition under ingest, and table sizes under steady load once retention kicks in.

On a throwaway embedded Postgres with the migrated (partitioned) inbox and outbox:

1. drain: ``--pending`` rows drained by real services, on three paths: the inbox with a no-op
   handler, the inbox with an exactly-once handler (each event's effect and completion in one
   transaction), and the relay's deliveries. For each: five successive drains in today's
   partitions with no vacuum between (ratio: the slowest of the last four to the first); a drain
   with ``--done`` million done rows in an old day's partition; three with ``--done-today`` million
   of its own in today's partition (where a busy day's completed events stay until retention drops
   them), each after one on emptied tables, then one while another session holds a REPEATABLE READ
   snapshot open: those ratios are to the drains they alternate with, the old partition's to the
   mean of two drains on emptied tables before and after that history.
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

Usage: python -m benchmarks.storage [--done 1.0] [--done-today 2.0] [--pending 20000] [--steady 60]
(``--done`` in millions; issue 13 asked for 10: use ``--done 10`` on a machine with time for it;
``--quick`` is make bench's short mode.) The drains run the services as users do: two ``hookline
worker --concurrency 32`` per provider (a no-op handler, an exactly-once one), one ``hookline relay
--concurrency 64`` to an endpoint in this process; each is timed by the server's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from aiohttp import web

from benchmarks import peers
from benchmarks.common import BenchDatabase, free_port, percentile, record, start_service, stop_all
from hookline import outbox
from hookline.core import db, partitions
from hookline.core.providers import apply_providers
from hookline.core.queue import INBOX, OUTBOX
from hookline.receiver.group_commit import INSERT_BATCH
from hookline.relay import endpoints

REPO = Path(__file__).resolve().parent.parent
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
    p.add_argument("--done-today", type=float, default=2.0,
                   help="millions of done rows per drained provider/endpoint in today's partition (default 2)")
    p.add_argument("--outbox-done", type=float, help="millions of done deliveries of history (default: --done)")
    p.add_argument("--steady", type=float, default=60.0, help="seconds of steady load (default 60)")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between size samples (default 5)")
    p.add_argument("--width", type=float, default=2.0, help="seconds per partition under steady load (default 2)")
    p.add_argument("--rate", type=int, default=400, help="events/s received and published under steady load")
    p.add_argument("--quick", action="store_true", help="make bench's short mode: 0.2 million done rows of "
                   "history, 0.5 million today, 20 s of steady load")
    p.add_argument("--results", help="append figures for make bench's summary to this file")
    args = p.parse_args()
    if args.quick:
        # Drains as long as the full run's: a drain of 5,000 took 0.3 s, and its ratios were noise.
        args.done, args.done_today, args.steady, args.sample = 0.2, 0.5, 20.0, 2.0
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
            f"received_at) SELECT ($1::text[])[g % 2 + 1], 'old_' || g, 't', '\\x7b7d', 'done', 1, {OLD_DAY}, "
            f"{OLD_DAY} FROM generate_series($2::bigint, $3::bigint) AS g", [NOOP_PROVIDER, EFFECT_PROVIDER], start,
            min(start + step, rows) - 1)
    await conn.execute("VACUUM ANALYZE hookline.inbox")


async def fill_outbox_history(conn: asyncpg.Connection, millions: float) -> None:
    """Done deliveries (one per event, spread over the endpoints) in an old day's outbox partitions,
    and a few thousand pending ones published today: what the per-endpoint statistics count."""
    for name in ENDPOINTS:  # disabled: the relay of the drains must not try them (their deliveries are parked)
        await conn.execute("INSERT INTO hookline.endpoints (name, url, enabled) VALUES ($1, 'https://bench.invalid/', "
                           "false)", name)
    for table in ("hookline.outbox", "hookline.deliveries"):
        await old_days_partition(conn, table)
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        await conn.execute(
            "WITH events AS (INSERT INTO hookline.outbox (event_id, event_type, payload, created_at) "
            f"SELECT 'msg_old_' || g, 't', '{{}}', {OLD_DAY} FROM generate_series($1::bigint, $2::bigint) AS g "
            "RETURNING id, created_at) "
            "INSERT INTO hookline.deliveries (outbox_id, endpoint, status, attempts, processed_at, created_at) "
            "SELECT id, ($3::text[])[id % 11 + 1], 'done', 1, created_at, created_at FROM events",
            start, min(start + step, rows) - 1, [*ENDPOINTS, DRAIN_ENDPOINT])
    await conn.execute("SELECT hookline.publish('t', '{}', NULL, NULL, e) FROM unnest($1::text[]) AS e, "
                       "generate_series(1, 50)", ENDPOINTS)
    await conn.execute("VACUUM ANALYZE hookline.outbox")
    await conn.execute("VACUUM ANALYZE hookline.deliveries")


@dataclass
class DrainPath:
    """One way rows are drained: services started once (``start``) that drain rows of ``partition``
    as ``add`` makes them, in the tables ``tables``. Drains are timed by the server's clock (CLOCK)."""

    name: str
    tables: tuple[str, ...]
    partition: str
    add: Callable[[asyncpg.Pool, str, int, str], Awaitable[object]]
    start: Callable[[str, Path], list[subprocess.Popen[bytes]]]
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)


NOOP_PROVIDER, EFFECT_PROVIDER, DRAIN_ENDPOINT = "drain-noop", "drain-effect", "drain"
DRAIN_PROVIDERS = f"""
kind: WebhookProvider
metadata: {{name: {NOOP_PROVIDER}}}
spec:
  signature: {{scheme: none}}
  handler: "benchmarks.handlers:noop"
---
kind: WebhookProvider
metadata: {{name: {EFFECT_PROVIDER}}}
spec:
  signature: {{scheme: none}}
  handler: "benchmarks.handlers:effect_tx"
"""
WORKER_PROCESSES, WORKER_CONCURRENCY, RELAY_CONCURRENCY = 2, 32, 64


async def add_events(pool: asyncpg.Pool, provider: str, count: int, tag: str) -> None:
    await pool.execute("INSERT INTO hookline.inbox (provider, event_id, event_type, body, content_type) "
                       "SELECT $1, $3 || g, 'invoice.paid', '{\"id\": 1}', 'application/json' "
                       "FROM generate_series(1, $2) AS g", provider, count, tag)


async def add_deliveries(pool: asyncpg.Pool, endpoint: str, count: int, tag: str) -> None:
    await pool.execute("SELECT hookline.publish('invoice.paid', jsonb_build_object('n', g, 'tag', $3::text), "
                       "NULL, NULL, $2) FROM generate_series(1, $1) AS g", count, endpoint, tag)


def workers(provider: str) -> Callable[[str, Path], list[subprocess.Popen[bytes]]]:
    def start(url: str, work: Path) -> list[subprocess.Popen[bytes]]:
        return [start_service(["worker", "--provider", provider, "--concurrency", str(WORKER_CONCURRENCY),
                               "--port", str(port := free_port())], url, port, work / f"worker-{provider}.log")
                for _ in range(WORKER_PROCESSES)]
    return start


def relay(url: str, work: Path) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    return [start_service(["relay", "--allow-private-networks", "--host", "127.0.0.1", "--port", str(port),
                           "--concurrency", str(RELAY_CONCURRENCY)], url, port, work / "relay.log")]


INBOX_TABLES = ("hookline.inbox",)
OUTBOX_TABLES = ("hookline.outbox", "hookline.deliveries")
PATHS = [DrainPath("inbox, no-op handler", INBOX_TABLES, NOOP_PROVIDER, add_events, workers(NOOP_PROVIDER)),
         DrainPath("inbox, exactly-once handler", INBOX_TABLES, EFFECT_PROVIDER, add_events, workers(EFFECT_PROVIDER)),
         DrainPath("relay deliveries", OUTBOX_TABLES, DRAIN_ENDPOINT, add_deliveries, relay)]
# What is left of a drain, through the partial indexes of unfinished rows (as the operator counts it).
REMAINING = {
    INBOX_TABLES: "SELECT (SELECT count(*) FROM hookline.inbox WHERE status = 'pending' AND provider = $1) + "
                  "(SELECT count(*) FROM hookline.inbox WHERE status = 'processing' AND provider = $1)",
    OUTBOX_TABLES: "SELECT count(*) FROM hookline.deliveries WHERE status IN ('pending', 'processing', 'parked') "
                   "AND endpoint = $1",
}
# A drain by the server's clock: from the first claim of its rows (the inbox keeps claimed_at) or from
# the commit of its rows (deliveries) to the last completion.
CLOCK = {
    INBOX_TABLES: "SELECT extract(epoch FROM max(processed_at) - min(claimed_at)) FROM hookline.inbox "
                  "WHERE provider = $1 AND event_id LIKE $2 || '%' AND status = 'done'",
    OUTBOX_TABLES: "SELECT extract(epoch FROM max(d.processed_at) - $3::timestamptz) FROM hookline.deliveries AS d "
                   "JOIN hookline.outbox AS o ON o.id = d.outbox_id AND o.created_at = d.created_at "
                   "WHERE d.endpoint = $1 AND o.payload->>'tag' = $2 AND d.status = 'done'",
}
ROUNDS = 3  # of the comparison with history in today's partition
POLL = 0.2  # as the issue measured: the count walks the partial indexes too, and costs what it polls
DRAIN_TAGS = (f"d{n}_" for n in itertools.count(1))  # each drain's rows by their event ids


async def drain(pool: asyncpg.Pool, path: DrainPath, pending: int) -> float:
    """Rows per second: ``pending`` new rows drained by the path's services."""
    tag = next(DRAIN_TAGS)
    await path.add(pool, path.partition, pending, tag)
    committed = await pool.fetchval("SELECT clock_timestamp()")
    started = time.perf_counter()
    while await pool.fetchval(REMAINING[path.tables], path.partition):
        if time.perf_counter() - started > 300:
            raise RuntimeError(f"{path.name}: a drain of {pending:,} did not finish in 300 s")
        if dead := [s for s in path.services if s.poll() is not None]:
            raise RuntimeError(f"{path.name}: a service exited with {dead[0].returncode} (logs in the work dir)")
        await asyncio.sleep(POLL)
    args = (path.partition, tag) if path.tables == INBOX_TABLES else (path.partition, tag, committed)
    seconds = float(await pool.fetchval(CLOCK[path.tables], *args))
    dead = await pool.fetchval(f"SELECT count(*) FROM {path.tables[-1]} WHERE status = 'dead'")
    if dead:
        raise RuntimeError(f"{path.name}: {dead} rows went dead")
    return pending / seconds


async def todays_partitions(pool: asyncpg.Pool, tables: Sequence[str]) -> list[str]:
    names = []
    for table in tables:
        names.append(await pool.fetchval("SELECT name FROM hookline.partitions($1) WHERE lower_bound <= now() "
                                         "AND upper_bound > now()", table))
    return names


async def empty_today(pool: asyncpg.Pool, tables: Sequence[str]) -> None:
    """Today's partitions of ``tables`` emptied, dead rows and index entries with them (TRUNCATE)."""
    await pool.execute(f"TRUNCATE {', '.join(await todays_partitions(pool, tables))}")


async def fill_today(pool: asyncpg.Pool, path: DrainPath, millions: float) -> None:
    """Done rows of the path's partition in today's partitions, where a busy day's completed events
    are until retention drops them; then VACUUM ANALYZE and a checkpoint, as the issue measured it."""
    rows, step = int(millions * 1_000_000), 200_000
    for start in range(0, rows, step):
        end = min(start + step, rows) - 1
        if path.tables == INBOX_TABLES:
            await pool.execute(
                "INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, processed_at) "
                "SELECT $1, 'today_' || g, 't', '\\x7b7d', 'done', 1, now() FROM generate_series($2::bigint, "
                "$3::bigint) AS g", path.partition, start, end)
        else:
            await pool.execute(
                "WITH events AS (INSERT INTO hookline.outbox (event_id, event_type, payload) "
                "SELECT 'msg_today_' || g, 't', '{}' FROM generate_series($1::bigint, $2::bigint) AS g "
                "RETURNING id, created_at) "
                "INSERT INTO hookline.deliveries (outbox_id, endpoint, status, attempts, processed_at, created_at) "
                "SELECT id, $3, 'done', 1, created_at, created_at FROM events", start, end, path.partition)
    for table in path.tables:
        await pool.execute(f"VACUUM ANALYZE {table}")
    await pool.execute("CHECKPOINT")


@dataclass
class DrainFigures:
    successive: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)
    old_history: float = 0.0
    today_history: list[float] = field(default_factory=list)
    paired_empty: list[float] = field(default_factory=list)  # the drains alternating with today_history
    held: float = 0.0

    def ratios(self) -> dict[str, float]:
        empty, paired = (sum(rates) / len(rates) for rates in (self.empty, self.paired_empty))
        return {"successive": min(later / self.successive[0] for later in self.successive[1:]),
                "today": sum(self.today_history) / len(self.today_history) / paired, "held": self.held / paired,
                "old": self.old_history / empty}


RATIOS = {  # what each ratio compares, and its target
    "successive": ("slowest of 4 drains after a first, no vacuum between / the first", ">= 0.9"),
    "today": ("drains with history in today's partition / empty", ">= 0.9"),
    "held": ("drain with history today and a snapshot held / empty", ">= 0.7"),
    "old": ("drain with history in an old partition / empty", ">= 0.9"),
}


async def held_snapshot_drain(pool: asyncpg.Pool, url: str, path: DrainPath, pending: int) -> float:
    """A drain while another session holds a REPEATABLE READ snapshot open: nothing dead since can be
    vacuumed or marked dead in the indexes."""
    holder = await asyncpg.connect(url)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM hookline.providers")  # takes the snapshot
        return await drain(pool, path, pending)
    finally:
        await holder.close()


def show(path: DrainPath, what: str, rate: float) -> None:
    print(f"  {path.name + ',':<30} {what:<44} {rate:9,.0f} rows/s", flush=True)


@contextlib.asynccontextmanager
async def running(pool: asyncpg.Pool, path: DrainPath, url: str, work: Path) -> AsyncIterator[None]:
    """The path's services started, warmed by a small drain (not measured), and stopped after."""
    path.services = await asyncio.to_thread(path.start, url, work)
    try:
        await drain(pool, path, 1000)
        yield
    finally:
        stop_all(path.services)
        path.services = []


async def drains_on_empty_tables(pool: asyncpg.Pool, url: str, work: Path, args: argparse.Namespace,
                                 figures: dict[str, DrainFigures]) -> None:
    """Per path: five successive drains without a vacuum between, then one on emptied tables."""
    for path in PATHS:
        await empty_today(pool, path.tables)
        async with running(pool, path, url, work):
            for n in range(5):
                figures[path.name].successive.append(rate := await drain(pool, path, args.pending))
                show(path, f"drain {n + 1} of 5, no vacuum between", rate)
            await empty_today(pool, path.tables)
            figures[path.name].empty.append(rate := await drain(pool, path, args.pending))
            show(path, "drain, emptied tables", rate)


async def drains_with_history_today(pool: asyncpg.Pool, url: str, work: Path, args: argparse.Namespace,
                                    figures: dict[str, DrainFigures]) -> None:
    """Per path, ROUNDS rounds of: a drain on emptied tables, then one with --done-today million done
    rows of its own in today's partition (alternating: single pairs of runs swung by a third on two
    cores); in the last round one more with a snapshot held open."""
    for path in PATHS:
        for n in range(ROUNDS):
            await empty_today(pool, path.tables)
            async with running(pool, path, url, work):
                figures[path.name].paired_empty.append(rate := await drain(pool, path, args.pending))
                show(path, f"round {n + 1} of {ROUNDS}: drain, emptied tables", rate)
            started = time.perf_counter()
            await fill_today(pool, path, args.done_today)
            print(f"  {args.done_today:g} million done rows of {path.partition} in today's partition of "
                  f"{path.tables[-1]} ({time.perf_counter() - started:,.0f} s to load)", flush=True)
            async with running(pool, path, url, work):
                figures[path.name].today_history.append(rate := await drain(pool, path, args.pending))
                show(path, f"round {n + 1} of {ROUNDS}: drain, history in today's partition", rate)
                if n == ROUNDS - 1:
                    figures[path.name].held = rate = await held_snapshot_drain(pool, url, path, args.pending)
                    show(path, "the same, snapshot held open", rate)
        await empty_today(pool, path.tables)


async def drains_on_old_history(pool: asyncpg.Pool, url: str, work: Path, args: argparse.Namespace,
                                figures: dict[str, DrainFigures], again: bool = False) -> None:
    """Per path: a drain on emptied tables of today, with the old day's history (``again``: once it
    is dropped, the second of the empty drains)."""
    for path in PATHS:
        await empty_today(pool, path.tables)
        async with running(pool, path, url, work):
            rate = await drain(pool, path, args.pending)
        if again:
            figures[path.name].empty.append(rate)
            show(path, "drain, emptied tables again", rate)
        else:
            figures[path.name].old_history = rate
            show(path, "drain, history in an old partition", rate)


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


@contextlib.asynccontextmanager
async def local_endpoint() -> AsyncIterator[str]:
    """An endpoint on 127.0.0.1 answering 204 at once (in this process: the relay's load in every
    drain, so the ratios compare like with like); its URL."""
    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


async def measure(url: str, sink_url: str, work: Path, args: argparse.Namespace) -> None:
    """Every phase, one after the other, printing each figure as it comes."""
    pool = await db.create_pool(url, min_size=4, max_size=8)
    async with pool.acquire() as conn:
        await old_days_partition(conn)
        await conn.execute(peers.EFFECT_TABLE)
        await apply_providers(conn, DRAIN_PROVIDERS)
        await endpoints.add(conn, DRAIN_ENDPOINT, sink_url, max_attempts=100, initial_delay=0.1, max_delay=1.0)
    figures = {path.name: DrainFigures() for path in PATHS}
    print(f"drains of {args.pending:,} rows: {WORKER_PROCESSES} `hookline worker --concurrency "
          f"{WORKER_CONCURRENCY}` per provider, `hookline relay --concurrency {RELAY_CONCURRENCY}` to a local "
          "endpoint answering 204")
    await drains_on_empty_tables(pool, url, work, args, figures)
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
    await drains_on_old_history(pool, url, work, args, figures)
    took, p99, inserts = await drop_under_ingest(pool, lambda conn: partitions.expire_inbox(
        conn, partitions.Retention(done_hours=1.0, dead_days=14, dedup_days=30)))
    print(f"drop of an old day's partition:      {took * 1000:,.0f} ms; receiver inserts during it: "
          f"{inserts}, p99 {p99:,.1f} ms")
    took, p99, inserts = await drop_under_ingest(pool, lambda conn: partitions.expire_outbox(
        conn, partitions.Retention(endpoint_done_hours=1.0)))
    print(f"drop of an old day's outbox pair:    {took * 1000:,.0f} ms; receiver inserts during it: "
          f"{inserts}, p99 {p99:,.1f} ms")
    await drains_with_history_today(pool, url, work, args, figures)
    await drains_on_old_history(pool, url, work, args, figures, again=True)
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


async def main() -> None:
    args = parse_args()
    # The worker processes import benchmarks.handlers: they run from the repository's root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.chdir(REPO)
    database = BenchDatabase()
    url = await database.start()
    try:
        async with local_endpoint() as sink_url:
            await measure(url, sink_url, Path(database.tmp.name), args)
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
