"""Queue statistics: one query per tick for every provider, read from a cache by every resource.

Cost grows with the number of unfinished events, never with the number of providers:
an operator-level maintenance job (``refresher``) runs ``provider_stats`` once per interval and keeps the result;
each resource's timers read it from the memo. A snapshot older than a few intervals
(Postgres unreachable) is not used: the operator never acts on what it cannot see.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from hookline.core import db, inbox_stats, metrics
from hookline.core.db import DATABASE_ERRORS
from hookline.core.inbox_stats import NO_EVENTS, ProviderStats, provider_stats
from hookline.core.maintenance import Job

log = logging.getLogger("hookline.operator")

STALE_AFTER_INTERVALS = 3


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # time.monotonic()
    providers: dict[str, ProviderStats]
    # provider -> why a worker cannot import its handler (hookline.handler_problems, migration 0027)
    handler_problems: dict[str, str] = field(default_factory=dict)

    def of(self, provider: str) -> ProviderStats:
        return self.providers.get(provider, NO_EVENTS)


@dataclass
class StatsCache:
    """The latest snapshot, and why there is no fresh one when there is not."""

    latest: Snapshot | None = None
    error: str = "no statistics read yet"
    refreshes: int = 0
    published: set[str] = field(default_factory=set)  # providers with gauges, to zero them once drained

    def fresh(self, interval: float, now: float | None = None) -> Snapshot | None:
        now = time.monotonic() if now is None else now
        if self.latest is None or now - self.latest.taken_at > STALE_AFTER_INTERVALS * interval:
            return None
        return self.latest


async def refresh(pool: asyncpg.Pool, cache: StatsCache) -> None:
    """Read every provider's statistics once; on failure keep the error (the snapshot goes stale)."""
    metrics.operator_stats_queries.inc()
    try:
        providers = await provider_stats(pool)
        # A few rows at most (one per provider whose handler does not import): no cost per provider.
        problems = {r["provider"]: f"handler {r['handler']} cannot be imported ({r['problem']})"
                    for r in await pool.fetch(db.query("handler_problems", "status.sql"))}
    except DATABASE_ERRORS as exc:
        cache.error = f"cannot read the inbox statistics ({type(exc).__name__})"
        log.warning("inbox statistics unavailable", extra={"error": str(exc)})
        metrics.operator_dependency_up.labels("postgres").set(0)
        return
    metrics.operator_dependency_up.labels("postgres").set(1)
    cache.latest = Snapshot(time.monotonic(), providers, problems)
    cache.refreshes += 1
    publish_metrics(providers, cache.published)
    log.debug("inbox statistics refreshed", extra={"providers": len(providers)})


def refresher(pool: asyncpg.Pool, cache: StatsCache, interval: float) -> Job:
    """The operator's statistics as a maintenance job run in every operator process (each shows
    its own resources' numbers): one query per interval, whatever the number of providers."""

    async def refresh_cache() -> None:
        await refresh(pool, cache)

    return Job("operator-stats", refresh_cache, interval, per_process=True)


def publish_metrics(providers: dict[str, ProviderStats], published: set[str]) -> None:
    """The hookline_inbox_* gauges on the operator's /metrics; a drained provider reports zeros."""
    inbox_stats.publish(providers, published)
    published.update(providers)


INT64_MAX = 2**63 - 1


def _count(value: float) -> int:
    """A CRD integer field: whole, 0 <= value <= int64 (NaN counts as 0)."""
    if value != value:  # NaN
        return 0
    return max(0, min(INT64_MAX, int(value)))


def status_fields(stats: ProviderStats) -> dict[str, Any]:
    """The WebhookProvider status numbers for one provider; every value satisfies the CRD
    schema (integers, minimum 0, int64), whatever the statistics hold."""
    return {
        "backlog": _count(stats.backlog),
        "oldestPendingSeconds": _count(stats.oldest_due_seconds) if stats.due > 0 else 0,
        "retrying": _count(stats.retrying),
        "deferred": _count(stats.deferred),
        "inFlight": _count(stats.in_flight),
        "deadLetters": _count(stats.dead),
    }


# Written when the resource does not own its provider name: another resource's numbers are
# never shown, and a merge patch with None removes numbers shown before the name was lost.
NOT_REPORTED: dict[str, Any] = dict.fromkeys(status_fields(NO_EVENTS))
