"""``hookline status``: is anything stuck, for which provider or endpoint, since when, and why.

Four statements, each reading indexes only: the operator's ``provider_stats`` (queries.sql)
for the inbox queue signals, ``recent_inbox_activity`` and ``endpoint_status`` (status.sql)
for the last minutes' traffic and the endpoints, and ``handler_problems`` (status.sql) for
what the workers found wrong with a provider's handler.

Unhealthy (``Status.problems``) means something a person must look at:
dead letters (inbox events or deliveries), a provider whose oldest due event has waited
longer than the threshold, a provider whose handler a worker cannot import (its events wait,
their attempts not counted), an endpoint whose circuit is open, a disabled endpoint.
Retries backing off, deferrals and a half-open circuit are normal operation.

The database's durability (core/durability.py: what a failover or crash can lose) is shown with its
warnings; they are not problems (a team may choose the risk, and some engines replicate below
Postgres), so they never make the status unhealthy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hookline.core import db
from hookline.core.durability import Durability, read
from hookline.core.inbox_stats import NO_EVENTS, provider_stats

RECENT_SECONDS = 300.0


@dataclass(frozen=True)
class ProviderStatus:
    name: str
    due: int  # claimable now
    retrying: int  # backing off after a failed attempt
    deferred: int  # waiting for a predecessor (ordering)
    processing: int  # leased by a worker
    dead: int
    oldest_due_seconds: float
    accepted_recently: int  # events received in the last RECENT_SECONDS
    failed_recently: int  # attempts failed in the last RECENT_SECONDS
    handler_problem: str | None = None  # why a worker cannot import the provider's handler


@dataclass(frozen=True)
class EndpointStatus:
    name: str
    enabled: bool
    circuit: str  # closed, open, half_open
    pending: int
    parked: int
    dead: int
    last_at: datetime | None
    last_outcome: str | None  # done, retry, dead, expired, parked
    last_http_status: int | None
    last_latency_ms: float | None
    last_error: str | None
    disabled_reason: str | None


@dataclass(frozen=True)
class Status:
    providers: list[ProviderStatus]
    endpoints: list[EndpointStatus]
    max_oldest_due_seconds: float
    recent_seconds: float
    database: Durability

    def problems(self) -> list[str]:
        """What makes the installation unhealthy, one sentence each; empty when healthy."""
        found: list[str] = []
        for p in self.providers:
            if p.handler_problem is not None:
                found.append(f"provider {p.name}: {p.handler_problem}")
            if p.dead:
                found.append(f"provider {p.name}: {p.dead} dead events")
            if p.oldest_due_seconds > self.max_oldest_due_seconds:
                found.append(f"provider {p.name}: oldest due event waiting {p.oldest_due_seconds:.0f} s "
                             f"(over {self.max_oldest_due_seconds:g} s)")
        for e in self.endpoints:
            if not e.enabled:
                found.append(f"endpoint {e.name}: disabled ({e.disabled_reason or 'no reason recorded'})")
            elif e.circuit == "open":
                found.append(f"endpoint {e.name}: circuit open")
            if e.dead:
                found.append(f"endpoint {e.name}: {e.dead} dead deliveries")
        return found

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": not self.problems(),
            "problems": self.problems(),
            "recent_seconds": self.recent_seconds,
            "max_oldest_due_seconds": self.max_oldest_due_seconds,
            "database": self.database.as_json(),
            "providers": [asdict(p) for p in self.providers],
            "endpoints": [{**asdict(e), "last_at": e.last_at.isoformat() if e.last_at else None}
                          for e in self.endpoints],
        }


async def collect(conn: asyncpg.Connection, *, max_oldest_due_seconds: float = 300.0,
                  recent_seconds: float = RECENT_SECONDS) -> Status:
    """The status of every provider (known, or with events) and every endpoint."""
    queues = await provider_stats(conn)
    names = {r["name"] for r in await conn.fetch(db.query("provider_names", "status.sql"))} | set(queues)
    recent = {r["provider"]: r for r in await conn.fetch(db.query("recent_inbox_activity", "status.sql"),
                                                          float(recent_seconds), sorted(names))}
    handler_problems = {r["provider"]: r for r in await conn.fetch(db.query("handler_problems", "status.sql"))}
    providers = []
    for name in sorted(names | set(recent)):
        q = queues.get(name, NO_EVENTS)
        r = recent.get(name)
        h = handler_problems.get(name)
        providers.append(ProviderStatus(
            name=name, due=q.due, retrying=q.retrying, deferred=q.deferred, processing=q.in_flight, dead=q.dead,
            oldest_due_seconds=round(q.oldest_due_seconds, 3),
            accepted_recently=int(r["accepted"]) if r else 0, failed_recently=int(r["failed"]) if r else 0,
            handler_problem=None if h is None else
            f"handler {h['handler']} cannot be imported ({h['problem']}); its events wait, their attempts "
            f"not counted (worker {h['worker']}, since {h['since'].isoformat(timespec='seconds')})"))
    endpoints = [
        EndpointStatus(
            name=r["name"], enabled=r["enabled"], circuit=r["circuit_state"], pending=int(r["pending"]),
            parked=int(r["parked"]), dead=int(r["dead"]), last_at=r["last_at"], last_outcome=r["last_outcome"],
            last_http_status=r["last_http_status"], last_latency_ms=r["last_latency_ms"],
            last_error=r["last_error"], disabled_reason=r["disabled_reason"])
        for r in await conn.fetch(db.query("endpoint_status", "status.sql"))
    ]
    return Status(providers, endpoints, max_oldest_due_seconds, recent_seconds, await read(conn))


def render_table(status: Status) -> str:
    """The status for people: a table of providers, one of endpoints, then the verdict."""
    window = f"{status.recent_seconds / 60:g}m"
    lines = [f"{'PROVIDER':<24} {'DUE':>7} {'RETRYING':>8} {'DEFERRED':>8} {'PROCESSING':>10} {'DEAD':>6} "
             f"{'OLDEST DUE':>10} {'ACCEPTED ' + window:>12} {'FAILED ' + window:>10}"]
    for p in status.providers:
        lines.append(f"{p.name:<24} {p.due:>7} {p.retrying:>8} {p.deferred:>8} {p.processing:>10} {p.dead:>6} "
                     f"{_age(p.oldest_due_seconds):>10} {p.accepted_recently:>12} {p.failed_recently:>10}")
    if not status.providers:
        lines.append("(no providers)")
    lines.append("")
    lines.append(f"{'ENDPOINT':<24} {'STATE':<13} {'PENDING':>7} {'PARKED':>7} {'DEAD':>6}  LAST RESPONSE")
    for e in status.endpoints:
        state = endpoint_state(e.enabled, e.circuit)
        lines.append(f"{e.name:<24} {state:<13} {e.pending:>7} {e.parked:>7} {e.dead:>6}  {_last_response(e)}")
    if not status.endpoints:
        lines.append("(no endpoints)")
    lines.append("")
    lines.append(f"DATABASE  {status.database.summary()}")
    lines.extend(f"  warning: {warning}" for warning in status.database.warnings().values())
    lines.extend(f"  note: {note}" for note in status.database.notes())
    lines.append("")
    problems = status.problems()
    lines.append("healthy" if not problems else "UNHEALTHY:\n" + "\n".join(f"  - {p}" for p in problems))
    return "\n".join(lines)


def endpoint_state(enabled: bool, circuit: str, paused: bool = False) -> str:
    """An endpoint's state as `endpoints list` and `status` show it (``-o json`` keeps the circuit's
    own names: closed, open, half_open)."""
    if not enabled:
        return "disabled"
    if paused:
        return "paused"
    return {"closed": "healthy", "open": "circuit open", "half_open": "probing"}.get(circuit, circuit)


def _age(seconds: float) -> str:
    if seconds < 1:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _last_response(e: EndpointStatus) -> str:
    if e.last_at is None:
        return "-"
    answer = f"HTTP {e.last_http_status}" if e.last_http_status is not None else (e.last_error or "no answer")[:60]
    latency = f" in {e.last_latency_ms:.0f} ms" if e.last_latency_ms else ""
    return f"{e.last_outcome} {answer}{latency} at {e.last_at.isoformat(timespec='seconds')}"
