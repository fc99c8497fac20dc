"""Transactional handlers in batches, with real worker processes on a real Postgres.

Under load a worker runs several two-parameter handlers of one provider in one
transaction, and one guarded completion ends the batch. A batch runs first without
savepoints; if anything goes wrong it is rolled back and runs again with a savepoint per
handler, which keeps the failure to its own event. These
tests put a few events in the inbox before a worker starts, so that its first
claim takes them all and they share a batch (the handler records the transaction
id of every call on another connection, so the tests can see who shared one), and
then check that each event still has exactly one effect:

* a batch where all goes well runs each handler once;
* a handler that raises rolls back only its own savepoint and is retried;
* an event whose lease is taken mid-batch loses only its own effect, and the events after it
  in the batch run again and commit once;
* a worker SIGKILLed mid-batch leaves nothing of the batch applied;
* events of one entity in one batch run in order, and a deferral inside a batch
  is released by its predecessor in the same batch, as it is unbatched.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import asyncpg
import pytest

from hookline.core import db
from hookline.core.maintenance import sweep_once
from hookline.core.queue import RetryPolicy
from support.batch_handlers import TABLES
from support.inbox import apply_provider
from support.processes import worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

UNFINISHED = "SELECT count(*) FROM hookline.inbox WHERE status NOT IN ('done', 'dead')"
# Room for the whole first claim in one batch, however slowly a loaded machine runs the handlers.
BATCH = ("--concurrency", "16", "--batch-seconds", "5")

PROVIDER = """
signature: {scheme: none}
handler: "support.batch_handlers:effect_or_trouble"
leaseSeconds: 3
retry: {maxAttempts: 3, initialDelaySeconds: 0.2, maxDelaySeconds: 0.5}
"""


@pytest.fixture
async def tables(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(TABLES)
    return pool


async def insert(pool: asyncpg.Pool, provider: str, events: list[tuple[str, str | None]]) -> list[str]:
    """Events of the given (type, entity key), in this order (ids ascending)."""
    ids = [f"evt_{n}_{uuid.uuid4().hex[:8]}" for n in range(len(events))]
    for event_id, (event_type, entity_key) in zip(ids, events, strict=True):
        await pool.execute("INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, body, "
                           "content_type) VALUES ($1, $2, $3, $4, '{}', 'application/json')",
                           provider, event_id, event_type, entity_key)
    return ids


async def run_until_finished(database_url: str, tables: asyncpg.Pool, log_dir, *extra: str) -> None:
    """A batching worker, run until every event is done or dead, then stopped cleanly."""
    w = worker(database_url, log_dir, *BATCH, *extra)
    try:
        await eventually(lambda: tables.fetchval(UNFINISHED), equals=0, timeout=60)
    finally:
        assert w.stop() == 0


async def effects_per_event(pool: asyncpg.Pool) -> Counter[str]:
    return Counter(r["event_id"] for r in await pool.fetch("SELECT event_id FROM batch_effects"))


async def first_attempt_txids(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT event_id, txid FROM batch_calls WHERE attempt = 1")
    return {r["event_id"]: r["txid"] for r in rows}


async def test_a_batch_where_all_goes_well_runs_each_handler_once(database_url: str, tables: asyncpg.Pool,
                                                                   log_dir) -> None:
    apply_provider(database_url, "batch", PROVIDER)
    ids = await insert(tables, "batch", [("ok", None)] * 8)
    await run_until_finished(database_url, tables, log_dir)
    calls = await tables.fetch("SELECT event_id, txid FROM batch_calls")
    assert Counter(r["event_id"] for r in calls) == Counter(ids)
    assert len({r["txid"] for r in calls}) < len(ids)  # batched: some shared a transaction
    assert await effects_per_event(tables) == Counter(ids)


async def test_a_handler_that_raises_rolls_back_only_its_savepoint(database_url: str, tables: asyncpg.Pool,
                                                                    log_dir) -> None:
    apply_provider(database_url, "batch", PROVIDER)
    ids = await insert(tables, "batch", [("ok", None)] * 3 + [("boom", None)] + [("ok", None)] * 3)
    await assert_failed_alone(database_url, tables, log_dir, ids, culprit=ids[3])


async def assert_failed_alone(database_url: str, tables: asyncpg.Pool, log_dir, ids: list[str], culprit: str) -> None:
    """Run a worker until every event is finished; then the culprit's first attempt ran in one
    transaction with others, those committed with it, its own effect rolled back, and its retry
    applied it once."""
    await run_until_finished(database_url, tables, log_dir)
    txids = await first_attempt_txids(tables)
    batch = txids[culprit]
    # The failing handler ran in one transaction with others, and those committed with it ...
    mates = {e for e, txid in txids.items() if txid == batch and e != culprit}
    assert mates, txids
    committed = {r["event_id"] for r in await tables.fetch("SELECT event_id FROM batch_effects WHERE txid = $1", batch)}
    assert committed == mates
    # ... while its own effect rolled back; its retry applied it once.
    assert await effects_per_event(tables) == Counter(ids)
    rows = {r["event_id"]: r for r in await tables.fetch("SELECT event_id, status, attempts FROM hookline.inbox")}
    assert all(r["status"] == "done" for r in rows.values())
    assert rows[culprit]["attempts"] == 2
    assert all(rows[e]["attempts"] == 1 for e in ids if e != culprit)


async def test_a_lease_lost_mid_batch_rolls_back_only_that_event(database_url: str, tables: asyncpg.Pool,
                                                                  log_dir) -> None:
    apply_provider(database_url, "batch", PROVIDER)
    # The thief runs before the victim in their batch (same entity key: by id) and takes its lease.
    ids = await insert(tables, "batch", [("ok", None), ("thief", None), ("victim", None), ("ok", None)])
    thief, victim = ids[1], ids[2]
    w = worker(database_url, log_dir, *BATCH)
    try:
        await eventually(lambda: tables.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"), equals=3,
                         timeout=60)
        # The stolen lease has expired: the sweeper takes the event back (a suspect now), and it runs again.
        await sweep_once(tables, {"batch": RetryPolicy(3, 0.2, 0.5)})
        await eventually(lambda: tables.fetchval(UNFINISHED), equals=0, timeout=60)
    finally:
        assert w.stop() == 0
    txids = await first_attempt_txids(tables)
    assert txids[victim] == txids[thief]  # one batch
    committed = {r["event_id"] for r in await tables.fetch("SELECT event_id FROM batch_effects WHERE txid = $1",
                                                            txids[victim])}
    assert thief in committed and victim not in committed
    # The lease went to "another worker" and expired; the sweeper took it back and it ran again, once.
    assert await effects_per_event(tables) == Counter(ids)
    row = await tables.fetchrow("SELECT status, attempts FROM hookline.inbox WHERE event_id = $1", victim)
    assert (row["status"], row["attempts"]) == ("done", 2)
    assert await tables.fetchval("SELECT attempt FROM batch_effects WHERE event_id = $1", victim) == 2


async def test_sigkill_mid_batch_leaves_nothing_half_applied(database_url: str, tables: asyncpg.Pool,
                                                             log_dir) -> None:
    apply_provider(database_url, "batch", PROVIDER)
    ids = await insert(tables, "batch", [("ok", None)] * 5 + [("kill", None)])
    w = worker(database_url, log_dir, *BATCH, wait=False)  # it may kill itself before its health check
    assert w.proc is not None
    assert await asyncio.to_thread(w.proc.wait, 30) == -9
    txids = await first_attempt_txids(tables)
    assert len(set(txids.values())) < len(txids)  # at least two shared the killed transaction
    # Nothing of the killed batch committed: every effect row belongs to a "done" row, and there are none yet.
    assert await tables.fetchval("SELECT count(*) FROM batch_effects") == 0
    assert await tables.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'") == 0
    w2 = worker(database_url, log_dir, *BATCH, "--sweep")
    try:
        await eventually(lambda: tables.fetchval(UNFINISHED), equals=0, timeout=60)
    finally:
        assert w2.stop() == 0
    assert await effects_per_event(tables) == Counter(ids)
    assert await tables.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'") == len(ids)


ORDERED = PROVIDER + """
ordering:
  entityKey: {jsonPointer: /entity}
  maxDeferralSeconds: 60
  transitions:
    - {"on": created, from: [null], to: created}
    - {"on": succeeded, from: [created], to: succeeded}
"""


async def test_ordered_events_in_one_batch_keep_their_order(database_url: str, tables: asyncpg.Pool,
                                                            log_dir) -> None:
    apply_provider(database_url, "ordered", ORDERED)
    # e1, e2: "succeeded" arrived first; e3: in order. All eight fit in one batch.
    events = [("succeeded", "e1"), ("succeeded", "e2"), ("created", "e3"), ("succeeded", "e3"),
              ("created", "e1"), ("created", "e2"), ("created", "e4"), ("succeeded", "e4")]
    ids = await insert(tables, "ordered", events)
    await run_until_finished(database_url, tables, log_dir, "--poll-interval", "5")
    assert await effects_per_event(tables) == Counter(ids)
    states = {r["entity_key"]: r["state"] for r in await tables.fetch(
        "SELECT entity_key, state FROM hookline.entity_states WHERE provider = 'ordered'")}
    assert states == {"e1": "succeeded", "e2": "succeeded", "e3": "succeeded", "e4": "succeeded"}
    effects = await tables.fetch("SELECT event_type, entity_key, attempt, txid FROM batch_effects ORDER BY n")
    for entity in ("e1", "e2", "e3", "e4"):
        assert [r["event_type"] for r in effects if r["entity_key"] == entity] == ["created", "succeeded"]
    txid = {(r["entity_key"], r["event_type"]): r["txid"] for r in effects}
    # Every "created" applied in the first batch; e3's and e4's successors right after, in it.
    assert len({txid[(e, "created")] for e in ("e1", "e2", "e3", "e4")}) == 1
    assert txid[("e3", "succeeded")] == txid[("e3", "created")] == txid[("e4", "succeeded")]
    # e1's and e2's successors were deferred in that batch, released by their predecessor in
    # it, and applied in a later transaction; a deferral costs no attempt.
    assert txid[("e1", "succeeded")] != txid[("e1", "created")]
    assert all(r["attempt"] == 1 for r in effects)


async def test_events_after_a_lost_lease_in_their_batch_run_again_and_commit_once(
        database_url: str, tables: asyncpg.Pool, log_dir) -> None:
    """The batch's one completion finds the victim's lease gone. The batch's first pass (no
    savepoints) is rolled back and the batch runs again in it, a savepoint per event; that
    completion is cut at the victim's savepoint, so the events that ran after it lose their
    effects there and are handed back: they run again (same attempt) in a later transaction,
    and commit once."""
    apply_provider(database_url, "batch", PROVIDER)
    ids = await insert(tables, "batch", [("ok", None), ("thief", None), ("victim", None), ("ok", None), ("ok", None)])
    before, thief, victim, after = ids[0], ids[1], ids[2], ids[3:]
    w = worker(database_url, log_dir, *BATCH)
    try:
        await eventually(lambda: tables.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'done'"), equals=4,
                         timeout=60)
    finally:
        assert w.stop() == 0
    calls: dict[str, list[int]] = {}
    for r in await tables.fetch("SELECT event_id, txid FROM batch_calls WHERE attempt = 1"):
        calls.setdefault(r["event_id"], []).append(r["txid"])
    batch = calls[victim][0]
    # Both passes ran in the batch's transaction.
    assert calls[before] == calls[thief] == calls[victim] == [batch, batch], calls
    for event_id in after:
        # Ran in the cut batch, then again in one other transaction, still as attempt 1.
        assert batch in calls[event_id] and len([t for t in calls[event_id] if t != batch]) == 1, calls
    committed = await tables.fetch("SELECT event_id, txid, attempt FROM batch_effects")
    assert Counter(r["event_id"] for r in committed) == Counter([before, thief, *after])
    assert {r["event_id"] for r in committed if r["txid"] == batch} == {before, thief}
    rows = {r["event_id"]: (r["status"], r["attempts"]) for r in await tables.fetch(
        "SELECT event_id, status, attempts FROM hookline.inbox")}
    assert rows[victim] == ("processing", 1)  # another worker's now, as far as this one knows
    assert all(rows[e] == ("done", 1) for e in [before, thief, *after])


async def test_handlers_plan_as_postgres_does_by_default(database_url: str, tables: asyncpg.Pool, log_dir) -> None:
    """The worker's pool plans Hookline's statements once (plan_cache_mode = force_generic_plan);
    a handler's transaction, alone or in a batch, is back at Postgres's default."""
    generic = await db.create_pool(database_url, generic_plans=True)
    try:
        assert await generic.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
    finally:
        await generic.close()
    apply_provider(database_url, "plans", PROVIDER.replace("effect_or_trouble", "record_plan_cache_mode"))
    ids = await insert(tables, "plans", [("ok", None)] * 6)
    await run_until_finished(database_url, tables, log_dir)
    rows = await tables.fetch("SELECT event_id, event_type, txid FROM batch_effects")
    assert sorted(r["event_id"] for r in rows) == sorted(ids)
    assert {r["event_type"] for r in rows} == {"auto"}
    assert len({r["txid"] for r in rows}) < len(rows)  # some of them shared a batch


@pytest.mark.parametrize("position", ["middle", "last"])
async def test_a_handler_that_leaves_its_transaction_aborted_fails_alone(
        database_url: str, tables: asyncpg.Pool, log_dir, position: str) -> None:
    """A handler that catches the error of its own failed statement returns normally, but its
    transaction is aborted: found at the next job's savepoint (or, last in the batch, at the
    completion), that event alone is rolled back and retried; its batch-mates commit."""
    apply_provider(database_url, "batch", PROVIDER)
    kinds = [("ok", None)] * 3 + [("swallow", None)] + ([("ok", None)] * 3 if position == "middle" else [])
    ids = await insert(tables, "batch", kinds)
    culprit = ids[3]
    await assert_failed_alone(database_url, tables, log_dir, ids, culprit)
    logged = await tables.fetchval("SELECT error FROM hookline.attempts WHERE row_id = "
                                   "(SELECT id FROM hookline.inbox WHERE event_id = $1) AND attempt = 1", culprit)
    assert logged is not None and "AbortedByHandler" in logged


async def test_a_batch_whose_connection_dies_fails_as_a_whole_and_runs_again(
        database_url: str, tables: asyncpg.Pool, log_dir) -> None:
    """The server ends a batch's connection mid-batch (pg_terminate_backend, as a failover does):
    asyncpg hands the dead connection back to the pool at once, so the batch must not touch it
    again (its rollback to the first savepoint, or booking a handler failure in its transaction,
    raised "connection has been released back to the pool"). The batch's events fail as one, on
    the pool, and their retries apply each once."""
    apply_provider(database_url, "batch", PROVIDER)
    ids = await insert(tables, "batch", [("ok", None)] * 3 + [("terminate", None)] + [("ok", None)] * 3)
    w = worker(database_url, log_dir, *BATCH)
    try:
        await eventually(lambda: tables.fetchval(UNFINISHED), equals=0, timeout=60)
    finally:
        assert w.stop() == 0
    txids = await first_attempt_txids(tables)
    assert {e for e, txid in txids.items() if txid == txids[ids[3]]} - {ids[3]}, txids  # it had batch-mates
    assert "released back to the pool" not in w.logs()
    assert await effects_per_event(tables) == Counter(ids)
    assert set(await tables.fetch("SELECT DISTINCT status FROM hookline.inbox")) == {("done",)}
    # The batch's first attempt failed for its connection, booked as such (not as a handler's fault).
    errors = await tables.fetch("SELECT a.error FROM hookline.attempts a JOIN hookline.inbox i ON i.id = a.row_id "
                                "WHERE a.attempt = 1 AND a.error IS NOT NULL")
    assert errors and all(r["error"].startswith("ConnectionLost: the connection to Postgres was lost")
                          for r in errors), errors
