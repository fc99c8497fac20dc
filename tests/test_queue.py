"""The queue mechanics (core/queue.py, sql/queue.sql) on a real Postgres, for the inbox and the outbox alike."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from hookline.core import queue
from hookline.core.queue import INBOX, OUTBOX, RetryPolicy
from support.queues import QUEUES, QueueCase

pytestmark = pytest.mark.asyncio(loop_scope="session")

each_queue = pytest.mark.parametrize("case", QUEUES, ids=[q.name for q in QUEUES])


@each_queue
async def test_claim_leases_the_oldest_due_rows_of_one_partition(pool: asyncpg.Pool, case: QueueCase) -> None:
    ids = await case.add(pool, "p", 5)
    other = await case.add(pool, "other", 2)
    later = ids[1]
    await pool.execute(f"UPDATE {case.queue.table} SET next_attempt_at = now() + interval '1 hour' WHERE id = $1",
                       later)

    first = await case.queue.claim(pool, "p", 3, "w1", 30)
    assert sorted(r["id"] for r in first) == [ids[0], ids[2], ids[3]]  # not the one due later
    for r in first:
        assert (r["status"], r["attempts"], r["locked_by"]) == ("processing", 1, "w1")
    assert [r["id"] for r in await case.queue.claim(pool, "p", 3, "w2", 30)] == [ids[4]]
    assert await case.queue.claim(pool, "p", 3, "w2", 30) == []
    assert await case.ids(pool, "other") == other  # another partition is untouched
    lease = await pool.fetchval(f"SELECT min(lease_expires_at - now()) FROM {case.queue.table} WHERE id = ANY($1)",
                                [r["id"] for r in first])
    assert 25 < lease.total_seconds() <= 30


@each_queue
async def test_a_due_retry_goes_first_only_where_the_queue_says_so(pool: asyncpg.Pool, case: QueueCase) -> None:
    ids = await case.add(pool, "p", 3)
    (tried,) = await case.queue.claim(pool, "p", 1, "w", 30)
    assert await case.queue.retry(pool, tried["id"], tried["attempts"], "w", 0.0, "HTTP 500")
    (next_row,) = await case.queue.claim(pool, "p", 1, "w", 30)
    # The outbox sends a due retry before older first attempts (a probe should be a retry);
    # the inbox takes rows by when they are due, and the retry became due last.
    expected = ids[0] if case.queue is OUTBOX else ids[1]
    assert next_row["id"] == expected
    assert sorted(r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30)) == sorted(set(ids) - {expected})


async def behind_the_floor(pool: asyncpg.Pool, case: QueueCase, id: int) -> None:
    """Row ``id`` due a minute ago, as a row whose transaction began before the claims since committed."""
    await pool.execute(f"UPDATE {case.queue.table} SET next_attempt_at = now() - interval '1 minute' WHERE id = $1",
                       id)


@each_queue
async def test_a_claim_starts_at_its_floor_and_a_claim_without_one_finds_what_is_behind_it(
        pool: asyncpg.Pool, case: QueueCase, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue, "FULL_SCAN_EVERY", 60.0)
    ids = await case.add(pool, "p", 4)
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [ids[0]]  # the floor: ids[0]'s
    (late,) = await case.add(pool, "p", 1)
    await behind_the_floor(pool, case, late)
    # From the floor on: the row behind it is not seen, though it is the oldest due.
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [ids[1]]
    monkeypatch.setattr(queue, "FULL_SCAN_EVERY", 0.0)  # the next claim is one without a floor
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [late]
    assert sorted(r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30)) == ids[2:]


async def test_an_ordered_claim_has_no_floor(pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue, "FULL_SCAN_EVERY", 60.0)
    # A row held back by its predecessor becomes claimable behind the rows claimed since.
    case = next(q for q in QUEUES if q.queue is OUTBOX)
    ids = await case.add(pool, "p", 3)
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [ids[0]]
    (late,) = await case.add(pool, "p", 1)
    await behind_the_floor(pool, case, late)
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30, ordered=True)] == [late]
    # The unordered claim's floor stayed where it was: the row behind it (now claimed) changed nothing.
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [ids[1]]


async def test_only_first_attempts_move_the_floor_where_retries_are_claimed_apart(
        pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue, "FULL_SCAN_EVERY", 60.0)
    # The outbox claims due retries first, from their own index: a batch of retries alone says nothing of
    # where the first attempts begin (a floor at the retry's time would hide b and c).
    case = next(q for q in QUEUES if q.queue is OUTBOX)
    a, b, c = await case.add(pool, "p", 3)
    (tried,) = await case.queue.claim(pool, "p", 1, "w", 30)
    assert tried["id"] == a and await case.queue.retry(pool, a, 1, "w", 0.0, "HTTP 500")
    assert [r["id"] for r in await case.queue.claim(pool, "p", 1, "w", 30)] == [a]  # the due retry
    assert sorted(r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30)) == [b, c]


async def test_ordered_claim_holds_back_a_key_until_its_older_row_is_finished(pool: asyncpg.Pool) -> None:
    case = next(q for q in QUEUES if q.queue is OUTBOX)  # the queue with an order key
    a0, a1 = await case.add(pool, "p", 2, key="a")
    (b0,) = await case.add(pool, "p", 1, key="b")
    (free,) = await case.add(pool, "p", 1)

    first = await case.queue.claim(pool, "p", 10, "w", 30, ordered=True)
    assert sorted(r["id"] for r in first) == [a0, b0, free]
    assert await case.queue.claim(pool, "p", 10, "w", 30, ordered=True) == []  # a1 waits for a0
    assert await case.queue.retry(pool, a0, 1, "w", 0.0, "HTTP 500")
    assert [r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30, ordered=True)] == [a0]  # a1 still waits
    assert await case.queue.complete(pool, [(a0, 2)], "w") == {a0}
    assert [r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30, ordered=True)] == [a1]


async def test_an_ordered_claim_needs_an_order_key(pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match=r"hookline\.inbox has no order key"):
        await INBOX.claim(pool, "p", 1, "w", 30, ordered=True)


@each_queue
async def test_extend_leases_reports_the_ids_whose_lease_is_lost(pool: asyncpg.Pool, case: QueueCase) -> None:
    done, swept, kept, buried = await case.add(pool, "p", 4)
    await case.queue.claim(pool, "p", 4, "w1", 30)
    assert await case.queue.complete(pool, [(done, 1)], "w1") == {done}
    assert await case.queue.bury(pool, buried, 1, "w1", "gave up")
    await pool.execute(f"UPDATE {case.queue.table} SET lease_expires_at = now() - interval '1 second' "
                       "WHERE id = $1", swept)
    assert (await case.queue.sweep_expired(pool, {})).requeued == {"p": 1}
    await pool.execute(f"UPDATE {case.queue.table} SET next_attempt_at = now() WHERE id = $1", swept)
    reclaimed = await case.queue.claim_suspect(pool, {"p": 30.0}, "w2")
    assert reclaimed is not None and reclaimed["id"] == swept

    before = (await case.row(pool, kept))["lease_expires_at"]
    # Done is finished, not lost; swept (now another worker's) and buried are lost.
    assert await case.queue.extend_leases(pool, [done, swept, kept, buried], "w1", 300) == {swept, buried}
    assert (await case.row(pool, kept))["lease_expires_at"] > before
    assert await case.queue.extend_leases(pool, [swept], "w2", 300) == set()


@each_queue
async def test_release_gives_leases_back_without_counting_the_attempt(pool: asyncpg.Pool, case: QueueCase) -> None:
    first, second = await case.add(pool, "p", 2)
    await case.queue.claim(pool, "p", 2, "w1", 30)
    assert await case.queue.release(pool, [first, second], "intruder") == set()  # only the holder can
    assert await case.queue.release(pool, [first], "w1", delay=60) == {first}
    row = await case.row(pool, first)
    assert (row["status"], row["attempts"], row["locked_by"]) == ("pending", 0, None)
    assert await case.queue.claim(pool, "p", 2, "w2", 30) == []  # the delay holds it back
    assert (await case.row(pool, second))["status"] == "processing"
    # A completion of the released attempt is refused: the lease is gone.
    assert await case.queue.complete(pool, [(first, 1)], "w1") == set()


@each_queue
async def test_sweep_applies_each_partitions_policy_and_makes_suspects(pool: asyncpg.Pool, case: QueueCase) -> None:
    (strict,) = await case.add(pool, "strict", 1)
    (lenient,) = await case.add(pool, "lenient", 1)
    await case.queue.claim(pool, "strict", 1, "crashed", 0.0)
    await case.queue.claim(pool, "lenient", 1, "crashed", 0.0)

    result = await case.queue.sweep_expired(
        pool, {"strict": RetryPolicy(max_attempts=1), "lenient": RetryPolicy(initial_delay=100, max_delay=100)})
    assert (result.dead, result.requeued, result.crashed) == ({"strict": 1}, {"lenient": 1},
                                                               {"strict": 1, "lenient": 1})
    dead, requeued = await case.row(pool, strict), await case.row(pool, lenient)
    assert dead["status"] == "dead" and "lease expired during attempt 1" in dead["last_error"]
    assert requeued["status"] == "pending" and requeued["suspect"] and requeued["attempts"] == 1
    wait = await pool.fetchval(f"SELECT next_attempt_at - now() FROM {case.queue.table} WHERE id = $1", lenient)
    assert 90 < wait.total_seconds() <= 100  # the lenient policy's backoff

    await pool.execute(f"UPDATE {case.queue.table} SET next_attempt_at = now() WHERE id = $1", lenient)
    assert await case.queue.claim(pool, "lenient", 10, "w", 30) == []  # suspects run alone
    assert await case.queue.suspects_due(pool, ["lenient"])
    suspect = await case.queue.claim_suspect(pool, {"lenient": 30.0}, "w")
    assert suspect is not None and suspect["id"] == lenient and suspect["attempts"] == 2
    assert (await case.queue.stats(pool))["strict"].dead == 1


@each_queue
async def test_replay_requeues_dead_rows_and_wakes_their_consumers(database_url: str, pool: asyncpg.Pool,
                                                                    case: QueueCase) -> None:
    dead = await case.add(pool, "p", 2)
    (other,) = await case.add(pool, "other", 1)
    for row in await case.queue.claim(pool, "p", 2, "w", 30) + await case.queue.claim(pool, "other", 1, "w", 30):
        assert await case.queue.bury(pool, row["id"], row["attempts"], "w", "HTTP 500")

    listener = await asyncpg.connect(database_url)
    woken: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(case.queue.channel, lambda *args: woken.put_nowait(args[3]))
    try:
        async with pool.acquire() as conn:
            assert await case.queue.replay_dead(conn, "p") == {"p": 2}
        assert await asyncio.wait_for(woken.get(), 10) == "p"
    finally:
        await listener.close()
    for id in dead:
        row = await case.row(pool, id)
        assert (row["status"], row["attempts"], row["last_error"], row["processed_at"]) == ("pending", 0, None, None)
    assert (await case.row(pool, other))["status"] == "dead"
    assert sorted(r["id"] for r in await case.queue.claim(pool, "p", 10, "w", 30)) == dead
