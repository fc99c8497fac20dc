"""Retention of the partitioned inbox (core/partitions.py, migration 0011) and outbox (0018) with
partitions of one second: partitions are created ahead and dropped whole only when nothing in them
must be kept; payloads of done events go, pending and dead events stay, dedup keys outlive their
payloads (a duplicate is still a duplicate, and copies racing across a partition boundary are
stored once), and of two maintainers racing only the leader manages. The outbox's events go with
their deliveries, per endpoint's retention; pending, parked and dead deliveries stay."""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline import outbox
from hookline.core import db, partitions, settings
from hookline.core.config import ConfigError
from hookline.core.maintenance import Job, Maintainer, partition_manager
from hookline.core.signatures import get_scheme
from hookline.receiver.group_commit import INSERT_BATCH
from hookline.relay import endpoints
from support.dedicated import GatedConnection
from support.endpoints import Answer, TestEndpoint
from support.inbox import apply_provider
from support.postgres import lock_waiters
from support.processes import receiver, relay
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

INBOX = "hookline.inbox"
KEEP_EVERYTHING_ELSE = {"dead_days": 1.0, "dedup_days": 1.0}  # a day: nothing but done rows expire here
ONE_SECOND = 1 / 3600  # in hours


async def one_second_partitions(pool: asyncpg.Pool, premake: int = 30) -> list[str]:
    """Replace the (empty) daily partitions of a new database by one-second ones."""
    for row in await pool.fetch(db.query("list_partitions", "partitions.sql"), INBOX):
        if not row["is_default"]:
            await pool.execute(f"DROP TABLE {row['name']}")
    assert await pool.fetchval(db.query("set_partition_width", "partitions.sql"), INBOX, datetime.timedelta(seconds=1),
                               premake) == INBOX
    return await partitions.ensure_partitions(pool)


async def receive(pool: asyncpg.Pool | asyncpg.Connection, provider: str, *event_ids: str) -> list[str]:
    """Store events as the receiver does; returns the ids stored, sorted (the others were duplicates)."""
    n = len(event_ids)
    rows = await pool.fetch(INSERT_BATCH, [provider] * n, list(event_ids), ["t"] * n, [None] * n,
                            [{}] * n, [b"{}"] * n, [None] * n)
    return sorted(r["event_id"] for r in rows)


async def partition_of(pool: asyncpg.Pool, event_id: str) -> str:
    name: str = await pool.fetchval("SELECT tableoid::regclass::text FROM hookline.inbox WHERE event_id = $1", event_id)
    return name


async def next_second(pool: asyncpg.Pool) -> None:
    start = await pool.fetchval("SELECT date_trunc('second', clock_timestamp())")
    await eventually(lambda: _after(pool, start))


async def _after(pool: asyncpg.Pool, moment: datetime.datetime) -> bool:
    return bool(await pool.fetchval("SELECT date_trunc('second', clock_timestamp()) > $1", moment))


async def test_partitions_are_created_ahead_and_not_twice(pool: asyncpg.Pool) -> None:
    created = await one_second_partitions(pool, premake=5)
    assert len(created) == 6  # the current second and five ahead
    names = [r["name"] for r in await pool.fetch(db.query("list_partitions", "partitions.sql"), INBOX)]
    assert set(created) <= set(names) and "hookline.inbox_default" in names
    # Concurrent passes (without the Maintainer's lock) create nothing twice and fail nowhere.
    again = await asyncio.gather(*(partitions.ensure_partitions(pool) for _ in range(4)))
    assert all(set(run).isdisjoint(created) for run in again)
    made = [name for run in again for name in run]
    assert len(made) == len(set(made))
    # New events land in the partition of their second, not in the default one.
    assert await receive(pool, "p", "evt-1") == ["evt-1"]
    assert await partition_of(pool, "evt-1") != "hookline.inbox_default"


async def test_retention_drops_done_payloads_keeps_pending_dead_and_keys(pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool)
    retention = partitions.Retention(done_hours=ONE_SECOND, **KEEP_EVERYTHING_ELSE)
    assert await receive(pool, "p", "done-alone") == ["done-alone"]
    await next_second(pool)
    assert await receive(pool, "p", "done-beside", "pending", "dead") == ["dead", "done-beside", "pending"]
    alone, mixed = await partition_of(pool, "done-alone"), await partition_of(pool, "pending")
    assert alone != mixed
    await pool.execute("UPDATE hookline.inbox SET status = 'done', processed_at = now() "
                       "WHERE event_id IN ('done-alone', 'done-beside')")
    await pool.execute("UPDATE hookline.inbox SET status = 'dead', processed_at = now() WHERE event_id = 'dead'")

    # Once both seconds are more than a second old: the partition of only done rows is dropped
    # whole; the one with a pending and a dead event stays, and only its done row is deleted.
    await next_second(pool)
    await next_second(pool)
    report = await partitions.expire_inbox(pool, retention)
    # (Empty partitions of the seconds before are dropped too.)
    assert {name: rows for name, rows in report.dropped.items() if rows} == {alone: 1}
    assert report.deleted == 1 and report.kept == 2
    remaining = {r["event_id"]: r["status"] for r in await pool.fetch("SELECT event_id, status FROM hookline.inbox")}
    assert remaining == {"pending": "pending", "dead": "dead"}
    assert await pool.fetchval("SELECT to_regclass($1)", alone) is None
    assert await pool.fetchval("SELECT to_regclass($1)::text", mixed) == mixed

    # Keys outlive payloads: every event sent again is a duplicate, stored and processed never again.
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox_keys") == 4
    assert await receive(pool, "p", "done-alone", "done-beside", "pending", "dead") == []
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == 2


async def test_dedup_keys_expire_only_after_their_window_and_their_partition(pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool)
    assert await receive(pool, "p", "old") == ["old"]
    await next_second(pool)
    assert await receive(pool, "p", "kept-pending") == ["kept-pending"]
    await pool.execute("UPDATE hookline.inbox SET status = 'done' WHERE event_id = 'old'")
    await next_second(pool)
    await next_second(pool)
    # A window shorter than the payloads': keys whose partition still exists are kept anyway.
    short = partitions.Retention(done_hours=1.0, dead_days=1.0, dedup_days=1 / 86400)
    report = await partitions.expire_inbox(pool, short)
    assert report.keys_deleted == 0 and not any(report.dropped.values())
    assert await receive(pool, "p", "old", "kept-pending") == []

    # Payloads of done events gone (a second), keys kept a day: still duplicates.
    long_keys = partitions.Retention(done_hours=ONE_SECOND, dead_days=1.0, dedup_days=1.0)
    report = await partitions.expire_inbox(pool, long_keys)
    assert sum(report.dropped.values()) == 1 and report.keys_deleted == 0
    assert await receive(pool, "p", "old") == []

    # Past the window and without a partition: the key goes, and the id is new again.
    report = await partitions.expire_inbox(pool, partitions.Retention(done_hours=ONE_SECOND, dead_days=1.0,
                                                                      dedup_days=1 / 86400))
    assert report.keys_deleted == 1
    assert await pool.fetchval("SELECT array_agg(event_id) FROM hookline.inbox_keys") == ["kept-pending"]
    assert await receive(pool, "p", "old") == ["old"]


async def test_per_provider_retention_from_the_spec(pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool)
    await pool.execute("INSERT INTO hookline.providers (name, spec) VALUES ('short', $1), ('long', $2)",
                       {"retention": {"doneHours": ONE_SECOND}}, {"retention": {"doneHours": 24}})
    assert await receive(pool, "short", "s-1") == ["s-1"]
    assert await receive(pool, "long", "l-1") == ["l-1"]
    await pool.execute("UPDATE hookline.inbox SET status = 'done', processed_at = now()")
    await next_second(pool)
    await next_second(pool)
    report = await partitions.expire_inbox(pool, partitions.Retention(done_hours=ONE_SECOND, dead_days=1.0,
                                                                      dedup_days=1.0))
    # The partition holds a provider that keeps done events a day: it stays, minus the other's row.
    assert not any(report.dropped.values()) and report.deleted == 1
    assert [r["event_id"] for r in await pool.fetch("SELECT event_id FROM hookline.inbox")] == ["l-1"]


async def test_of_two_maintainers_racing_only_the_leader_manages_partitions(database_url: str,
                                                                           pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool, premake=3)
    ran: list[str] = []

    def job(name: str) -> Job:
        manager = partition_manager(pool, partitions.Retention(), interval=0.05)

        async def run() -> None:
            ran.append(name)
            await manager.run()

        return Job(manager.name, run, manager.interval)

    maintainers = [Maintainer("inbox", [job(name)], GatedConnection(database_url), election_interval=0.1)
                   for name in ("a", "b")]
    for m in maintainers:
        await m.start()
    try:
        await eventually(lambda: len(ran) >= 40)
        leaders = [name for name, m in zip("ab", maintainers, strict=True) if m.is_leader]
        assert len(leaders) == 1 and set(ran) == set(leaders)
    finally:
        for m in maintainers:
            await m.stop()
    # Partitions kept being created ahead, one per second, none twice.
    names = [r["name"] for r in await pool.fetch(db.query("list_partitions", "partitions.sql"), INBOX)]
    assert len(names) == len(set(names)) and len(names) >= 5


async def test_a_duplicate_racing_across_a_partition_boundary_is_stored_once(database_url: str,
                                                                            pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool)
    first, second = await db.connect(database_url), await db.connect(database_url)
    try:
        tx = first.transaction()
        await tx.start()
        assert await receive(first, "p", "racer") == ["racer"]  # stored, not committed yet
        await next_second(pool)
        # The copy arrives a partition later and waits on the key the first one holds.
        racing = asyncio.create_task(receive(second, "p", "racer"))
        await eventually(lambda: lock_waiters(pool), what="a statement waiting on the lock")
        await tx.commit()
        assert await racing == []
    finally:
        await first.close()
        await second.close()
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE event_id = 'racer'") == 1


async def test_the_receiver_answers_duplicate_after_the_payload_is_gone(database_url: str, pool: asyncpg.Pool,
                                                                       log_dir: Path) -> None:
    await one_second_partitions(pool)
    apply_provider(database_url, "open", 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    service = receiver(database_url, log_dir)
    try:
        async with aiohttp.ClientSession() as http:
            body = json.dumps({"id": "evt_gone", "type": "t"}).encode()

            async def send() -> tuple[int, object]:
                async with http.post(f"{service.url}/webhooks/open", data=body,
                                     headers={"content-type": "application/json"}) as r:
                    return r.status, await r.json()

            assert await send() == (200, {"status": "accepted", "event_id": "evt_gone"})
            await pool.execute("UPDATE hookline.inbox SET status = 'done', processed_at = now()")
            await next_second(pool)
            await next_second(pool)
            report = await partitions.expire_inbox(pool, partitions.Retention(done_hours=ONE_SECOND,
                                                                              **KEEP_EVERYTHING_ELSE))
            assert sum(report.dropped.values()) == 1
            assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == 0
            assert await send() == (200, {"status": "duplicate", "event_id": "evt_gone"})
            assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == 0
    finally:
        service.stop()


async def test_append_only_tables_are_partitioned_ahead_and_dropped_by_age(pool: asyncpg.Pool) -> None:
    await one_second_partitions(pool)
    # A log like the attempt log: registered with `retain`, it is managed by age alone (migration 0012).
    await pool.execute("CREATE TABLE hookline.test_log (at timestamptz NOT NULL DEFAULT now(), line text) "
                       "PARTITION BY RANGE (at)")
    await pool.execute("INSERT INTO hookline.partition_config (parent, width, premake, retain) "
                       "VALUES ('hookline.test_log', '1 second', 5, '1 second')")
    report = await partitions.manage_partitions(pool, partitions.Retention())
    assert sum(name.startswith("hookline.test_log_p") for name in report.created) == 6
    await pool.execute("INSERT INTO hookline.test_log (line) VALUES ('old')")
    await next_second(pool)
    await next_second(pool)
    await pool.execute("INSERT INTO hookline.test_log (line) VALUES ('new')")
    dropped = await partitions.expire_by_age(pool)
    assert dropped["dropped"] and all(name.startswith("hookline.test_log_p") for name in dropped["dropped"])
    assert [r["line"] for r in await pool.fetch("SELECT line FROM hookline.test_log")] == ["new"]


# --- The outbox: events and their deliveries, partitioned together, retained per endpoint ---------

OUTBOX, DELIVERIES = "hookline.outbox", "hookline.deliveries"
SHORT_ENDPOINT_DEFAULTS = {"endpoint_done_hours": ONE_SECOND, "endpoint_dead_days": 1.0}


async def one_second_outbox_partitions(pool: asyncpg.Pool, premake: int = 30) -> None:
    """Replace the (empty) daily partitions of the outbox and its deliveries by one-second ones."""
    for table in (OUTBOX, DELIVERIES):
        for row in await pool.fetch(db.query("list_partitions", "partitions.sql"), table):
            if not row["is_default"]:
                await pool.execute(f"DROP TABLE {row['name']}")
    await pool.execute(db.query("set_outbox_partition_width", "partitions.sql"), datetime.timedelta(seconds=1),
                       premake)
    for table in (OUTBOX, DELIVERIES):
        await partitions.ensure_partitions(pool, table)


async def add_endpoint(pool: asyncpg.Pool, name: str, *, enabled: bool = True, done_hours: float | None = None,
                       dead_days: float | None = None) -> None:
    async with pool.acquire() as conn:
        await endpoints.add(conn, name, f"https://{name}.example.com/hook", event_types=["t"],
                            done_hours=done_hours, dead_days=dead_days)
    if not enabled:
        await pool.execute("UPDATE hookline.endpoints SET enabled = false WHERE name = $1", name)


async def publish(pool: asyncpg.Pool, tag: str, *, event_type: str = "t", endpoint: str | None = None) -> None:
    async with pool.acquire() as conn:
        await outbox.publish(conn, event_type, {"tag": tag}, endpoint=endpoint)


async def finish(pool: asyncpg.Pool, tag: str, status: str, endpoint: str | None = None) -> None:
    """Book the deliveries of event `tag` (to `endpoint`, or all) as the relay would have."""
    await pool.execute(
        "UPDATE hookline.deliveries AS d SET status = $2, processed_at = now() FROM hookline.outbox AS o "
        "WHERE o.id = d.outbox_id AND o.payload->>'tag' = $1 AND ($3::text IS NULL OR d.endpoint = $3)",
        tag, status, endpoint)


async def deliveries_left(pool: asyncpg.Pool) -> dict[tuple[str, str], str]:
    rows = await pool.fetch("SELECT o.payload->>'tag' AS tag, d.endpoint, d.status FROM hookline.deliveries AS d "
                            "JOIN hookline.outbox AS o ON o.id = d.outbox_id")
    return {(r["tag"], r["endpoint"]): r["status"] for r in rows}


async def events_left(pool: asyncpg.Pool) -> list[str]:
    return sorted(r["tag"] for r in await pool.fetch("SELECT payload->>'tag' AS tag FROM hookline.outbox"))


async def outbox_partition_of(pool: asyncpg.Pool, tag: str) -> str:
    name: str = await pool.fetchval("SELECT tableoid::regclass::text FROM hookline.outbox WHERE payload->>'tag' = $1",
                                    tag)
    return name


async def test_outbox_retention_drops_delivered_pairs_keeps_pending_parked_and_dead(pool: asyncpg.Pool) -> None:
    await one_second_outbox_partitions(pool)
    await add_endpoint(pool, "ep")
    await add_endpoint(pool, "off", enabled=False)  # its deliveries are created parked
    await publish(pool, "delivered", endpoint="ep")
    await publish(pool, "nobody", event_type="unmatched")  # an event no endpoint wanted
    await finish(pool, "delivered", "done")
    await next_second(pool)
    for tag in ("pending", "dead", "done-beside"):
        await publish(pool, tag, endpoint="ep")
    await publish(pool, "parked", endpoint="off")
    await finish(pool, "dead", "dead")
    await finish(pool, "done-beside", "done")
    alone, mixed = await outbox_partition_of(pool, "delivered"), await outbox_partition_of(pool, "pending")
    assert alone != mixed and await outbox_partition_of(pool, "nobody") == alone

    await next_second(pool)
    await next_second(pool)
    report = await partitions.expire_outbox(pool, partitions.Retention(**SHORT_ENDPOINT_DEFAULTS))
    # The second of only delivered events goes whole, events and deliveries together.
    assert {name: rows for name, rows in report.dropped.items() if rows} == {
        alone: 2, alone.replace(OUTBOX, DELIVERIES): 1}
    assert await pool.fetchval("SELECT to_regclass($1)", alone) is None
    # The other stays for its pending, parked and dead deliveries; only the delivered one goes,
    # with its event.
    assert report.deleted_from == {DELIVERIES: 1, OUTBOX: 1} and report.kept == 3
    assert await deliveries_left(pool) == {("pending", "ep"): "pending", ("dead", "ep"): "dead",
                                           ("parked", "off"): "parked"}
    assert await events_left(pool) == ["dead", "parked", "pending"]

    # Dead letters go after deadDays; the pending and parked ones (and their events) never.
    report = await partitions.expire_outbox(pool, partitions.Retention(endpoint_done_hours=ONE_SECOND,
                                                                       endpoint_dead_days=1 / 86400))
    assert report.deleted_from == {DELIVERIES: 1, OUTBOX: 1} and not any(report.dropped.values())
    assert await events_left(pool) == ["parked", "pending"]


async def test_outbox_retention_per_endpoint(pool: asyncpg.Pool) -> None:
    await one_second_outbox_partitions(pool)
    await add_endpoint(pool, "short", done_hours=ONE_SECOND, dead_days=1 / 86400)
    await add_endpoint(pool, "long", done_hours=24, dead_days=1)
    await publish(pool, "both")  # fanned out to both endpoints
    await publish(pool, "short-only", endpoint="short")
    await publish(pool, "short-dead", endpoint="short")
    await publish(pool, "long-dead", endpoint="long")
    await finish(pool, "both", "done")
    await finish(pool, "short-only", "done")
    await finish(pool, "short-dead", "dead")
    await finish(pool, "long-dead", "dead")
    await next_second(pool)
    await next_second(pool)
    # The install's defaults are long; each endpoint's own settings decide for its deliveries.
    report = await partitions.expire_outbox(pool, partitions.Retention(endpoint_done_hours=24, endpoint_dead_days=1))
    assert not any(report.dropped.values())
    assert await deliveries_left(pool) == {("both", "long"): "done", ("long-dead", "long"): "dead"}
    # An event goes with its last delivery, not before.
    assert await events_left(pool) == ["both", "long-dead"]
    assert report.deleted_from == {DELIVERIES: 3, OUTBOX: 2}


async def test_outbox_retention_end_to_end_with_a_real_relay(database_url: str, pool: asyncpg.Pool,
                                                             log_dir: Path) -> None:
    await one_second_outbox_partitions(pool)
    secret = get_scheme("standard-webhooks").generate_secret()
    async with TestEndpoint(secret) as ok, TestEndpoint(secret, lambda n, r: Answer(500)) as failing:
        for name, target in (("ok", ok), ("failing", failing)):
            async with pool.acquire() as conn:
                await endpoints.add(conn, name, target.url, event_types=["t"], secret=secret, max_attempts=1,
                                    done_hours=ONE_SECOND, dead_days=1.0)
        async with pool.acquire() as conn:
            await endpoints.add(conn, "later", "https://later.example.com/hook", event_types=["t"],
                                done_hours=ONE_SECOND)
        await pool.execute("UPDATE hookline.endpoints SET enabled = false WHERE name = 'later'")
        for n in range(5):
            await publish(pool, f"e{n}")
        service = relay(database_url, log_dir, "--allow-private-networks")
        try:
            # (The relay's own partition manager may delete the delivered ones as soon as they are.)
            await eventually(lambda: len({r.webhook_id for r in ok.received}) == 5)
            await eventually(lambda: _count(pool, "SELECT count(*) FROM hookline.deliveries WHERE status = 'dead'", 5))
        finally:
            assert service.stop() == 0
    await next_second(pool)
    await next_second(pool)
    # A pass of the partition manager, as the relays' leader runs it every minute.
    await partitions.manage_partitions(pool, partitions.Retention(endpoint_done_hours=ONE_SECOND))
    left = await deliveries_left(pool)
    # Delivered payloads are gone; every dead and parked delivery and its event is untouched.
    assert sorted(left.values()) == ["dead"] * 5 + ["parked"] * 5
    assert await events_left(pool) == [f"e{n}" for n in range(5)]


async def _count(pool: asyncpg.Pool, sql: str, expected: int) -> bool:
    return bool(await pool.fetchval(sql) == expected)


async def test_a_drop_never_holds_a_partition_while_waiting_for_its_parent(database_url: str,
                                                                         pool: asyncpg.Pool) -> None:
    # DROP TABLE of a partition also locks the parent. A pass that locked the partition first and
    # then waited for the parent deadlocked with any query holding the parent and reading that
    # partition (a claim, a completion); migration 0019 locks the parent first.
    await one_second_partitions(pool)
    assert await receive(pool, "p", "old") == ["old"]
    await pool.execute("UPDATE hookline.inbox SET status = 'done', processed_at = now()")
    await next_second(pool)
    await next_second(pool)
    reader = await db.connect(database_url)
    try:
        tx = reader.transaction()
        await tx.start()
        await reader.execute("SELECT FROM ONLY hookline.inbox")  # holds the parent, no partition yet
        retention = partitions.Retention(done_hours=ONE_SECOND, **KEEP_EVERYTHING_ELSE)
        passing = asyncio.create_task(partitions.expire_inbox(pool, retention))
        await eventually(lambda: lock_waiters(pool), what="a statement waiting on the lock")
        # The reader now reads every partition: it must not wait for the pass (which waits for it).
        assert await reader.fetchval("SELECT count(*) FROM hookline.inbox") == 1
        await tx.commit()
        report = await passing
    finally:
        await reader.close()
    assert report.deferred or report.dropped
    await partitions.expire_inbox(pool, retention)
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox") == 0


async def test_the_install_maximum_is_read_and_never_below_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLINE_RETENTION_DONE_HOURS", "1000")
    assert settings.retention_from_env().max_done_hours == 1000  # unset: raised to the default chosen
    monkeypatch.setenv("HOOKLINE_RETENTION_MAX_DONE_HOURS", "500")
    with pytest.raises(ConfigError, match="HOOKLINE_RETENTION_MAX_DONE_HOURS"):
        settings.retention_from_env()
    monkeypatch.setenv("HOOKLINE_RETENTION_MAX_DONE_HOURS", "two weeks")
    with pytest.raises(ConfigError, match="must be a number"):
        settings.retention_from_env()
