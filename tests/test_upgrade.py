"""Upgrading in place to the partitioned inbox (migration 0011): a database populated through the
previous schema keeps every event, its id and its state; duplicates of old events are still
recognised; workers then process what was pending or leased, and leave done and dead alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hookline.core import db, migrations
from support.inbox import apply_provider, create_effect_tables, wait_for
from support.postgres import PgServer
from support.processes import worker

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
        stored = await conn.fetch(db.query("insert_inbox_batch"), ["legacy", "legacy"], ["done-1", "new-1"],
                                  ["t", "t"], [None, None], ["{}", "{}"], [b"{}", b"{}"], [None, None])
        assert [r["event_id"] for r in stored] == ["new-1"]
        assert await conn.fetchval("SELECT id FROM hookline.inbox WHERE event_id = 'new-1'") > max(
            r["id"] for r in before)
        await create_effect_tables(conn)
    finally:
        await conn.close()

    apply_provider(old_database, "legacy", """
signature: {scheme: none}
handler: "support.handlers:record_effect"
retry: {maxAttempts: 12, initialDelaySeconds: 0, maxDelaySeconds: 0}
leaseSeconds: 5
""")
    w = worker(old_database, log_dir, "--concurrency", "4", "--sweep")
    try:
        conn = await asyncpg.connect(old_database)
        try:
            # pending-1, pending-2, the expired lease (swept, then run alone) and new-1.
            await wait_for(conn, "SELECT count(*) FROM test_effects", 4, timeout=90)
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
