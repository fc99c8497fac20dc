"""The relay: claims outbox deliveries and POSTs them, signed per Standard Webhooks.

Loop: for each enabled endpoint in turn, claim up to the free concurrency with the
queue claim (one statement, SKIP LOCKED, leased, the attempt counted at claim; due
retries first: ``claim`` in queue.sql), start a task per delivery, and
when nothing is due sleep until a publish's NOTIFY or the poll interval. While an
endpoint's circuit is open (``relay/breaker.py``) only its probes go out, one at a time.

Why nothing is skipped: the claim selects by *status* ('pending' rows that are
due), not by "ids above the last one I saw". An event whose transaction drew a
lower id but committed later is simply pending when it becomes visible, and
the next claim takes it. No high-water mark, so no gap to fall into.

Delivery is at least once: the HTTP call happens outside any transaction and the
bookkeeping after it. If the relay dies in between, the lease runs out, the
sweeper puts the delivery back, and it is sent again with the same webhook-id
(the outbox event's id), which is what receivers deduplicate on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from hookline import outbox
from hookline.core import delivery, metrics, pools, tracing
from hookline.core.batching import Batcher
from hookline.core.consumer import LeasedConsumer, write_completion
from hookline.core.delivery import DeliveryResult, Outcome
from hookline.core.gc_tuning import tune_gc_for_serving
from hookline.core.host import Connections, Wiring
from hookline.core.http_client import WebhookClient
from hookline.core.listener import Listener
from hookline.core.maintenance import Job, lease_rescuer, partition_manager
from hookline.core.partitions import Retention
from hookline.core.queue import OUTBOX, SweepResult, make_worker_id, truncate_error
from hookline.core.secrets_at_rest import SealedValueError, SecretKeyError
from hookline.core.settings import RelaySettings, Settings
from hookline.core.signatures import sign_standard_webhooks
from hookline.relay import breaker
from hookline.relay import endpoints as endpoints_mod
from hookline.relay.breaker import BreakerSettings, CircuitState, CircuitUpdate
from hookline.relay.egress import EgressClients
from hookline.relay.endpoints import Endpoint, opened_secrets

log = logging.getLogger(__name__)

RESPONSE_STORED = 1000  # characters of an answer kept in deliveries.last_response
MIN_THROTTLE = 0.005  # seconds: a throttled endpoint is looked at again no sooner (no busy loop)
SUCCESS_COUNT_INTERVAL = 1.0  # seconds successes may wait to be counted for their circuit (see Bookkeeper)


@dataclass(slots=True)  # one per delivery: not frozen, whose __init__ costs three times as much
class Claimed:
    id: int
    attempts: int
    endpoint: Endpoint
    event_id: str
    body: bytes
    probe: bool = False  # the probe of a half-open circuit: its outcome decides the circuit
    traceparent: str | None = None  # the publisher's trace context (core/tracing.py)


_event_types_json: dict[str, str] = {}  # an install has few event types: each encoded once


def envelope(event_type: str, timestamp: str, payload_json: str) -> bytes:
    """The Standard Webhooks body: the same bytes on every attempt (the stored event does not change).
    ``timestamp`` is the event's creation time in RFC 3339 (formatted by ``claimed_with_events``) and
    ``payload_json`` the stored payload as Postgres prints it, spliced in rather than decoded and
    encoded again (one per delivery)."""
    event_type_json = _event_types_json.get(event_type)
    if event_type_json is None:
        event_type_json = json.dumps(event_type, ensure_ascii=False)
        if len(_event_types_json) < 10_000:
            _event_types_json[event_type] = event_type_json
    return f'{{"type":{event_type_json},"timestamp":"{timestamp}","data":{payload_json}}}'.encode()


# The relay's claims, by whether the endpoint is ordered: outbox.sql's claimed_with_events around queue.sql's
# claim (or claim_ordered) of the outbox, so that each claimed delivery comes back with its event.
CLAIMS_WITH_EVENTS = {ordered: OUTBOX.claim_within(outbox.query("claimed_with_events"),
                                                   "claim_ordered" if ordered else "claim")
                      for ordered in (False, True)}


@dataclass(slots=True)  # one per attempt, as Claimed
class Booking:
    """What one attempt ended with: its outcome for the endpoint's circuit and, when it was
    delivered, the delivery and its answer to book done."""

    endpoint: str
    ok: bool
    probe: bool
    delivered: tuple[Claimed, DeliveryResult] | None = None


class Bookkeeper:
    """The relay's bookkeeping in batches (the shared group-commit ``Batcher``): one statement per
    batch marks the delivered ones done with their answers; when the batch also counts outcomes for
    the endpoints' circuits (``relay/breaker.py``, see below) it does both in one transaction.

    Why successes and failures share one queue, in the order their answers arrived: counted apart
    (successes in a completion batch, failures one transaction each), failures reached the circuit
    first, and a relay with 64 attempts in flight counted 20 failures and no success from an endpoint
    that fails every other attempt: it opened. Why completions and counts share a transaction: one
    connection, BEGIN and COMMIT per batch instead of two (the relay's CPU per delivery); a batch that
    counts nothing is the completion statement alone, one round trip.

    Successes alone change no circuit (a closed one opens on failures, a half-open one closes on
    probes), so a batch of nothing else counts them only once ``SUCCESS_COUNT_INTERVAL`` has passed;
    until then they wait, in memory, for the next batch with a failure or a probe and are counted
    before it. A steady stream of deliveries then skips the circuit statements in most batches.
    ``count_held`` (the relay's maintainer runs it every interval) counts what an idle relay still
    holds, so old successes never dilute a later window's failures.
    """

    def __init__(self, pool: asyncpg.Pool, worker_id: str, settings: BreakerSettings,
                 on_circuits: breaker.CircuitsChanged, in_flight: Callable[[], int], max_batch: int = 500,
                 window: float = 0.02) -> None:
        """``in_flight``: the relay's deliveries not yet booked (each may join a batch). A batch waits up
        to ``window`` for more of them (fewer, larger batches under load), and not at all when it holds
        all there are (a lone delivery, an ordered endpoint's next event, is booked at once)."""
        self._pool, self._worker_id = pool, worker_id
        self._settings, self._on_circuits = settings, on_circuits
        self._batcher: Batcher[Booking, bool] = Batcher(self._write, name="relay-bookkeeping", max_batch=max_batch,
                                                        window=window, expected=in_flight)
        self._uncounted: dict[str, breaker.Outcomes] = {}  # successes not yet counted
        self._counted_at = time.monotonic()
        self._counting = asyncio.Lock()  # batches and count_held take turns with the held counts

    def start(self) -> None:
        self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()
        try:
            await self.count_held(at_once=True)
        except Exception as exc:  # advisory counts: a stopping relay does not wait for Postgres
            log.warning("circuit breaker counts not written at stop", extra={"error": str(exc)[:300]})

    async def count_held(self, *, at_once: bool = False) -> None:
        """Count the successes held back once they waited ``SUCCESS_COUNT_INTERVAL`` (``at_once``: now)."""
        async with self._counting:
            if not self._uncounted or not (at_once or time.monotonic() >= self._counted_at + SUCCESS_COUNT_INTERVAL):
                return
            async with self._pool.acquire() as conn, conn.transaction():
                updates = await breaker.record_outcomes(conn, self._settings, self._uncounted)
            self._uncounted, self._counted_at = {}, time.monotonic()
        self._on_circuits(updates)

    async def delivered(self, claimed: Claimed, result: DeliveryResult) -> bool:
        """Book a delivered attempt (and count it): True when booked; False when the lease was lost
        meanwhile (someone else books that attempt). Raises when the batch could not be written."""
        return await self._batcher.submit(Booking(claimed.endpoint.name, True, claimed.probe, (claimed, result)))

    async def count(self, endpoint: str, *, ok: bool, probe: bool) -> None:
        """Count an attempt that is booked elsewhere. The breaker is advisory: if the count cannot be
        written (Postgres away), the delivery's own bookkeeping goes on and the circuit decides on later counts."""
        try:
            await self._batcher.submit(Booking(endpoint, ok, probe))
        except Exception as exc:
            log.warning("circuit breaker count failed", extra={"endpoint": endpoint, "error": str(exc)[:300]})

    async def _write(self, batch: list[Booking]) -> list[bool]:
        async with self._counting:
            return await self._write_counting(batch)

    async def _write_counting(self, batch: list[Booking]) -> list[bool]:
        delivered = [b.delivered for b in batch if b.delivered is not None]
        outcomes = dict(self._uncounted)
        for endpoint, tally in breaker.tally((b.endpoint, b.ok, b.probe) for b in batch).items():
            outcomes[endpoint] = outcomes[endpoint] + tally if endpoint in outcomes else tally
        now = time.monotonic()
        count = now >= self._counted_at + SUCCESS_COUNT_INTERVAL or any(not b.ok or b.probe for b in batch)
        updates: list[CircuitUpdate] = []
        async with self._pool.acquire() as conn:
            if not count:  # the common case: one statement, no transaction around it
                done = await self._complete(conn, delivered) if delivered else set()
            else:
                async with conn.transaction():
                    done = await self._complete(conn, delivered) if delivered else set()
                    # last: the endpoint rows it locks stay locked until the commit, and relays take turns
                    updates = await breaker.record_outcomes(conn, self._settings, outcomes)
        self._uncounted, self._counted_at = ({}, now) if count else (outcomes, self._counted_at)
        self._on_circuits(updates)
        return [b.delivered is None or b.delivered[0].id in done for b in batch]

    async def _complete(self, conn: asyncpg.Connection, delivered: list[tuple[Claimed, DeliveryResult]]) -> set[int]:
        """Mark the delivered ones done with their answers (``complete_deliveries``); the ids booked."""
        ids = await conn.fetchval(
            outbox.query("complete_deliveries"), [c.id for c, _ in delivered], [c.attempts for c, _ in delivered],
            self._worker_id, [r.status for _, r in delivered], [r.body[:RESPONSE_STORED] for _, r in delivered],
            [r.latency * 1000 for _, r in delivered],
        )
        return set(ids or ())


class Relay(LeasedConsumer):
    """The relay, a component of a Host (core/host.py): ``hookline relay`` and ``hookline dev``."""

    def __init__(self, pool: asyncpg.Pool, listener: Listener, settings: RelaySettings | None = None, *,
                 retention: Retention | None = None, worker_id: str | None = None) -> None:
        settings = settings or RelaySettings()
        concurrency = settings.concurrency
        super().__init__(pool, OUTBOX, worker_id=worker_id or make_worker_id("relay"),
                         channels=(OUTBOX.channel, "hookline_endpoints"),
                         concurrency=concurrency, poll_interval=settings.poll_interval,
                         grace_period=settings.grace_period, refill=min(concurrency // 4, 16),
                         completion_overlap=concurrency, listener=listener)
        self.settings, self.retention = settings, retention or Retention()
        self.allow_private_networks = settings.allow_private_networks
        self.lease_seconds = settings.lease_seconds
        self.breaker_settings = settings.breaker
        self.bookkeeper = Bookkeeper(pool, self.worker_id, self.breaker_settings, self._circuits_changed,
                                     in_flight=lambda: len(self.in_flight) + len(self.completing))
        self.client = WebhookClient(allow_private_networks=self.allow_private_networks, connections=concurrency,
                                    proxy=settings.egress_proxy)
        self.egress = EgressClients(self.client, install_proxy=settings.egress_proxy, connections=concurrency)
        self._endpoints: dict[str, Endpoint] = {}
        self._endpoints_loaded = 0.0
        self._rotation = 0
        self._probes: dict[str, int] = {}  # endpoint -> the delivery this relay sends as its probe
        self._probe_looked: dict[str, float] = {}  # endpoint -> when a probe was last asked for in vain
        self._throttled_until: dict[str, float] = {}  # endpoint -> when its bucket or 429 may let it claim

    @classmethod
    def connections(cls, settings: Settings) -> Connections:
        # The pool, the LISTEN connection and the outbox's and partitions' leader leases: pools.relay in all.
        return Connections(pools.relay(settings.relay.concurrency), scopes=("outbox", "partitions"), min_pool=1,
                           generic_plans=True)

    @classmethod
    def create(cls, wiring: Wiring) -> Relay:
        return cls(wiring.pool, wiring.listener, wiring.settings.relay, retention=wiring.settings.retention)

    def jobs(self) -> Sequence[tuple[str, Job]]:
        """Rescuing leases runs on the relays' elected leader; each relay its own gauges and held counts.
        The partition manager (core/partitions.py: partitions ahead, retention of the inbox and of the
        outbox) runs here too: relays hold the full credential in every install (the chart's worker pods
        log in as tenants), and the "partitions" scope's lease lets one process of the whole install do
        it, relay or `worker --sweep`."""
        return [
            ("outbox", lease_rescuer(self.pool, lambda: {e.name: e.retry for e in self._endpoints.values()}, OUTBOX,
                                     self.settings.sweep_interval, swept=self._swept)),
            ("outbox", Job("outbox-stats", self.refresh_stats, self.settings.stats_interval, per_process=True)),
            ("outbox", Job("circuit-counts", self.bookkeeper.count_held, SUCCESS_COUNT_INTERVAL, per_process=True)),
            ("partitions", partition_manager(self.pool, self.retention)),
        ]

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._refresh_endpoints()
        self.bookkeeper.start()
        await self.start_loops()
        tune_gc_for_serving()
        log.info("relay started", extra={"worker": self.worker_id, "concurrency": self.concurrency,
                                         "allow_private_networks": self.allow_private_networks})

    async def stop(self) -> None:
        """Stop claiming, let in-flight deliveries finish within the grace period, give back the rest
        (a request that may or may not have reached its endpoint is sent again: the safe side)."""
        await self.stop_loops()
        await self.bookkeeper.stop()
        await self.client.close()
        await self.egress.close()
        log.info("relay stopped", extra={"worker": self.worker_id})

    def shortest_lease(self) -> float:
        return self.lease_seconds

    # --- endpoints -------------------------------------------------------------------------

    def endpoint(self, name: str) -> Endpoint | None:
        """The endpoint as this relay last loaded it (a change reaches it with the endpoints' NOTIFY)."""
        return self._endpoints.get(name)

    async def _refresh_endpoints(self) -> None:
        self._endpoints = {e.name: e for e in await endpoints_mod.load(self.pool)}
        self._endpoints_loaded = time.monotonic()
        await self.egress.retain({name: e.egress for name, e in self._endpoints.items()})
        # A new endpoint's series at 0 (its state as loaded: it may be disabled), a deleted one's gone.
        for name in metrics.sync_endpoints(set(self._endpoints)):
            self._publish_state(self._endpoints[name])

    def _breaker_open(self, endpoint: Endpoint) -> bool:
        """Open or half-open: only probes go through."""
        return endpoint.circuit.state is not CircuitState.CLOSED

    def _circuits_changed(self, updates: list[CircuitUpdate]) -> None:
        """Our own view of circuits takes effect at once; other relays' arrives with the endpoint
        refresh that a state change's NOTIFY triggers (or the next poll)."""
        for update in updates:
            breaker.report(update)
            cached = self._endpoints.get(update.endpoint)
            if cached is not None:
                self._endpoints[update.endpoint] = dataclasses.replace(cached, circuit=update.circuit)
            if update.circuit.state is not CircuitState.OPEN and update.before is not CircuitState.CLOSED:
                self.wake()  # the next probe, or the closed circuit's backlog, may go now

    def _per_endpoint_limit(self, active: int) -> int:
        # One endpoint that hangs until its timeout must not take every slot from
        # the others: with several endpoints, each gets at most half.
        return self.concurrency if active <= 1 else max(1, self.concurrency // 2)

    # --- claiming --------------------------------------------------------------------------

    def on_notify(self, channel: str, payload: str) -> bool:
        if channel == "hookline_endpoints":
            self._endpoints_loaded = 0.0  # re-read before the next claim
        return True

    async def claim_round(self) -> int:
        if time.monotonic() - self._endpoints_loaded > self.poll_interval:
            await self._refresh_endpoints()
        return await self._claim_round()

    async def _claim_round(self) -> int:
        active = [e for e in self._endpoints.values() if e.claimable]
        if not active:
            return 0
        self._rotation = (self._rotation + 1) % len(active)
        per_endpoint = self._per_endpoint_limit(len(active))
        # One connection for the whole round: a pool acquire and release cost about as much CPU as the
        # claim itself, and a round runs two statements per endpoint (the claim, then its events).
        async with self.pool.acquire() as conn:
            return await self._claim_endpoints(conn, active[self._rotation:] + active[: self._rotation],
                                               per_endpoint)

    async def _claim_endpoints(self, conn: asyncpg.Connection, endpoints: list[Endpoint], per_endpoint: int) -> int:
        claimed = 0
        for endpoint in endpoints:
            busy = sum(1 for _, _, name in self.in_flight.values() if name == endpoint.name)
            limit = min(self.free_slots, per_endpoint - busy)
            if self.stopping or self.free_slots <= 0:
                break
            if limit <= 0:
                continue
            if self._breaker_open(endpoint):
                if not busy:
                    claimed += await self._probe(conn, endpoint)
                continue
            if self._throttled(endpoint.name):
                continue
            rows = await self._claim_within_limit(conn, endpoint, limit)
            if rows:
                self._start_claimed(endpoint, rows)
            claimed += len(rows)
        return claimed

    async def _probe(self, conn: asyncpg.Connection, endpoint: Endpoint) -> int:
        """Send an open or half-open circuit's next probe if it is due and no relay holds it."""
        name, circuit = endpoint.name, endpoint.circuit
        if name in self._probes or time.monotonic() - self._probe_looked.get(name, -1e9) < self.poll_interval:
            return 0
        if circuit.probe_not_before is not None and circuit.probe_not_before > datetime.now(UTC):
            return 0  # not due by our clock; the database's clock decides when it is close
        # Held until the probe's outcome is booked; the hold only matters if this relay dies meanwhile.
        hold = max(self.breaker_settings.probe_interval, endpoint.timeout) + 5.0
        taken = await breaker.take_probe(self.pool, name, hold)
        if taken is None:
            self._probe_looked[name] = time.monotonic()
            return 0
        self._circuits_changed([taken])
        rows = await self._claim_within_limit(conn, endpoint, 1)
        if not rows:
            await breaker.release_probe(self.pool, name)
            self._probe_looked[name] = time.monotonic()
            return 0
        self._probes[name] = rows[0]["id"]
        self._start_claimed(self._endpoints.get(name, endpoint), rows, probe=True)
        return 1

    def _throttled(self, name: str) -> bool:
        """Held back by its rate limit or a 429 until a moment this relay knows (``_throttled_until``)."""
        until = self._throttled_until.get(name)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._throttled_until[name]
        return False

    async def _claim_within_limit(self, conn: asyncpg.Connection, endpoint: Endpoint, limit: int
                                  ) -> list[asyncpg.Record]:
        """Up to ``limit`` deliveries, as many as the endpoint's rate limit (if it has one) allows now."""
        if endpoint.rate_limit is None:
            return await self._claim(conn, endpoint, limit)
        return await self._claim_metered(conn, endpoint, limit)

    async def _claim_metered(self, conn: asyncpg.Connection, endpoint: Endpoint, limit: int
                             ) -> list[asyncpg.Record]:
        """The claim of a rate-limited endpoint: its share of the bucket taken, and what the claim did
        not use given back, in the claim's transaction (lock_endpoint holds the endpoint's row until the
        commit, so the relays' claims of one limited endpoint take turns and see each other's)."""
        async with conn.transaction():
            await conn.execute(outbox.query("lock_endpoint"), endpoint.name)
            granted, wait = await conn.fetchrow(outbox.query("take_tokens"), endpoint.name, limit)
            if not granted:
                # Not due before then: skipped by this relay's rounds, and its idle wait ends then.
                self._throttled_until[endpoint.name] = time.monotonic() + max(MIN_THROTTLE, wait)
                return []
            rows = await self._claim(conn, endpoint, granted)
            if len(rows) < granted:
                await conn.execute(outbox.query("return_tokens"), endpoint.name, granted - len(rows))
        return rows

    async def _idle_timeout(self) -> float:
        """As every consumer's, and no later than the first throttled endpoint may claim again."""
        timeout = await super()._idle_timeout()
        if self._throttled_until:
            timeout = min(timeout, max(MIN_THROTTLE, min(self._throttled_until.values()) - time.monotonic()))
        return timeout

    async def _throttle(self, endpoint: Endpoint, retry_after: float | None) -> None:
        """A 429: pause the endpoint until its Retry-After (1 s without one) in this relay, and in all of
        them through its bucket, whose rate then halves and recovers (throttle_endpoint)."""
        pause = retry_after if retry_after is not None else 1.0
        self._throttled_until[endpoint.name] = time.monotonic() + pause
        await self.pool.execute(outbox.query("throttle_endpoint"), endpoint.name, pause)
        log.info("endpoint answered 429: sending it less", extra={"endpoint": endpoint.name, "pause": pause})

    async def _claim(self, conn: asyncpg.Connection, endpoint: Endpoint, limit: int) -> list[asyncpg.Record]:
        """The queue claim (due retries first: see claim in queue.sql), each delivery with its event
        (``claimed_with_events``); none when the endpoint was deleted just now, its deliveries with it."""
        return await OUTBOX.fetch_claim(conn, CLAIMS_WITH_EVENTS[endpoint.ordered], endpoint.name, limit,
                                        self.worker_id, self.lease_seconds, ordered=endpoint.ordered)

    def _start_claimed(self, endpoint: Endpoint, rows: Sequence[Mapping[str, Any]], *, probe: bool = False) -> None:
        """Start claimed deliveries: ``rows`` as ``claimed_with_events`` returns them, of one endpoint."""
        try:
            secrets = opened_secrets(endpoint.name, rows[0]["secrets"])
        except (SealedValueError, SecretKeyError) as exc:
            # Not signed: these attempts fail ("no valid secret") and retry; the reason, not the value.
            log.error("endpoint's secrets do not open", extra={"endpoint": endpoint.name, "error": str(exc)})
            secrets = ()
        if secrets != endpoint.secrets:  # rotated since the cache was loaded
            endpoint = dataclasses.replace(endpoint, secrets=secrets)
            self._endpoints[endpoint.name] = endpoint
        for row in rows:
            self._start(Claimed(row["id"], row["attempts"], endpoint, row["event_id"],
                                envelope(row["event_type"], row["timestamp"], row["payload"]), probe,
                                row["traceparent"]))

    def _start(self, claimed: Claimed) -> None:
        self.spawn(claimed.id, self._deliver(claimed), self.lease_seconds, claimed.endpoint.name)

    def suspect_partitions(self) -> dict[str, float]:
        # A delivery whose relay died runs alone next time (core/consumer.py). Open circuits too: probes
        # skip suspects, so an endpoint whose only backlog is suspects would otherwise never close.
        return {e.name: self.lease_seconds for e in self._endpoints.values()
                if e.claimable and not self._throttled(e.name)}

    async def start_suspect(self, row: asyncpg.Record) -> None:
        endpoint = self._endpoints.get(row["endpoint"])
        if endpoint is None:
            return
        event = await self.pool.fetchrow(outbox.query("claimed_events"), [row["outbox_id"]], endpoint.name)
        if event is not None:  # None: the endpoint was deleted just now, and its deliveries with it
            self._start_claimed(endpoint, [{**event, "id": row["id"], "attempts": row["attempts"]}])

    def on_finished(self, id: int, partition: str, task: asyncio.Task[Any]) -> None:
        if self._probes.get(partition) == id:
            del self._probes[partition]
            self.wake()  # the next probe may be due at once (a success that did not close the circuit yet)
        endpoint = self._endpoints.get(partition)
        if endpoint is not None and endpoint.ordered:
            self.wake()  # a finished delivery may be what its aggregate's next event waits for
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Bookkeeping failed (Postgres away): the lease runs out and the sweeper retries it.
            log.warning("delivery bookkeeping failed; the lease will expire and it is retried",
                        extra={"delivery": id, "error": f"{type(exc).__name__}: {exc}"})

    # --- one delivery ----------------------------------------------------------------------

    async def _deliver(self, claimed: Claimed) -> None:
        endpoint = claimed.endpoint
        if not tracing.enabled():  # the common case: no span to open per delivery
            result = await self._post(claimed, None)
        else:
            with tracing.span("hookline.deliver", claimed.traceparent, tracing.CLIENT,
                              {"hookline.endpoint": endpoint.name, "hookline.event_id": claimed.event_id,
                               "hookline.attempt": claimed.attempts}) as traceparent:
                result = await self._post(claimed, traceparent)
        outcome = delivery.classify(result)  # every outcome but gone is retried, client errors included
        if metrics.endpoint_declared(endpoint.name):  # not deleted while this attempt was out: no stale series
            metrics.child(metrics.relay_deliveries, endpoint.name, outcome).inc()
            if result.status is not None:
                metrics.child(metrics.relay_latency, endpoint.name).observe(result.latency)
        if outcome is Outcome.GONE:  # disables the endpoint; not a count for its circuit
            await self._disable(claimed, result)
            return
        # The breaker's count is written before the task ends, so a probe's successor sees it.
        if outcome is Outcome.DELIVERED:
            # Booked and counted in one batch; retried while the lease lasts; never a retry or dead
            # letter for a delivered event. Its slot takes the next delivery meanwhile.
            self.effect_done(claimed.id)
            await write_completion(lambda: self.bookkeeper.delivered(claimed, result), self.lease_seconds,
                                   {"endpoint": endpoint.name, "event_id": claimed.event_id})
        elif result.status == 429:
            # Alive and asking for less: slowed by the limiter, not held against its circuit. A probe's
            # 429 is a sign of life that ends the probe (or a half-open circuit would wait for its hold).
            counted = (self.bookkeeper.count(endpoint.name, ok=True, probe=True),) if claimed.probe else ()
            await asyncio.gather(self._throttle(endpoint, result.retry_after), self._fail(claimed, result), *counted)
        else:  # counted and booked side by side (neither waits for the other)
            await asyncio.gather(self.bookkeeper.count(endpoint.name, ok=False, probe=claimed.probe),
                                 self._fail(claimed, result))

    async def _post(self, claimed: Claimed, traceparent: str | None) -> DeliveryResult:
        endpoint = claimed.endpoint
        if not endpoint.secrets:
            return DeliveryResult(None, "", 0.0, error="the endpoint has no valid secret to sign with")
        headers = sign_standard_webhooks(endpoint.secrets, claimed.event_id, int(time.time()), claimed.body)
        headers["content-type"] = "application/json"
        if traceparent is not None:
            headers["traceparent"] = traceparent
        if endpoint.egress is not None:  # its own proxy, TLS or OAuth2 (relay/egress.py)
            return await self.egress.post(endpoint.name, endpoint.egress, endpoint.url, claimed.body, headers,
                                          endpoint.timeout)
        return await self.client.post(endpoint.url, claimed.body, headers, timeout=endpoint.timeout)

    async def _disable(self, claimed: Claimed, result: DeliveryResult) -> None:
        reason = f"HTTP 410 Gone at {datetime.now(UTC).isoformat(timespec='seconds')}: endpoint disabled"
        parked = await self.pool.fetch(
            outbox.query("disable_endpoint"), claimed.endpoint.name, reason, claimed.id, claimed.attempts,
            self.worker_id, result.status, result.body[:RESPONSE_STORED], result.latency * 1000,
        )
        self._endpoints_loaded = 0.0
        log.warning("endpoint answered 410 Gone: disabled, its deliveries parked (hookline endpoints enable "
                    "re-enables it)", extra={"endpoint": claimed.endpoint.name, "parked": len(parked)})

    async def _fail(self, claimed: Claimed, result: DeliveryResult) -> None:
        endpoint = claimed.endpoint
        error = truncate_error(result.describe(), endpoint.secrets)
        async with self.pool.acquire() as conn, conn.transaction():
            if claimed.attempts >= endpoint.retry.max_attempts:
                booked = await OUTBOX.bury(conn, claimed.id, claimed.attempts, self.worker_id, error)
                if booked:
                    metrics.relay_dead.labels(endpoint.name).inc()
                    log.warning("delivery dead after its last attempt",
                                extra={"endpoint": endpoint.name, "event_id": claimed.event_id, "error": error})
            else:
                delay = endpoint.retry.next_delay(claimed.attempts, result.retry_after)
                booked = await OUTBOX.retry(conn, claimed.id, claimed.attempts, self.worker_id, delay, error)
                if booked:
                    # The endpoint may have been disabled (410) while this was in flight.
                    await conn.execute(outbox.query("park_delivery"), claimed.id, claimed.attempts)
            if not booked:
                return  # the lease was lost meanwhile; whoever holds it now books it
            await conn.execute(outbox.query("record_responses"), [claimed.id], [result.status],
                               [result.body[:RESPONSE_STORED]], [result.latency * 1000])

    # --- background work -------------------------------------------------------------------

    def _swept(self, result: SweepResult) -> None:
        """The leader's lease rescuer requeued (or buried) deliveries whose relay died: the
        at-least-once half of the crash story."""
        for partition, count in result.dead.items():
            metrics.relay_dead.labels(partition).inc(count)
        if result.total:
            self.wake()

    async def refresh_stats(self) -> None:
        stats = await OUTBOX.stats(self.pool)
        ages = {r["endpoint"]: r for r in await self.pool.fetch(outbox.query("undelivered_age"))}
        # The endpoints whose series are declared (metrics.sync_endpoints); one added since the last
        # endpoint refresh is there at the next tick.
        for name, endpoint in self._endpoints.items():
            s, a = stats.get(name), ages.get(name)
            metrics.outbox_backlog.labels(name).set(s.pending if s else 0)
            metrics.outbox_dead.labels(name).set(s.dead if s else 0)
            metrics.outbox_suspects.labels(name).set(s.suspects if s else 0)
            metrics.outbox_oldest_undelivered.labels(name).set(float(a["seconds"]) if a else 0)
            metrics.outbox_parked.labels(name).set(int(a["parked"]) if a else 0)
            self._publish_state(endpoint)

    def _publish_state(self, endpoint: Endpoint) -> None:
        """The gauges of the endpoint's circuit and of whether it is disabled, as this relay sees them."""
        state = endpoint.circuit.state
        metrics.relay_circuit_state.labels(endpoint.name).set(breaker.STATE_VALUE[state])
        metrics.relay_circuit_open.labels(endpoint.name).set(int(state is not CircuitState.CLOSED))
        metrics.outbox_endpoint_disabled.labels(endpoint.name).set(int(not endpoint.enabled))
