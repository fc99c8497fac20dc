"""make bench-worker: worker drain throughput vs. the pgbench ceiling, PgQueuer and procrastinate.

One embedded Postgres for everything, so the ratios compare like with like:

1. Hookline: N pending inbox rows preloaded with one INSERT ... SELECT, drained by
   P `hookline worker` processes with a no-op handler — first the one-parameter
   handler (no transaction, batched completions), then the `(event, conn)` one
   (a transaction per event).
2. Ceiling: pgbench running the worker's own `claim` and `complete` statements
   (read from hookline.core.queue) over a fresh N rows, batch = concurrency. The
   one-parameter drain and the ceiling alternate for ``--rounds`` rounds with a
   CHECKPOINT before each (a quick drain takes about 1.5 s: single runs swung
   0.54-1.09), and the ratio is of their rates over all rounds.
3. Peers: PgQueuer and procrastinate (installed from PyPI when missing), each in
   its own database on the same server, N no-op jobs enqueued in bulk, drained by
   P processes with the same concurrency.
4. Latency: signed events through a real `hookline receiver` at a moderate rate;
   (handler start - HTTP 200 received at the sender), p50 / p99.

A drain is timed from the first poll (every 100 ms) that sees the backlog
shrink until it reaches zero, so interpreter start-up and imports — which
differ between the three libraries and say nothing about queue throughput —
are left out; the wall time including start-up is printed too. Hookline's
drains are also timed by the server's clock (first claim to last completion,
as pgbench's own clock times the ceiling): the ratio to the ceiling uses that,
and prints the polls' ratio beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import asyncpg

from benchmarks import peers
from benchmarks.common import (
    BenchDatabase,
    Usage,
    checkpoint,
    free_port,
    parent_pid,
    percentile,
    record,
    start_service,
    stop_all,
)
from hookline.core.embedded import binary
from hookline.core.queue import INBOX
from hookline.core.signatures import sign_standard_webhooks

REPO = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + base64.b64encode(b"benchmark-secret-benchmark-secret").decode()
BODY = json.dumps({"type": "invoice.paid", "data": {"id": "in_1", "amount": 4200, "currency": "eur",
                                                    "customer": "cus_123456789"}}).encode()
PROVIDERS = f"""
kind: WebhookProvider
metadata: {{name: noop-tx}}
spec:
  signature: {{scheme: none}}
  handler: "benchmarks.handlers:noop_tx"
---
kind: WebhookProvider
metadata: {{name: latency}}
spec:
  signature: {{scheme: standard-webhooks, secrets: ["{SECRET}"]}}
  handler: "benchmarks.handlers:record_start"
---
kind: WebhookProvider
metadata: {{name: latency-tx}}
spec:
  signature: {{scheme: standard-webhooks, secrets: ["{SECRET}"]}}
  handler: "benchmarks.handlers:record_start_tx"
"""


def log(message: str) -> None:
    """Progress goes to stderr; the results block at the end goes to stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Drain:
    jobs: int  # finished in the measured interval
    seconds: float  # first visible progress -> backlog zero (or the budget ran out)
    wall: float  # process spawn -> end
    total: int  # the backlog at the start
    usage: Usage | None = None  # the worker processes' RSS and CPU while draining
    cpu_jobs: int = 0  # finished while usage counted CPU (from the first progress on)
    server: Usage | None = None  # Postgres (every backend) over the same interval
    # Hookline's drains: the server's clock, first claim -> last completion (see HOOKLINE_CLOCK)
    clock_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def clock_rate(self) -> float:
        """The rate by the server's clock where it was read (as pgbench times the ceiling), else by the polls."""
        return self.jobs / self.clock_seconds if self.clock_seconds else self.rate

    @property
    def cpu_us(self) -> float:
        """Worker processes' CPU per job finished while draining (start-up left out), in microseconds."""
        return self.usage.cpu / max(self.cpu_jobs, 1) * 1e6 if self.usage else float("nan")

    @property
    def server_cpu_us(self) -> float:
        """Postgres CPU per job finished while draining, in microseconds."""
        return self.server.cpu / max(self.cpu_jobs, 1) * 1e6 if self.server else float("nan")

    def describe_usage(self) -> str:
        if self.usage is None:
            return ""
        return (f"RSS {self.usage.describe_rss()}, CPU {self.cpu_us:,.0f} us/event, "
                f"Postgres {self.server_cpu_us:,.0f} us/event")

    def describe(self, unit: str) -> str:
        done = f"{self.jobs:,} {unit} in {self.seconds:.2f} s"
        if self.jobs < self.total:
            done += f", stopped at the time budget with {self.total - self.jobs:,} left"
        return f"{done}, {self.wall:.2f} s incl. start-up"


async def preload(conn: asyncpg.Connection, provider: str, count: int) -> None:
    """Pending inbox rows exactly as the receiver would store them, in one statement."""
    await conn.execute(
        """INSERT INTO hookline.inbox (provider, event_id, event_type, body, content_type)
           SELECT $1, 'evt_' || g, 'invoice.paid', $2::bytea, 'application/json'
           FROM generate_series(1, $3::int) AS g""",
        provider, BODY, count,
    )
    # Every stage starts from a vacuumed, analysed table, so one stage's dead tuples
    # do not slow the next and the planner sees the new rows.
    await conn.execute("VACUUM ANALYZE hookline.inbox")


async def drain(conn: asyncpg.Connection, remaining_sql: str, args: tuple[object, ...],
                spawn: Callable[[], list[subprocess.Popen[bytes]]], logs: list[Path], budget: float) -> Drain:
    """Start the worker processes and poll the backlog every 100 ms until it is empty.

    A queue slow enough to need more than ``budget`` seconds is measured over the
    budget instead (the rate is what it finished meanwhile), so one slow peer cannot
    hold up the whole run for many minutes.
    """
    total = int(await conn.fetchval(remaining_sql, *args))
    postmaster = parent_pid(int(await conn.fetchval("SELECT pg_backend_pid()")))
    spawned = time.monotonic()
    procs = spawn()
    usage = Usage([p.pid for p in procs])
    usage.start()
    server = Usage([postmaster])  # every backend, the consumers' and this poll's
    server.start()
    try:
        previous = spawned
        started: float | None = None
        start_remaining = remaining_at_rebase = total
        while True:
            await asyncio.sleep(0.1)
            remaining = int(await conn.fetchval(remaining_sql, *args))
            now = time.monotonic()
            if started is None and remaining < total:
                # The first rows finished somewhere since the previous poll: counting from
                # that poll errs on the slow side by at most one interval.
                started = previous
                usage.rebase()  # CPU per event without the interpreter's start-up and imports
                server.rebase()
                remaining_at_rebase = remaining
            if remaining == 0 or (started is not None and now - started > budget):
                assert started is not None
                await usage.stop()
                await server.stop()
                return Drain(start_remaining - remaining, now - started, now - spawned, total, usage,
                             remaining_at_rebase - remaining, server)
            if now - spawned > budget + 60:
                raise RuntimeError(f"no progress in {now - spawned:.0f} s ({remaining:,} of {total:,} left)")
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                tail = "".join(p.read_text()[-2000:] for p in logs if p.exists())
                raise RuntimeError(f"a worker process exited (code {dead[0].returncode}):\n{tail}")
            previous = now
    finally:
        stop_all(procs)


# --- Hookline ----------------------------------------------------------------------------------------

# Each count through its own partial index (claimable, leased): one count over both statuses read every
# row of the provider, done ones too, 8-16 ms of Postgres CPU per poll at 20,000 events, ten polls a
# second taken from the drain it measures.
HOOKLINE_REMAINING = ("SELECT (SELECT count(*) FROM hookline.inbox WHERE status = 'pending' AND provider = $1)"
                      " + (SELECT count(*) FROM hookline.inbox WHERE status = 'processing' AND provider = $1)")
# A drain by the server's clock: from the first claim (its transaction's now()) to the last completion's.
# The 100 ms polls time a drain of about 1.5 s up to two intervals long on average, one at each end; pgbench
# times the ceiling by its own clock, from its first transaction to its last.
HOOKLINE_CLOCK = ("SELECT extract(epoch FROM max(processed_at) - min(claimed_at)) FROM hookline.inbox "
                  "WHERE provider = $1 AND status = 'done'")


def hookline_workers(url: str, provider: str, args: argparse.Namespace, log_file: Path
                     ) -> list[subprocess.Popen[bytes]]:
    extra = shlex.split(args.worker_args)
    return [start_service(["worker", "--provider", provider, "--concurrency", str(args.concurrency),
                           "--port", str(free_port()), *extra], url, None, log_file)
            for _ in range(args.processes)]


async def run_hookline(conn: asyncpg.Connection, url: str, provider: str, args: argparse.Namespace,
                       work: Path, events: int | None = None) -> Drain:
    await preload(conn, provider, events or args.events)
    log_file = work / f"worker-{provider}.log"
    result = await drain(conn, HOOKLINE_REMAINING, (provider,),
                         lambda: hookline_workers(url, provider, args, log_file), [log_file], args.budget)
    dead = await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND status = 'dead'",
                               provider)
    if dead:
        raise RuntimeError(f"{dead} {provider} events went dead (see {log_file})")
    if result.jobs < result.total:
        return result  # stopped at the time budget: the polls' interval is the measured one
    return replace(result, clock_seconds=float(await conn.fetchval(HOOKLINE_CLOCK, provider)))


# --- Ceiling -----------------------------------------------------------------------------------------

def ceiling_script(provider: str, batch: int) -> str:
    """The worker's exact claim and complete statements as a two-statement pgbench transaction.

    pgbench cannot pass rows between statements, so the claim's RETURNING feeds an
    aggregate whose two arrays \\gset stores (the worker wraps the same claim in worker.sql's
    ``claimed_events``, which selects the columns it reads: a data-modifying CTE cannot nest, so
    the script wraps queue.sql's claim itself); the complete statement then takes them
    as its unnest() arrays, just as BatchCompleter passes them. Each statement
    commits on its own, as in the worker.
    """

    def bind(sql: str, values: dict[str, str]) -> str:
        body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
        return re.sub(r"\$(\d+)", lambda m: values[m.group(1)], body).strip().rstrip(";")

    worker = "'pgbench-ceiling'"
    claim = bind(INBOX.sql("claim"), {"1": f"'{provider}'", "2": str(batch), "3": worker, "4": "60", "5": "NULL"})
    complete = bind(INBOX.sql("complete"), {"1": ":ids", "2": ":atts", "3": worker})
    return (f"WITH claimed AS (\n{claim}\n)\n"
            "SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempts), '{}') AS atts "
            "FROM claimed \\gset\n"
            f"{complete};\n")


@dataclass(frozen=True)
class Ceiling:
    rate: float
    tps: float
    transactions: int
    done: int


async def run_ceiling(conn: asyncpg.Connection, url: str, args: argparse.Namespace, provider: str) -> Ceiling:
    await preload(conn, provider, args.events)
    clients = args.ceiling_clients or args.processes
    # Enough transactions per client to drain every row; the few that find nothing at
    # the end only add time, so the rate errs low.
    per_client = math.ceil(args.events / (clients * args.concurrency)) + 1
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(ceiling_script(provider, args.concurrency))
    os.chmod(f.name, 0o644)
    try:
        out = await asyncio.to_thread(
            subprocess.run,
            [str(binary("pgbench")), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
             "-t", str(per_client), "-f", f.name, url],
            capture_output=True, text=True,
        )
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{out.stdout}\n{out.stderr}")
    tps = re.search(r"tps = ([\d.]+)", out.stdout)
    count = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
    if not tps or not count:
        raise RuntimeError(f"unexpected pgbench output:\n{out.stdout}")
    done = int(await conn.fetchval(
        "SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND status = 'done'", provider))
    transactions = int(count.group(1))
    seconds = transactions / float(tps.group(1))  # pgbench's own clock, connection set-up excluded
    return Ceiling(done / seconds, float(tps.group(1)), transactions, done)


# --- Peers -------------------------------------------------------------------------------------------

async def run_peer(peer: peers.Peer, database: BenchDatabase, args: argparse.Namespace, work: Path,
                   task: str = "noop", events: int | None = None, label: str = "") -> Drain | str:
    """The peer's drain of ``events`` jobs of ``task`` (in a database of its own), or why it could not be measured."""
    error = await asyncio.to_thread(peers.ensure_installed, peer.package)
    if error:
        return error
    name = f"{peer.database}_{task}{label}"
    admin = await asyncpg.connect(database.server.url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = database.server.url_for(name)
    try:
        await peer.setup(url, events or args.events, task)
    except Exception as exc:  # a peer's API change must not sink the rest of the run
        return f"setup failed: {type(exc).__name__}: {exc}"
    log_file = work / f"peer-{name}.log"

    def spawn() -> list[subprocess.Popen[bytes]]:
        out = open(log_file, "ab")  # noqa: SIM115 - handed to the child processes
        return [subprocess.Popen([sys.executable, "-m", "benchmarks.peers", peer.package, url,
                                  "--concurrency", str(args.concurrency)], cwd=REPO, stdout=out, stderr=out)
                for _ in range(args.processes)]

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
        return await drain(conn, peer.remaining_sql, (), spawn, [log_file], args.budget)
    except RuntimeError as exc:
        return str(exc)
    finally:
        await conn.close()


# --- Latency -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Latency:
    sent: int
    non_200: int
    handled: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def signed_request(port: int, provider: str, event_id: str) -> bytes:
    body = json.dumps({"id": event_id, "type": "invoice.paid", "data": {"id": "in_1", "amount": 4200}}).encode()
    headers = sign_standard_webhooks([SECRET], event_id, int(time.time()), body)
    head = (f"POST /webhooks/{provider} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
    return head.encode() + body


async def send_paced(port: int, provider: str, rate: float, seconds: float, connections: int = 16
                     ) -> tuple[dict[str, float], int]:
    """Open-loop load: request i leaves at t0 + i/rate whatever the earlier ones are doing.

    Returns the wall-clock time each 200 arrived, by event id, and the non-200 count.
    """
    count = int(rate * seconds)
    ids = [f"lat_{uuid.uuid4().hex}" for _ in range(count)]
    prepared = [(event_id, signed_request(port, provider, event_id)) for event_id in ids]
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    arrived: dict[str, float] = {}
    failures = 0

    async def send(event_id: str, request: bytes) -> None:
        nonlocal failures
        reader, writer = await idle.get()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if head.startswith(b"HTTP/1.1 200"):
                arrived[event_id] = time.time()
            else:
                failures += 1
        finally:
            idle.put_nowait((reader, writer))

    tasks = []
    start = time.monotonic()
    for i, (event_id, request) in enumerate(prepared):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(event_id, request)))
    await asyncio.gather(*tasks)
    while not idle.empty():
        idle.get_nowait()[1].close()
    return arrived, failures


async def started_times(conn: asyncpg.Connection, directory: Path) -> dict[str, float]:
    """Handler start times recorded so far by both probes (files and the table)."""
    found = {r["event_id"]: r["started_at"] for r in await conn.fetch("SELECT * FROM public.bench_latency")}
    for path in directory.glob("*.txt"):
        for line in path.read_text().splitlines():
            event_id, _, started = line.partition(" ")
            if started:
                found[event_id] = float(started)
    return found


async def run_latency(conn: asyncpg.Connection, url: str, provider: str, args: argparse.Namespace,
                      work: Path) -> Latency:
    directory = work / f"latency-{provider}"
    directory.mkdir()
    os.environ["HOOKLINE_BENCH_LATENCY_DIR"] = str(directory)  # inherited by the worker processes
    await conn.execute("CREATE TABLE IF NOT EXISTS public.bench_latency "
                       "(event_id text PRIMARY KEY, started_at double precision NOT NULL)")
    log_file = work / f"{provider}.log"
    port = free_port()
    procs = [start_service(["receiver", "--host", "127.0.0.1", "--port", str(port)], url, port, log_file)]
    try:
        for _ in range(args.processes):
            worker_port = free_port()
            procs.append(start_service(["worker", "--provider", provider, "--concurrency", str(args.concurrency),
                                        "--port", str(worker_port), *shlex.split(args.worker_args)],
                                       url, worker_port, log_file))
        await send_paced(port, provider, args.latency_rate, 1.0)  # warm-up: connections, prepared statements
        arrived, failures = await send_paced(port, provider, args.latency_rate, args.latency_seconds)
        deadline = time.monotonic() + 30
        while True:
            started = await started_times(conn, directory)
            if all(e in started for e in arrived) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        stop_all(procs)
    # Both clocks are this machine's time.time(), so the difference is meaningful. It
    # can be negative: the event is committed (and the NOTIFY sent) before the receiver
    # writes its 200, so an idle worker often starts the handler before the sender has
    # read the response. Kept signed rather than clamped, so the percentiles stay honest.
    delays = [(started[e] - at) * 1000 for e, at in arrived.items() if e in started]
    return Latency(int(args.latency_rate * args.latency_seconds), failures, len(delays),
                   percentile(delays, 50), percentile(delays, 99), max(delays, default=float("nan")))


# --- Main --------------------------------------------------------------------------------------------

def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


# --- The exactly-once effect against the peers' at-least-once effect -----------------------------------

def round_providers(rounds: int) -> str:
    """Providers per round (the no-op drain, the ceiling's rows, the effect comparison), so every
    round drains fresh rows of its own and is timed on them alone."""
    return "".join(f"""
---
kind: WebhookProvider
metadata: {{name: {name}-{n}}}
spec:
  signature: {{scheme: none}}
  handler: "benchmarks.handlers:{handler}"
""" for n in range(rounds) for name, handler in (("noop", "noop"), ("ceiling", "noop"), ("effect-tx", "effect_tx")))


@dataclass(frozen=True)
class EffectRound:
    hookline: Drain
    peers: dict[str, Drain | str]


async def run_effect_rounds(conn: asyncpg.Connection, url: str, database: BenchDatabase, args: argparse.Namespace,
                            work: Path) -> list[EffectRound]:
    """Hookline's exactly-once path (the handler writes one row in the event's transaction) against
    the peers whose jobs write the same row through a pool, alternating, CHECKPOINT before each."""
    await conn.execute(peers.EFFECT_TABLE)
    rounds = []
    for n in range(args.rounds):
        await checkpoint(url)
        log(f"round {n + 1}: hookline (event, conn) handler writing one effect row, {args.effect_events:,} events")
        hookline = await run_hookline(conn, url, f"effect-tx-{n}", args, work, args.effect_events)
        log(f"  {hookline.rate:,.0f} events/s")
        results: dict[str, Drain | str] = {}
        for peer in [] if args.no_peers else peers.PEERS:
            await checkpoint(url)
            log(f"round {n + 1}: {peer.name} job writing one effect row through a pool")
            result = await run_peer(peer, database, args, work, "effect", args.effect_events, f"_{n}")
            log(f"  {result.rate:,.0f} jobs/s" if isinstance(result, Drain) else f"  {result}")
            results[peer.package] = result
        rounds.append(EffectRound(hookline, results))
    return rounds


def effect_lines(rounds: list[EffectRound], args: argparse.Namespace) -> list[str]:
    hook_rates = [r.hookline.rate for r in rounds]
    lines = [f"exactly-once effect, hookline (event, conn) handler writing one row: "
             f"{', '.join(f'{x:,.0f}' for x in hook_rates)} events/s per round ({args.effect_events:,} events, "
             f"{shape(args)}; {rounds[0].hookline.describe_usage()})"]
    for peer in [] if args.no_peers else peers.PEERS:
        per_round = [r.peers[peer.package] for r in rounds]
        failed = [d for d in per_round if not isinstance(d, Drain)]
        if failed:
            lines.append(f"  {peer.name}: not measured: {failed[0]}")
            continue
        rates = [d.rate for d in per_round if isinstance(d, Drain)]
        overall = sum(hook_rates) / sum(rates)
        each = ", ".join(f"{h / p:.2f}" for h, p in zip(hook_rates, rates, strict=True))
        target = ">= 1.5" if peer.package == "pgqueuer" else "> 1.0"
        first = per_round[0]
        assert isinstance(first, Drain)
        lines.append(f"  {peer.name} {peers.version(peer.package)}, job writing the same row through a pool (at least "
                     f"once): {', '.join(f'{x:,.0f}' for x in rates)} jobs/s per round; ratio hookline/{peer.name} "
                     f"{overall:.2f}x (rounds {each}; target {target}x; round 1: {first.describe_usage()})")
        record(args.results, "worker", f"exactly-once effect / {peer.name} {peers.version(peer.package)} effect",
               overall, target)
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="rows/jobs preloaded per drain (default 100000)")
    parser.add_argument("--quick", action="store_true", help="20,000 events and a 5 s latency run")
    parser.add_argument("--processes", type=int, default=2, help="worker processes per drain (default 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="events in flight per process (default 32)")
    parser.add_argument("--ceiling-clients", type=int, default=0,
                        help="pgbench clients (default: --processes, one claim stream per worker process)")
    parser.add_argument("--worker-args", default="", help="extra flags for `hookline worker`")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="longest a drain is timed; a slower queue is rated on what it finished (default 120 s)")
    parser.add_argument("--no-peers", action="store_true", help="skip PgQueuer and procrastinate")
    parser.add_argument("--latency-rate", type=float, default=200.0, help="events/s for the latency run")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--effect-events", type=int, default=20_000,
                        help="events/jobs per round of the exactly-once effect comparison (default 20000)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating rounds of the no-op drain and its ceiling, and of the effect comparison, "
                             "CHECKPOINT before each run (default 2)")
    parser.add_argument("--results", default=None, help="append the figures as JSON lines (for make bench)")
    args = parser.parse_args()
    if args.quick:
        args.events = min(args.events, 20_000)
        args.effect_events = min(args.effect_events, 10_000)
        args.latency_seconds = min(args.latency_seconds, 5.0)
        args.budget = min(args.budget, 20.0)
    return args


@dataclass(frozen=True)
class Results:
    plain: list[Drain]  # hookline, handler(event), one per round
    tx: Drain  # hookline, handler(event, conn)
    ceiling: list[Ceiling]  # one per round, alternating with ``plain``
    peers: list[tuple[peers.Peer, Drain | str]]  # a peer's drain, or why it was not measured
    latencies: dict[str, Latency]  # by provider: "latency", "latency-tx"
    effects: list[EffectRound]  # the exactly-once effect against the peers', round by round

    @property
    def plain_rate(self) -> float:
        """The no-op drains' events/s over every round, by the polls."""
        return sum(d.jobs for d in self.plain) / sum(d.seconds for d in self.plain)

    @property
    def plain_clock_rate(self) -> float:
        """The no-op drains' events/s over every round, by the server's clock (as pgbench times the ceiling)."""
        return sum(d.jobs for d in self.plain) / sum(d.jobs / d.clock_rate for d in self.plain)

    @property
    def ceiling_rate(self) -> float:
        return sum(c.done for c in self.ceiling) / sum(c.done / c.rate for c in self.ceiling)


async def measure(url: str, database: BenchDatabase, args: argparse.Namespace, work: Path) -> Results:
    """Every run, one after the other on the one Postgres, logging each result as it comes."""
    from hookline.core import db
    from hookline.core.providers import apply_providers

    conn = await db.connect(url)
    try:
        await apply_providers(conn, PROVIDERS + round_providers(args.rounds))
        plain: list[Drain] = []
        ceiling: list[Ceiling] = []
        for n in range(args.rounds):  # alternating, CHECKPOINT before each: a drain of 20,000 takes ~1.5 s
            await checkpoint(url)
            log(f"round {n + 1}: hookline no-op drain of {args.events:,} events ({shape(args)})")
            plain.append(await run_hookline(conn, url, f"noop-{n}", args, work))
            log(f"  {plain[-1].rate:,.0f} events/s")
            await checkpoint(url)
            log(f"round {n + 1}: pgbench ceiling")
            ceiling.append(await run_ceiling(conn, url, args, f"ceiling-{n}"))
            log(f"  {ceiling[-1].rate:,.0f} events/s")
        log("hookline transactional no-op drain")
        tx = await run_hookline(conn, url, "noop-tx", args, work)
        log(f"  {tx.rate:,.0f} events/s")
        peer_results: list[tuple[peers.Peer, Drain | str]] = []
        for peer in [] if args.no_peers else peers.PEERS:
            log(f"{peer.name} drain")
            result = await run_peer(peer, database, args, work)
            log(f"  {result.rate:,.0f} jobs/s" if isinstance(result, Drain) else f"  {result}")
            peer_results.append((peer, result))
        effects = await run_effect_rounds(conn, url, database, args, work)
        latencies: dict[str, Latency] = {}
        for provider in ("latency", "latency-tx"):
            log(f"{provider}: {args.latency_rate:g} events/s for {args.latency_seconds:g} s through the receiver")
            latencies[provider] = await run_latency(conn, url, provider, args, work)
            log(f"  p50 {latencies[provider].p50_ms:.1f} ms")
    finally:
        await conn.close()
    return Results(plain, tx, ceiling, peer_results, latencies, effects)


def shape(args: argparse.Namespace) -> str:
    return f"{args.processes} processes x concurrency {args.concurrency}"


def report(results: Results, args: argparse.Namespace) -> list[str]:
    """The summary lines: each run, its ratio to the ceiling and to each peer, and the latencies."""
    plain, tx, ceiling = results.plain[0], results.tx, results.ceiling[0]  # round 1, described in full
    clients = args.ceiling_clients or args.processes
    plain_rate, ceiling_rate = results.plain_rate, results.ceiling_rate
    each = ", ".join(f"{d.clock_rate / c.rate:.2f}" for d, c in zip(results.plain, results.ceiling, strict=True))
    lines = [
        f"hookline worker, no-op handler (event):         {plain_rate:>9,.0f} events/s  "
        f"(rounds: {', '.join(f'{d.rate:,.0f}' for d in results.plain)}; round 1: {plain.describe('events')}; "
        f"{shape(args)}; {plain.describe_usage()})",
        f"hookline worker, no-op handler (event, conn):   {tx.rate:>9,.0f} events/s  "
        f"({tx.describe('events')}; {tx.describe_usage()})",
        f"  ratio transactional/one-parameter no-op: {tx.rate / plain_rate:.2f} (target >= 0.5)",
        f"ceiling, pgbench claim+complete (same SQL):     {ceiling_rate:>9,.0f} events/s  "
        f"(rounds: {', '.join(f'{c.rate:,.0f}' for c in results.ceiling)}; round 1: {ceiling.tps:,.0f} tps x batch "
        f"{args.concurrency}, {clients} clients, {ceiling.done:,} rows done in {ceiling.transactions:,} transactions)",
        f"  ratio hookline/ceiling: {results.plain_clock_rate / ceiling_rate:.2f} (rounds {each}; target >= 0.70; "
        f"the drains by the server's clock, {results.plain_clock_rate:,.0f} events/s, as pgbench's clock times the "
        f"ceiling; by the 100 ms polls {plain_rate / ceiling_rate:.2f}); transactional handler "
        f"{tx.clock_rate / ceiling_rate:.2f}",
    ]
    for peer, result in results.peers:
        lines += peer_lines(peer, result, results, args)
    lines += effect_lines(results.effects, args)
    drains = [*results.plain, tx, *(r.hookline for r in results.effects)]
    worker_rss = max(d.usage.max_rss for d in drains if d.usage)
    lines.append(f"worker RSS under load: largest process {worker_rss:.0f} MB (target <= 100 MB); CPU per event "
                 f"(worker processes while draining): no-op {plain.cpu_us:,.0f} us, (event, conn) no-op "
                 f"{tx.cpu_us:,.0f} us, effect {results.effects[0].hookline.cpu_us:,.0f} us")
    record(args.results, "worker", "one-parameter no-op / pgbench claim+complete",
           results.plain_clock_rate / ceiling_rate, ">= 0.7")
    record(args.results, "worker", "(event, conn) no-op / one-parameter no-op", tx.rate / plain_rate, ">= 0.5")
    record(args.results, "worker", "worker RSS (largest process)", worker_rss, "<= 100", "MB")
    lines.append(f"latency, receiver 200 -> handler start, {args.latency_rate:g} events/s for "
                 f"{args.latency_seconds:g} s (target p50 <= 20 ms):")
    for provider, label in (("latency", "handler (event)"), ("latency-tx", "handler (event, conn)")):
        lat = results.latencies[provider]
        lines.append(f"  {label + ':':<24}p50 {lat.p50_ms:6.1f} ms, p99 {lat.p99_ms:6.1f} ms, "
                     f"max {lat.max_ms:6.1f} ms ({lat.handled}/{lat.sent} handled, {lat.non_200} non-200)")
    return lines


def peer_lines(peer: peers.Peer, result: Drain | str, results: Results, args: argparse.Namespace) -> list[str]:
    if not isinstance(result, Drain):
        return [f"{peer.name}: not measured: {result}"]
    label = f"{peer.name} {peers.version(peer.package)}"
    target = ">= 1.2" if peer.package == "pgqueuer" else "> 1.0"
    return [
        f"{label + ', no-op job:':<48}{result.rate:>9,.0f} jobs/s    ({result.describe('jobs')}; {shape(args)}; "
        f"{result.describe_usage()})",
        f"  ratio hookline/{peer.name}: {ratio(results.plain_rate, result.rate)} (target {target}x); "
        f"transactional handler {ratio(results.tx.rate, result.rate)}",
    ]


async def main() -> None:
    args = parse_args()
    # The worker processes import benchmarks.handlers; they run from the repo root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.chdir(REPO)
    database = BenchDatabase()
    url = await database.start()
    try:
        results = await measure(url, database, args, Path(database.tmp.name))
    finally:
        database.stop()
    print()
    print("$ " + " ".join([Path(sys.executable).name, "-m", "benchmarks.worker", *sys.argv[1:]]))
    for line in report(results, args):
        print(line)

if __name__ == "__main__":
    asyncio.run(main())
