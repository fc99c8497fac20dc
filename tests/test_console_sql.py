"""The console's reads (core/sql/console.sql, console/store.py) against a real Postgres.

Row-level security: a transaction of ``Store.scoped`` for provider A reads nothing of provider B,
even with hand-written SQL, and no secret column at all. Plans: each list and count reads the
console's indexes (migration 0029), the partial ones for the dead letters, never a whole inbox
partition (the approach of tests/test_sql.py, on a larger table)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from hookline.console.access import Access
from hookline.console.store import BadRequest, EventFilter, Forbidden, NotFound, Store
from hookline.core import db

ONLY_A = Access(subject="team-a", read=frozenset({"a"}), replay=frozenset({"a"}), install_wide=False)
READS_B = Access(subject="reader", read=frozenset({"a", "b"}), replay=frozenset({"a"}), install_wide=False)
EVERYONE = Access(subject="admin", read=None, replay=None, install_wide=True)
CONSOLE_ROLE = "SELECT name FROM hookline.console_role"


async def seed(pool: asyncpg.Pool) -> None:
    await pool.execute("""
        INSERT INTO hookline.providers (name, spec, secrets, destination_secret)
        VALUES ('a', '{"signature": {"scheme": "none"}}', '["SECRET-A"]', 'DEST-A'),
               ('b', '{"signature": {"scheme": "none"}}', '["SECRET-B"]', 'DEST-B');
        INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, processed_at, received_at)
        SELECT p, p || '_evt_' || g, 'order.created', convert_to('{"n": ' || g || '}', 'UTF8'),
               CASE WHEN g % 5 = 0 THEN 'dead' ELSE 'done' END, now(), now() - g * interval '1 minute'
        FROM unnest(ARRAY['a', 'b']) AS p, generate_series(1, 30) AS g;
        INSERT INTO hookline.endpoints (name, url, secrets) VALUES ('e', 'https://example.com/h', '["ESECRET"]');
    """)
    await pool.execute("INSERT INTO hookline.attempts (queue, row_id, part, attempt, outcome, error) "
                       "SELECT 'inbox', id, provider, 1, 'dead', 'boom' FROM hookline.inbox WHERE status = 'dead'")


async def test_a_scope_for_provider_a_reads_nothing_of_b_even_by_hand(pool: asyncpg.Pool) -> None:
    await seed(pool)
    store = Store(pool)
    async with store.scoped(ONLY_A) as conn:
        assert {r["provider"] for r in await conn.fetch("SELECT * FROM hookline.inbox")} == {"a"}
        assert [r["name"] for r in await conn.fetch("SELECT name FROM hookline.providers")] == ["a"]
        assert {r["part"] for r in await conn.fetch("SELECT part FROM hookline.attempts")} == {"a"}
        assert await conn.fetch("SELECT name FROM hookline.endpoints") == []
        assert await conn.fetch("SELECT id FROM hookline.deliveries") == []
        assert await conn.fetchval("SELECT current_user") == await pool.fetchval(CONSOLE_ROLE)
    async with store.scoped(ONLY_A) as conn:
        # Partitions carry no policy: the role may not read them at all.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT * FROM hookline.inbox_default")
    for secret in ("SELECT secrets FROM hookline.providers", "SELECT destination_secret FROM hookline.providers",
                   "SELECT * FROM hookline.providers", "SELECT secrets FROM hookline.endpoints"):
        async with store.scoped(EVERYONE) as conn:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch(secret)
    async with store.scoped(ONLY_A) as conn:
        # Writing is not the role's either.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE hookline.inbox SET status = 'pending'")


async def test_without_settings_the_role_reads_nothing(pool: asyncpg.Pool) -> None:
    await seed(pool)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f"SET LOCAL ROLE {await conn.fetchval(CONSOLE_ROLE)}")
        assert await conn.fetchval("SELECT count(*) FROM hookline.inbox") == 0
        assert await conn.fetchval("SELECT count(*) FROM hookline.endpoints") == 0


async def test_the_store_lists_and_pages_only_what_the_access_reads(pool: asyncpg.Pool) -> None:
    await seed(pool)
    store = Store(pool)
    assert [p["name"] for p in await store.providers(ONLY_A)] == ["a"]
    assert (await store.providers(ONLY_A))[0]["dead"] == 6
    with pytest.raises(NotFound):
        await store.provider(ONLY_A, "b")
    seen: list[str] = []
    cursor = None
    while True:
        items, cursor = await store.events(EVERYONE, EventFilter(), limit=7, cursor=cursor)
        seen += [f"{i['provider']}:{i['event_id']}" for i in items]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 60
    items, _ = await store.events(ONLY_A, EventFilter(provider="b"))
    assert items == []
    dead, _ = await store.dead_letters(ONLY_A, EventFilter())
    assert {d["provider"] for d in dead} == {"a"} and len(dead) == 6
    with pytest.raises(NotFound):
        await store.event(ONLY_A, "b", "b_evt_5")
    event = await store.event(ONLY_A, "a", "a_evt_5")
    assert event["body_json"] == {"n": 5} and event["attempt_log"][0]["error"] == "boom"
    with pytest.raises(BadRequest):
        await store.events(ONLY_A, EventFilter(), cursor="not-a-cursor")


async def test_a_replay_needs_the_right_and_is_recorded(pool: asyncpg.Pool) -> None:
    await seed(pool)
    store = Store(pool)
    with pytest.raises(Forbidden):
        await store.replay(READS_B, provider="b", filters=EventFilter(provider="b"))
    with pytest.raises(NotFound):
        await store.replay(ONLY_A, filters=EventFilter(provider="b"))
    # Every provider the Access may replay: a only, though it reads b too.
    assert (await store.replay(READS_B, filters=EventFilter(), dry_run=True))["count"] == 6
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 12
    done = await store.replay(READS_B, filters=EventFilter())
    assert done["count"] == 6 and done["providers"] == {"a": 6}
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead' AND provider = 'b'") == 6
    assert await pool.fetchval("SELECT count(*) FROM hookline.attempts WHERE outcome = 'replayed' "
                               "AND worker = 'console:reader' AND part = 'a'") == 6


# -- plans ----------------------------------------------------------------------------------------

BIG_INBOX = """
INSERT INTO hookline.providers (name, spec) SELECT 'p' || g, '{}' FROM generate_series(0, 9) AS g;
INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, received_at, processed_at)
SELECT 'p' || g % 10, 'evt_' || g, 't' || g % 7, '\\x'::bytea,
       CASE WHEN g % 1000 = 0 THEN 'dead' WHEN g % 100 = 0 THEN 'pending' ELSE 'done' END,
       now() - (g % 4) * interval '1 day' - g * interval '1 millisecond', now()
FROM generate_series(1, 200000) AS g;
ANALYZE;
"""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


async def _plan(conn: asyncpg.Connection, sql: str, *args: object) -> list[dict[str, Any]]:
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    plan = json.loads(raw) if isinstance(raw, str) else raw  # the pool's connections decode json
    return _nodes(plan[0]["Plan"])


@pytest.mark.timeout(300)
async def test_the_lists_read_the_console_indexes(pool: asyncpg.Pool) -> None:
    await pool.execute(BIG_INBOX)
    store = Store(pool)
    names = [f"p{g}" for g in range(10)]
    console_key = "(provider, received_at, id)"
    dead_only = "WHERE (status = 'dead'::text)"
    cases = {
        "events": (db.query("events_page", "console.sql", dead=False),
                   (names, None, None, None, None, None, None, None, None, 51), [console_key]),
        "events of a type": (db.query("events_page", "console.sql", dead=False),
                             (["p1"], None, "t3", None, None, None, None, None, None, 51), [console_key]),
        "dead letters": (db.query("events_page", "console.sql", dead=True),
                         (names, None, None, None, None, None, None, None, None, 51), [console_key, dead_only]),
        "replay count": (db.query("dead_to_replay", "console.sql"),
                         (names, None, None, None, None, None, None, 10001), [console_key, dead_only]),
        "one event": (db.query("event", "console.sql"), ("p1", "evt_11", 1024), ["(provider, event_id)"]),
    }
    for label, (sql, args, wanted) in cases.items():
        async with store.scoped(EVERYONE) as conn:
            nodes = await _plan(conn, sql, *args)
        scans = [n for n in nodes if "Scan" in n["Node Type"] and n.get("Relation Name", "").startswith("inbox")]
        assert scans, label
        # An empty partition (the premade future ones) is read whole at no cost; a filled one never.
        filled = {r["relname"] for r in await pool.fetch(
            "SELECT relname FROM pg_class WHERE relnamespace = 'hookline'::regnamespace AND reltuples > 0")}
        assert not [n["Relation Name"] for n in scans
                    if n["Node Type"] == "Seq Scan" and n["Relation Name"] in filled], label
        used = [n["Index Name"] for n in nodes if "Index Name" in n]
        definitions = [d for d in [await pool.fetchval("SELECT indexdef FROM pg_indexes WHERE schemaname = 'hookline' "
                                                       "AND indexname = $1", name) for name in used]
                       if d and " ON hookline.inbox" in d]
        assert definitions, label
        assert all(all(w in d for w in wanted) for d in definitions), (label, definitions)


async def test_every_read_is_bounded_by_the_statement_timeout(pool: asyncpg.Pool) -> None:
    store = Store(pool, statement_timeout=0.2)
    async with store.scoped(EVERYONE) as conn:
        assert await conn.fetchval("SHOW statement_timeout") == "200ms"
    with pytest.raises(asyncpg.QueryCanceledError):
        async with store.scoped(EVERYONE) as conn:
            await conn.execute("SELECT pg_sleep(2)")
    # The setting ends with the transaction: the pool's connection is as it was.
    assert await pool.fetchval("SHOW statement_timeout") != "200ms"
    assert await pool.fetchval("SELECT current_user") != await pool.fetchval(CONSOLE_ROLE)


BIG_OUTBOX = """
INSERT INTO hookline.endpoints (name, url) SELECT 'e' || g, 'https://example.com/hook' FROM generate_series(0, 9) AS g;
INSERT INTO hookline.outbox (event_id, event_type, payload, created_at)
SELECT 'msg_' || g, 't' || g % 7, '{}', now() - (g % 4) * interval '1 day' FROM generate_series(1, 200000) AS g;
INSERT INTO hookline.deliveries (outbox_id, endpoint, status, created_at)
SELECT id, 'e' || id % 10, CASE WHEN id % 1000 = 0 THEN 'dead' ELSE 'done' END, created_at FROM hookline.outbox;
ANALYZE;
"""


@pytest.mark.timeout(300)
async def test_the_deliveries_pages_read_indexes_only(pool: asyncpg.Pool) -> None:
    """The deliveries list walks the deliveries' primary key down from the cursor; one delivery is
    a probe of each partition's primary key, its event one of the outbox's."""
    await pool.execute(BIG_OUTBOX)
    store = Store(pool)
    some_id = await pool.fetchval("SELECT max(id) / 2 FROM hookline.deliveries")
    cases = {
        "deliveries": (db.query("deliveries_page", "console.sql"), (None, None, None, None, None, 51)),
        "deliveries of an endpoint, from a cursor": (db.query("deliveries_page", "console.sql"),
                                                     ("e3", None, None, None, some_id, 51)),
        "replay count": (db.query("dead_deliveries_to_replay", "console.sql"), (None, "e3", 10001, None)),
        "one delivery": (db.query("delivery", "console.sql"), (some_id, 1024)),
    }
    filled = {r["relname"] for r in await pool.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = 'hookline'::regnamespace AND reltuples > 0")}
    for label, (sql, args) in cases.items():
        async with store.scoped(EVERYONE) as conn:
            nodes = await _plan(conn, sql, *args)
        scans = [n for n in nodes if "Scan" in n["Node Type"]
                 and n.get("Relation Name", "").startswith(("deliveries", "outbox"))]
        assert scans, label
        assert not [n["Relation Name"] for n in scans
                    if n["Node Type"] == "Seq Scan" and n["Relation Name"] in filled], (label, scans)
    async with store.scoped(EVERYONE) as conn:
        assert await conn.fetchval(db.query("delivery", "console.sql"), some_id, 1024) is not None
