"""Dead inbox events (worker/dlq.py): listed newest first, requeued by provider and event type
through the one replay path, which wakes the provider's workers."""

from __future__ import annotations

import asyncpg
import pytest

from hookline.worker.dlq import dlq_inbox, replay_dead
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def bury(pool: asyncpg.Pool, provider: str, event_id: str, event_type: str) -> None:
    await pool.execute("""
        INSERT INTO hookline.inbox (provider, event_id, event_type, body, status, attempts, processed_at, last_error)
        VALUES ($1, $2, $3, '{}'::bytea, 'dead', 12, now(), 'HTTP 500')""", provider, event_id, event_type)


async def statuses(pool: asyncpg.Pool) -> dict[str, tuple[str, int]]:
    rows = await pool.fetch("SELECT event_id, status, attempts FROM hookline.inbox")
    return {r["event_id"]: (r["status"], r["attempts"]) for r in rows}


async def test_replay_by_type_requeues_only_that_type_and_wakes_the_providers_workers(
        database_url: str, pool: asyncpg.Pool) -> None:
    await bury(pool, "stripe", "a", "invoice.paid")
    await bury(pool, "stripe", "b", "invoice.failed")
    await bury(pool, "github", "c", "invoice.paid")
    woken: list[str] = []
    listener = await asyncpg.connect(database_url)
    await listener.add_listener("hookline_inbox", lambda _c, _p, _ch, payload: woken.append(payload))
    try:
        async with pool.acquire() as conn:
            assert await replay_dead(conn, "stripe", "invoice.paid") == {"stripe": 1}
        assert await statuses(pool) == {"a": ("pending", 0), "b": ("dead", 12), "c": ("dead", 12)}
        await eventually(lambda: woken == ["stripe"])

        async with pool.acquire() as conn:
            assert await replay_dead(conn, "stripe", "no.such.type") == {}
            assert await dlq_inbox(conn, "replay", event_type="no.such.type") == ["no dead events matched"]
            assert await dlq_inbox(conn, "replay") == ["github: requeued 1 dead event(s)",
                                                        "stripe: requeued 1 dead event(s)"]
        assert {status for status, _ in (await statuses(pool)).values()} == {"pending"}
        await eventually(lambda: sorted(woken) == ["github", "stripe", "stripe"])
    finally:
        await listener.close()


async def test_list_shows_the_dead_of_one_provider(pool: asyncpg.Pool) -> None:
    await bury(pool, "stripe", "evt_1", "invoice.paid")
    await bury(pool, "github", "evt_2", "push")
    async with pool.acquire() as conn:
        lines = await dlq_inbox(conn, "list", provider="stripe")
        with pytest.raises(ValueError, match="unknown dlq action"):
            await dlq_inbox(conn, "purge")
    assert lines[0].split()[:2] == ["PROVIDER", "EVENT"]
    assert [line.split()[:3] for line in lines[1:]] == [["stripe", "evt_1", "invoice.paid"]]
    assert "HTTP 500" in lines[1]
