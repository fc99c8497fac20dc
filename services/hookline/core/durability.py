"""What a failover (or a crash) of the database can lose: the durability Postgres actually gives.

An event is acknowledged once its commit returns. Whether that commit survives depends on settings no
Hookline code can change: with no synchronous standby, a failover promotes a standby that may not
have the last commits yet; with ``synchronous_commit`` off or ``fsync`` off, even a crash of the one
server can lose them. Hookline warns (``hookline status``, a log line when each service starts and
whenever it changes, the ``hookline_database_durability_warning`` metric) and never refuses: engines
that replicate below Postgres (RDS Multi-AZ, Aurora, Cloud SQL HA) keep commits without a standby
Postgres can see, and a team may choose the risk. docs/postgres.md says how to fix each warning.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from hookline.core import db, metrics

log = logging.getLogger(__name__)

REFRESH_SECONDS = 60.0
EMPTY = "''"
FIX = ("see docs/postgres.md, 'What a failover can lose' (pg_auto_failover: number_sync_standbys; Patroni: "
       "synchronous_mode; CloudNativePG: postgresql.synchronous; RDS Multi-AZ, Aurora and Cloud SQL HA "
       "replicate below Postgres)")


@dataclass(frozen=True)
class Durability:
    synchronous_commit: str
    synchronous_standby_names: str
    fsync: str
    full_page_writes: str
    synchronous_standbys: int  # connected now and synchronous (sync or quorum)
    unseen_standbys: int  # connected, but this role may not see how (it lacks pg_read_all_stats)
    standbys: int

    def warnings(self) -> dict[str, str]:
        """What can lose acknowledged events, by reason (the metric's label), one sentence each."""
        found: dict[str, str] = {}
        if self.fsync != "on":
            found["fsync_off"] = ("fsync is off: a crash of the database server can lose or corrupt "
                                  "acknowledged events")
        if self.full_page_writes != "on":
            found["full_page_writes_off"] = ("full_page_writes is off: a crash of the database server "
                                             "can corrupt pages that hold acknowledged events")
        if self.synchronous_commit == "off":
            found["synchronous_commit_off"] = (
                "synchronous_commit is off: commits are acknowledged before they are on disk, so a crash "
                "of the database server can lose the last acknowledged events")
        if not self.synchronous_standby_names.strip():
            found["no_synchronous_standby"] = (
                "no synchronous standby (synchronous_standby_names is empty): a failover can lose "
                "the events acknowledged just before it, unless the engine replicates below Postgres")
        elif self.synchronous_commit in ("off", "local"):
            found["standby_not_awaited"] = (
                f"synchronous_commit is {self.synchronous_commit}: commits do not wait for the synchronous "
                "standby, so a failover can lose the events acknowledged just before it")
        elif self.synchronous_standbys == 0 and self.unseen_standbys == 0:
            found["synchronous_standby_disconnected"] = (
                "a synchronous standby is configured but none is connected now: commits wait until one "
                "connects (the engine may drop the requirement, and then a failover can lose events)")
        return found

    def notes(self) -> list[str]:
        """What is not a risk but worth knowing."""
        if self.unseen_standbys:
            return [f"{self.unseen_standbys} standby(s) connected whose synchronous state this role cannot "
                    "see (grant it pg_monitor to see it)"]
        return []

    def summary(self) -> str:
        standbys = f"{self.synchronous_standbys} synchronous of {self.standbys} connected"
        if self.unseen_standbys:
            standbys += f", {self.unseen_standbys} unseen"
        return (f"synchronous_commit={self.synchronous_commit}, synchronous_standby_names="
                f"{self.synchronous_standby_names or EMPTY}, standbys: {standbys}, fsync={self.fsync}, "
                f"full_page_writes={self.full_page_writes}")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "warnings": list(self.warnings().values()), "notes": self.notes()}


async def read(conn: asyncpg.Connection | asyncpg.Pool) -> Durability:
    row = await conn.fetchrow(db.query("database_durability", "status.sql"))
    assert row is not None
    return Durability(
        synchronous_commit=row["synchronous_commit"], synchronous_standby_names=row["synchronous_standby_names"],
        fsync=row["fsync"], full_page_writes=row["full_page_writes"],
        synchronous_standbys=int(row["synchronous_standbys"]), unseen_standbys=int(row["unseen_standbys"]),
        standbys=int(row["standbys"]))


def report(durability: Durability, previous: Durability | None = None) -> None:
    """The metrics, and a log line: at start (``previous`` None) always, later only when a warning
    comes or goes."""
    warnings = durability.warnings()
    metrics.database_synchronous_standbys.set(durability.synchronous_standbys)
    for reason in metrics.DURABILITY_WARNINGS:
        metrics.database_durability_warning.labels(reason).set(1 if reason in warnings else 0)
    if previous is not None and previous.warnings().keys() == warnings.keys():
        return
    if warnings:
        log.warning("database durability: acknowledged events can be lost: " + "; ".join(warnings.values()),
                    extra={"durability": durability.summary(), "fix": FIX})
    else:
        log.info("database durability: a failover or crash loses no acknowledged event",
                 extra={"durability": durability.summary()})


async def watch(pool: asyncpg.Pool, first: Durability | None) -> None:
    """Read again every REFRESH_SECONDS (a standby can disconnect, an engine can change its settings);
    a read that fails (the database is away) is tried again at the next one."""
    previous = first
    while True:
        await asyncio.sleep(REFRESH_SECONDS)
        try:
            current = await read(pool)
        except db.DATABASE_ERRORS:
            continue
        report(current, previous)
        previous = current


async def check_at_start(pool: asyncpg.Pool) -> Durability | None:
    """The start-up read and its log line; a database that cannot tell is no reason not to start."""
    try:
        durability = await read(pool)
    except db.DATABASE_ERRORS as exc:
        log.warning("database durability: could not be read", extra={"error": str(exc)[:200]})
        return None
    report(durability)
    return durability
