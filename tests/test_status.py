"""``hookline status``: the queue signals per provider and endpoint, the attempts of the last
minutes from the attempt log (written by the real completion statements), and an exit status
that says unhealthy for dead letters, a stale due event, an open circuit or a disabled endpoint."""

from __future__ import annotations

import json

import asyncpg
import pytest

from hookline import outbox
from hookline.core import db
from hookline.core.queue import INBOX, OUTBOX
from hookline.relay import endpoints
from support.inbox import insert_events
from support.processes import hookline_cli

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKER = "test-worker"


async def book_inbox_outcomes(pool: asyncpg.Pool) -> None:
    """Four stripe events: one done, one retrying, one dead, one still due."""
    await insert_events(pool, "stripe", 4)
    claimed = await INBOX.claim(pool, "stripe", 3, WORKER, 60)
    done, retried, buried = claimed
    assert await INBOX.complete(pool, [(done["id"], done["attempts"])], WORKER) == {done["id"]}
    assert await INBOX.retry(pool, retried["id"], retried["attempts"], WORKER, 600, "destination: HTTP 503")
    assert await INBOX.bury(pool, buried["id"], buried["attempts"], WORKER, "handler raised KeyError")


async def test_status_counts_each_state_and_the_recent_attempts(pool: asyncpg.Pool, database_url: str) -> None:
    await book_inbox_outcomes(pool)
    result = hookline_cli(database_url, "status", "-o", "json")
    assert result.returncode == 1, result.stderr  # a dead event is unhealthy
    found = json.loads(result.stdout)
    assert found["providers"] == [{
        "name": "stripe", "due": 1, "retrying": 1, "deferred": 0, "processing": 0, "dead": 1,
        "oldest_due_seconds": found["providers"][0]["oldest_due_seconds"],
        "accepted_recently": 4, "failed_recently": 2, "handler_problem": None}]
    assert found["problems"] == ["provider stripe: 1 dead events"]
    assert found["healthy"] is False

    attempts = await pool.fetch("SELECT attempt, worker, outcome, error FROM hookline.attempts "
                                "WHERE queue = 'inbox' ORDER BY outcome")
    assert [tuple(a) for a in attempts] == [(1, WORKER, "dead", "handler raised KeyError"),
                                           (1, WORKER, "done", None),
                                           (1, WORKER, "retry", "destination: HTTP 503")]


async def test_a_healthy_installation_exits_zero_and_prints_tables(pool: asyncpg.Pool, database_url: str) -> None:
    await insert_events(pool, "github", 2)
    result = hookline_cli(database_url, "status")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["PROVIDER", "DUE", "RETRYING"]
    assert lines[1].split()[:2] == ["github", "2"]
    assert lines[-1] == "healthy"


async def test_a_waiting_due_event_is_unhealthy_past_the_threshold(pool: asyncpg.Pool, database_url: str) -> None:
    await pool.execute("""
        INSERT INTO hookline.inbox (provider, event_id, body, next_attempt_at)
        VALUES ('shopify', 'evt_old', '\\x'::bytea, now() - interval '10 minutes')""")
    assert hookline_cli(database_url, "status", "--max-oldest-due", "900").returncode == 0
    result = hookline_cli(database_url, "status", "--max-oldest-due", "60")
    assert result.returncode == 1
    assert "provider shopify: oldest due event waiting" in result.stdout
    assert "(over 60 s)" in result.stdout


async def test_endpoints_show_their_last_answer_circuit_and_disabling(pool: asyncpg.Pool, database_url: str) -> None:
    async with pool.acquire() as conn:
        await endpoints.add(conn, "billing", "https://billing.example.com/hooks")
        await endpoints.add(conn, "gone", "https://gone.example.com/hooks")
        async with conn.transaction():
            await outbox.publish(conn, "invoice.paid", {"n": 1})
            await outbox.publish(conn, "invoice.paid", {"n": 2})
    [delivery] = await OUTBOX.claim(pool, "billing", 1, WORKER, 60)
    async with pool.acquire() as conn, conn.transaction():
        assert await OUTBOX.retry(conn, delivery["id"], delivery["attempts"], WORKER, 600, "HTTP 503")
        await conn.execute(outbox.query("record_responses"), [delivery["id"]], [503], ["busy"], [42.0])
    [gone] = await OUTBOX.claim(pool, "gone", 1, WORKER, 60)
    await pool.execute(outbox.query("disable_endpoint"), "gone", "HTTP 410 Gone", gone["id"], gone["attempts"],
                       WORKER, 410, "", 7.0)
    await pool.execute("UPDATE hookline.endpoints SET circuit_state = 'open' WHERE name = 'billing'")

    result = hookline_cli(database_url, "status", "-o", "json")
    assert result.returncode == 1
    found = json.loads(result.stdout)
    billing, gone_endpoint = found["endpoints"]
    assert (billing["name"], billing["circuit"], billing["pending"], billing["parked"]) == ("billing", "open", 2, 0)
    assert (billing["last_outcome"], billing["last_http_status"], billing["last_latency_ms"]) == ("retry", 503, 42.0)
    assert (gone_endpoint["enabled"], gone_endpoint["parked"]) == (False, 2)
    assert (gone_endpoint["last_outcome"], gone_endpoint["last_http_status"]) == ("parked", 410)
    assert found["problems"] == ["endpoint billing: circuit open", "endpoint gone: disabled (HTTP 410 Gone)"]

    table = hookline_cli(database_url, "status").stdout
    assert "retry HTTP 503 in 42 ms" in table
    assert "gone                     disabled" in table


LARGE_HISTORY = """
INSERT INTO hookline.inbox (provider, event_id, body, status, received_at)
SELECT 'p' || g % 10, 'evt_' || g, '\\x'::bytea, CASE WHEN g % 1000 = 0 THEN 'pending' ELSE 'done' END,
       now() - make_interval(secs => 200000 - g)
FROM generate_series(1, 200000) AS g;
INSERT INTO hookline.attempts (at, queue, row_id, part, attempt, outcome)
SELECT now() - make_interval(secs => 200000 - g), 'inbox', g, 'p' || g % 10, 1, 'done'
FROM generate_series(1, 200000) AS g;
INSERT INTO hookline.endpoints (name, url) SELECT 'e' || g, 'https://example.com/hook' FROM generate_series(0, 9) AS g;
ANALYZE;
"""


async def test_status_reads_indexes_not_whole_tables(pool: asyncpg.Pool) -> None:
    """On a long history (200k done events and attempts), every status statement finds its rows
    through indexes: no sequential scan of the inbox, the deliveries or the attempt log."""
    await pool.execute(LARGE_HISTORY)
    names = [f"p{n}" for n in range(10)]
    for name, args in (("recent_inbox_activity", (300.0, names)), ("endpoint_status", ())):
        sql = db.query(name, "status.sql")
        plan = await pool.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)  # the pool decodes json
        scanned = [n["Relation Name"] for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan"]
        # Small tables may be scanned whole: the partitioned inbox's future partitions are empty, and
        # today's holds only the history since midnight UTC (at 00:45, 2,700 rows, 11 % of them recent:
        # the planner rightly reads them all). Anything holding a tenth of the history may not be.
        large = await pool.fetch("SELECT relname FROM pg_class WHERE relname = ANY($1::text[]) AND reltuples > 20000",
                                 scanned)
        assert not large, (name, [r["relname"] for r in large])


def plan_nodes(plan: object) -> list[dict[str, object]]:
    if isinstance(plan, list):
        return [n for item in plan for n in plan_nodes(item)]
    if not isinstance(plan, dict):
        return []
    found = [plan] if "Node Type" in plan else []
    return found + [n for v in plan.values() if isinstance(v, (list, dict)) for n in plan_nodes(v)]
