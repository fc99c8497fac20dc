"""What each provider's inbox looks like right now, for every provider in one indexed query.

The signals mean what they say (see ``provider_stats`` in sql/queries.sql):
``backlog`` is the work a worker could do now — due events plus events in flight —
so retries backing off and deferred events never ask for more workers; they are
reported on their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import asyncpg

from hookline.core import db, metrics


class ProviderStats(NamedTuple):
    due: int = 0  # pending with next_attempt_at <= now(): claimable this instant
    oldest_due_seconds: float = 0.0  # how long the longest-waiting due event has waited; never negative
    retrying: int = 0  # pending after a failed attempt, backing off (not due yet)
    deferred: int = 0  # pending, waiting for a predecessor (ordering)
    in_flight: int = 0  # processing: leased by a worker
    expired_leases: int = 0  # in flight, but the lease ran out (the sweeper's work)
    dead: int = 0
    suspects: int = 0  # pending, waiting to run alone after a lease expired (counted in due or retrying too)

    @property
    def backlog(self) -> int:
        return self.due + self.in_flight


NO_EVENTS = ProviderStats()


async def provider_stats(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, ProviderStats]:
    """Every provider with any unfinished or dead event; a provider not in the result has none."""
    return {
        row["provider"]: ProviderStats(
            due=int(row["due"]), oldest_due_seconds=max(0.0, float(row["oldest_due_seconds"])),
            retrying=int(row["retrying"]), deferred=int(row["deferred"]), in_flight=int(row["in_flight"]),
            expired_leases=int(row["expired_leases"]), dead=int(row["dead"]), suspects=int(row["suspects"]),
        )
        for row in await conn.fetch(db.query("provider_stats"))
    }


def publish(providers: dict[str, ProviderStats], known: Iterable[str]) -> None:
    """Set the inbox gauges (hookline_inbox_*) of every provider in ``providers`` or ``known``;
    a known provider without events gets zeros rather than keeping its last values."""
    for name in set(providers) | set(known):
        stats = providers.get(name, NO_EVENTS)
        metrics.inbox_backlog.labels(name).set(stats.backlog)
        metrics.inbox_oldest_pending.labels(name).set(stats.oldest_due_seconds)
        metrics.inbox_dead.labels(name).set(stats.dead)
        metrics.inbox_retrying.labels(name).set(stats.retrying)
        metrics.inbox_deferred.labels(name).set(stats.deferred)
        metrics.inbox_in_flight.labels(name).set(stats.in_flight)
        metrics.inbox_suspects.labels(name).set(stats.suspects)
