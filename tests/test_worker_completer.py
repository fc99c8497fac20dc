"""The worker's BatchCompleter keeps its writer's pool connection while completions come one batch after
another, gives it back once idle, and after a write that failed. Real pool, real Postgres."""

from __future__ import annotations

import asyncpg
import pytest

from hookline.core import db
from hookline.core.consumer import write_completion
from hookline.core.queue import INBOX
from hookline.worker.service import CLAIM_EVENTS, BatchCompleter
from support.inbox import insert_events
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKER = "w-completer"


async def claimed(pool: asyncpg.Pool, provider: str, count: int) -> list[tuple[int, int]]:
    await insert_events(pool, provider, count)
    rows = await INBOX.fetch_claim(pool, CLAIM_EVENTS, provider, count, WORKER, 30.0)
    return [(r["id"], r["attempts"]) for r in rows]


async def test_connection_kept_until_idle_and_given_back_after_a_failed_write(
        database_url: str, pool: asyncpg.Pool) -> None:
    events = await claimed(pool, "completer-held", 3)
    own = await db.create_pool(database_url, min_size=2, max_size=2, lean=True)
    completer = BatchCompleter(own, WORKER, lambda: 0)
    completer.start()
    try:
        assert await completer.complete(*events[0]) is True
        assert own.get_idle_size() == 1  # kept for the next batch
        await completer.release_if_idle()
        assert own.get_idle_size() == 2

        # A write on a connection that broke fails that batch, and the connection goes back to the pool
        # (which replaces it): the next batch is written.
        assert await completer.complete(*events[1]) is True
        kept = await own.fetchval("SELECT pid FROM pg_stat_activity WHERE query LIKE '%hookline.log_attempts%' "
                                  "AND pid <> pg_backend_pid() AND datname = current_database() "
                                  "ORDER BY backend_start DESC LIMIT 1")
        assert kept is not None
        await pool.execute("SELECT pg_terminate_backend($1)", kept)
        await eventually(lambda: pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", kept), equals=0)
        # The kept connection the server ended is replaced (core/consumer.py HeldConnection) and the next
        # batch is written, through the retry every completion has (write_completion): whether the one
        # batch sent just as the server's goodbye arrives fails first is a race with the client's read.
        assert await write_completion(lambda: completer.complete(*events[2]), 10.0, {}) is True
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'completer-held' "
                                   "AND status = 'done'") == 3
        await completer.stop()
        assert own.get_idle_size() == 2  # stop gives it back
    finally:
        await completer.stop()
        await own.close()
