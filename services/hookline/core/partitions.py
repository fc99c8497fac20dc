"""The partition manager: time partitions created ahead, and retention by dropping them.

The inbox is partitioned by ``received_at`` (migration 0011), outbox events and their deliveries
by the event's ``created_at`` (migration 0018, the two tables on one grid). Like pg_partman, a
job creates the partitions of the next periods before they are needed and drops old ones whole,
so old rows leave without a long ``DELETE`` and without vacuum debt. Unlike a plain time-based
drop, nothing that must be kept is ever dropped: a partition that still holds pending,
processing or parked rows, or dead letters younger than their provider's or endpoint's
``deadDays``, stays; only its rows past their own limit are deleted, in small batches like
River's job cleaner, and the partition goes once the survivors are gone. The decisions are in SQL
functions (``hookline.expire_inbox``, ``hookline.expire_outbox``) so that each pass is one
transaction that locks a partition before it checks and drops it.

Dedup keys (``hookline.inbox_keys``) have their own, usually longer window (``dedupDays``), and a
key is never deleted while the partition of its event may still exist.

The job runs on the leader of the ``partitions`` maintenance scope only (``core/maintenance.py``).
"""

from __future__ import annotations

import datetime
import logging
import re
from dataclasses import dataclass, field

import asyncpg

from hookline.core import db, metrics
from hookline.core.config import ConfigError

log = logging.getLogger(__name__)

INBOX = "hookline.inbox"
OUTBOX = "hookline.outbox"
DELIVERIES = "hookline.deliveries"
PARTITION_INTERVAL = 60.0  # seconds between the manager's passes
BATCH = 5000  # rows per batch delete: short transactions, little WAL at once
MAX_BATCHES = 20  # per pass; the rest waits for the next pass
# Drops per run and table: each is a pass and a transaction of its own (migration 0019), so they
# are counted apart from the batches, and many aged partitions (after an outage, or partitions of
# seconds in tests) cannot use up the batch deletes' turn.
MAX_DROPS = 200
_PARTITION_SUFFIX = re.compile(r"_(p\d{8}_\d{6}|legacy|default)$")
LOCK_WAIT = datetime.timedelta(seconds=1)  # longest a drop waits for its lock before deferring


@dataclass(frozen=True, slots=True)
class Retention:
    """Default retention, for providers whose spec has no ``retention`` (chart: retention.*) and
    endpoints created without one (chart: retention.endpoints.*); read by core/settings.py retention_from_env."""

    done_hours: float = 72.0
    dead_days: float = 14.0
    dedup_days: float = 30.0
    endpoint_done_hours: float = 72.0
    endpoint_dead_days: float = 14.0
    # The most any provider's spec.retention may keep (chart: retention.maxDoneHours, maxDeadDays):
    # whole partitions are dropped by the longest retention of all providers, so without a bound
    # one team's spec decides how long every team's events stay.
    max_done_hours: float = 720.0
    max_dead_days: float = 90.0

    def __post_init__(self) -> None:
        if self.max_done_hours < self.done_hours or self.max_dead_days < self.dead_days:
            raise ConfigError("the maximum retention (HOOKLINE_RETENTION_MAX_DONE_HOURS, _MAX_DEAD_DAYS) must be at "
                             "least the default one (HOOKLINE_RETENTION_DONE_HOURS, _DEAD_DAYS)")

    @property
    def done(self) -> datetime.timedelta:
        return datetime.timedelta(hours=self.done_hours)

    @property
    def dead(self) -> datetime.timedelta:
        return datetime.timedelta(days=self.dead_days)

    @property
    def max_done(self) -> datetime.timedelta:
        return datetime.timedelta(hours=self.max_done_hours)

    @property
    def max_dead(self) -> datetime.timedelta:
        return datetime.timedelta(days=self.max_dead_days)

    @property
    def dedup(self) -> datetime.timedelta:
        return datetime.timedelta(days=self.dedup_days)

    @property
    def endpoint_done(self) -> datetime.timedelta:
        return datetime.timedelta(hours=self.endpoint_done_hours)

    @property
    def endpoint_dead(self) -> datetime.timedelta:
        return datetime.timedelta(days=self.endpoint_dead_days)


@dataclass
class PassReport:
    """What one retention pass over a table (the inbox, or the outbox with its deliveries) did."""

    table: str
    dropped: dict[str, int] = field(default_factory=dict)  # partition -> rows it held
    deleted_from: dict[str, int] = field(default_factory=dict)  # table -> rows deleted in batches
    keys_deleted: int = 0
    deferred: list[str] = field(default_factory=list)
    default_rows: dict[str, int] = field(default_factory=dict)  # default partition -> rows in it
    kept: int = 0  # rows holding aged partitions back (pending, processing, parked, dead)

    @property
    def deleted(self) -> int:
        return sum(self.deleted_from.values())


@dataclass
class ManagerReport:
    """One pass of the partition manager."""

    created: list[str]
    inbox: PassReport
    outbox: PassReport
    deferred_by_age: list[str]


def _query(name: str) -> str:
    return db.query(name, "partitions.sql")


async def ensure_partitions(pool: asyncpg.Pool | asyncpg.Connection, table: str = INBOX) -> list[str]:
    """Create the partitions of the current period and the configured number ahead."""
    created = [r["created"] for r in await pool.fetch(_query("ensure_partitions"), table)]
    if created:
        metrics.partitions_created.labels(table).inc(len(created))
        log.info("partitions created ahead", extra={"table": table, "partitions": created})
    return created


async def _expire(pool: asyncpg.Pool | asyncpg.Connection, report: PassReport, statement: str,
                  done: datetime.timedelta, dead: datetime.timedelta, batch: int,
                  *bounds: datetime.timedelta) -> None:
    """Passes of one retention function while a pass dropped a partition (a pass ends at its first
    drop, so that it never waits for a lock while holding one: migration 0019) or deleted a full
    batch; at most ``MAX_DROPS`` drops and ``MAX_BATCHES`` other passes, the rest waits for the
    next run."""
    drops = batches = 0
    while drops < MAX_DROPS and batches < MAX_BATCHES:
        report.kept = 0  # each pass counts them afresh; the last pass's count stands
        rows = await pool.fetch(_query(statement), done, dead, batch, LOCK_WAIT, *bounds)
        for row in rows:
            _account(report, row["action"], row["target"], row["affected"])
        if any(row["action"] == "dropped" for row in rows):
            drops += 1
        elif any(row["action"] == "deleted" and row["affected"] >= batch for row in rows):
            batches += 1
        else:
            break


async def expire_inbox(pool: asyncpg.Pool | asyncpg.Connection, retention: Retention,
                       batch: int = BATCH) -> PassReport:
    """Retention of inbox payloads and dedup keys: whole partitions dropped when nothing in them
    must be kept, otherwise batch deletes of rows past their own limit."""
    report = PassReport(INBOX)
    await _expire(pool, report, "expire_inbox", retention.done, retention.dead, batch,
                  retention.max_done, retention.max_dead)
    for _ in range(MAX_BATCHES):
        deleted = await pool.fetchval(_query("expire_inbox_keys"), retention.dedup, batch)
        report.keys_deleted += deleted
        if deleted < batch:
            break
    _publish(report)
    return report


async def expire_outbox(pool: asyncpg.Pool | asyncpg.Connection, retention: Retention,
                        batch: int = BATCH) -> PassReport:
    """Retention of outbox events and deliveries, per endpoint: a pair of partitions (events and
    their deliveries) dropped whole when nothing in it must be kept, otherwise deliveries past
    their endpoint's limits deleted in batches, then the events left with no delivery."""
    report = PassReport(OUTBOX)
    await _expire(pool, report, "expire_outbox", retention.endpoint_done, retention.endpoint_dead, batch)
    _publish(report)
    return report


def _account(report: PassReport, action: str, target: str, affected: int) -> None:
    if action == "dropped":
        report.dropped[target] = affected
    elif action == "deleted":
        report.deleted_from[target] = report.deleted_from.get(target, 0) + affected
    elif action == "drop_deferred" and target not in report.deferred:
        report.deferred.append(target)
    elif action == "kept":
        report.kept += affected
    elif action == "default_rows":
        report.default_rows[target] = affected


def parent_of(partition: str) -> str:
    """The partitioned table a partition of the manager's naming belongs to (``<parent>_p...``,
    ``<parent>_legacy``, ``<parent>_default``)."""
    return _PARTITION_SUFFIX.sub("", partition)


def _publish(report: PassReport) -> None:
    for partition, rows in report.dropped.items():
        metrics.partitions_dropped.labels(parent_of(partition)).inc()
        metrics.retention_rows.labels(parent_of(partition), "dropped").inc(rows)
    for table, rows in report.deleted_from.items():
        metrics.retention_rows.labels(table, "deleted").inc(rows)
    if report.table == INBOX:
        metrics.retention_rows.labels("hookline.inbox_keys", "deleted").inc(report.keys_deleted)
        metrics.partition_rows_in_default.labels(INBOX).set(report.default_rows.get("hookline.inbox_default", 0))
    else:
        for table in (OUTBOX, DELIVERIES):
            metrics.partition_rows_in_default.labels(table).set(report.default_rows.get(f"{table}_default", 0))
    metrics.partition_rows_kept.labels(report.table).set(report.kept)
    if report.dropped or report.deleted or report.keys_deleted:
        log.info("retention", extra={"table": report.table, "dropped": report.dropped,
                                     "deleted": report.deleted_from, "keys_deleted": report.keys_deleted})
    if report.deferred:
        log.info("partition drop deferred: its lock was not granted in time (busy readers); next pass",
                 extra={"partitions": report.deferred})
    if report.default_rows:
        log.warning("rows in the default partition: no partition covered their time; they are kept and "
                    "retained like any other, but partitions overlapping them cannot be created",
                    extra={"table": report.table, "rows": report.default_rows})


async def expire_by_age(pool: asyncpg.Pool | asyncpg.Connection) -> dict[str, list[str]]:
    """Drop the aged partitions of tables retained by age alone (``partition_config.retain``, migration
    0012: append-only logs); returns the partitions dropped and deferred. One drop per pass and
    transaction (migration 0019), at most ``MAX_DROPS``."""
    done: dict[str, list[str]] = {"dropped": [], "drop_deferred": []}
    for _ in range(MAX_DROPS):
        rows = await pool.fetch(_query("expire_by_age"), LOCK_WAIT)
        for row in rows:
            if row["action"] == "drop_deferred" and row["target"] in done["drop_deferred"]:
                continue  # deferred again in a later pass of this run
            done[row["action"]].append(row["target"])
            if row["action"] == "dropped":
                metrics.partitions_dropped.labels(parent_of(row["target"])).inc()
        if not any(row["action"] == "dropped" for row in rows):
            break
    if done["dropped"]:
        log.info("aged partitions dropped", extra={"partitions": done["dropped"]})
    return done


async def manage_partitions(pool: asyncpg.Pool | asyncpg.Connection, retention: Retention) -> ManagerReport:
    """One pass of the partition manager: create ahead for every partitioned table, then retention."""
    created = []
    for row in await pool.fetch(_query("partitioned_tables")):
        created += await ensure_partitions(pool, row["parent"])
    inbox = await expire_inbox(pool, retention)
    outbox = await expire_outbox(pool, retention)
    dropped_by_age = await expire_by_age(pool)
    return ManagerReport(created, inbox, outbox, dropped_by_age["drop_deferred"])
