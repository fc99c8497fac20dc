"""What happened to one event: ``hookline events list/show``, ``hookline deliveries show`` and
``hookline dlq replay --event``.

Attempts come from the attempt log (``hookline.attempts``, migration 0013), which the
statements that book an outcome write as they book it. Stored headers are shown redacted:
signatures, credentials and anything secret-looking never reach the terminal.
"""

from __future__ import annotations

import re
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
    lines = [f"{'ID':>10} {'PROVIDER':<16} {'EVENT ID':<36} {'TYPE':<28} {'STATUS':<10} {'ATTEMPTS':>8}  "
             "RECEIVED AT                LAST ERROR"]
    for r in rows:
        lines.append(f"{r['id']:>10} {r['provider']:<16} {r['event_id']:<36} {(r['event_type'] or '-'):<28} "
                     f"{r['status']:<10} {r['attempts']:>8}  {_time(r['received_at']):<26} "
                     f"{(r['last_error'] or '')[:80]}")
    return lines


async def show_event(conn: asyncpg.Connection, ref: EventRef) -> list[str]:
    row = await conn.fetchrow(db.query("find_event", "history.sql"), ref.provider, ref.event_id, ref.id,
                              PREVIEW_BYTES)
    if row is None:
        raise HistoryError(f"no inbox event {ref}")
    lines = [f"event {row['provider']}:{row['event_id']} (id {row['id']})"]
    for label, key in (("type", "event_type"), ("entity", "entity_key"), ("status", "status"),
                       ("attempts", "attempts"), ("received", "received_at"), ("next attempt", "next_attempt_at"),
                       ("finished", "processed_at"), ("leased by", "locked_by"), ("lease until", "lease_expires_at"),
                       ("deferred since", "deferred_since"), ("last error", "last_error")):
        if row[key] is not None:
            lines.append(f"  {label + ':':<16}{_time(row[key]) if isinstance(row[key], datetime) else row[key]}")
    if row["suspect"]:
        lines.append(f"  {'suspect:':<16}yes (its last lease expired: it runs alone)")
    lines.append("headers (redacted):")
    lines += [f"  {name}: {value}" for name, value in redact_headers(row["headers"] or {}).items()]
    lines.append(f"body ({row['content_type'] or 'no content type'}, {row['body_bytes']} bytes):")
    lines.append("  " + preview(bytes(row["body_preview"]), row["body_bytes"]))
    lines += await _attempt_lines(conn, "inbox", row["id"])
    return lines


async def show_deliveries(conn: asyncpg.Connection, ref: str) -> list[str]:
    """One delivery (a numeric id) or every delivery of an outbox event (its msg_ id)."""
    delivery_id = int(ref) if ref.isdigit() else None
    rows = await conn.fetch(db.query("find_deliveries", "history.sql"), delivery_id,
                            None if delivery_id else ref, PREVIEW_BYTES)
    if not rows:
        raise HistoryError(f"no delivery {ref!r} (give a delivery id or an outbox event id, msg_...)")
    lines: list[str] = []
    for r in rows:
        lines.append(f"delivery {r['id']} of event {r['event_id']} ({r['event_type']}) to endpoint {r['endpoint']}")
        for label, key in (("status", "status"), ("attempts", "attempts"), ("created", "created_at"),
                           ("next attempt", "next_attempt_at"), ("finished", "processed_at"),
                           ("leased by", "locked_by"), ("last status", "last_status"),
                           ("last latency", "last_latency_ms"), ("last error", "last_error"),
                           ("last response", "last_response")):
            value = r[key]
            if value is not None and value != "":
                shown = _time(value) if isinstance(value, datetime) else value
                lines.append(f"  {label + ':':<16}{str(shown)[:200]}")
        if r["aggregate_id"] is not None:
            lines.append(f"  {'aggregate:':<16}{r['aggregate_type'] or ''}:{r['aggregate_id']}")
        lines.append(f"  {'payload:':<16}{r['payload_preview']}")
        lines += await _attempt_lines(conn, "deliveries", r["id"])
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


async def _attempt_lines(conn: asyncpg.Connection, queue: str, row_id: int) -> list[str]:
    attempts = await conn.fetch(db.query("attempts_of", "history.sql"), queue, row_id)
    if not attempts:
        return ["attempts: none logged"]
    lines = [f"attempts:\n  {'#':>3}  {'AT':<26} {'OUTCOME':<8} {'WORKER':<32} {'HTTP':>4} {'MS':>7}  ERROR"]
    for a in attempts:
        latency = f"{a['latency_ms']:.0f}" if a["latency_ms"] is not None else "-"
        lines.append(f"  {a['attempt']:>3}  {_time(a['at']):<26} {a['outcome']:<8} {(a['worker'] or '-'):<32} "
                     f"{a['http_status'] or '-':>4} {latency:>7}  {(a['error'] or '')[:120]}")
    return lines


def _time(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds")
