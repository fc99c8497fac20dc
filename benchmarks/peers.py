"""The peer queues for `make bench-worker`: PgQueuer and procrastinate doing the same no-op work.

Each peer gets its own database on the benchmark's Postgres server. The parent
(benchmarks.worker) installs the package if needed, creates the schema and
enqueues the jobs in bulk through the peer's own API; the worker processes are
this module run as a script, so every queue is drained by separate OS
processes exactly as Hookline's workers are (each peer is the exact release in PINS):

    python -m benchmarks.peers pgqueuer URL --concurrency 32

Each peer is driven with its documented public API and its defaults, except
for the concurrency knobs, which are set to match Hookline's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg

# The peers' exact versions: a ratio to a peer means something only against a known release, and a new
# release can change its defaults (batch sizes, polling). Bump deliberately, then re-run and update docs/performance.md.
PINS = {"pgqueuer": "1.6.0", "procrastinate": "3.10.0"}

# Jobs are enqueued in chunks: one call per chunk keeps each statement's
# parameter arrays a sane size while still being a bulk insert.
CHUNK = 10_000


@dataclass(frozen=True)
class Peer:
    name: str  # as printed
    package: str  # PyPI name, also the import name
    database: str
    setup: Callable[[str, int, str], Awaitable[None]]  # (url, jobs, task): schema + bulk enqueue
    remaining_sql: str  # jobs not finished yet (queued or in progress)


def ensure_installed(package: str) -> str | None:
    """Install the pinned release of ``package`` into this interpreter's environment unless it is there
    already; the error text on failure."""
    requirement = f"{package}=={PINS[package]}"
    if _installed_version(package) == PINS[package]:
        return None
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"pip install {requirement} failed: {(done.stderr or done.stdout).strip()[-500:]}"
    importlib.invalidate_caches()
    if importlib.util.find_spec(package) is None:
        return f"{package} not importable after install"
    found = _installed_version(package)
    return None if found == PINS[package] else f"{requirement} installed, but {found} is what imports"


def _installed_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def version(package: str) -> str:
    from importlib.metadata import version as dist_version

    return dist_version(package)


# Task "effect": the job writes one row, the same row Hookline's exactly-once benchmark handler
# writes in its event's transaction; a peer writes it through a pool of its worker's own (at least once).
EFFECT_TABLE = "CREATE TABLE IF NOT EXISTS public.bench_effects (event_id text NOT NULL)"
EFFECT = "INSERT INTO public.bench_effects (event_id) VALUES ($1)"
TASKS = ("noop", "effect")


async def effect_pool(url: str, concurrency: int) -> asyncpg.Pool:
    return await asyncpg.create_pool(url, min_size=1, max_size=concurrency)


# --- PgQueuer ---------------------------------------------------------------------------------------

async def pgqueuer_setup(url: str, jobs: int, task: str) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(EFFECT_TABLE)
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for start in range(0, jobs, CHUNK):
            n = min(CHUNK, jobs - start)
            await queries.enqueue([task] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


async def pgqueuer_worker(url: str, concurrency: int) -> None:
    from pgqueuer import AsyncpgDriver, Job, PgQueuer

    conn = await asyncpg.connect(url)
    pool = await effect_pool(url, concurrency)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    @pgq.entrypoint("effect")
    async def effect(job: Job) -> None:
        await pool.execute(EFFECT, str(job.id))

    # PgQueuer requires max_concurrent_tasks >= 2 * batch_size; this pair gives it the
    # same number of jobs in flight as a Hookline worker with --concurrency N.
    await pgq.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency)


# --- procrastinate ---------------------------------------------------------------------------------

_procrastinate_pool: list[asyncpg.Pool] = []  # the worker's effect pool, once it runs


def procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        pass

    @app.task(name="effect")
    async def effect(n: int) -> None:
        await _procrastinate_pool[0].execute(EFFECT, str(n))

    return app


async def procrastinate_setup(url: str, jobs: int, task: str) -> None:
    app = procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(EFFECT_TABLE)
        finally:
            await conn.close()
        deferrer = app.tasks[task]
        for start in range(0, jobs, CHUNK):
            await deferrer.batch_defer_async(*({"n": n} if task == "effect" else {}
                                               for n in range(start, min(jobs, start + CHUNK))))


async def procrastinate_worker(url: str, concurrency: int) -> None:
    _procrastinate_pool.append(await effect_pool(url, concurrency))
    app = procrastinate_app(url)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=True)


PEERS = [
    Peer("PgQueuer", "pgqueuer", "peer_pgqueuer", pgqueuer_setup,
         # Finished jobs are deleted from the queue table (and logged elsewhere).
         "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')"),
    Peer("procrastinate", "procrastinate", "peer_procrastinate", procrastinate_setup,
         "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"),
]
WORKERS: dict[str, Callable[[str, int], Coroutine[Any, Any, None]]] = {
    "pgqueuer": pgqueuer_worker, "procrastinate": procrastinate_worker,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="Run one peer queue's worker (used by benchmarks.worker).")
    parser.add_argument("peer", choices=sorted(WORKERS))
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(WORKERS[args.peer](args.url, args.concurrency))


if __name__ == "__main__":
    main()
