"""The worker with real processes on a real Postgres: exactly one effect per event, whatever happens."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time

import aiohttp
import asyncpg
import pytest
import standardwebhooks
from aiohttp import web

from hookline.core.providers import stored_destination_secret
from hookline.core.queue import RetryPolicy
from hookline.core.secrets_at_rest import configured_ring
from support import senders
from support.inbox import apply_provider, create_effect_tables, insert_events, status_counts
from support.processes import ServiceProcess, receiver, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

ALL_DONE = "SELECT count(*) FROM hookline.inbox WHERE status NOT IN ('done', 'dead')"


@pytest.fixture
async def effects(pool: asyncpg.Pool) -> asyncpg.Pool:
    await create_effect_tables(pool)
    return pool


async def effect_counts(pool: asyncpg.Pool) -> tuple[int, int]:
    row = await pool.fetchrow("SELECT count(*) AS n, count(DISTINCT (provider, event_id)) AS d FROM test_effects")
    return row["n"], row["d"]


@pytest.mark.asyncio(loop_scope="session")
async def test_backoff_stays_in_its_window() -> None:
    policy = RetryPolicy(max_attempts=10, initial_delay=2, max_delay=60)
    rng = random.Random(7)
    for attempt in range(1, 12):
        cap = min(60, 2 * 2 ** (attempt - 1))
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(2 <= d <= cap for d in delays)
        if cap > 2:
            assert max(delays) - min(delays) > (cap - 2) / 2  # jittered across the window, not constant
    assert policy.next_delay(1, retry_after=30, rng=rng) == 30
    assert policy.next_delay(1, retry_after=999, rng=rng) == 999  # the server knows better than max_delay
    assert policy.next_delay(1, retry_after=10**9, rng=rng) == 86400  # but never more than a day


async def test_four_workers_5000_events_each_handled_exactly_once(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "bulk", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    ids = await insert_events(effects, "bulk", 5000)
    workers = [worker(database_url, log_dir, "--concurrency", "8") for _ in range(4)]
    try:
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=120)
    finally:
        for w in workers:
            assert w.stop() == 0
    assert await effect_counts(effects) == (5000, 5000)
    assert await effects.fetchval("SELECT count(*) FROM test_calls") == 5000
    assert await effects.fetchval("SELECT count(DISTINCT pid) FROM test_calls") >= 2
    assert await status_counts(effects) == {"done": 5000}
    assert set(ids) == {r["event_id"] for r in await effects.fetch("SELECT event_id FROM test_effects")}


async def test_sigkill_chaos_with_duplicates_loses_nothing_and_duplicates_nothing(database_url, effects,
                                                                                  log_dir) -> None:
    apply_provider(database_url, "chaos", f"""
signature: {{scheme: standard-webhooks, secrets: ["{senders.SW_SECRET}"]}}
handler: "support.handlers:record_effect"
leaseSeconds: 2
retry: {{maxAttempts: 50, initialDelaySeconds: 0.05, maxDelaySeconds: 0.5}}
""")
    rng = random.Random(42)
    unique = [f"msg_{i:05d}_{rng.getrandbits(32):08x}" for i in range(5000)]
    deliveries = unique + rng.sample(unique, 1500)  # 30% delivered twice
    rng.shuffle(deliveries)
    recv = receiver(database_url, log_dir)
    workers = [worker(database_url, log_dir, "--concurrency", "8", "--sweep") for _ in range(3)]
    stop_chaos = asyncio.Event()

    async def chaos() -> int:
        kills = 0
        while not stop_chaos.is_set():
            await asyncio.sleep(rng.uniform(0.3, 0.8))
            i = rng.randrange(len(workers))
            workers[i].kill()
            kills += 1
            workers[i] = worker(database_url, log_dir, "--concurrency", "8", "--sweep")
        return kills

    async def send_all() -> None:
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as http:
            async def send(msg_id: str) -> None:
                body = f'{{"type": "order.paid", "id": "{msg_id}"}}'.encode()
                async with sem:
                    for _ in range(20):  # a sender retries until it gets a 2xx
                        async with http.post(f"{recv.url}/webhooks/chaos", data=body,
                                             headers=senders.standard_webhooks(body, msg_id)) as r:
                            if r.status == 200:
                                return
                        await asyncio.sleep(0.1)
                    raise AssertionError(f"{msg_id} never accepted")
            await asyncio.gather(*(send(m) for m in deliveries))

    chaos_task = asyncio.create_task(chaos())
    try:
        await send_all()
        await eventually(lambda: effects.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"),
                         equals=5000, timeout=240)
    finally:
        stop_chaos.set()
        kills = await chaos_task
        for w in workers:
            w.stop()
        recv.stop()
    assert kills >= 3
    assert await effect_counts(effects) == (5000, 5000)
    assert await status_counts(effects) == {"done": 5000}
    stored = {r["event_id"] for r in await effects.fetch("SELECT event_id FROM test_effects")}
    assert stored == set(unique)


async def test_a_handler_that_kills_its_worker_ends_dead_by_lease_expiry(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "killer", """
signature: {scheme: none}
handler: "support.handlers:kill_my_worker"
leaseSeconds: 1
retry: {maxAttempts: 3, initialDelaySeconds: 0, maxDelaySeconds: 0}
""")
    await insert_events(effects, "killer", 1)

    async def dead() -> bool:
        return bool(await effects.fetchval("SELECT status FROM hookline.inbox") == "dead")

    async def killed_or_dead(w: ServiceProcess) -> bool:
        assert w.proc is not None
        return w.proc.poll() is not None or await dead()

    # Like a supervisor (k8s): a new worker each time the handler killed the last one. One worker
    # per attempt, and one more whose sweeper finds the last lease expired and buries the event.
    for _ in range(3 + 1):
        if await dead():
            break
        # Not waiting for /healthz: the handler may kill the process before it answers.
        w = ServiceProcess(["worker", "--port", "0", "--sweep"], database_url, log_dir).start(wait_path=None)
        await eventually(lambda w=w: killed_or_dead(w), what="the handler killing its worker, or the event dead")
        w.stop()
    assert await dead(), await effects.fetchrow("SELECT * FROM hookline.inbox")
    row = await effects.fetchrow("SELECT attempts, last_error FROM hookline.inbox")
    assert row["attempts"] == 3
    assert "lease expired" in row["last_error"]
    assert await effects.fetchval("SELECT count(*) FROM test_calls") == 3


async def test_retries_follow_the_policy_then_succeed(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "flaky", """
signature: {scheme: none}
handler: "support.handlers:fail_until_third"
retry: {maxAttempts: 5, initialDelaySeconds: 0.3, maxDelaySeconds: 0.5}
""")
    await insert_events(effects, "flaky", 1)
    w = worker(database_url, log_dir, "--poll-interval", "0.05")
    try:
        await eventually(lambda: effects.fetchval("SELECT status FROM hookline.inbox"), equals="done", timeout=30)
    finally:
        w.stop()
    calls = [r["at"] for r in await effects.fetch("SELECT at FROM test_calls ORDER BY at")]
    assert len(calls) == 3
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.3  # attempt 1 waits initial; attempt 2 waits in [0.3, 0.5]
    assert all(g < 3 for g in gaps)
    assert await effect_counts(effects) == (1, 1)
    # Each failed attempt said so in the log, at once: which event, which attempt of how many, when next, why.
    retried = [line for line in w.logs().splitlines() if "attempt failed; will retry" in line]
    assert len(retried) == 2, w.logs()
    for n, line in enumerate(retried, start=1):
        assert f'attempt="{n} of 5"' in line, line
        assert "provider=flaky" in line and f"failing attempt {n} on purpose" in line, line


async def test_poison_events_go_dead_without_stalling_the_rest(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "poison", """
signature: {scheme: none}
handler: "support.handlers:always_fail"
retry: {maxAttempts: 2, initialDelaySeconds: 0, maxDelaySeconds: 0}
""")
    apply_provider(database_url, "good", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    await insert_events(effects, "poison", 20)
    await insert_events(effects, "good", 200)
    w = worker(database_url, log_dir, "--poll-interval", "0.05")
    try:
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=60)
    finally:
        w.stop()
    assert await effect_counts(effects) == (200, 200)
    dead = await effects.fetch("SELECT attempts, last_error FROM hookline.inbox WHERE status = 'dead'")
    assert len(dead) == 20
    assert all(r["attempts"] == 2 and "KeyError" in r["last_error"] for r in dead)


ORDERING = """
signature: {scheme: none}
handler: "support.handlers:record_effect"
eventType: {jsonPointer: /type}
ordering:
  entityKey: {jsonPointer: /data/object/id}
  maxDeferralSeconds: 3
  transitions:
    - {on: payment_intent.created, from: [null], to: created}
    - {on: payment_intent.succeeded, from: [created], to: succeeded}
    - {on: payment_intent.refunded, from: [succeeded], to: refunded}
"""


async def _send_open(http: aiohttp.ClientSession, url: str, provider: str, event_id: str, event_type: str,
                     entity: str) -> None:
    body = f'{{"id": "{event_id}", "type": "{event_type}", "data": {{"object": {{"id": "{entity}"}}}}}}'
    async with http.post(f"{url}/webhooks/{provider}", data=body) as r:
        assert r.status == 200, await r.text()


async def test_out_of_order_event_is_deferred_then_applied_right_after_its_predecessor(
        database_url, effects, log_dir) -> None:
    apply_provider(database_url, "pay", ORDERING)
    recv = receiver(database_url, log_dir)
    w = worker(database_url, log_dir, "--poll-interval", "5")
    try:
        async with aiohttp.ClientSession() as http:
            await _send_open(http, recv.url, "pay", "e2", "payment_intent.succeeded", "pi_1")
            await _send_open(http, recv.url, "pay", "x1", "payment_intent.created", "pi_other")
            await eventually(lambda: effects.fetchval(
                "SELECT deferred_since IS NOT NULL FROM hookline.inbox WHERE event_id = 'e2'"), timeout=10)
            row = await effects.fetchrow("SELECT status, attempts, last_error FROM hookline.inbox "
                                         "WHERE event_id = 'e2'")
            assert (row["status"], row["attempts"]) == ("pending", 0)  # deferral is not a failed attempt
            assert "precondition_not_met" in row["last_error"]
            # Another entity is never blocked by pi_1's wait.
            await eventually(lambda: effects.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'x1'"),
                             equals="done", timeout=10)
            sent_created = time.monotonic()
            await _send_open(http, recv.url, "pay", "e1", "payment_intent.created", "pi_1")
            await eventually(lambda: effects.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"),
                             equals=3, timeout=10)
            # Released at once, not at the next deferral check or poll (both >= 3 s away).
            assert time.monotonic() - sent_created < 2.5
    finally:
        w.stop()
        recv.stop()
    order = [r["event_id"] for r in await effects.fetch("SELECT event_id FROM test_effects ORDER BY at")
             if r["event_id"] != "x1"]
    assert order == ["e1", "e2"]
    assert await effects.fetchval("SELECT state FROM hookline.entity_states WHERE entity_key = 'pi_1'") == "succeeded"


async def test_a_transition_that_never_becomes_valid_dies_after_max_deferral(database_url, effects,
                                                                              log_dir) -> None:
    apply_provider(database_url, "pay", ORDERING)
    recv = receiver(database_url, log_dir)
    w = worker(database_url, log_dir, "--poll-interval", "0.2")
    try:
        async with aiohttp.ClientSession() as http:
            await _send_open(http, recv.url, "pay", "r1", "payment_intent.refunded", "pi_9")
            await eventually(lambda: effects.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'r1'"),
                             equals="dead", timeout=15)
            # A dead event does not block the entity's later events.
            await _send_open(http, recv.url, "pay", "c1", "payment_intent.created", "pi_9")
            await eventually(lambda: effects.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'c1'"),
                             equals="done", timeout=10)
    finally:
        w.stop()
        recv.stop()
    row = await effects.fetchrow("SELECT attempts, last_error FROM hookline.inbox WHERE event_id = 'r1'")
    assert row["last_error"].startswith("precondition_not_met")
    assert row["attempts"] <= 1  # deferral checks did not pile up attempts; only the burying claim shows
    assert await effects.fetchval("SELECT count(*) FROM test_effects WHERE event_id = 'r1'") == 0


async def test_destination_outcomes_follow_the_rules(database_url, effects, log_dir) -> None:
    plans = {"ok": [200], "flaky": [500, "timeout", 429, 200], "bad": [400]}
    seen: dict[str, list[float]] = {k: [] for k in plans}
    verified: list[str] = []
    secret_box: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        # The internal service verifies Hookline's call with the Standard Webhooks library.
        standardwebhooks.Webhook(secret_box[0]).verify(body, dict(request.headers))
        verified.append(request.headers["Idempotency-Key"])
        event_id = request.headers["Hookline-Event-Id"]
        assert request.headers["Hookline-Provider"] == "dest"
        seen[event_id].append(time.monotonic())
        step = plans[event_id][min(len(seen[event_id]), len(plans[event_id])) - 1]
        if step == "timeout":
            await asyncio.sleep(2)
            return web.Response(status=200)
        if step == 429:
            return web.Response(status=429, headers={"Retry-After": "1"})
        return web.Response(status=int(step), text="nope" if step == 400 else "")

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    from hookline.core.embedded import free_port

    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    apply_provider(database_url, "dest", f"""
signature: {{scheme: none}}
destination: {{url: "http://127.0.0.1:{port}/hook", timeoutSeconds: 0.5}}
retry: {{maxAttempts: 6, initialDelaySeconds: 0.1, maxDelaySeconds: 0.2}}
""")
    stored = await effects.fetchval("SELECT destination_secret FROM hookline.providers WHERE name = 'dest'")
    secret_box.append(stored_destination_secret(configured_ring(), "dest", stored))  # sealed at rest
    for event_id in plans:
        await effects.execute("INSERT INTO hookline.inbox (provider, event_id, body) VALUES ('dest', $1, $2)",
                              event_id, b'{"hello": "world"}')
    w = worker(database_url, log_dir, "--poll-interval", "0.05")
    try:
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=30)
    finally:
        w.stop()
        await runner.cleanup()
    rows = {r["event_id"]: r for r in await effects.fetch("SELECT * FROM hookline.inbox")}
    assert (rows["ok"]["status"], rows["ok"]["attempts"]) == ("done", 1)
    assert (rows["flaky"]["status"], rows["flaky"]["attempts"]) == ("done", 4)
    assert (rows["bad"]["status"], rows["bad"]["attempts"]) == ("dead", 1)  # 4xx: permanent, no retry
    assert "HTTP 400: nope" in rows["bad"]["last_error"]
    flaky = seen["flaky"]
    assert flaky[3] - flaky[2] >= 0.95  # Retry-After: 1 honoured although maxDelaySeconds is 0.2
    assert set(verified) == {"dest:ok", "dest:flaky", "dest:bad"}


async def test_sigterm_finishes_in_flight_work_and_leaves_nothing_processing(database_url, effects,
                                                                              log_dir) -> None:
    apply_provider(database_url, "slow", """
signature: {scheme: none}
handler: "support.handlers:record_effect_slowly"
""")
    await insert_events(effects, "slow", 60)
    w = worker(database_url, log_dir, "--concurrency", "10", env={"TEST_HANDLER_SLEEP": "0.5"})
    await eventually(lambda: effects.fetchval("SELECT count(*) > 0 FROM test_effects"), equals=True, timeout=30)
    w.signal(signal.SIGTERM)
    assert w.proc is not None
    assert await asyncio.to_thread(w.proc.wait, 30) == 0
    counts = await status_counts(effects)
    assert "processing" not in counts
    assert counts["done"] == (await effect_counts(effects))[0]
    w2 = worker(database_url, log_dir, "--concurrency", "10", env={"TEST_HANDLER_SLEEP": "0"})
    try:
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=30)
    finally:
        w2.stop()
    assert await effect_counts(effects) == (60, 60)


async def test_grace_period_expiry_gives_leases_back(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "stuck", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect_slowly"')
    await insert_events(effects, "stuck", 5)
    w = worker(database_url, log_dir, "--grace-period", "0.5", env={"TEST_HANDLER_SLEEP": "30"})
    await eventually(lambda: effects.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'processing'"),
                     equals=5, timeout=30)
    w.signal(signal.SIGTERM)
    assert w.proc is not None
    assert await asyncio.to_thread(w.proc.wait, 30) == 0
    rows = await effects.fetch("SELECT status, attempts FROM hookline.inbox")
    assert {(r["status"], r["attempts"]) for r in rows} == {("pending", 0)}
    assert await effect_counts(effects) == (0, 0)


async def test_heartbeat_keeps_a_long_handler_its_lease(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "long", """
signature: {scheme: none}
handler: "support.handlers:external_effect"
leaseSeconds: 2
""")
    gate = log_dir / "gate"
    gate.write_text("hold")
    await insert_events(effects, "long", 1)
    w = worker(database_url, log_dir, "--sweep", env={"TEST_GATE": str(gate)})
    w2 = worker(database_url, log_dir, "--sweep")
    try:
        await eventually(lambda: effects.fetchval("SELECT count(*) FROM test_calls"), equals=1, timeout=10)
        first_expiry = await effects.fetchval("SELECT lease_expires_at FROM hookline.inbox")
        # Extended until 2.5 lease lengths past the first expiry: without heartbeats the sweepers
        # (both workers run one) would have taken it back long before.
        await eventually(lambda: effects.fetchval(
            "SELECT lease_expires_at > $1::timestamptz + make_interval(secs => 5) FROM hookline.inbox", first_expiry),
            timeout=20)
        row = await effects.fetchrow("SELECT status, attempts FROM hookline.inbox")
        assert (row["status"], row["attempts"]) == ("processing", 1)
        gate.unlink()
        await eventually(lambda: effects.fetchval("SELECT status FROM hookline.inbox"), equals="done", timeout=10)
    finally:
        w.stop()
        w2.stop()
    assert await effects.fetchval("SELECT count(*) FROM test_calls") == 1


async def test_heartbeat_keeps_leases_while_every_slot_holds_a_transaction(database_url, effects, log_dir) -> None:
    """Every handler slot holds a pooled connection in an open transaction for longer than the lease:
    the heartbeat must still get a connection of its own (pools.WORKER_EXTRA), or the leases lapse and
    the events are taken back and run again."""
    apply_provider(database_url, "busy", """
signature: {scheme: none}
handler: "support.handlers:record_effect_slowly"
leaseSeconds: 2
""")
    apply_provider(database_url, "idle", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    slots, events = 3, 6
    await insert_events(effects, "busy", events)
    # The sweeper runs in a worker of its own (one for another provider), so that it never waits for
    # the busy worker's pool: it would take back any lease that lapsed.
    sweeper = worker(database_url, log_dir, "--sweep", "--provider", "idle")
    busy = worker(database_url, log_dir, "--concurrency", str(slots), "--provider", "busy",
                  env={"TEST_HANDLER_SLEEP": "5"})
    try:
        in_transaction = ("SELECT count(*) >= $1 FROM pg_stat_activity WHERE datname = current_database() "
                          "AND state = 'idle in transaction'")
        await eventually(lambda: effects.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'processing'"),
                         equals=slots, timeout=15)
        await eventually(lambda: effects.fetchval(in_transaction, slots), equals=True, timeout=10)
        first_expiry = await effects.fetchval("SELECT max(lease_expires_at) FROM hookline.inbox "
                                              "WHERE status = 'processing'")
        # Two lease lengths past the first expiry, every slot still in its transaction: extended, not lapsed.
        await eventually(lambda: effects.fetchval(
            "SELECT min(lease_expires_at) > $1::timestamptz + make_interval(secs => 2) "
            "FROM hookline.inbox WHERE status = 'processing'", first_expiry), timeout=10)
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=60)
    finally:
        busy.stop()
        sweeper.stop()
    rows = await effects.fetch("SELECT status, attempts, suspect FROM hookline.inbox")
    assert {(r["status"], r["attempts"], r["suspect"]) for r in rows} == {("done", 1, False)}
    assert await effects.fetchval("SELECT count(*) FROM test_calls") == events
    assert await effect_counts(effects) == (events, events)


async def test_a_worker_that_lost_its_lease_does_not_commit(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "lost", 'signature: {scheme: none}\nhandler: "support.handlers:external_effect"')
    gate = log_dir / "gate"
    gate.write_text("hold")
    await insert_events(effects, "lost", 1)
    w = worker(database_url, log_dir, env={"TEST_GATE": str(gate)})
    try:
        await eventually(lambda: effects.fetchval("SELECT count(*) FROM test_calls"), equals=1, timeout=10)
        # Another worker took the event over (as after a sweep and a new claim).
        await effects.execute("UPDATE hookline.inbox SET locked_by = 'another-worker', attempts = attempts + 1")
        gate.unlink()
        # The worker counts each outcome once it has tried to book it: then the row shows what it did.
        text = await _metrics_once(w.url, 'hookline_worker_events_total{provider="lost",')
    finally:
        w.stop()
    row = await effects.fetchrow("SELECT status, locked_by FROM hookline.inbox")
    assert (row["status"], row["locked_by"]) == ("processing", "another-worker")
    assert 'hookline_worker_events_total{provider="lost",result="lost"} 1.0' in text


async def test_worker_metrics(database_url, effects, log_dir) -> None:
    apply_provider(database_url, "m", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    await insert_events(effects, "m", 10)
    w: ServiceProcess = worker(database_url, log_dir)
    try:
        await eventually(lambda: effects.fetchval(ALL_DONE), equals=0, timeout=30)
        text = await _metrics_once(w.url, 'hookline_inbox_backlog{provider="m"} 0.0')  # a stats refresh since
    finally:
        w.stop()
    assert 'hookline_worker_events_total{provider="m",result="done"} 10.0' in text
    assert 'hookline_inbox_backlog{provider="m"} 0.0' in text
    assert 'hookline_inbox_dead{provider="m"} 0.0' in text
    assert "hookline_worker_handler_seconds_bucket" in text


async def _metrics_once(url: str, line: str) -> str:
    """The /metrics text, as soon as it contains ``line``."""
    async with aiohttp.ClientSession() as http:
        async def text_with_line() -> str | None:
            async with http.get(f"{url}/metrics") as r:
                text = await r.text()
            return text if line in text else None

        return await eventually(text_with_line, what=f"{line!r} in {url}/metrics", timeout=30)
