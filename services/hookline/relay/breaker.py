"""Each endpoint's circuit breaker, shared by every relay through its row in ``hookline.endpoints``.

States and transitions::

    closed ---- failure rate >= threshold over the window, with >= min_volume outcomes ---> open
    open ------ 1 s later, doubling with each opening in a row up to probe_interval,
                one relay (the one whose row update wins) probes -------------------------> half_open
    half_open - close_after probes succeeded --------------------------------------------> closed
    half_open - probe failures reach the failure rate (so a first failed probe does) ----> open

Why a failure *rate* and not consecutive failures: an endpoint that fails half of
its attempts is alive and must keep receiving, yet it strings five failures
together every few dozen attempts. Why probes prefer retries (the outbox's claim
in queue.sql puts due retries first): a delivery that failed before and now
succeeds is the best evidence of recovery, while a first attempt may fail for
reasons of its own (an endpoint that refuses every message once). Why probes run one at a time and a failed probe
re-opens at once: an endpoint that refuses every connection then costs one probe
per interval, and nothing else. Why the wait before a probe starts at a second and
doubles with each opening in a row (as resilience4j's exponential wait in the open
state, or Envoy's ejection time growing with each ejection): an endpoint that is
alive but fails often (one that refuses every first attempt, say) opens its circuit
with the burst of first attempts before any retry is due; with a fixed wait of
probe_interval it would get nothing for that long, again and again, and be starved.
Its probes (due retries) succeed a second later, and it is slowed instead. A dead
endpoint reaches the full interval after a handful of probes; half a window closed
starts the count again.

The window covers the last ``window_seconds`` in two halves: when the current half
is older than half a window it becomes the previous half, so the rate always
covers between half a window and a whole one of recent outcomes.

Decisions are made here, in plain functions of (row, outcomes, now) that tests can
call; a short transaction locks the endpoint rows (``lock_circuits``), decides with
the database's clock and stores the result (``store_circuits``), so every relay
applies the same rule to the same numbers and exactly one of them makes (and
reports) each transition. The relay's ``Bookkeeper`` (relay/service.py) counts
attempts in batches, in the order their answers arrived.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from hookline import outbox
from hookline.core import metrics

log = logging.getLogger(__name__)


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


FIRST_PROBE_WAIT = 1.0  # seconds from an opening to its probe, doubling with each opening in a row

# hookline_relay_circuit_state's values: higher is worse.
STATE_VALUE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


@dataclass(frozen=True)
class BreakerSettings:
    """The thresholds every relay of an installation should share (the CLI flags of ``hookline relay``)."""

    failure_rate: float = 0.9  # opens at or above this share of failed attempts ...
    min_volume: int = 20  # ... once the window holds at least this many outcomes
    window_seconds: float = 60.0
    probe_interval: float = 30.0  # the longest an open circuit waits before (the next) probe
    close_after: int = 3  # successful probes that close a half-open circuit

    def problems(self) -> list[str]:
        """What is wrong with these settings, as messages naming the flag to fix."""
        found = []
        if not 0.0 < self.failure_rate <= 1.0:
            found.append("--breaker-failure-rate must be above 0 and at most 1 (a share of attempts, e.g. 0.9)")
        if self.min_volume < 1:
            found.append("--breaker-min-volume must be at least 1")
        if self.window_seconds <= 0:
            found.append("--breaker-window must be positive (seconds)")
        if self.probe_interval <= 0:
            found.append("--breaker-probe-interval must be positive (seconds)")
        if self.close_after < 1:
            found.append("--breaker-close-after must be at least 1")
        return found


@dataclass(frozen=True)
class Circuit:
    """The breaker columns of one endpoint row."""

    state: CircuitState = CircuitState.CLOSED
    changed_at: datetime | None = None
    # Open: no probe before this. Half-open: the probe in flight holds the circuit until then
    # (None: the next probe may start now). Column circuit_open_until.
    probe_not_before: datetime | None = None
    window_started_at: datetime | None = None
    successes: int = 0  # in the current half of the window
    failures: int = 0
    previous_successes: int = 0  # in the previous half
    previous_failures: int = 0
    probe_successes: int = 0  # since the circuit went half-open
    probe_failures: int = 0
    consecutive_failures: int = 0  # informational: `hookline endpoints list`
    openings: int = 0  # in a row, without half a window closed between (the probe wait doubles)

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Circuit:
        return cls(
            state=CircuitState(row["circuit_state"]), changed_at=row["circuit_changed_at"],
            probe_not_before=row["circuit_open_until"], window_started_at=row["window_started_at"],
            successes=row["window_successes"], failures=row["window_failures"],
            previous_successes=row["previous_successes"], previous_failures=row["previous_failures"],
            probe_successes=row["probe_successes"], probe_failures=row["probe_failures"],
            consecutive_failures=row["consecutive_failures"], openings=row["circuit_openings"],
        )

    @property
    def volume(self) -> int:
        return self.successes + self.failures + self.previous_successes + self.previous_failures

    @property
    def failure_rate(self) -> float:
        return (self.failures + self.previous_failures) / self.volume if self.volume else 0.0


@dataclass(frozen=True)
class Outcomes:
    """Attempts to one endpoint that finished, to be counted together."""

    successes: int = 0
    failures: int = 0
    probe_successes: int = 0
    probe_failures: int = 0

    def __add__(self, other: Outcomes) -> Outcomes:
        return Outcomes(self.successes + other.successes, self.failures + other.failures,
                        self.probe_successes + other.probe_successes, self.probe_failures + other.probe_failures)


def tally(attempts: Iterable[tuple[str, bool, bool]]) -> dict[str, Outcomes]:
    """(endpoint, ok, probe) per finished attempt, counted per endpoint (one Outcomes per endpoint,
    not one per attempt)."""
    counts: dict[str, list[int]] = {}
    for endpoint, ok, probe in attempts:
        counts.setdefault(endpoint, [0, 0, 0, 0])[(2 if probe else 0) + (0 if ok else 1)] += 1
    return {endpoint: Outcomes(*c) for endpoint, c in counts.items()}


@dataclass(frozen=True)
class CircuitUpdate:
    endpoint: str
    before: CircuitState
    circuit: Circuit

    @property
    def changed(self) -> bool:
        return self.before is not self.circuit.state


def _rolled(c: Circuit, settings: BreakerSettings, now: datetime) -> Circuit:
    """The window as of now (closed): a half that ended rolls over, and ends a run of openings."""
    half = timedelta(seconds=settings.window_seconds / 2)
    if c.window_started_at is not None and now - c.window_started_at < half:
        return c
    if c.window_started_at is not None and now - c.window_started_at < 2 * half:
        return dataclasses.replace(c, window_started_at=now, successes=0, failures=0,
                                   previous_successes=c.successes, previous_failures=c.failures, openings=0)
    return dataclasses.replace(c, window_started_at=now, successes=0, failures=0, previous_successes=0,
                               previous_failures=0, openings=0)


def _fresh_window(c: Circuit, now: datetime) -> Circuit:
    return dataclasses.replace(c, window_started_at=now, successes=0, failures=0, previous_successes=0,
                               previous_failures=0)


def probe_wait(settings: BreakerSettings, openings: int) -> float:
    """Seconds from the opening'th opening in a row to its first probe."""
    return min(settings.probe_interval, FIRST_PROBE_WAIT * 2.0 ** min(max(openings - 1, 0), 30))


def _opened(c: Circuit, settings: BreakerSettings, now: datetime) -> Circuit:
    # The counts stay as they were (nothing is counted while open) for the log line and
    # `endpoints list`; closing starts a fresh window.
    openings = c.openings + 1
    return dataclasses.replace(c, state=CircuitState.OPEN, changed_at=now, openings=openings,
                               probe_not_before=now + timedelta(seconds=probe_wait(settings, openings)))


def record(c: Circuit, settings: BreakerSettings, now: datetime, outcomes: Outcomes) -> Circuit:
    """The circuit after these outcomes."""
    succeeded = outcomes.successes + outcomes.probe_successes
    failed = outcomes.failures + outcomes.probe_failures
    c = dataclasses.replace(c, consecutive_failures=0 if succeeded else c.consecutive_failures + failed)
    if c.state is CircuitState.CLOSED:
        # A probe that reports after its circuit closed counts like any other attempt.
        c = _rolled(c, settings, now)
        c = dataclasses.replace(c, successes=c.successes + succeeded, failures=c.failures + failed)
        if c.volume >= settings.min_volume and c.failure_rate >= settings.failure_rate:
            return _opened(c, settings, now)
        return c
    if c.state is CircuitState.HALF_OPEN and (outcomes.probe_successes or outcomes.probe_failures):
        c = dataclasses.replace(c, probe_successes=c.probe_successes + outcomes.probe_successes,
                                probe_failures=c.probe_failures + outcomes.probe_failures)
        if c.probe_failures and c.probe_failures >= settings.failure_rate * (c.probe_successes + c.probe_failures):
            return _opened(c, settings, now)
        if c.probe_successes >= settings.close_after:
            return dataclasses.replace(_fresh_window(c, now), state=CircuitState.CLOSED, changed_at=now,
                                       probe_not_before=None)
        return dataclasses.replace(c, probe_not_before=None)  # the next probe may go at once
    # Open, or attempts claimed before the circuit opened: they say nothing about recovery.
    return c


def granted_probe(c: Circuit, now: datetime, hold: float) -> Circuit | None:
    """The circuit with a probe taken out (held for ``hold`` seconds), or None if no probe is due."""
    if c.state is CircuitState.CLOSED or (c.probe_not_before is not None and c.probe_not_before > now):
        return None
    if c.state is CircuitState.OPEN:
        c = dataclasses.replace(c, state=CircuitState.HALF_OPEN, changed_at=now, probe_successes=0,
                                probe_failures=0)
    return dataclasses.replace(c, probe_not_before=now + timedelta(seconds=hold))


# --- in the database -------------------------------------------------------------------------


async def _locked(conn: asyncpg.Connection, names: Sequence[str]) -> list[tuple[str, Circuit, datetime]]:
    rows = await conn.fetch(outbox.query("lock_circuits"), sorted(names))
    return [(r["name"], Circuit.from_row(r), r["now"]) for r in rows]


async def _store(conn: asyncpg.Connection, updates: Sequence[CircuitUpdate]) -> None:
    if not updates:
        return
    if any(u.changed for u in updates):
        await conn.execute(outbox.query("circuits_changed"))  # delivered at commit
    cs = [u.circuit for u in updates]
    await conn.execute(
        outbox.query("store_circuits"), [u.endpoint for u in updates], [str(c.state) for c in cs],
        [c.changed_at for c in cs], [c.probe_not_before for c in cs], [c.window_started_at for c in cs],
        [c.successes for c in cs], [c.failures for c in cs], [c.previous_successes for c in cs],
        [c.previous_failures for c in cs], [c.probe_successes for c in cs], [c.probe_failures for c in cs],
        [c.consecutive_failures for c in cs], [c.openings for c in cs],
    )


async def record_outcomes(conn: asyncpg.Connection, settings: BreakerSettings,
                          outcomes: Mapping[str, Outcomes]) -> list[CircuitUpdate]:
    """Count outcomes and apply the transitions they cause, in the caller's transaction (which
    holds the endpoint rows from here to its commit, so relays take turns)."""
    updates = [CircuitUpdate(name, before.state, record(before, settings, now, outcomes[name]))
               for name, before, now in await _locked(conn, list(outcomes))]
    await _store(conn, updates)
    return updates


async def take_probe(pool: asyncpg.Pool, endpoint: str, hold: float) -> CircuitUpdate | None:
    """Take the endpoint's next probe if it is due (None: not due, or another relay took it)."""
    async with pool.acquire() as conn, conn.transaction():
        for name, before, now in await _locked(conn, [endpoint]):
            after = granted_probe(before, now, hold)
            if after is not None:
                update = CircuitUpdate(name, before.state, after)
                await _store(conn, [update])
                return update
    return None


async def release_probe(pool: asyncpg.Pool, endpoint: str) -> None:
    """Give back a probe that found nothing to send: the next delivery due may probe at once."""
    await pool.execute(outbox.query("release_probe"), endpoint)


CircuitsChanged = Callable[[list[CircuitUpdate]], None]


def report(update: CircuitUpdate) -> None:
    """Metrics and one structured log line for a transition (made by exactly one relay)."""
    c = update.circuit
    metrics.relay_circuit_state.labels(update.endpoint).set(STATE_VALUE[c.state])
    metrics.relay_circuit_open.labels(update.endpoint).set(int(c.state is not CircuitState.CLOSED))
    if not update.changed:
        return
    metrics.relay_circuit_transitions.labels(update.endpoint, str(c.state)).inc()
    fields: dict[str, object] = {"endpoint": update.endpoint, "from": str(update.before), "to": str(c.state)}
    if update.before is CircuitState.CLOSED:
        fields.update(failure_rate=round(c.failure_rate, 3), volume=c.volume)
    if update.before is CircuitState.HALF_OPEN:
        fields.update(probe_successes=c.probe_successes, probe_failures=c.probe_failures)
    if c.state is CircuitState.OPEN and c.probe_not_before is not None:
        fields["next_probe_at"] = c.probe_not_before.isoformat()
    level = logging.WARNING if c.state is CircuitState.OPEN else logging.INFO
    log.log(level, f"endpoint circuit {update.before} -> {c.state}", extra=fields)
