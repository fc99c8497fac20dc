"""Leased claiming over a Postgres table: the one mechanism behind the inbox and the outbox.

A queue table has the columns ``id bigint, status text, attempts int,
next_attempt_at, lease_expires_at, locked_by, last_error, processed_at,
deferred_since, suspect`` and a partition column (``provider`` for the inbox,
``endpoint`` for outbox deliveries), plus a partial index on
``(partition, next_attempt_at, id) WHERE status = 'pending'``. The SQL is in
``sql/queue.sql``; this module fills in the table names once and gives it types.

Every write after the claim is guarded by (id, attempts, locked_by): a worker
whose lease was swept and re-claimed by another cannot overwrite the newer
attempt's outcome.

Rows whose lease expired come back as *suspects* (they may have killed their
consumer): ``claim`` skips them and ``claim_suspect`` hands out one at a time to a
consumer with nothing else in flight (see ``core/consumer.py``).
"""

from __future__ import annotations

import functools
import importlib.resources
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from hookline.core.db import parse_queries

MAX_RETRY_AFTER = 86400.0


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


@functools.cache
def _templates() -> dict[str, str]:
    return parse_queries(importlib.resources.files("hookline.core").joinpath("sql/queue.sql").read_text())


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
    backlog: int
    oldest_pending_seconds: float
    dead: int
    suspects: int = 0  # pending rows that must run alone (their last lease expired)


class Queue:
    """The queue operations for one table, e.g. ``Queue("hookline.inbox", "provider")``.

    ``order_key`` names a column whose rows must be processed one at a time in id
    order within a partition; it enables ``claim(..., ordered=True)``.
    """

    def __init__(self, table: str, partition: str, order_key: str | None = None) -> None:
        self.table = table
        self.partition = partition
        self.order_key = order_key
        names = {"table": table, "partition": partition, "order_key": order_key}
        templates = dict(_templates())
        ordered_filter = templates.pop("ordered_claim_filter")
        self._sql = {name: sql.format(**names, claim_filter="") for name, sql in templates.items()}
        if order_key is not None:
            self._sql["claim_ordered"] = templates["claim"].format(
                **names, claim_filter=ordered_filter.format(**names))

    def sql(self, name: str) -> str:
        return self._sql[name]

    async def claim(self, conn: asyncpg.Connection | asyncpg.Pool, partition: str, limit: int, worker: str,
                    lease_seconds: float, *, ordered: bool = False) -> list[asyncpg.Record]:
        sql = self._sql["claim_ordered" if ordered else "claim"]
        return list(await conn.fetch(sql, partition, limit, worker, float(lease_seconds)))

    async def claim_suspect(self, conn: asyncpg.Connection | asyncpg.Pool, leases: dict[str, float],
                            worker: str) -> asyncpg.Record | None:
        """Claim one due suspect of the partitions in ``leases`` (partition -> lease seconds)."""
        names = list(leases)
        return await conn.fetchrow(self._sql["claim_suspect"], names, [float(leases[n]) for n in names], worker)

    async def suspects_due(self, conn: asyncpg.Connection | asyncpg.Pool, partitions: Sequence[str]) -> bool:
        return bool(await conn.fetchval(self._sql["suspects_due"], list(partitions)))

    async def extend_leases(self, conn: asyncpg.Connection | asyncpg.Pool, ids: Sequence[int], worker: str,
                            lease_seconds: float) -> set[int]:
        """Extend ``worker``'s leases on ``ids``; return the ids whose lease it has lost."""
        rows = await conn.fetch(self._sql["extend_leases"], list(ids), worker, float(lease_seconds))
        return {r["id"] for r in rows}

    async def complete(self, conn: asyncpg.Connection | asyncpg.Pool, done: Sequence[tuple[int, int]],
                       worker: str) -> set[int]:
        rows = await conn.fetch(self._sql["complete"], [d[0] for d in done], [d[1] for d in done], worker)
        return {r["id"] for r in rows}

    async def retry(self, conn: asyncpg.Connection | asyncpg.Pool, id: int, attempts: int, worker: str,
                    delay: float, error: str) -> bool:
        return await conn.fetchval(self._sql["retry"], id, attempts, worker, float(delay), error) is not None

    async def bury(self, conn: asyncpg.Connection | asyncpg.Pool, id: int, attempts: int, worker: str,
                   error: str) -> bool:
        return await conn.fetchval(self._sql["bury"], id, attempts, worker, error) is not None

    async def release(self, conn: asyncpg.Connection | asyncpg.Pool, ids: Sequence[int], worker: str,
                      delay: float = 0.0) -> set[int]:
        rows = await conn.fetch(self._sql["release"], list(ids), worker, float(delay))
        return {r["id"] for r in rows}

    async def sweep_expired(self, conn: asyncpg.Connection | asyncpg.Pool, policies: dict[str, RetryPolicy],
                            default: RetryPolicy = RetryPolicy(), limit: int = 1000,
                            partition: str | None = None) -> SweepResult:
        names = list(policies)
        rows = await conn.fetch(
            self._sql["sweep_expired"], names,
            [policies[n].max_attempts for n in names], [policies[n].initial_delay for n in names],
            [policies[n].max_delay for n in names],
            default.max_attempts, default.initial_delay, default.max_delay, limit, partition,
        )
        requeued: dict[str, int] = {}
        dead: dict[str, int] = {}
        holders: dict[str, set[str]] = {}
        for r in rows:
            target = dead if r["status"] == "dead" else requeued
            target[r["partition"]] = target.get(r["partition"], 0) + 1
            holders.setdefault(r["partition"], set()).add(r["holder"])
        return SweepResult(requeued, dead, {name: len(h) for name, h in holders.items()})

    async def replay_dead(self, conn: asyncpg.Connection | asyncpg.Pool, partition: str | None = None,
                          since: datetime | None = None, until: datetime | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in await conn.fetch(self._sql["replay_dead"], partition, since, until):
            counts[r["partition"]] = counts.get(r["partition"], 0) + 1
        return counts

    async def stats(self, conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, PartitionStats]:
        return {
            r["partition"]: PartitionStats(int(r["backlog"]), float(r["oldest_pending_seconds"]), int(r["dead"]),
                                           int(r["suspects"]))
            for r in await conn.fetch(self._sql["stats"])
        }

    async def in_flight(self, conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, int]:
        return {r["partition"]: int(r["processing"]) for r in await conn.fetch(self._sql["in_flight"])}


INBOX = Queue("hookline.inbox", "provider")
OUTBOX = Queue("hookline.deliveries", "endpoint", order_key="aggregate_key")


def truncate_error(message: str, secrets: Iterable[str] = (), limit: int = 2000) -> str:
    """An error message safe to store: secrets masked, length bounded."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message if len(message) <= limit else message[: limit - 15] + "... (truncated)"
