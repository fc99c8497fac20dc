"""The outbox on a real Postgres: publish in the caller's transaction, fan-out, ordering, partitions, CLI."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from hookline import outbox
from hookline.core.queue import OUTBOX
from hookline.relay import endpoints
from hookline.relay.dlq import dlq_outbox
from support.postgres import lock_waiters
from support.processes import hookline_cli
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def count(conn: asyncpg.Connection | asyncpg.Pool, sql: str, *args: object) -> int:
    return int(await conn.fetchval(sql, *args))


async def add(pool: asyncpg.Pool, name: str, *types: str, ordered: bool = False) -> str:
    async with pool.acquire() as conn:
        return await endpoints.add(conn, name, f"https://{name}.example.com/hook", event_types=types,
                                   ordered=ordered)


async def test_rollback_leaves_no_event_and_commit_keeps_it(pool: asyncpg.Pool) -> None:
    await add(pool, "billing", "invoice.*")
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await outbox.publish(conn, "invoice.paid", {"id": 1})
        await tx.rollback()
        assert await count(conn, "SELECT count(*) FROM hookline.outbox") == 0
        assert await count(conn, "SELECT count(*) FROM hookline.deliveries") == 0
        async with conn.transaction():
            event_id = await outbox.publish(conn, "invoice.paid", {"id": 2})
    assert event_id.startswith("msg_") and len(event_id) == 36
    row = await pool.fetchrow("SELECT * FROM hookline.outbox")
    assert row["event_id"] == event_id and row["payload"] == {"id": 2}
    assert await count(pool, "SELECT count(*) FROM hookline.deliveries WHERE status = 'pending'") == 1


async def test_plain_asyncpg_connection_and_sql_function(database_url: str, pool: asyncpg.Pool) -> None:
    await add(pool, "all")
    conn = await asyncpg.connect(database_url)  # no jsonb codec: publish must still store an object
    try:
        await outbox.publish(conn, "a.b", {"nested": [1, "two"]}, aggregate_type="order", aggregate_id="7")
        via_sql = await conn.fetchval("SELECT hookline.publish('a.c', '{\"x\": 1}'::jsonb, NULL, NULL, NULL)")
        named = await conn.fetchval("SELECT hookline.publish(event_type => 'a.d', payload => '[]')")
    finally:
        await conn.close()
    rows = await pool.fetch("SELECT event_id, payload FROM hookline.outbox ORDER BY id")
    assert [r["payload"] for r in rows] == [{"nested": [1, "two"]}, {"x": 1}, []]
    assert rows[1]["event_id"] == via_sql and rows[2]["event_id"] == named
    assert len({r["event_id"] for r in rows}) == 3


async def test_fan_out_matches_exact_prefix_and_all(pool: asyncpg.Pool) -> None:
    await add(pool, "exact", "invoice.paid")
    await add(pool, "prefix", "invoice.*")
    await add(pool, "everything")
    await add(pool, "other", "customer.created", "refund.*")
    async with pool.acquire() as conn:
        await outbox.publish(conn, "invoice.paid", {})
        await outbox.publish(conn, "invoice.voided", {})
        await outbox.publish(conn, "invoiceX.paid", {})  # 'invoice.*' must not match 'invoiceX.'
        await outbox.publish(conn, "refund.created", {})
        await outbox.publish(conn, "invoice.paid", {}, endpoint="other")  # explicit target, whatever its types
        with pytest.raises(asyncpg.InvalidParameterValueError, match="no endpoint named"):
            await outbox.publish(conn, "invoice.paid", {}, endpoint="missing")
        with pytest.raises(asyncpg.InvalidParameterValueError):
            await outbox.publish(conn, "", {})
    rows = await pool.fetch("""SELECT o.event_type, array_agg(d.endpoint ORDER BY d.endpoint) AS eps
                               FROM hookline.outbox o LEFT JOIN hookline.deliveries d ON d.outbox_id = o.id
                               GROUP BY o.id, o.event_type ORDER BY o.id""")
    assert [(r["event_type"], r["eps"]) for r in rows] == [
        ("invoice.paid", ["everything", "exact", "prefix"]),
        ("invoice.voided", ["everything", "prefix"]),
        ("invoiceX.paid", ["everything"]),
        ("refund.created", ["everything", "other"]),
        ("invoice.paid", ["other"]),
    ]


async def test_claim_takes_late_committing_lower_ids(pool: asyncpg.Pool) -> None:
    """A transaction that drew a lower id but commits later is not skipped: claims go by status."""
    await add(pool, "ep")
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        early = await outbox.publish(slow, "t", {"n": 1})  # lower id, still uncommitted
        async with pool.acquire() as conn:
            late = await outbox.publish(conn, "t", {"n": 2})
        claimed = await OUTBOX.claim(pool, "ep", 10, "test", 30)
        assert len(claimed) == 1
        await OUTBOX.complete(pool, [(claimed[0]["id"], claimed[0]["attempts"])], "test")
        await tx.commit()
    finally:
        await pool.release(slow)
    claimed = await OUTBOX.claim(pool, "ep", 10, "test", 30)
    ids = await pool.fetch("SELECT o.event_id FROM hookline.outbox o JOIN hookline.deliveries d "
                           "ON d.outbox_id = o.id WHERE d.id = $1", claimed[0]["id"])
    assert [r["event_id"] for r in ids] == [early]
    assert late != early


async def test_same_aggregate_publishers_serialize_so_id_order_is_commit_order(pool: asyncpg.Pool) -> None:
    await add(pool, "ep", ordered=True)
    first = await pool.acquire()
    try:
        tx = first.transaction()
        await tx.start()
        await outbox.publish(first, "t", {"n": 1}, aggregate_type="order", aggregate_id="1")

        async def second() -> None:
            async with pool.acquire() as conn, conn.transaction():
                await outbox.publish(conn, "t", {"n": 2}, aggregate_type="order", aggregate_id="1")

        waiting = asyncio.create_task(second())

        async def held_or_done() -> bool:
            return waiting.done() or await lock_waiters(pool) > 0

        await eventually(held_or_done, what="the second publisher waiting on a lock (or done)")
        assert not waiting.done(), "a second publisher for the same aggregate must wait for the first"
        async with pool.acquire() as conn:  # other aggregates are not held up
            await asyncio.wait_for(outbox.publish(conn, "t", {"n": 0}, aggregate_type="order", aggregate_id="2"), 2)
        await tx.commit()
        await asyncio.wait_for(waiting, 5)
    finally:
        await pool.release(first)
    rows = await pool.fetch("SELECT payload FROM hookline.outbox WHERE aggregate_id = '1' ORDER BY id")
    assert [r["payload"]["n"] for r in rows] == [1, 2]


async def test_ordered_claim_holds_back_an_aggregate_not_the_others(pool: asyncpg.Pool) -> None:
    await add(pool, "ep", ordered=True)
    async with pool.acquire() as conn:
        for n in range(3):
            for agg in ("a", "b"):
                await outbox.publish(conn, "t", {"agg": agg, "n": n}, aggregate_type="x", aggregate_id=agg)
        await outbox.publish(conn, "t", {"agg": None, "n": 0})  # no aggregate: never held back

    async def claim() -> list[tuple[str | None, int]]:
        rows = await OUTBOX.claim(pool, "ep", 100, "test", 30, ordered=True)
        payloads = await pool.fetch("SELECT o.payload FROM hookline.outbox o JOIN hookline.deliveries d "
                                    "ON d.outbox_id = o.id WHERE d.id = ANY($1::bigint[]) ORDER BY d.id",
                                    [r["id"] for r in rows])
        return [(p["payload"]["agg"], p["payload"]["n"]) for p in payloads]

    first = await claim()
    assert sorted(first, key=str) == sorted([("a", 0), ("b", 0), (None, 0)], key=str)
    assert await claim() == []  # a0 and b0 are in flight: a1 and b1 wait
    ids = {r["agg"]: r["id"] for r in await pool.fetch(
        "SELECT d.id, o.payload->>'agg' AS agg FROM hookline.deliveries d JOIN hookline.outbox o "
        "ON o.id = d.outbox_id WHERE d.status = 'processing'")}
    await OUTBOX.retry(pool, ids["b"], 1, "test", 0, "HTTP 500")  # b0 failed: b1 still waits for it
    await OUTBOX.complete(pool, [(ids["a"], 1)], "test")
    assert sorted(await claim(), key=str) == [("a", 1), ("b", 0)]


async def test_deliveries_live_in_the_partition_of_their_event(pool: asyncpg.Pool) -> None:
    # Retention drops an event's partition with its deliveries' (migration 0018): both tables are
    # partitioned by the event's created_at, which each delivery carries.
    await add(pool, "one")
    await add(pool, "two")
    async with pool.acquire() as conn:
        await outbox.publish(conn, "t", {})
    rows = await pool.fetch(
        "SELECT o.tableoid::regclass::text AS event_partition, d.tableoid::regclass::text AS delivery_partition, "
        "o.created_at = d.created_at AS same_time FROM hookline.outbox AS o JOIN hookline.deliveries AS d "
        "ON d.outbox_id = o.id")
    assert len(rows) == 2 and all(r["same_time"] for r in rows)
    assert {r["event_partition"].removeprefix("hookline.outbox") for r in rows} == {
        r["delivery_partition"].removeprefix("hookline.deliveries") for r in rows}
    assert not any(r["event_partition"].endswith("_default") for r in rows)


async def test_dlq_list_and_replay_by_endpoint_and_window(pool: asyncpg.Pool) -> None:
    await add(pool, "one")
    await add(pool, "two")
    async with pool.acquire() as conn:
        await outbox.publish(conn, "t", {})
    for name in ("one", "two"):
        row = (await OUTBOX.claim(pool, name, 1, "test", 30))[0]
        await OUTBOX.bury(pool, row["id"], row["attempts"], "test", "HTTP 500: nope")
    async with pool.acquire() as conn:
        listing = await dlq_outbox(conn, "list")
        assert len(listing) == 3 and "HTTP 500: nope" in listing[1]
        future = datetime.now(UTC) + timedelta(hours=1)
        assert await dlq_outbox(conn, "replay", endpoint="one", since=future) == ["no dead deliveries matched"]
        assert await dlq_outbox(conn, "replay", endpoint="one") == ["endpoint/one: requeued 1 dead deliveries"]
    statuses = dict(await pool.fetch("SELECT endpoint, status FROM hookline.deliveries"))  # type: ignore[arg-type]
    assert statuses == {"one": "pending", "two": "dead"}


async def test_endpoints_cli_shows_the_secret_once(database_url: str) -> None:
    added = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "partner", "--url",
                                    "https://partner.example.com/hooks", "--event-type", "invoice.*", "--ordered")
    assert added.returncode == 0, added.stderr
    secret = added.stdout.split("shown once; verify deliveries with it): ")[1].strip()
    assert secret.startswith("whsec_")
    listed = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "list")
    assert listed.returncode == 0 and "partner" in listed.stdout and "invoice.*" in listed.stdout
    assert secret not in listed.stdout and secret.removeprefix("whsec_") not in listed.stdout
    assert endpoints.fingerprint(secret) in listed.stdout
    again = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "partner", "--url",
                                    "https://x.example.com/")
    assert again.returncode == 2 and "exists already" in again.stderr
    bad = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "bad", "--url", "ftp://x/",
                                  "--secret", "whsec_!!!")
    assert bad.returncode == 2 and "URL" in bad.stderr and "!!!" not in bad.stderr
    given = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "given", "--url",
                                    "https://g.example.com/", "--secret", secret)
    assert given.returncode == 0 and secret not in given.stdout + given.stderr
    deleted = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "delete", "partner")
    assert deleted.returncode == 0
    missing = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "delete", "partner")
    assert missing.returncode == 2


async def test_endpoint_retention_from_the_cli(database_url: str, pool: asyncpg.Pool) -> None:
    added = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "kept", "--url",
                                    "https://kept.example.com/", "--done-hours", "6", "--dead-days", "30")
    assert added.returncode == 0, added.stderr
    row = await pool.fetchrow("SELECT retention_done_hours, retention_dead_days FROM hookline.endpoints")
    assert tuple(row) == (6.0, 30.0)
    for flags in (["--done-hours", "0"], ["--dead-days", "-1"], ["--done-hours", "1e9"]):
        bad = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "set-retention", "kept", *flags)
        assert bad.returncode == 2 and flags[0] in bad.stderr
    assert tuple(await pool.fetchrow("SELECT retention_done_hours, retention_dead_days FROM hookline.endpoints")) == (
        6.0, 30.0)
    reset = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "set-retention", "kept",
                                    "--done-hours", "1.5")
    assert reset.returncode == 0 and "1.5h" in reset.stdout and "default" in reset.stdout
    assert tuple(await pool.fetchrow("SELECT retention_done_hours, retention_dead_days FROM hookline.endpoints")) == (
        1.5, None)
    listed = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "list")
    assert "1.5h/default" in listed.stdout
    missing = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "set-retention", "nope")
    assert missing.returncode == 2 and "no endpoint named" in missing.stderr
