"""What happened to one event: ``hookline events list/show``, ``hookline deliveries show`` and
``hookline dlq replay --event``.

Attempts come from the attempt log (``hookline.attempts``, migration 0013), which the
statements that book an outcome write as they book it (migration 0016): when, which worker,
the outcome, the error, the HTTP status of a delivery and the latency (an inbox attempt's from
its claim to its outcome; a delivery's HTTP call's). Stored headers are shown redacted:
signatures, credentials and anything secret-looking never reach the terminal. ``show`` prints
for people, or JSON (``event_record`` / ``delivery_records``) for scripts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hookline.core import db
from hookline.core.queue import INBOX

STATUSES = ("pending", "processing", "done", "dead")
PREVIEW_BYTES = 512
REDACTED = "[redacted]"

# Header names that carry signatures or credentials (every scheme's signature header matches).
_SECRET_NAME = re.compile(r"sign|secret|token|auth|hmac|cookie|passw|api[-_]?key|credential|session", re.I)
# Values that look like a secret whatever their header is called.
_SECRET_VALUE = re.compile(r"whsec_|sk_(live|test)_|bearer\s|basic\s|v1,|sha256=|v0=", re.I)


class HistoryError(Exception):
    """A reference that names nothing, or a request that cannot be done; the message says why."""


@dataclass(frozen=True)
class EventRef:
    """An inbox event named as PROVIDER:EVENT_ID or by its numeric id."""

    provider: str | None = None
    event_id: str | None = None
    id: int | None = None

    @classmethod
    def parse(cls, text: str) -> EventRef:
        if text.isdigit():
            return cls(id=int(text))
        provider, sep, event_id = text.partition(":")
        if not sep or not provider or not event_id:
            raise HistoryError(f"{text!r} names no event: give PROVIDER:EVENT_ID (e.g. stripe:evt_123) or the "
                               "numeric id `hookline events list` shows")
        return cls(provider, event_id)

    def __str__(self) -> str:
        return f"{self.provider}:{self.event_id}" if self.id is None else f"id {self.id}"


def redact_headers(headers: dict[str, Any]) -> dict[str, str]:
    return {name: REDACTED if _SECRET_NAME.search(name) or _SECRET_VALUE.search(str(value)) else str(value)
            for name, value in sorted(headers.items())}


def preview(body: bytes, total: int) -> str:
    text = body.decode("utf-8", errors="replace")
    return text if total <= len(body) else f"{text}... ({total} bytes in all)"


async def list_events(conn: asyncpg.Connection, *, provider: str | None = None, status: str | None = None,
                      since: datetime | None = None, limit: int = 50) -> list[str]:
    if status is not None and status not in STATUSES:
        raise HistoryError(f"--status must be one of {', '.join(STATUSES)}, not {status!r}")
    rows = await conn.fetch(db.query("list_events", "history.sql"), provider, status, since, limit)
    return table(("ID", "PROVIDER", "EVENT ID", "TYPE", "STATUS", "ATTEMPTS", "RECEIVED AT", "LAST ERROR"),
                  [(str(r["id"]), r["provider"], r["event_id"], r["event_type"] or "-", r["status"],
                    str(r["attempts"]), _time(r["received_at"]), (r["last_error"] or "")[:80]) for r in rows],
                  right={0, 5})


DELIVERY_STATUSES = (*STATUSES, "parked")


async def list_deliveries(conn: asyncpg.Connection, *, endpoint: str | None = None, status: str | None = None,
                          limit: int = 50) -> list[str]:
    """`hookline deliveries list`: the newest deliveries first."""
    if status is not None and status not in DELIVERY_STATUSES:
        raise HistoryError(f"--status must be one of {', '.join(DELIVERY_STATUSES)}, not {status!r}")
    rows = await conn.fetch(db.query("list_deliveries", "history.sql"), endpoint, status, limit)
    return table(("ID", "ENDPOINT", "EVENT ID", "TYPE", "STATUS", "ATTEMPTS", "CREATED AT", "LAST ANSWER"),
                  [(str(r["id"]), r["endpoint"], r["event_id"], r["event_type"], r["status"], str(r["attempts"]),
                    _time(r["created_at"]), _last_answer(r["last_status"], r["last_error"])) for r in rows],
                  right={0, 5})


def _last_answer(status: int | None, error: str | None) -> str:
    """The last error (which names its HTTP status), else the last status."""
    return (error or "")[:80] or (f"HTTP {status}" if status else "-")


EVENT_FIELDS = ("event_type", "entity_key", "status", "attempts", "received_at", "next_attempt_at", "processed_at",
                "locked_by", "lease_expires_at", "deferred_since", "last_error", "suspect", "content_type")
DELIVERY_FIELDS = ("status", "attempts", "created_at", "next_attempt_at", "processed_at", "locked_by",
                   "last_status", "last_latency_ms", "last_error", "last_response")
ATTEMPT_FIELDS = ("attempt", "at", "outcome", "worker", "http_status", "latency_ms", "error")


async def event_record(conn: asyncpg.Connection, ref: EventRef) -> dict[str, Any]:
    """One inbox event as `hookline events show -o json` prints it (the shape is documented in
    the README, "Event history"): its state, redacted headers, a body preview and every logged
    attempt, oldest first. Times are ISO 8601 strings; absent values are null."""
    row = await conn.fetchrow(db.query("find_event", "history.sql"), ref.provider, ref.event_id, ref.id,
                              PREVIEW_BYTES)
    if row is None:
        raise HistoryError(f"no inbox event {ref}")
    return {"id": row["id"], "provider": row["provider"], "event_id": row["event_id"],
            **{key: _plain(row[key]) for key in EVENT_FIELDS},
            "headers": redact_headers(row["headers"] or {}), "body_bytes": row["body_bytes"],
            "body_preview": preview(bytes(row["body_preview"]), row["body_bytes"]),
            "attempt_log": await _attempts(conn, "inbox", row["id"], row["received_at"])}


async def delivery_records(conn: asyncpg.Connection, ref: str) -> list[dict[str, Any]]:
    """One delivery (a numeric id) or every delivery of an outbox event (its msg_ id), as
    `hookline deliveries show -o json` prints them (documented in the README, "Event history")."""
    delivery_id = int(ref) if ref.isdigit() else None
    rows = await conn.fetch(db.query("find_deliveries", "history.sql"), delivery_id,
                            None if delivery_id else ref, PREVIEW_BYTES)
    if not rows:
        raise HistoryError(f"no delivery {ref!r} (give a delivery id or an outbox event id, msg_...)")
    return [{"id": r["id"], "event_id": r["event_id"], "event_type": r["event_type"], "endpoint": r["endpoint"],
             **{key: _plain(r[key]) for key in DELIVERY_FIELDS},
             "aggregate_type": r["aggregate_type"], "aggregate_id": r["aggregate_id"],
             "payload_preview": r["payload_preview"],
             "attempt_log": await _attempts(conn, "deliveries", r["id"], r["created_at"])}
            for r in rows]


def event_lines(event: dict[str, Any]) -> list[str]:
    """`hookline events show` for people."""
    lines = [f"event {event['provider']}:{event['event_id']} (id {event['id']})"]
    for label, key in (("type", "event_type"), ("entity", "entity_key"), ("status", "status"),
                       ("attempts", "attempts"), ("received", "received_at"), ("next attempt", "next_attempt_at"),
                       ("finished", "processed_at"), ("leased by", "locked_by"), ("lease until", "lease_expires_at"),
                       ("deferred since", "deferred_since"), ("last error", "last_error")):
        if event[key] is not None and _shown_for(event["status"], key):
            lines.append(f"  {label + ':':<16}{event[key]}")
    if event["suspect"]:
        lines.append(f"  {'suspect:':<16}yes (its last lease expired: it runs alone)")
    lines.append("headers (redacted):")
    lines += [f"  {name}: {value}" for name, value in event["headers"].items()]
    lines.append(f"body ({event['content_type'] or 'no content type'}, {event['body_bytes']} bytes):")
    lines.append("  " + event["body_preview"])
    return lines + _attempt_lines(event["attempt_log"])


def delivery_lines(deliveries: list[dict[str, Any]]) -> list[str]:
    """`hookline deliveries show` for people."""
    lines: list[str] = []
    for d in deliveries:
        lines.append(f"delivery {d['id']} of event {d['event_id']} ({d['event_type']}) to endpoint {d['endpoint']}")
        for label, key in (("status", "status"), ("attempts", "attempts"), ("created", "created_at"),
                           ("next attempt", "next_attempt_at"), ("finished", "processed_at"),
                           ("leased by", "locked_by"), ("last status", "last_status"),
                           ("last latency", "last_latency_ms"), ("last error", "last_error"),
                           ("last response", "last_response")):
            if d[key] is not None and d[key] != "" and _shown_for(d["status"], key):
                value = _duration(d[key]) if key == "last_latency_ms" else str(d[key])
                lines.append(f"  {label + ':':<16}{value[:200]}")
        if d["aggregate_id"] is not None:
            lines.append(f"  {'aggregate:':<16}{d['aggregate_type'] or ''}:{d['aggregate_id']}")
        lines.append(f"  {'payload:':<16}{d['payload_preview']}")
        lines += _attempt_lines(d["attempt_log"])
    return lines


async def replay_event(conn: asyncpg.Connection, ref: EventRef) -> str:
    """Requeue one dead inbox event through the one replay path (``Queue.replay_dead``)."""
    row = await conn.fetchrow(db.query("find_event", "history.sql"), ref.provider, ref.event_id, ref.id, 0)
    if row is None:
        raise HistoryError(f"no inbox event {ref}")
    name = f"{row['provider']}:{row['event_id']}"
    if row["status"] != "dead":
        raise HistoryError(f"event {name} is {row['status']}, not dead: only dead events are replayed")
    if not await INBOX.replay_dead(conn, ids=[row["id"]]):
        raise HistoryError(f"event {name} changed meanwhile (replayed by someone else?); nothing requeued")
    return f"{name}: requeued (attempts start again)"


async def _attempts(conn: asyncpg.Connection, queue: str, row_id: int, created: datetime) -> list[dict[str, Any]]:
    """The logged attempts of one row, which was created at ``created`` (none is older)."""
    return [{key: _plain(a[key]) for key in ATTEMPT_FIELDS}
            for a in await conn.fetch(db.query("attempts_of", "history.sql"), queue, row_id, created)]


def _shown_for(status: str, key: str) -> bool:
    """A next attempt is a pending row's; a finished one has none to show."""
    return key != "next_attempt_at" or status == "pending"


def _attempt_lines(attempts: list[dict[str, Any]]) -> list[str]:
    if not attempts:
        return ["attempts: none logged"]
    rows = [(str(a["attempt"]), a["at"], a["outcome"], a["worker"] or "-", str(a["http_status"] or "-"),
             _milliseconds(a["latency_ms"]), (a["error"] or "").partition("\n")[0][:120]) for a in attempts]
    header, *lines = table(("#", "AT", "OUTCOME", "WORKER", "HTTP", "MS", "ERROR"), rows, right={0, 4, 5},
                            indent="  ", min_widths={0: 3})
    # A replay starts the count again: say so where it does, or "1" after "3" reads as a mistake.
    for at in reversed([i for i in range(1, len(attempts)) if attempts[i]["attempt"] <= attempts[i - 1]["attempt"]]):
        lines.insert(at, "  -- replayed: attempts count from 1 again --")
    # The newest traceback a failed handler left (the attempt log keeps it after the error's
    # first line; earlier attempts' are in `-o json`).
    traced = next((a for a in reversed(attempts) if "\n" in (a["error"] or "")), None)
    if traced is not None:
        lines.append(f"traceback of attempt {traced['attempt']}:")
        lines += [f"  {line}" for line in traced["error"].partition("\n")[2].rstrip("\n").splitlines()]
    return ["attempts:", header, *lines]


def died_at(when: datetime | None) -> str:
    """When a dead letter died, to the second, for the dead-letter tables."""
    return when.isoformat(timespec="seconds") if when else "-"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], *, right: set[int], indent: str = "",
           min_widths: dict[int, int] | None = None) -> list[str]:
    """A header and rows, each column as wide as its widest cell (``right``: right-aligned columns), two
    spaces apart; the last column is not padded."""
    widths = [max([len(header[i]), (min_widths or {}).get(i, 0), *(len(r[i]) for r in rows)])
              for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        padded = [cell.rjust(width) if i in right else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(cells, widths, strict=True))]
        return (indent + "  ".join([*padded[:-1], cells[-1]])).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _duration(milliseconds: float) -> str:
    """A latency for people, with its unit: 3.7 s, 120 ms, 4.2 ms."""
    if milliseconds >= 1000:
        return f"{milliseconds / 1000:.1f} s"
    return f"{_milliseconds(milliseconds)} ms"


def _milliseconds(value: float | None) -> str:
    """Whole milliseconds, or one decimal below 10 ms (a fast handler is not "0")."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _plain(value: Any) -> Any:
    """A column value as JSON has it: times as ISO 8601 strings, everything else as it is."""
    return _time(value) if isinstance(value, datetime) else value


def _time(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds")
