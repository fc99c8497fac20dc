"""Upgrading in place to the partitioned inbox (migration 0011) and outbox (0018): a database
populated through the previous schema keeps every event, its id and its state; duplicates of old
events are still recognised; workers and relays then process what was pending or leased, and
leave done, dead and parked alone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hookline.core import migrations
from hookline.core.signatures import get_scheme
from hookline.receiver.group_commit import INSERT_BATCH
from support.endpoints import TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.postgres import PgServer
from support.processes import relay, worker
from support.waiting import eventually

PREVIOUS_SCHEMA = 10

# Rows in every state, written as the previous schema's services wrote them.
OLD_ROWS = """
INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, next_attempt_at,
                            lease_expires_at, locked_by, processed_at, last_error, received_at)
VALUES
    ('legacy', 'pending-1', 't', '{"n": 1}', 'pending', 0, now(), NULL, NULL, NULL, NULL, now() - interval '2 days'),
    ('legacy', 'pending-2', 't', '{"n": 2}', 'pending', 1, now(), NULL, NULL, NULL, 'boom', now() - interval '1 hour'),
    ('legacy', 'processing-1', 't', '{"n": 3}', 'processing', 1, now(), now() - interval '1 minute',
     'worker-gone', NULL, NULL, now() - interval '5 minutes'),
    ('legacy', 'done-1', 't', '{"n": 4}', 'done', 1, now(), NULL, NULL, now(), NULL, now() - interval '3 days'),
    ('legacy', 'dead-1', 't', '{"n": 5}', 'dead', 12, now(), NULL, NULL, now(), 'gave up', now() - interval '1 day')
"""

# The old rows' provider, as the upgraded services run it: retries at once, leases short enough for
# the expired one to be swept within the test.
LEGACY_PROVIDER = """
signature: {scheme: none}
handler: "support.handlers:record_effect"
retry: {maxAttempts: 12, initialDelaySeconds: 0, maxDelaySeconds: 0}
leaseSeconds: 5
"""

SNAPSHOT = "SELECT id, provider, event_id, status, attempts, received_at, body FROM hookline.inbox ORDER BY id"


@pytest.fixture
async def old_database(pg_server: PgServer) -> AsyncIterator[str]:
    """A database migrated only up to the previous schema (not from the test template)."""
    name = await pg_server.create_database(template=None)
    try:
        yield pg_server.url_for(name)
    finally:
        await pg_server.drop_database(name)


async def test_upgrade_keeps_every_event_and_its_state(old_database: str, log_dir: Path) -> None:
    conn = await asyncpg.connect(old_database)
    try:
        await migrations.migrate(conn, up_to=PREVIOUS_SCHEMA)
        assert await conn.fetchval("SELECT to_regclass('hookline.inbox_keys')") is None
        await conn.execute(OLD_ROWS)
        before = [dict(r) for r in await conn.fetch(SNAPSHOT)]

        applied = await migrations.migrate(conn)
        assert applied and applied[0].startswith("0011_")

        assert [dict(r) for r in await conn.fetch(SNAPSHOT)] == before
        assert await conn.fetchval(
            "SELECT relkind::text FROM pg_class WHERE oid = 'hookline.inbox'::regclass") == "p"
        assert await conn.fetchval("SELECT count(*) FROM hookline.inbox_keys WHERE provider = 'legacy'") == 5

        # An old event sent again is a duplicate; a new one is stored after the old ids.
        stored = await conn.fetch(INSERT_BATCH, ["legacy", "legacy"], ["done-1", "new-1"],
                                  ["t", "t"], [None, None], ["{}", "{}"], [b"{}", b"{}"], [None, None])
        assert [r["event_id"] for r in stored] == ["new-1"]
        assert await conn.fetchval("SELECT id FROM hookline.inbox WHERE event_id = 'new-1'") > max(
            r["id"] for r in before)
        await create_effect_tables(conn)
    finally:
        await conn.close()

    apply_provider(old_database, "legacy", LEGACY_PROVIDER)
    w = worker(old_database, log_dir, "--concurrency", "4", "--sweep")
    try:
        conn = await asyncpg.connect(old_database)
        try:
            # pending-1, pending-2, the expired lease (swept, then run alone) and new-1.
            await eventually(lambda: conn.fetchval("SELECT count(*) FROM test_effects"), equals=4, timeout=90)
            states = {r["event_id"]: r["status"] for r in await conn.fetch(
                "SELECT event_id, status FROM hookline.inbox")}
            effects = sorted(r["event_id"] for r in await conn.fetch("SELECT event_id FROM test_effects"))
        finally:
            await conn.close()
    finally:
        assert w.stop() == 0
    assert effects == ["new-1", "pending-1", "pending-2", "processing-1"]
    assert states == {"pending-1": "done", "pending-2": "done", "processing-1": "done", "new-1": "done",
                      "done-1": "done", "dead-1": "dead"}


# --- The outbox partitioned with its deliveries (migration 0018) -------------------------------------

OUTBOX_SCHEMA = 15

# Deliveries in every state, as the schema-15 relay left them: `live` is the endpoint a real
# relay delivers to afterwards, `off` was disabled by a 410 (its deliveries parked).
OLD_DELIVERY_STATES = """
UPDATE hookline.deliveries AS d SET status = s.status, attempts = s.attempts, processed_at = s.processed_at,
       lease_expires_at = s.lease_expires_at, locked_by = s.locked_by, last_error = s.last_error
FROM hookline.outbox AS o, (VALUES
    ('pending', 'pending', 0, NULL::timestamptz, NULL::timestamptz, NULL, NULL),
    ('retrying', 'pending', 2, NULL, NULL, NULL, 'HTTP 503'),
    ('in-flight', 'processing', 1, NULL, now() - interval '1 minute', 'relay-gone', NULL),
    ('delivered', 'done', 1, now(), NULL, NULL, NULL),
    ('given-up', 'dead', 12, now(), NULL, NULL, 'HTTP 500')
) AS s(tag, status, attempts, processed_at, lease_expires_at, locked_by, last_error)
WHERE o.id = d.outbox_id AND o.payload->>'tag' = s.tag AND d.endpoint = 'live'
"""

DELIVERIES_SNAPSHOT = """
SELECT d.id, d.outbox_id, d.endpoint, d.status, d.attempts, d.created_at, o.event_id, o.payload, o.created_at
FROM hookline.deliveries AS d JOIN hookline.outbox AS o ON o.id = d.outbox_id ORDER BY d.id
"""


async def test_upgrade_keeps_every_outbox_event_and_delivery_and_a_relay_delivers(old_database: str,
                                                                                  log_dir: Path) -> None:
    secret = get_scheme("standard-webhooks").generate_secret()
    async with TestEndpoint(secret) as live:
        conn = await asyncpg.connect(old_database)
        try:
            await migrations.migrate(conn, up_to=OUTBOX_SCHEMA)
            await conn.execute(
                "INSERT INTO hookline.endpoints (name, url, event_types, secrets, enabled, initial_delay_seconds) "
                "VALUES ('live', $1, '{t}', $2::text::jsonb, true, 0), "
                "('off', 'https://off.example.com/', '{t}', $2::text::jsonb, false, 0)",
                live.url, json.dumps([{"value": secret, "notAfter": None}]))
            for tag in ("pending", "retrying", "in-flight", "delivered", "given-up"):
                await conn.execute("SELECT hookline.publish('t', jsonb_build_object('tag', $1::text))", tag)
            await conn.execute("SELECT hookline.publish('unwanted', '{\"tag\": \"nobody\"}')")
            await conn.execute(OLD_DELIVERY_STATES)
            before = [dict(r) for r in await conn.fetch(DELIVERIES_SNAPSHOT)]
            events_before = await conn.fetchval("SELECT count(*) FROM hookline.outbox")

            applied = await migrations.migrate(conn)
            assert any(name.startswith("0018_") for name in applied)

            assert [dict(r) for r in await conn.fetch(DELIVERIES_SNAPSHOT)] == before
            assert await conn.fetchval("SELECT count(*) FROM hookline.outbox") == events_before == 6
            assert [r["relkind"] for r in await conn.fetch(
                "SELECT relkind::text FROM pg_class WHERE oid IN ('hookline.outbox'::regclass, "
                "'hookline.deliveries'::regclass)")] == ["p", "p"]
            assert {r["state"] for r in await conn.fetch(
                "SELECT status AS state FROM hookline.deliveries WHERE endpoint = 'off'")} == {"parked"}
            # A new event is published after the old ids, into today's partition.
            await conn.execute("SELECT hookline.publish('t', '{\"tag\": \"new\"}')")
            assert await conn.fetchval("SELECT min(id) FROM hookline.outbox WHERE payload->>'tag' = 'new'") > max(
                r["outbox_id"] for r in before)
        finally:
            await conn.close()

        service = relay(old_database, log_dir, "--allow-private-networks")
        try:
            # pending, retrying, the expired lease (swept, then sent alone) and the new event.
            await eventually(lambda: len({r.webhook_id for r in live.received}) == 4, timeout=90)
            conn = await asyncpg.connect(old_database)
            try:
                await eventually(lambda: conn.fetchval(
                    "SELECT count(*) FROM hookline.deliveries WHERE endpoint = 'live' AND status = 'done'"),
                    equals=5, timeout=30)
                states = {(r["tag"], r["endpoint"]): r["status"] for r in await conn.fetch(
                    "SELECT o.payload->>'tag' AS tag, d.endpoint, d.status FROM hookline.deliveries AS d "
                    "JOIN hookline.outbox AS o ON o.id = d.outbox_id")}
            finally:
                await conn.close()
        finally:
            assert service.stop() == 0
    assert sorted({r.body["data"]["tag"] for r in live.received if r.status == 200}) == [
        "in-flight", "new", "pending", "retrying"]
    assert {k: v for k, v in states.items() if k[1] == "live"} == {
        ("pending", "live"): "done", ("retrying", "live"): "done", ("in-flight", "live"): "done",
        ("delivered", "live"): "done", ("given-up", "live"): "dead", ("new", "live"): "done"}
    assert {v for k, v in states.items() if k[1] == "off"} == {"parked"}



# --- Claims without the queue state's statistics (migration 0028) -----------------------------------

CLAIM_STATISTICS_SCHEMA = 27
QUEUE_STATE_COLUMNS = {"hookline.inbox": {"status"}, "hookline.deliveries": {"status", "attempts"}}


async def collected_statistics(conn: asyncpg.Connection) -> set[tuple[str, str]]:
    """(table, column) of the queue-state columns ANALYZE has statistics of, in any partition."""
    rows = await conn.fetch("SELECT tablename, attname FROM pg_stats WHERE schemaname = 'hookline' AND "
                            "attname IN ('status', 'attempts') AND (tablename LIKE 'inbox%' OR tablename LIKE "
                            "'deliveries%') AND tablename NOT LIKE 'inbox_keys%'")
    return {(r["tablename"], r["attname"]) for r in rows if not (r["attname"] == "attempts"
                                                                 and r["tablename"].startswith("inbox"))}


async def test_upgrade_drops_the_queue_state_statistics_and_workers_and_a_relay_drain_every_state(
        old_database: str, log_dir: Path) -> None:
    secret = get_scheme("standard-webhooks").generate_secret()
    async with TestEndpoint(secret) as live:
        conn = await asyncpg.connect(old_database)
        try:
            await migrations.migrate(conn, up_to=CLAIM_STATISTICS_SCHEMA)
            await conn.execute(OLD_ROWS)
            await conn.execute("INSERT INTO hookline.endpoints (name, url, event_types, secrets, enabled, "
                               "initial_delay_seconds) VALUES ('live', $1, '{t}', $2::text::jsonb, true, 0)",
                               live.url, json.dumps([{"value": secret, "notAfter": None}]))
            for tag in ("pending", "retrying", "in-flight", "delivered", "given-up"):
                await conn.execute("SELECT hookline.publish('t', jsonb_build_object('tag', $1::text))", tag)
            await conn.execute(OLD_DELIVERY_STATES)
            await conn.execute("ANALYZE hookline.inbox; ANALYZE hookline.deliveries")
            assert await collected_statistics(conn)  # what the upgrade is to remove
            before = [dict(r) for r in await conn.fetch(SNAPSHOT)], [
                dict(r) for r in await conn.fetch(DELIVERIES_SNAPSHOT)]

            applied = await migrations.migrate(conn)
            assert applied[0][:4] == "0028"  # and whatever came after it

            assert ([dict(r) for r in await conn.fetch(SNAPSHOT)],
                    [dict(r) for r in await conn.fetch(DELIVERIES_SNAPSHOT)]) == before
            for table, columns in QUEUE_STATE_COLUMNS.items():
                targets = await conn.fetch(
                    "SELECT t.relid::regclass::text AS rel, a.attname FROM pg_partition_tree($1::regclass) AS t "
                    "JOIN pg_attribute AS a ON a.attrelid = t.relid WHERE a.attnum > 0 AND a.attstattarget = 0", table)
                assert {r["attname"] for r in targets} == columns
                assert len(targets) == len(columns) * await conn.fetchval(
                    "SELECT count(*) FROM pg_partition_tree($1::regclass)", table)
            await conn.execute("ANALYZE hookline.inbox; ANALYZE hookline.deliveries")
            if conn.get_server_version().major >= 18:  # older servers keep them until retention drops them
                assert await collected_statistics(conn) == set()
            await create_effect_tables(conn)
        finally:
            await conn.close()

        apply_provider(old_database, "legacy", LEGACY_PROVIDER)
        services = [worker(old_database, log_dir, "--concurrency", "4", "--sweep"),
                    relay(old_database, log_dir, "--allow-private-networks")]
        try:
            conn = await asyncpg.connect(old_database)
            try:
                # The inbox's pending, retried and expired (swept, then run alone) events; the same deliveries.
                await eventually(lambda: conn.fetchval("SELECT count(*) FROM test_effects"), equals=3, timeout=90)
                await eventually(lambda: conn.fetchval(
                    "SELECT count(*) FROM hookline.deliveries WHERE status = 'done'"), equals=4, timeout=90)
                inbox = {r["event_id"]: r["status"] for r in await conn.fetch(
                    "SELECT event_id, status FROM hookline.inbox")}
                deliveries = {r["tag"]: r["status"] for r in await conn.fetch(
                    "SELECT o.payload->>'tag' AS tag, d.status FROM hookline.deliveries AS d "
                    "JOIN hookline.outbox AS o ON o.id = d.outbox_id")}
            finally:
                await conn.close()
        finally:
            assert [s.stop() for s in services] == [0, 0]
    assert inbox == {"pending-1": "done", "pending-2": "done", "processing-1": "done", "done-1": "done",
                     "dead-1": "dead"}
    assert deliveries == {"pending": "done", "retrying": "done", "in-flight": "done", "delivered": "done",
                          "given-up": "dead"}
    assert sorted({r.body["data"]["tag"] for r in live.received if r.status == 200}) == [
        "in-flight", "pending", "retrying"]
