"""Crashes and slow bookkeeping with real worker processes on a real Postgres.

* A handler that kills its worker takes down whatever else was in flight in that
  process. The sweeper brings those events back as suspects, and each runs alone
  once: the crasher uses up its own attempts and dies; its neighbours lose at most
  the one attempt they shared with it and end done, with one effect each.
* An event whose destination call succeeded keeps its lease until "done" is
  written, however long that takes (here: a real row lock held by another
  connection), and a completion write that fails (here: its connection killed by
  ``pg_terminate_backend``) is neither a retry nor a dead letter. The destination
  receives every event exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web

from hookline.core.embedded import free_port
from hookline.core.maintenance import sweep_once
from hookline.core.queue import RetryPolicy
from support.inbox import apply_provider, create_effect_tables, insert_events, status_counts
from support.processes import ServiceProcess, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

UNFINISHED = "SELECT count(*) FROM hookline.inbox WHERE status NOT IN ('done', 'dead')"


@pytest.fixture
async def effects(pool: asyncpg.Pool) -> asyncpg.Pool:
    await create_effect_tables(pool)
    return pool


class Supervisor:
    """Keeps ``count`` worker processes running and restarts those that die, as Kubernetes would."""

    def __init__(self, database_url: str, log_dir: Path, count: int, *args: str, env: dict[str, str]) -> None:
        self.database_url, self.log_dir, self.args, self.env = database_url, log_dir, args, env
        self.workers = [self._start() for _ in range(count)]
        self.restarts = 0

    def _start(self) -> ServiceProcess:
        # Not waiting for /healthz: a handler may end the process before it answers.
        return ServiceProcess(["worker", "--port", "0", *self.args], self.database_url, self.log_dir,
                              env=self.env).start(wait_path=None)

    async def run(self) -> None:
        while True:
            for i, w in enumerate(self.workers):
                if w.proc is not None and w.proc.poll() is not None:
                    self.restarts += 1
                    self.workers[i] = self._start()
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


async def test_a_crashing_event_costs_its_neighbours_at_most_one_attempt(database_url: str, effects: asyncpg.Pool,
                                                                         log_dir: Path) -> None:
    apply_provider(database_url, "crashy", """
signature: {scheme: none}
handler: "support.handlers:kill_my_worker_on_crash_events"
leaseSeconds: 2
retry: {maxAttempts: 3, initialDelaySeconds: 0.2, maxDelaySeconds: 1}
""")
    # The crasher sits in the middle of the queue, so the first claims take it with neighbours.
    innocent = await insert_events(effects, "crashy", 25)
    [crasher] = await insert_events(effects, "crashy", 1, event_type="crash")
    innocent += await insert_events(effects, "crashy", 25)
    supervisor = Supervisor(database_url, log_dir, 3, "--concurrency", "8", "--sweep", "--poll-interval", "0.1",
                            env={"TEST_HANDLER_SLEEP": "0.3"})
    supervising = asyncio.create_task(supervisor.run())
    try:
        await eventually(lambda: effects.fetchval(UNFINISHED), equals=0, timeout=120)
    finally:
        supervising.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervising
        supervisor.stop()
    rows = {r["event_id"]: r for r in await effects.fetch("SELECT event_id, status, attempts, suspect, last_error "
                                                          "FROM hookline.inbox")}
    assert (rows[crasher]["status"], rows[crasher]["attempts"]) == ("dead", 3)
    assert "lease expired" in rows[crasher]["last_error"]
    calls = Counter(r["event_id"] for r in await effects.fetch("SELECT event_id FROM test_calls"))
    assert calls[crasher] == 3
    assert supervisor.restarts >= 3  # each attempt of the crasher ended a worker
    # Every innocent event is done with exactly one effect ...
    assert all(rows[e]["status"] == "done" and not rows[e]["suspect"] for e in innocent)
    effects_by_event = Counter(r["event_id"] for r in await effects.fetch("SELECT event_id FROM test_effects"))
    assert effects_by_event == Counter(innocent)
    # ... and lost at most the one attempt it shared with the crasher. Some did share one:
    # the first crash took its batch-mates down with it (that is what isolation is for).
    attempts = Counter(rows[e]["attempts"] for e in innocent)
    assert set(attempts) <= {1, 2}, attempts
    assert attempts[2] >= 1, attempts


class Destination:
    """An HTTP destination that counts every POST per event. When the event named ``blocker``
    arrives, another connection takes a row lock on its inbox row (and holds it) before the
    answer goes out, so the worker's completion of that event waits on a real lock."""

    def __init__(self, locker: asyncpg.Connection, blocker: str) -> None:
        self.locker, self.blocker = locker, blocker
        self.port = free_port()
        self.received: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        event_id = request.headers["Hookline-Event-Id"]
        self.received[event_id] += 1
        if event_id == self.blocker and self.received[event_id] == 1:
            await self.locker.execute("BEGIN")
            await self.locker.execute("SELECT 1 FROM hookline.inbox WHERE event_id = $1 FOR UPDATE", event_id)
        return web.Response(status=200)

    async def release(self) -> None:
        await self.locker.execute("COMMIT")

    async def __aenter__(self) -> Destination:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner:
            await self._runner.cleanup()


@pytest.fixture
async def locker(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def sweep_often(pool: asyncpg.Pool, policy: RetryPolicy) -> None:
    """The real lease sweeper, every 0.2 s: any lease left to expire is taken back at once."""
    while True:
        await sweep_once(pool, {"dest": policy})
        await asyncio.sleep(0.2)


WAITING_COMPLETION = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%SET status = ''done''%'
  AND now() - query_start > make_interval(secs => $1)
"""


# Long enough that a heartbeat (every third of it) is not late on a loaded machine, short enough
# that holding the lock past it keeps the test short.
LEASE = 3


async def run_blocked_completion(database_url: str, effects: asyncpg.Pool, locker: asyncpg.Connection,
                                 log_dir: Path, *, kill_the_write: bool) -> Destination:
    """One event's completion waits on a row lock for several lease lengths (and, with
    ``kill_the_write``, its connection is killed meanwhile) while 30 more events are delivered
    and wait to be booked behind it; a sweeper runs all along and a second worker is ready to
    take anything swept. Then the lock goes away and everything is booked."""
    [blocker] = await insert_events(effects, "dest", 1)
    async with Destination(locker, blocker) as destination:
        apply_provider(database_url, "dest", f"""
signature: {{scheme: none}}
destination: {{url: "{destination.url}", timeoutSeconds: 5}}
leaseSeconds: {LEASE}
retry: {{maxAttempts: 3, initialDelaySeconds: 0.1, maxDelaySeconds: 0.2}}
""")
        sweeper = asyncio.create_task(sweep_often(effects, RetryPolicy(3, 0.1, 0.2)))
        # Room for every event at once, so that all of them are delivered while the first waits.
        workers = [worker(database_url, log_dir, "--concurrency", "40", "--poll-interval", "0.1")]
        try:
            # The blocker's completion is written alone and waits on the lock ...
            await eventually(lambda: effects.fetchval(f"SELECT count(*) > 0 FROM ({WAITING_COMPLETION}) AS w", 0.0),
                             equals=True, timeout=30)
            # ... while the others are delivered and queue up behind it.
            await insert_events(effects, "dest", 30)
            await eventually(lambda: len(destination.received) == 31)
            # A second worker takes whatever the sweeper hands back (nothing, if leases are kept).
            workers.append(worker(database_url, log_dir, "--concurrency", "8", "--poll-interval", "0.1"))
            if kill_the_write:
                killed = await effects.fetchval(f"SELECT count(pg_terminate_backend(pid)) FROM "
                                                f"({WAITING_COMPLETION}) AS w", 0.0)
                assert killed == 1
            # Keep the lock two lease lengths longer (the retried write, after a kill, waits on it
            # again): without heartbeats the sweeper would have taken every delivered event back.
            await eventually(lambda: effects.fetchval(f"SELECT count(*) > 0 FROM ({WAITING_COMPLETION}) AS w",
                                                      2 * LEASE), timeout=30)
            # (After a kill the batch queued behind the lost write is booked at once; the blocker waits.)
            blocked = await effects.fetchrow("SELECT status, attempts FROM hookline.inbox WHERE event_id = $1",
                                             blocker)
            assert (blocked["status"], blocked["attempts"]) == ("processing", 1)
            await destination.release()
            await eventually(lambda: effects.fetchval(UNFINISHED), equals=0, timeout=30)
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            for w in workers:
                w.stop()
    return destination


async def assert_each_event_delivered_once(effects: asyncpg.Pool, destination: Destination) -> None:
    assert len(destination.received) == 31
    assert {e: n for e, n in destination.received.items() if n != 1} == {}
    assert await status_counts(effects) == {"done": 31}
    rows = await effects.fetch("SELECT event_id, attempts, last_error FROM hookline.inbox WHERE attempts <> 1")
    assert [dict(r) for r in rows] == []


async def test_a_slow_completion_keeps_its_lease_and_the_destination_gets_each_event_once(
        database_url: str, effects: asyncpg.Pool, locker: asyncpg.Connection, log_dir: Path) -> None:
    destination = await run_blocked_completion(database_url, effects, locker, log_dir, kill_the_write=False)
    await assert_each_event_delivered_once(effects, destination)


async def test_a_failed_completion_write_is_not_a_retry_or_a_dead_letter(
        database_url: str, effects: asyncpg.Pool, locker: asyncpg.Connection, log_dir: Path) -> None:
    destination = await run_blocked_completion(database_url, effects, locker, log_dir, kill_the_write=True)
    await assert_each_event_delivered_once(effects, destination)
