"""Leased claiming over a Postgres table: the one mechanism behind the inbox and the outbox.

A queue table has the columns ``id bigint, status text, attempts int,
next_attempt_at, lease_expires_at, locked_by, last_error, processed_at,
suspect`` and a partition column (``provider`` for the inbox, ``endpoint`` for
outbox deliveries), plus a partial index on ``(partition, next_attempt_at, id)
WHERE status = 'pending'``. The SQL is in ``sql/queue.sql``, valid SQL with
template comments; this module renders it once per queue and gives it types.

Every write after the claim is guarded by (id, attempts, locked_by): a worker
whose lease was swept and re-claimed by another cannot overwrite the newer
attempt's outcome.

Rows whose lease expired come back as *suspects* (they may have killed their
consumer): ``claim`` skips them and ``claim_suspect`` hands out one at a time to a
consumer with nothing else in flight (see ``core/consumer.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import asyncpg

from hookline.core import db

MAX_RETRY_AFTER = 86400.0
# A claim floor is dropped this long after the last claim that went without one (see ClaimFloors).
FULL_SCAN_EVERY = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: attempt n waits between ``initial_delay`` and
    min(max_delay, initial_delay * 2**(n-1)), uniformly. Spreading retries over the
    whole window keeps a burst of failures from retrying in lock-step."""

    max_attempts: int = 12
    initial_delay: float = 5.0
    max_delay: float = 3600.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        cap = min(self.max_delay, self.initial_delay * 2 ** min(max(attempt, 1) - 1, 30))
        low = min(self.initial_delay, cap)
        return float(low + (rng or random).random() * (cap - low))

    def next_delay(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """The wait before the next attempt. A server's Retry-After is honoured even beyond
        max_delay — it said when it can take more — but never beyond a day."""
        delay = self.delay(attempt, rng)
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
        return delay


def make_worker_id(role: str | None = None) -> str:
    """A consumer's name in ``locked_by``: host, pid and a random suffix (a restarted pid is
    someone else), after ``role`` when given (``relay:...``)."""
    name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    return f"{role}:{name}" if role else name


@dataclass(frozen=True)
class SweepResult:
    requeued: dict[str, int]
    dead: dict[str, int]
    # Per partition, how many consumers had leases expire in this sweep (crashes, kills, stalls).
    crashed: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.requeued.values()) + sum(self.dead.values())


@dataclass(frozen=True)
class PartitionStats:
    pending: int  # every pending row, due or not (the inbox's backlog is due + in flight: core/inbox_stats.py)
    oldest_pending_seconds: float
    dead: int
    suspects: int = 0  # pending rows that must run alone (their last lease expired)


class ClaimFloors:
    """Where this process's next claim of each partition starts looking (``claim`` in queue.sql, $5).

    A claim's rows are the oldest due ones it could lock, so the rows it skipped below the first of
    them were locked by another claim or not yet committed, and the next claim can start there (or a
    second before now, if earlier) instead of walking the dead index entries of everything claimed
    before. What that misses — a row whose transaction committed more than a second behind the floor,
    a row another claim locked and then let go — is found by a claim without a floor, at least every
    ``FULL_SCAN_EVERY`` seconds. ``first_attempts_only``: the queue's due retries are claimed apart
    (``retries_first``), so only first attempts move the floor.
    """

    def __init__(self, *, first_attempts_only: bool = False) -> None:
        self.first_attempts_only = first_attempts_only
        self._floors: dict[str, datetime | None] = {}
        self._full_scans: dict[str, float] = {}

    def clear(self) -> None:
        """Forget every floor: the next claims go without one (a test starting afresh)."""
        self._floors.clear()
        self._full_scans.clear()

    def floor(self, partition: str) -> datetime | None:
        """The floor for the next claim of ``partition``; None: claim without one."""
        if time.monotonic() - self._full_scans.get(partition, float("-inf")) >= FULL_SCAN_EVERY:
            return None
        return self._floors.get(partition)

    def full_scan_due_in(self) -> float | None:
        """Seconds until a partition that has a floor is due its claim without one (None: no partition
        has a floor). An idle consumer wakes by then: what its floored claims missed is found by it."""
        now = time.monotonic()
        waits = [self._full_scans.get(p, float("-inf")) + FULL_SCAN_EVERY - now
                 for p, floor in self._floors.items() if floor is not None]
        return max(0.0, min(waits)) if waits else None

    def claimed(self, partition: str, floor: datetime | None, rows: Sequence[asyncpg.Record]) -> None:
        """Move the floor after a claim from ``floor`` returned ``rows`` (with next_attempt_at, attempts)."""
        if floor is None:
            self._full_scans[partition] = time.monotonic()
        starts = [r["next_attempt_at"] for r in rows if not self.first_attempts_only or r["attempts"] == 1]
        if starts:
            self._floors[partition] = min(starts)
        elif floor is None:
            self._floors[partition] = None  # nothing due: the next rows may come from anywhere


class Queue:
    """The queue operations for one table, e.g. ``Queue("hookline.inbox", "provider", "hookline_inbox")``.

    ``channel`` is the NOTIFY channel its consumers LISTEN on. ``order_key`` names a
    column whose rows must be processed one at a time in id order within a partition;
    it enables ``claim(..., ordered=True)``. ``retries_first``: claims take due retries
    before first attempts. ``deferrable``: the table has the inbox's ``deferred_since``.
    ``log_name`` names the queue in the attempt log; ``timed``: the table has ``claimed_at``,
    and an attempt's logged latency runs from its claim to its outcome.
    """

    def __init__(self, table: str, partition: str, channel: str, *, log_name: str, order_key: str | None = None,
                 retries_first: bool = False, deferrable: bool = False, timed: bool = False) -> None:
        self.table = table
        self.partition = partition
        self.channel = channel
        self.log_name = log_name  # its rows' queue in the attempt log
        self.floors = ClaimFloors(first_attempts_only=retries_first)
        values: dict[str, db.TemplateValue] = {
            "table": table, "partition": partition, "retries_first": retries_first, "deferrable": deferrable,
            "ordered": False, "timed": timed, "log_queue": f"'{log_name}'"}
        self._sql = {name: db.query(name, "queue.sql", **values) for name in db.statements("queue.sql")}
        if order_key is not None:
            self._sql["claim_ordered"] = db.query("claim", "queue.sql", **{**values, "ordered": True,
                                                                           "order_key": order_key})

    def sql(self, name: str) -> str:
        """The statement as this queue runs it (``claim_ordered`` is the ordered claim)."""
        return self._sql[name]

    def statements(self) -> dict[str, str]:
        """Every statement as this queue runs it, by name."""
        return dict(self._sql)

    def claim_within(self, wrapper: str, claim: str = "claim") -> str:
        """``wrapper`` with this queue's ``claim`` (or ``claim_ordered``) in place of its stand-in
        ``SELECT * FROM <table> WHERE false``: the claimed rows come back in the columns, and with the
        joins, the wrapper selects, in the claim's one round trip (its RETURNING is the whole row)."""
        stand_in = f"SELECT * FROM {self.table} WHERE false"
        if wrapper.count(stand_in) != 1:
            raise ValueError(f"a statement wrapping the claim of {self.table} must hold {stand_in!r} once")
        return wrapper.replace(stand_in, self.sql(claim).rstrip().removesuffix(";"))

    async def claim(self, conn: asyncpg.Connection | asyncpg.Pool, partition: str, limit: int, worker: str,
                    lease_seconds: float, *, ordered: bool = False) -> list[asyncpg.Record]:
        """Lease up to ``limit`` due rows of ``partition`` to ``worker`` (see ``claim`` in queue.sql)."""
        if ordered and "claim_ordered" not in self._sql:
            raise ValueError(f"{self.table} has no order key: it has no ordered claim")
        return await self.fetch_claim(conn, self._sql["claim_ordered" if ordered else "claim"], partition, limit,
                                      worker, lease_seconds, ordered=ordered)

    async def fetch_claim(self, conn: _Fetcher, sql: str, partition: str, limit: int, worker: str,
                          lease_seconds: float, *, ordered: bool = False) -> list[asyncpg.Record]:
        """Run ``sql``, this queue's claim or a statement wrapping it (``claim_within``) whose rows
        have next_attempt_at and attempts, with the partition's claim floor (``ClaimFloors``)."""
        floor = None if ordered else self.floors.floor(partition)
        rows = list(await conn.fetch(sql, partition, limit, worker, float(lease_seconds), floor))
        if not ordered:
            self.floors.claimed(partition, floor, rows)
        return rows

    async def claim_suspect(self, conn: asyncpg.Connection | asyncpg.Pool, leases: dict[str, float],
                            worker: str) -> asyncpg.Record | None:
        """Claim one due suspect of the partitions in ``leases`` (partition -> lease seconds)."""
        names = list(leases)
        return await conn.fetchrow(self._sql["claim_suspect"], names, [float(leases[n]) for n in names], worker)

    async def suspects_due(self, conn: asyncpg.Connection | asyncpg.Pool, partitions: Sequence[str]) -> bool:
        return bool(await conn.fetchval(self._sql["suspects_due"], list(partitions)))

    async def next_due(self, conn: asyncpg.Connection | asyncpg.Pool, partitions: Sequence[str]) -> float | None:
        """Seconds until the next pending row of ``partitions`` is due, by the server's clock (None: none)."""
        if not partitions:
            return None
        seconds = await conn.fetchval(self._sql["next_due"], list(partitions))
        return None if seconds is None else float(seconds)

    async def extend_leases(self, conn: asyncpg.Connection | asyncpg.Pool, ids: Sequence[int], worker: str,
                            lease_seconds: float) -> set[int]:
        """Extend ``worker``'s leases on ``ids``; return the ids whose lease it has lost."""
        rows = await conn.fetch(self._sql["extend_leases"], list(ids), worker, float(lease_seconds))
        return {r["id"] for r in rows}

    async def complete(self, conn: asyncpg.Connection | asyncpg.Pool, done: Sequence[tuple[int, int]],
                       worker: str) -> set[int]:
        """Mark (id, attempts) pairs done and log them; returns the ids whose lease was still ours."""
        ids = await conn.fetchval(self._sql["complete"], [d[0] for d in done], [d[1] for d in done], worker)
        return set(ids or ())

    async def retry(self, conn: asyncpg.Connection | asyncpg.Pool, id: int, attempts: int, worker: str,
                    delay: float, error: str, detail: str | None = None) -> bool:
        """Book a failed attempt for another one after ``delay`` seconds; False when the lease was lost.
        ``detail``: what the attempt log keeps instead of ``error`` (the error with its traceback)."""
        return bool(await conn.fetchval(self._sql["fail"], id, attempts, worker, float(delay), error, detail))

    async def bury(self, conn: asyncpg.Connection | asyncpg.Pool, id: int, attempts: int, worker: str,
                   error: str, detail: str | None = None) -> bool:
        """Book a failed attempt as the last: the row is dead; False when the lease was lost."""
        return bool(await conn.fetchval(self._sql["fail"], id, attempts, worker, None, error, detail))

    async def release(self, conn: asyncpg.Connection | asyncpg.Pool, ids: Sequence[int], worker: str,
                      delay: float = 0.0) -> set[int]:
        rows = await conn.fetch(self._sql["release"], list(ids), worker, float(delay))
        return {r["id"] for r in rows}

    async def sweep_expired(self, conn: asyncpg.Connection | asyncpg.Pool, policies: dict[str, RetryPolicy],
                            default: RetryPolicy = RetryPolicy(), limit: int = 1000,
                            partition: str | None = None) -> SweepResult:
        """The rescuer: leases that ran out go back to pending — or to dead once the partition's
        max_attempts is used up — with the attempt counted and the same backoff as a failed
        attempt (``RetryPolicy.delay``, drawn per row, so rows claimed together are not due
        together again), and their consumers are woken. Unknown partitions get ``default``;
        ``partition`` limits the sweep."""
        async with _connection(conn) as c, c.transaction():
            expired = await c.fetch(self._sql["lock_expired"], limit, partition)
            if not expired:
                return SweepResult({}, {})
            fates = [(r["attempts"] >= (policy := policies.get(r["partition"], default)).max_attempts,
                      policy.delay(r["attempts"])) for r in expired]
            await c.execute(self._sql["requeue_expired"], [r["id"] for r in expired], [f[0] for f in fates],
                            [f[1] for f in fates], [r["locked_by"] for r in expired])
            # Requeued rows come due after their backoff, and nothing else tells an idle consumer they
            # exist: woken now, it sleeps until the first is due (``next_due``) rather than a poll interval.
            back = sorted({r["partition"] for r, (exhausted, _) in zip(expired, fates, strict=True) if not exhausted})
            if back:
                await c.execute(self._sql["wake"], self.channel, back)
        requeued: dict[str, int] = {}
        dead: dict[str, int] = {}
        holders: dict[str, set[str]] = {}
        for r, (exhausted, _) in zip(expired, fates, strict=True):
            target = dead if exhausted else requeued
            target[r["partition"]] = target.get(r["partition"], 0) + 1
            holders.setdefault(r["partition"], set()).add(r["locked_by"])
        return SweepResult(requeued, dead, {name: len(h) for name, h in holders.items()})

    async def replay_dead(self, conn: asyncpg.Connection, partition: str | None = None,
                          since: datetime | None = None, until: datetime | None = None,
                          ids: Sequence[int] | None = None) -> dict[str, int]:
        """Requeue dead rows and wake the consumers of their partitions: the one replay path.
        Returns the count requeued per partition."""
        counts: dict[str, int] = {}
        async with conn.transaction():
            rows = await conn.fetch(self._sql["replay_dead"], partition, since, until,
                                    None if ids is None else list(ids))
            for r in rows:
                counts[r["partition"]] = counts.get(r["partition"], 0) + 1
            if counts:
                await conn.execute(self._sql["wake"], self.channel, sorted(counts))
        return counts

    async def stats(self, conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, PartitionStats]:
        return {
            r["partition"]: PartitionStats(int(r["pending"]), float(r["oldest_pending_seconds"]), int(r["dead"]),
                                           int(r["suspects"]))
            for r in await conn.fetch(self._sql["stats"])
        }


class _Fetcher(Protocol):
    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]: ...


@contextlib.asynccontextmanager
async def _connection(conn: asyncpg.Connection | asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """One connection for a transaction: ``conn`` itself, or one taken from the pool."""
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as acquired:
            yield acquired
    else:
        yield conn


INBOX = Queue("hookline.inbox", "provider", "hookline_inbox", log_name="inbox", deferrable=True, timed=True)
OUTBOX = Queue("hookline.deliveries", "endpoint", "hookline_outbox", log_name="deliveries", order_key="aggregate_key",
               retries_first=True)


def truncate_error(message: str, secrets: Iterable[str] = (), limit: int = 2000) -> str:
    """An error message safe to store: secrets masked, length bounded."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message if len(message) <= limit else message[: limit - 15] + "... (truncated)"
