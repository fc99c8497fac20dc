"""The shared consumer loop (core/consumer.py) and the queue's suspect statements, in-process on a real Postgres.

A small consumer over the inbox runs tasks that wait for the test, so the test
decides when each effect is done and when its completion is written. The last
test runs the relay, the other consumer, on suspects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hookline import outbox
from hookline.core.consumer import LeasedConsumer
from hookline.core.dedicated import DedicatedConnection
from hookline.core.host import Host
from hookline.core.listener import Listener
from hookline.core.maintenance import sweep_once
from hookline.core.queue import INBOX, RetryPolicy
from hookline.core.settings import RelaySettings, Settings
from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from hookline.relay.service import Relay
from support.endpoints import Answer, Received, TestEndpoint
from support.inbox import insert_events
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE = 1.0
IMMEDIATE = RetryPolicy(max_attempts=10, initial_delay=0, max_delay=0)


class GatedConsumer(LeasedConsumer):
    """Claims inbox rows of provider "p"; each task waits for ``effect[id]`` (then gives back its
    slot, as the worker does once an effect is done) and for ``booked[id]`` before completing."""

    def __init__(self, pool: asyncpg.Pool, listener: Listener, concurrency: int, poll_interval: float = 0.05,
                 channels: tuple[str, ...] = ()) -> None:
        super().__init__(pool, INBOX, worker_id="gated", channels=channels, concurrency=concurrency,
                         poll_interval=poll_interval, grace_period=1.0, completion_overlap=concurrency,
                         listener=listener)
        self.effect: dict[int, asyncio.Event] = {}
        self.booked: dict[int, asyncio.Event] = {}
        self.log: list[tuple[str, int, bool]] = []  # ("start" | "end", id, suspect)

    def suspect_partitions(self) -> dict[str, float]:
        return {"p": LEASE}

    def shortest_lease(self) -> float:
        return LEASE

    async def start_suspect(self, row: asyncpg.Record) -> None:
        self._start(row)

    async def claim_round(self) -> int:
        rows = await INBOX.claim(self.pool, "p", self.free_slots, self.worker_id, LEASE)
        for row in rows:
            self._start(row)
        return len(rows)

    def _start(self, row: asyncpg.Record) -> None:
        self.effect[row["id"]] = asyncio.Event()
        self.booked[row["id"]] = asyncio.Event()
        self.spawn(row["id"], self._work(row), LEASE, "p")

    async def _work(self, row: asyncpg.Record) -> None:
        id = row["id"]
        self.log.append(("start", id, row["suspect"]))
        await self.effect[id].wait()
        self.effect_done(id)
        await self.booked[id].wait()
        await INBOX.complete(self.pool, [(id, row["attempts"])], self.worker_id)
        self.log.append(("end", id, row["suspect"]))

    def finish(self, id: int) -> None:
        self.effect[id].set()
        self.booked[id].set()


@pytest.fixture
async def consumers(database_url: str, pool: asyncpg.Pool) -> AsyncIterator[Callable[..., GatedConsumer]]:
    started: list[GatedConsumer] = []
    listener = Listener(DedicatedConnection(database_url))
    await listener.start()

    def start(concurrency: int, poll_interval: float = 0.05, channels: tuple[str, ...] = ()) -> GatedConsumer:
        consumer = GatedConsumer(pool, listener, concurrency, poll_interval, channels)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        for id in consumer.effect:
            consumer.finish(id)
        await consumer.stop_loops()
    await listener.stop()


async def ids_of(pool: asyncpg.Pool, event_ids: list[str]) -> list[int]:
    return [r["id"] for r in await pool.fetch("SELECT id FROM hookline.inbox WHERE event_id = ANY($1) ORDER BY id",
                                              event_ids)]


async def test_an_effect_done_keeps_its_lease_until_its_completion_is_written(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    [event] = await insert_events(pool, "p", 1)
    consumer = consumers(2)
    await consumer.start_loops()
    await eventually(lambda: len(consumer.effect) == 1)
    [id] = consumer.effect
    first_expiry = await pool.fetchval("SELECT lease_expires_at FROM hookline.inbox WHERE id = $1", id)
    consumer.effect[id].set()  # the effect is done; the completion is not written yet
    await eventually(lambda: id in consumer.completing)
    assert consumer.free_slots == 2  # the slot is free for the next claim ...
    sweeper = asyncio.create_task(_sweep_forever(pool))
    try:
        # ... but the lease is extended past three of its lengths, with the sweeper running all along.
        await eventually(lambda: pool.fetchval("SELECT lease_expires_at > $2::timestamptz + make_interval(secs => 3) "
                             "FROM hookline.inbox WHERE id = $1", id, first_expiry), equals=True, timeout=15)
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
    row = await pool.fetchrow("SELECT status, attempts, locked_by FROM hookline.inbox WHERE id = $1", id)
    assert (row["status"], row["attempts"], row["locked_by"]) == ("processing", 1, "gated")
    consumer.booked[id].set()
    await eventually(lambda: pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = $1", event),
                     equals="done")
    await eventually(lambda: not consumer.busy)


async def test_shutdown_hands_back_unstarted_work_but_never_an_effect_done(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    await insert_events(pool, "p", 2)
    consumer = consumers(2)
    await consumer.start_loops()
    await eventually(lambda: len(consumer.effect) == 2)
    done_id, working_id = sorted(consumer.effect)
    consumer.effect[done_id].set()  # its effect happened; its completion never gets written
    await eventually(lambda: done_id in consumer.completing)
    await consumer.stop_loops()  # grace period 1 s, then both tasks are cancelled
    rows = {r["id"]: r for r in await pool.fetch("SELECT id, status, attempts, locked_by FROM hookline.inbox")}
    # Work that had not happened goes back at once, its attempt not counted ...
    assert (rows[working_id]["status"], rows[working_id]["attempts"]) == ("pending", 0)
    # ... an effect that happened keeps its lease until it expires (handing it back would repeat it now).
    assert (rows[done_id]["status"], rows[done_id]["attempts"], rows[done_id]["locked_by"]) == (
        "processing", 1, "gated")


async def _sweep_forever(pool: asyncpg.Pool) -> None:
    while True:
        await sweep_once(pool, {"p": IMMEDIATE})
        await asyncio.sleep(0.1)


async def test_a_suspect_waits_for_in_flight_work_then_runs_alone(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    before = await ids_of(pool, await insert_events(pool, "p", 3))
    consumer = consumers(3)
    consumer.suspect_check_interval = 0  # look for suspects on every claim round
    await consumer.start_loops()
    await eventually(lambda: len(consumer.effect) == 3)
    # A suspect arrives (as if swept after a crash elsewhere), with new work behind it.
    [suspect] = await ids_of(pool, await insert_events(pool, "p", 1))
    await pool.execute("UPDATE hookline.inbox SET suspect = true WHERE id = $1", suspect)
    after = await ids_of(pool, await insert_events(pool, "p", 3))
    claimed_before = _suspects_claimed()
    for id in before:  # a slot frees; the consumer drains instead of filling it
        consumer.finish(id)
        await eventually(lambda id=id: pool.fetchval("SELECT status FROM hookline.inbox WHERE id = $1", id),
                         equals="done")
    await eventually(lambda: suspect in consumer.effect)
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'processing'") == 1
    consumer.finish(suspect)
    # The rows behind it are claimed once it has ended (waited for by their tasks, not by a count of
    # processing rows, which once read 3 under load while one of them was not claimed yet).
    await eventually(lambda: all(id in consumer.effect for id in after))
    for id in after:
        consumer.finish(id)
    await eventually(lambda: pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"), equals=7)
    starts = [id for kind, id, _ in consumer.log if kind == "start"]
    suspect_start = consumer.log.index(("start", suspect, True))
    suspect_end = consumer.log.index(("end", suspect, True))
    # Everything claimed before it had ended when it started; nothing started while it ran.
    assert all(consumer.log.index(("end", id, False)) < suspect_start for id in before)
    assert all(consumer.log.index(("start", id, False)) > suspect_end for id in after)
    assert sorted(starts) == sorted([*before, suspect, *after])
    assert await pool.fetchval("SELECT suspect FROM hookline.inbox WHERE id = $1", suspect) is False
    assert _suspects_claimed() == claimed_before + 1


NEVER_POLLS = 600.0  # longer than any test: only a wake-up or the next due row can start a claim


async def test_an_idle_consumer_wakes_when_the_next_row_comes_due(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    # A retry's backoff (or a deferral) runs out with nobody notifying: the consumer must not sleep
    # through its poll interval, but only until that row is due.
    [event] = await insert_events(pool, "p", 1)
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() + interval '2 seconds'")
    consumer = consumers(1, NEVER_POLLS)
    await consumer.start_loops()
    await eventually(lambda: len(consumer.effect) == 1, timeout=30)
    [id] = consumer.effect
    assert await pool.fetchval("SELECT next_attempt_at <= now() FROM hookline.inbox WHERE id = $1", id)
    consumer.finish(id)
    await eventually(lambda: pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = $1", event),
                     equals="done")


async def test_an_idle_consumer_runs_a_swept_suspect_once_it_is_due(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    # After a failover (or a crash) the sweep hands back leases into backoff as suspects: it wakes
    # the consumers, which sleep until the first is due and then look for a suspect at once, not a
    # suspect check interval (here: the poll interval) later.
    [event] = await insert_events(pool, "p", 1)
    [claimed] = await INBOX.claim(pool, "p", 1, "crashed-worker", 0.0)
    consumer = consumers(1, NEVER_POLLS, (INBOX.channel,))
    await consumer.start_loops()
    await asyncio.sleep(0.5)  # its first round found nothing to claim: now it is idle
    assert not consumer.effect
    swept = await sweep_once(pool, {"p": RetryPolicy(max_attempts=10, initial_delay=1, max_delay=1)})
    assert swept.requeued == {"p": 1}
    await eventually(lambda: claimed["id"] in consumer.effect, timeout=30)
    assert ("start", claimed["id"], True) in consumer.log  # claimed as a suspect, alone
    consumer.finish(claimed["id"])
    await eventually(lambda: pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = $1", event),
                     equals="done")


async def test_an_idle_consumer_looks_past_its_claim_floor(
        pool: asyncpg.Pool, consumers: Callable[..., GatedConsumer]) -> None:
    # A row whose transaction began long before it committed sorts behind the claim floor (core/queue.py
    # ClaimFloors): only a claim without the floor finds it, and an idle consumer must make one.
    await insert_events(pool, "p", 1)
    consumer = consumers(1, NEVER_POLLS)
    await consumer.start_loops()
    await eventually(lambda: len(consumer.effect) == 1)
    [late] = await insert_events(pool, "p", 1)
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() - interval '10 seconds' "
                       "WHERE event_id = $1", late)
    [first_id] = consumer.effect
    consumer.finish(first_id)
    [late_id] = await ids_of(pool, [late])
    await eventually(lambda: late_id in consumer.effect, timeout=30)
    consumer.finish(late_id)
    await eventually(lambda: pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"), equals=2)


async def test_next_due_reads_only_future_rows_of_the_partitions_asked(pool: asyncpg.Pool) -> None:
    assert await INBOX.next_due(pool, ["p"]) is None and await INBOX.next_due(pool, []) is None
    await insert_events(pool, "p", 2)
    await insert_events(pool, "other", 1)
    assert await INBOX.next_due(pool, ["p"]) is None  # due already: the claim takes them, no timer
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() + interval '30 seconds' "
                       "WHERE provider = 'p'")
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() + interval '5 seconds' "
                       "WHERE provider = 'other'")
    due = await INBOX.next_due(pool, ["p"])
    assert due is not None and 25 < due <= 30
    both = await INBOX.next_due(pool, ["p", "other"])
    assert both is not None and 0 < both <= 5


def _suspects_claimed() -> float:
    return REGISTRY.get_sample_value("hookline_suspects_claimed_total", {"queue": "hookline.inbox",
                                                                        "partition": "p"}) or 0.0


def _crashes() -> float:
    return REGISTRY.get_sample_value("hookline_consumer_crashes_total", {"queue": "hookline.inbox",
                                                                        "partition": "p"}) or 0.0


async def test_the_sweep_makes_suspects_that_only_claim_suspect_hands_out(pool: asyncpg.Pool) -> None:
    await insert_events(pool, "p", 20)
    claimed = await INBOX.claim(pool, "p", 20, "crashed-worker", 0.0)
    assert len(claimed) == 20
    # Later attempts have a wide backoff window: each row gets its own point in it.
    await pool.execute("UPDATE hookline.inbox SET attempts = 5")
    crashes_before = _crashes()
    swept = await sweep_once(pool, {"p": RetryPolicy(max_attempts=10, initial_delay=0.01, max_delay=0.2)})
    assert swept.requeued == {"p": 20} and swept.crashed == {"p": 1}
    assert _crashes() == crashes_before + 1  # one consumer lost, however many leases it held
    rows = await pool.fetch("SELECT status, suspect, next_attempt_at FROM hookline.inbox")
    assert {(r["status"], r["suspect"]) for r in rows} == {("pending", True)}
    assert len({r["next_attempt_at"] for r in rows}) > 10  # not due together again
    await eventually(lambda: pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE next_attempt_at <= now()"),
                     equals=20)
    assert await INBOX.claim(pool, "p", 20, "w", 30) == []  # normal claims skip suspects
    assert await INBOX.claim_suspect(pool, {"other": 30.0}, "w") is None  # only the partitions asked for
    assert await INBOX.suspects_due(pool, ["p"]) and not await INBOX.suspects_due(pool, ["other"])
    one = await INBOX.claim_suspect(pool, {"p": 30.0}, "w")
    assert one is not None and one["suspect"] and one["attempts"] == 6 and one["locked_by"] == "w"
    assert (await INBOX.stats(pool))["p"].suspects == 19
    assert await INBOX.complete(pool, [(one["id"], one["attempts"])], "w") == {one["id"]}
    assert await pool.fetchval("SELECT suspect FROM hookline.inbox WHERE id = $1", one["id"]) is False


async def test_the_relay_delivers_suspects_one_at_a_time(database_url: str, pool: asyncpg.Pool) -> None:
    running, most = 0, 0

    async def one_at_a_time(_n: int, _r: Received) -> Answer:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1
        return Answer(200)

    async with TestEndpoint(get_scheme("standard-webhooks").generate_secret(), one_at_a_time) as ep:
        async with pool.acquire() as conn:
            await endpoints.add(conn, "partner", ep.url, secret=ep.secret)
            async with conn.transaction():
                for i in range(5):
                    await outbox.publish(conn, "order.shipped", {"order": i})
        # As the sweep leaves them after a relay died with all five in flight.
        await pool.execute("UPDATE hookline.deliveries SET suspect = true, attempts = 1")
        claimed_before = REGISTRY.get_sample_value(
            "hookline_suspects_claimed_total", {"queue": "hookline.deliveries", "partition": "partner"}) or 0.0
        relay = Host(Settings(database_url, relay=RelaySettings(allow_private_networks=True, poll_interval=0.05,
                                                                concurrency=16)), [Relay])
        await relay.start()
        try:
            await eventually(lambda: pool.fetchval(
                "SELECT count(*) FROM hookline.deliveries WHERE status = 'done' AND NOT suspect"), equals=5, timeout=30)
        finally:
            await relay.stop()
    assert len(ep.effects) == 5 and most == 1
    assert REGISTRY.get_sample_value("hookline_suspects_claimed_total", {
        "queue": "hookline.deliveries", "partition": "partner"}) == claimed_before + 5
