"""A primary failover under load, on a real pg_auto_failover formation (tests/support/ha.py).

Every Hookline process is given both nodes in one URL with ``target_session_attrs=read-write``.
While a sender posts signed events to the receiver (retrying on anything but a 2xx, as senders
do), two workers (one with ``--sweep``) drain a backlog with an exactly-once handler that writes
its effect and publishes an outbox event in the event's transaction, and a relay delivers the
outbox to a local endpoint, the primary's keeper and postmaster are SIGKILLed. Then: every event
the receiver acknowledged is stored; each event has exactly one effect and one outbox event; each
outbox event reached the endpoint with its own id as webhook-id; no lease is left behind; the
Maintainer's leadership is renewed on the new primary. The workers and the relay poll only every
600 s, so every claim after the kill is started by a LISTEN wake-up on the new primary or by a row
coming due (a swept lease's backoff). The times from the kill to the first acknowledged event and
to a drained backlog are printed. Then the old primary rejoins as a standby, and nothing changes.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter

import aiohttp
import asyncpg
import pytest

from hookline.core.embedded import free_port
from support.endpoints import TestEndpoint
from support.ha import Formation
from support.inbox import apply_provider, create_effect_tables, insert_events
from support.processes import ServiceProcess, hookline_cli, receiver, worker
from support.senders import SW_SECRET, standard_webhooks
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKLOG = 3000  # events in the inbox when the workers start
INGESTED = 1000  # events posted to the receiver, the primary killed after KILL_AFTER of them
KILL_AFTER = 300
SENDERS = 16
NEVER = "600"  # seconds: the services' poll interval, longer than the test
# The workers' sweeper returns leases claimed at the moment of the kill after LEASE seconds.
PROVIDER = f"""
signature: {{scheme: standard-webhooks, secrets: ["{SW_SECRET}"]}}
eventId: {{header: webhook-id}}
eventType: {{jsonPointer: /type}}
handler: "support.handlers:publish_shipped"
leaseSeconds: 5
retry: {{maxAttempts: 20, initialDelaySeconds: 0.5, maxDelaySeconds: 2}}
"""


class Sender:
    """Posts signed events, each until it is acknowledged (a 2xx), recording when the acks came."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: list[tuple[str, float]] = []  # (event id, time.monotonic())
        self.refused = Counter[str]()  # what was answered instead of a 2xx, and how often

    async def send(self, http: aiohttp.ClientSession, event_id: str) -> None:
        body = json.dumps({"id": event_id, "type": "order.paid"}).encode()
        while True:
            try:
                async with http.post(self.url, data=body, headers=standard_webhooks(body, event_id),
                                     timeout=aiohttp.ClientTimeout(total=10)) as answer:
                    if 200 <= answer.status < 300:
                        self.acked.append((event_id, time.monotonic()))
                        return
                    self.refused[str(answer.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.2)

    async def send_all(self, event_ids: list[str]) -> None:
        queue = list(reversed(event_ids))
        async with aiohttp.ClientSession() as http:
            async def lane() -> None:
                while queue:
                    await self.send(http, queue.pop())
            await asyncio.gather(*(lane() for _ in range(SENDERS)))


async def connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url, timeout=5)


async def snapshot(url: str) -> dict[str, object]:
    conn = await connect(url)
    try:
        return {
            "inbox": dict(await conn.fetch("SELECT status, count(*) FROM hookline.inbox GROUP BY status")),
            "effects": await conn.fetchval("SELECT count(*) FROM test_effects"),
            "outbox": await conn.fetchval("SELECT count(*) FROM hookline.outbox"),
        }
    finally:
        await conn.close()


async def test_a_primary_killed_under_load_loses_and_repeats_nothing(formation: Formation, log_dir) -> None:
    url = formation.url
    migrated = hookline_cli(url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    setup = await connect(url)
    try:
        await create_effect_tables(setup)
        apply_provider(url, "orders", PROVIDER)
        backlog = await insert_events(setup, "orders", BACKLOG, "order.paid")
    finally:
        await setup.close()

    procs: list[ServiceProcess] = []
    async with TestEndpoint(SW_SECRET) as endpoint:
        try:
            added = hookline_cli(url, "endpoints", "add", "partner", "--url", endpoint.url, "--secret", SW_SECRET)
            assert added.returncode == 0, added.stderr
            ingest = receiver(url, log_dir)
            # No polling within the test's time: only wake-ups (NOTIFY, or the next row due) claim.
            procs += [ingest, worker(url, log_dir, "--concurrency", "16", "--sweep", "--poll-interval", NEVER),
                      worker(url, log_dir, "--concurrency", "16", "--poll-interval", NEVER)]
            port = free_port()
            relay_args = ["relay", "--allow-private-networks", "--host", "127.0.0.1", "--poll-interval", NEVER]
            procs.append(ServiceProcess([*relay_args, "--port", str(port)], url, log_dir, port=port).start("/readyz"))

            sender = Sender(f"{ingest.url}/webhooks/orders")
            posted = [f"msg_{uuid.uuid4().hex}" for _ in range(INGESTED)]
            sending = asyncio.create_task(sender.send_all(posted))
            await eventually(lambda: len(sender.acked) >= KILL_AFTER or sending.done(), timeout=60)
            old = formation.kill_primary()
            killed_at, killed_at_wall = time.monotonic(), time.time()
            new = await asyncio.to_thread(formation.wait_for_new_primary, old)
            await sending
            first_ack = min(at for _, at in sender.acked if at > killed_at)

            # Events after the failover.
            late = [f"msg_late_{n}" for n in range(20)]
            await sender.send_all(late)
            everything = backlog + posted + late

            async def progress() -> tuple[object, ...]:
                state = await snapshot(url)
                return state["inbox"], state["outbox"], len(endpoint.delivered())
            total = len(everything)
            await eventually(progress, what="every event done and delivered", equals=({"done": total}, total, total),
                             timeout=120)
            drained_at = time.monotonic()
            print(f"\nfailover: {old} killed, {new} promoted; first acknowledged event {first_ack - killed_at:.1f} s "
                  f"after the kill, backlog drained {drained_at - killed_at:.1f} s after it; the sender was "
                  f"answered {dict(sender.refused)} instead of a 2xx meanwhile")

            conn = await connect(url)
            try:
                # Every acknowledged event is stored, and each has exactly one effect ...
                stored = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM hookline.inbox")}
                assert {event_id for event_id, _ in sender.acked} <= stored
                assert stored == set(everything)
                effects = Counter(r["event_id"] for r in await conn.fetch("SELECT event_id FROM test_effects"))
                assert effects == Counter(everything)
                # ... and one outbox event, delivered under its own id (a repeat is the same webhook-id).
                outbox = {r["event_id"]: r["source"] for r in await conn.fetch(
                    "SELECT event_id, payload->>'source_event' AS source FROM hookline.outbox")}
                assert Counter(outbox.values()) == Counter(everything)
                assert {r.webhook_id for r in endpoint.received} == set(outbox)
                assert {r.webhook_id for r in endpoint.delivered()} == set(outbox)
                assert endpoint.invalid == []
                assert await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'processing'") == 0
                # The Maintainer's leadership was renewed on the new primary (a lease outlives the
                # last renewal by three 5 s intervals: one ending this late was taken after the kill).
                await eventually(lambda: conn.fetchval(
                    "SELECT count(*) FROM hookline.maintenance_leaders WHERE scope = 'inbox' "
                    "AND expires_at > to_timestamp($1) + interval '15 seconds'", killed_at_wall), equals=1)
            finally:
                await conn.close()
            for p in procs:  # the batch path (worker/processing.py); the claim loop's is still open
                assert not [line for line in p.logs().splitlines()
                            if "batched write failed" in line and "released back to the pool" in line], p.log_path

            before = await snapshot(url)
            await asyncio.to_thread(formation.restart_old_node, old)
            # The old primary follows the new one; the services, still on the new primary, change nothing.
            assert formation.sql(old, "hookline", "SELECT pg_is_in_recovery()") == "t"
            assert await snapshot(url) == before
        finally:
            for p in procs:
                p.stop()
