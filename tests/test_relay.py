"""The relay against real HTTP endpoints on localhost and a real Postgres.

Endpoints verify every request with the standardwebhooks library (and svix's verifier):
see support/endpoints.py. Most tests run the relay in-process for speed and control;
the crash, shutdown and private-network tests run ``hookline relay`` as a real process.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hookline import outbox
from hookline.core.host import Host
from hookline.core.settings import RelaySettings, Settings
from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from hookline.relay.breaker import BreakerSettings
from hookline.relay.service import Relay
from support.endpoints import Answer, Received, TestEndpoint
from support.processes import relay as relay_process
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

StartRelay = Callable[..., Awaitable[Relay]]


def new_secret() -> str:
    return get_scheme("standard-webhooks").generate_secret()


@pytest.fixture
async def start_relay(database_url: str) -> AsyncIterator[StartRelay]:
    """A relay in this process, on a Host as `hookline relay` runs it (its own pool, LISTEN and lease connections)."""
    started: list[Host] = []

    async def start(**options: object) -> Relay:
        settings: dict[str, object] = {"allow_private_networks": True, "poll_interval": 0.1,
                                       "sweep_interval": 0.5, "concurrency": 16, "grace_period": 2.0}
        host = Host(Settings(database_url, relay=RelaySettings(**{**settings, **options})),  # type: ignore[arg-type]
                    [Relay])
        await host.start()
        started.append(host)
        return host.component(Relay)

    yield start
    for host in started:
        await host.stop()


async def register(pool: asyncpg.Pool, name: str, endpoint: TestEndpoint, **options: object) -> None:
    settings: dict[str, object] = {"initial_delay": 0.1, "max_delay": 0.5, "max_attempts": 10}
    async with pool.acquire() as conn:
        await endpoints.add(conn, name, endpoint.url, secret=endpoint.secret,
                            **{**settings, **options})  # type: ignore[arg-type]


async def publish(pool: asyncpg.Pool, event_type: str, payload: object, **kw: str | None) -> str:
    async with pool.acquire() as conn, conn.transaction():
        return await outbox.publish(conn, event_type, payload, **kw)


async def delivery(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT d.* FROM hookline.deliveries d JOIN hookline.outbox o ON o.id = d.outbox_id "
                              "WHERE o.event_id = $1", event_id)
    assert row is not None
    return row


async def test_commit_delivers_a_signed_envelope_and_rollback_nothing(pool: asyncpg.Pool,
                                                                      start_relay: StartRelay) -> None:
    async with TestEndpoint(new_secret()) as ep:
        await register(pool, "partner", ep)
        await start_relay()
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await outbox.publish(conn, "invoice.voided", {"id": "inv_0"})
            await tx.rollback()
        event_id = await publish(pool, "invoice.paid", {"id": "inv_1", "amount": 4200},
                                 aggregate_type="invoice", aggregate_id="inv_1")
        await eventually(lambda: ep.delivered())
        row = await eventually(lambda: _done(pool, event_id))  # booked: the relay sends it no more
        assert ep.invalid == []
        assert [r.webhook_id for r in ep.received] == [event_id]
        body = ep.received[0].body
        assert body["type"] == "invoice.paid" and body["data"] == {"id": "inv_1", "amount": 4200}
        assert body["timestamp"].endswith("Z") and "T" in body["timestamp"]
        assert row["attempts"] == 1 and row["last_status"] == 200 and row["last_latency_ms"] > 0


async def _done(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record | None:
    row = await delivery(pool, event_id)
    return row if row["status"] == "done" else None


async def test_secret_rotation_signs_with_both_secrets(pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    from datetime import timedelta

    async with TestEndpoint(new_secret()) as ep:
        await register(pool, "rotating", ep)
        await start_relay()
        async with pool.acquire() as conn:
            new = await endpoints.rotate_secret(conn, "rotating", timedelta(hours=1))
        assert new is not None and new != ep.secret
        await publish(pool, "t", {"n": 1})
        await eventually(lambda: len(ep.delivered()) == 1)  # verified with the old secret
        ep.secret = new
        await publish(pool, "t", {"n": 2})
        await eventually(lambda: len(ep.delivered()) == 2)  # and with the new one
        assert ep.invalid == []
        assert [len(r.headers["webhook-signature"].split()) for r in ep.received] == [2, 2]


async def test_retry_schedule_then_dead_then_replay(pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    healthy = False

    def behaviour(_n: int, _r: Received) -> Answer:
        return Answer(200 if healthy else 500)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "flaky", ep, max_attempts=4, initial_delay=0.3, max_delay=0.6)
        await start_relay()
        event_id = await publish(pool, "t", {})
        row = await eventually(lambda: _status(pool, event_id, "dead"), timeout=15)
        times = [r.at for r in ep.received]
        assert len(times) == 4 and all(r.webhook_id == event_id for r in ep.received)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # attempt n waits at least initialDelay (uniformly in [0.3, min(0.6, 0.3 * 2**(n-1))]); how much
        # later it actually goes depends on the machine, so only the lower bound is the relay's promise
        assert all(g >= 0.28 for g in gaps), gaps
        assert row["attempts"] == 4 and row["last_status"] == 500 and "HTTP 500" in row["last_error"]
        healthy = True
        async with pool.acquire() as conn:
            from hookline.relay.dlq import dlq_outbox

            assert await dlq_outbox(conn, "replay", endpoint="flaky") == ["endpoint/flaky: requeued 1 dead deliveries"]
        await eventually(lambda: _status(pool, event_id, "done"))
        assert len(ep.delivered()) == 1


async def _status(pool: asyncpg.Pool, event_id: str, status: str) -> asyncpg.Record | None:
    row = await delivery(pool, event_id)
    return row if row["status"] == status else None


async def test_retry_after_is_honoured(pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    def behaviour(n: int, _r: Received) -> Answer:
        return Answer(429, {"Retry-After": "2"}) if n == 1 else Answer(200)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "slow-down", ep, initial_delay=0.05, max_delay=10)
        await start_relay()
        event_id = await publish(pool, "t", {})
        await eventually(lambda: _status(pool, event_id, "done"), timeout=10)
        assert len(ep.received) == 2
        assert ep.received[1].at - ep.received[0].at >= 1.95


async def test_410_disables_the_endpoint_and_parks_until_enabled(pool: asyncpg.Pool,
                                                                 start_relay: StartRelay) -> None:
    gone = True

    def behaviour(_n: int, r: Received) -> Answer:
        if gone and r.body["data"]["n"] == 0:
            return Answer(500, delay=0.5)  # still in flight when the 410 disables the endpoint: parks when it fails
        return Answer(410 if gone else 200)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "gone", ep)
        await start_relay()
        ids = [await publish(pool, "t", {"n": n}) for n in range(3)]
        await eventually(lambda: pool.fetchval("SELECT NOT enabled FROM hookline.endpoints WHERE name = 'gone'"))
        await eventually(lambda: pool.fetchval(
              "SELECT count(*) = 3 FROM hookline.deliveries WHERE status = 'parked'"))
        ids.append(await publish(pool, "t", {"n": 3}))  # published while disabled: parked, not lost
        assert (await delivery(pool, ids[-1]))["status"] == "parked"
        row = await pool.fetchrow("SELECT disabled_reason FROM hookline.endpoints")
        assert "410" in row["disabled_reason"]
        requests = len(ep.received)
        await asyncio.sleep(0.5)
        assert len(ep.received) == requests  # nothing is sent to a disabled endpoint
        gone = False
        async with pool.acquire() as conn:
            assert await endpoints.enable(conn, "gone") == 4
        await eventually(lambda: len(ep.delivered()) == 4)
        assert {r.webhook_id for r in ep.delivered()} == set(ids)


async def test_a_paused_endpoint_gets_nothing_until_resumed_and_then_all_in_order(
        pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    async with TestEndpoint(new_secret()) as ep, TestEndpoint(new_secret()) as other:
        await register(pool, "paused", ep, ordered=True)
        await register(pool, "other", other)
        relay = await start_relay()
        async with pool.acquire() as conn:
            assert await endpoints.set_paused(conn, "paused", True)
            assert not await endpoints.set_paused(conn, "missing", True)
        # The pause reaches the relay with the endpoints' NOTIFY: a claim round already under way
        # when it commits may still claim (docs/outbox.md), so the events come once it has arrived.
        await eventually(lambda: getattr(relay.endpoint("paused"), "claimable", True) is False)
        ids = [await publish(pool, "t", {"n": n}, aggregate_type="a", aggregate_id="1") for n in range(5)]
        await eventually(lambda: len(other.delivered()) == 5)  # the relay is running, and busy elsewhere
        await asyncio.sleep(0.5)
        assert ep.received == []
        assert await pool.fetchval("SELECT count(*) FROM hookline.deliveries WHERE endpoint = 'paused' "
                                   "AND status = 'pending'") == 5  # waiting, not parked: nothing to enable
        async with pool.acquire() as conn:
            assert await endpoints.set_paused(conn, "paused", False)
        await eventually(lambda: len(ep.delivered()) == 5)
        assert [r.webhook_id for r in ep.delivered()] == ids


async def test_circuit_breaker_opens_sends_only_probes_and_closes(pool: asyncpg.Pool,
                                                                  start_relay: StartRelay) -> None:
    healthy = False

    def behaviour(_n: int, _r: Received) -> Answer:
        return Answer(200 if healthy else 503)

    def probes() -> float:  # this process's count of probes taken (the relay runs in-process here)
        return REGISTRY.get_sample_value("hookline_relay_circuit_transitions_total",
                                         {"endpoint": "breaker", "to": "half_open"}) or 0.0

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "breaker", ep, initial_delay=0.05, max_delay=0.1, max_attempts=1000)
        settings = BreakerSettings(min_volume=5, probe_interval=0.5, close_after=2)
        await start_relay(breaker=settings, concurrency=4)
        for n in range(20):
            await publish(pool, "t", {"n": n})
        await eventually(lambda: pool.fetchval("SELECT circuit_state = 'open' FROM hookline.endpoints"))
        await eventually(lambda: pool.fetchval(  # the deliveries in flight when it opened have finished
              "SELECT count(*) = 0 FROM hookline.deliveries WHERE status = 'processing'"))
        # Read order: a probe is counted when taken, before its request is sent.
        probes_before, requests_before = probes(), len(ep.received)
        await eventually(lambda: probes() >= probes_before + 3)  # closed, 20 retrying deliveries would be
        await eventually(lambda: pool.fetchval(  # ~200 requests a second
              "SELECT count(*) = 0 FROM hookline.deliveries WHERE status = 'processing'"))
        assert len(ep.received) - requests_before <= probes() - probes_before
        healthy = True
        await eventually(lambda: len(ep.delivered()) == 20, timeout=10)
        row = await pool.fetchrow("SELECT circuit_state, consecutive_failures FROM hookline.endpoints")
        assert row["circuit_state"] == "closed" and row["consecutive_failures"] == 0


async def test_ordered_endpoint_keeps_each_aggregates_order_with_a_flaky_endpoint(
        pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    rng = random.Random(4)
    done: set[tuple[str, int]] = set()
    violations: list[str] = []

    def behaviour(_n: int, r: Received) -> Answer:
        agg, seq = r.body["data"]["agg"], r.body["data"]["seq"]
        if seq > 0 and (agg, seq - 1) not in done:
            violations.append(f"{agg}#{seq} sent before {agg}#{seq - 1} was delivered")
        if rng.random() < 0.2:
            return Answer(500)
        done.add((agg, seq))
        return Answer(200, delay=rng.random() * 0.005)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "ordered", ep, ordered=True, initial_delay=0.01, max_delay=0.05, max_attempts=100)
        aggregates = [f"acct_{i}" for i in range(20)]
        next_seq = dict.fromkeys(aggregates, 0)
        async with pool.acquire() as conn:
            for _ in range(10):
                async with conn.transaction():
                    for _ in range(100):
                        agg = rng.choice(aggregates)
                        await outbox.publish(conn, "account.updated", {"agg": agg, "seq": next_seq[agg]},
                                             aggregate_type="account", aggregate_id=agg)
                        next_seq[agg] += 1
        await start_relay(concurrency=32)
        await eventually(lambda: len(ep.delivered()) == 1000, timeout=120)
        assert violations == []
        assert any(r.status == 500 for r in ep.received)  # the flakiness did happen
        for agg in aggregates:
            seqs = [r.body["data"]["seq"] for r in ep.delivered() if r.body["data"]["agg"] == agg]
            assert seqs == list(range(next_seq[agg])), agg


async def test_fan_out_to_three_endpoints_with_one_down(pool: asyncpg.Pool, start_relay: StartRelay) -> None:
    def hang(_n: int, _r: Received) -> Answer:
        return Answer(200, delay=5)

    async with TestEndpoint(new_secret()) as a, TestEndpoint(new_secret()) as b, \
            TestEndpoint(new_secret(), hang) as down:
        await register(pool, "a", a)
        await register(pool, "b", b)
        await register(pool, "down", down, timeout_seconds=1.0)
        await start_relay(concurrency=8)
        ids = [await publish(pool, "t", {"n": n}) for n in range(50)]
        await eventually(lambda: len(a.delivered()) == 50 and len(b.delivered()) == 50, timeout=30)
        # Not held up by the one that hangs until its timeout: a and b have everything while most
        # of down's deliveries have not even had a first attempt (at most 4 of its 1 s attempts run at once).
        assert await pool.fetchval(
            "SELECT count(*) FROM hookline.deliveries WHERE endpoint = 'down' AND attempts = 0") > 0
        assert {r.webhook_id for r in a.delivered()} == set(ids) == {r.webhook_id for r in b.delivered()}
        assert a.invalid == b.invalid == []
        rows = await pool.fetch("SELECT status, last_error FROM hookline.deliveries WHERE endpoint = 'down'")
        assert all(r["status"] != "done" for r in rows)
        await eventually(lambda: pool.fetchval(
              "SELECT count(*) > 0 FROM hookline.deliveries WHERE endpoint = 'down' AND last_error LIKE '%timed out%'"))


# --- the relay as a real process -----------------------------------------------------------


async def test_relay_killed_between_post_and_bookkeeping_delivers_again_with_the_same_id(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    def behaviour(n: int, _r: Received) -> Answer:
        # The first request is processed (the effect happens) but answered only after
        # the relay is dead: exactly the "POST done, bookkeeping not" crash.
        return Answer(200, delay=2.0) if n == 1 else Answer(200)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await register(pool, "partner", ep)
        first = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks",
                                        "--lease-seconds", "2")
        try:
            event_id = await publish(pool, "order.shipped", {"order": 1})
            await asyncio.wait_for(ep.first_request.wait(), 10)
            first.kill()  # SIGKILL while the request is in flight
        finally:
            first.stop()
        assert (await delivery(pool, event_id))["status"] == "processing"
        second = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks",
                                         "--lease-seconds", "2")
        try:
            row = await eventually(lambda: _status(pool, event_id, "done"), timeout=30)
        finally:
            assert second.stop() == 0, second.logs()
        assert [r.webhook_id for r in ep.received] == [event_id, event_id]  # at least once ...
        assert ep.effects == [event_id]  # ... and a receiver deduplicating on webhook-id applies it once
        assert row["attempts"] == 2 and ep.invalid == []


async def test_sigterm_lets_the_in_flight_delivery_finish(database_url: str, pool: asyncpg.Pool,
                                                          log_dir: Path) -> None:
    async with TestEndpoint(new_secret(), lambda n, r: Answer(200, delay=1.0)) as ep:
        await register(pool, "partner", ep)
        relay = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks")
        event_id = await publish(pool, "t", {})
        await asyncio.wait_for(ep.first_request.wait(), 10)
        relay.signal(signal.SIGTERM)
        assert relay.proc is not None
        # Wait without signalling again: a second SIGTERM during shutdown is not what this tests.
        assert await asyncio.to_thread(relay.proc.wait, 20) == 0, relay.logs()
        row = await delivery(pool, event_id)
        assert row["status"] == "done" and len(ep.received) == 1


async def test_private_addresses_are_refused_without_the_flag(database_url: str, pool: asyncpg.Pool,
                                                              log_dir: Path) -> None:
    async with TestEndpoint(new_secret()) as ep:
        await register(pool, "internal", ep)
        relay = await asyncio.to_thread(relay_process, database_url, log_dir,
                                        env={"HOOKLINE_ALLOW_PRIVATE_NETWORKS": "false"})
        try:
            event_id = await publish(pool, "t", {})
            row = await eventually(lambda: _with_error(pool, event_id))
            assert "127.0.0.1 is an internal address" in row["last_error"]
            assert "allow private networks" in row["last_error"]
            assert ep.received == []
            text = await asyncio.to_thread(_get, relay.url + "/metrics")
            assert 'hookline_relay_deliveries_total{endpoint="internal",result="blocked"}' in text
            assert "hookline_outbox_backlog" in text
        finally:
            relay.stop()
        allowed = await asyncio.to_thread(relay_process, database_url, log_dir,
                                          env={"HOOKLINE_ALLOW_PRIVATE_NETWORKS": "true"})
        try:
            await pool.execute("UPDATE hookline.deliveries SET next_attempt_at = now() WHERE status = 'pending'")
            await eventually(lambda: _status(pool, event_id, "done"), timeout=15)
        finally:
            allowed.stop()
        assert [r.webhook_id for r in ep.delivered()] == [event_id]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


async def _with_error(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record | None:
    row = await delivery(pool, event_id)
    return row if row["last_error"] else None


async def test_a_nat64_address_of_a_private_ipv4_is_refused(database_url: str, pool: asyncpg.Pool,
                                                            log_dir: Path) -> None:
    # 64:ff9b::7f00:1 is 127.0.0.1 behind a NAT64 gateway: as internal as 127.0.0.1 itself.
    async with pool.acquire() as conn:
        await endpoints.add(conn, "nat64", "http://[64:ff9b::7f00:1]:8080/hook")
    service = await asyncio.to_thread(relay_process, database_url, log_dir)
    try:
        event_id = await publish(pool, "t", {})
        row = await eventually(lambda: _with_error(pool, event_id))
        assert "64:ff9b::7f00:1 is an internal address" in row["last_error"], row["last_error"]
        text = await asyncio.to_thread(_get, service.url + "/metrics")
        assert 'hookline_relay_deliveries_total{endpoint="nat64",result="blocked"}' in text
    finally:
        assert service.stop() == 0, service.logs()
