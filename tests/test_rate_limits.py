"""Rate limits per endpoint that hold across relays (migration 0031): the token bucket and the
in-flight cap are taken in the claim's transaction, so three real relay processes together keep
to them; a 429 pauses and slows an endpoint, and is not held against its circuit.

The minute-long measurement prints what it measured (rate, peak concurrency, the unlimited
endpoint's rate beside it); its assertions are the issue's bounds, not tight timings."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from hookline.core.signatures import get_scheme
from hookline.relay import endpoints
from hookline.relay.endpoints import EndpointError, RateLimit
from support.endpoints import Answer, Received, TestEndpoint
from support.processes import ServiceProcess
from support.processes import relay as relay_process
from support.waiting import eventually

RATE, BURST, MAX_IN_FLIGHT = 50.0, 10, 8
WAITING = 10_000
FREE = 10_000  # for the unlimited endpoint beside it
MEASURED = 60.0


def new_secret() -> str:
    return get_scheme("standard-webhooks").generate_secret()


class Concurrency:
    """Counts the requests the endpoint is answering at once; each takes ``latency`` seconds."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.now = 0
        self.peak = 0

    async def __call__(self, _n: int, _r: Received) -> Answer:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.now -= 1
        return Answer(200)


async def add(pool: asyncpg.Pool, name: str, ep: TestEndpoint, event_type: str, limit: RateLimit | None) -> None:
    async with pool.acquire() as conn:
        # A long timeout: a request the relay gave up on is no longer in flight for the limiter, but
        # a test server that fell behind (this process, on a loaded machine) would still count it.
        await endpoints.add(conn, name, ep.url, event_types=[event_type], secret=ep.secret, initial_delay=0.2,
                            max_delay=1.0, timeout_seconds=120.0)
        assert await endpoints.set_rate_limit(conn, name, limit)


async def test_three_relays_keep_an_endpoint_to_its_rate_and_in_flight_cap(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    limited_load = Concurrency(0.03)
    async with TestEndpoint(new_secret(), limited_load) as limited, TestEndpoint(new_secret()) as free:
        await add(pool, "limited", limited, "limited.t", RateLimit(RATE, BURST, MAX_IN_FLIGHT))
        await add(pool, "free", free, "free.t", None)
        await pool.execute("SELECT hookline.publish('limited.t', jsonb_build_object('n', n)) "
                           "FROM generate_series(1, $1) AS n", WAITING)
        await pool.execute("SELECT hookline.publish('free.t', jsonb_build_object('n', n)) "
                           "FROM generate_series(1, $1) AS n", FREE)
        relays: list[ServiceProcess] = []
        try:
            for _ in range(3):
                relays.append(await asyncio.to_thread(relay_process, database_url, log_dir,
                                                      "--allow-private-networks", "--concurrency", "32"))
            await eventually(lambda: len(limited.received) >= BURST, timeout=30)
            # The burst at the start is allowed; the rate is measured after it.
            await asyncio.sleep(3.0)
            start_count, start = len(limited.received), time.monotonic()
            await asyncio.sleep(MEASURED)
            elapsed = time.monotonic() - start
            rate = (len(limited.received) - start_count) / elapsed
        finally:
            for process in relays:
                process.stop()
    # The unlimited endpoint's rate over its own deliveries, first to last, while the limited one waited.
    free_times = [r.at for r in free.delivered()]
    free_rate = len(free_times) / (free_times[-1] - free_times[0])
    print(f"\nrate limit {RATE:g}/s burst {BURST} max in flight {MAX_IN_FLIGHT}, 3 relay processes, "
          f"{WAITING} waiting: measured {rate:.2f}/s over {elapsed:.1f} s ({rate / RATE:.3f} of the limit), "
          f"peak concurrency at the endpoint {limited_load.peak}; the unlimited endpoint beside it: "
          f"{len(free.delivered())} of {FREE} delivered, {free_rate:.0f}/s ({free_rate / RATE:.1f}x the limit)")
    assert limited.invalid == free.invalid == []
    assert abs(rate - RATE) <= 0.05 * RATE, rate
    assert limited_load.peak <= MAX_IN_FLIGHT
    assert len(free.delivered()) == FREE and free_rate > 3 * RATE


async def test_a_429_pauses_the_endpoint_for_its_retry_after_and_halves_its_rate(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    answered_429: list[float] = []

    def behaviour(_n: int, r: Received) -> Answer:
        if not answered_429:
            answered_429.append(time.monotonic())
            return Answer(429, {"Retry-After": "2"})
        return Answer(200)

    async with TestEndpoint(new_secret(), behaviour) as ep:
        await add(pool, "throttling", ep, "t", RateLimit(20.0, 1, None))
        await pool.execute("SELECT hookline.publish('t', jsonb_build_object('n', n)) FROM generate_series(1, 20) AS n")
        process = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks")
        try:
            await eventually(lambda: len(ep.delivered()) == 20, timeout=60)
        finally:
            process.stop()
    # burst 1: one request at a time, so nothing else was on its way when the 429 was answered.
    during = [r for r in ep.received if answered_429[0] < r.at < answered_429[0] + 1.9]
    row = await pool.fetchrow("SELECT throttled_factor, circuit_state FROM hookline.endpoints")
    print(f"\nafter the 429: {len(during)} requests during its Retry-After; factor {row['throttled_factor']}")
    assert during == []
    assert row["throttled_factor"] == 0.5 and row["circuit_state"] == "closed"
    assert {r.webhook_id for r in ep.delivered()} == {r.webhook_id for r in ep.received}


@pytest.mark.parametrize(("given", "message"), [
    ((50.0, None, None), "together"),
    ((None, 10, None), "together"),
    ((0.0, 1, None), "greater than 0"),
    ((5.0, 0, None), "the burst must be"),
    ((None, None, 0), "max in flight must be"),
    ((None, None, None), "needs a rate"),
])
def test_bad_limits_are_refused(given: tuple[float | None, int | None, int | None], message: str) -> None:
    with pytest.raises(EndpointError, match=message):
        RateLimit(*given)
