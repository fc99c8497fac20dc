"""Dead inbox events: list them and requeue them (``hookline dlq ... [--provider P]``).

The inbox side of ``relay/dlq.py``; both requeue through ``Queue.replay_dead``, which
also wakes the consumers.
"""

from __future__ import annotations

import asyncpg

from hookline.core import db
from hookline.core.history import died_at, table
from hookline.core.queue import INBOX


async def list_dead(conn: asyncpg.Connection, provider: str | None = None, limit: int = 50) -> list[str]:
    """The newest dead events (of one provider, or all) as lines to print."""
    rows = await conn.fetch(db.query("list_dead_events"), provider, limit)
    return table(("PROVIDER", "EVENT ID", "TYPE", "ATTEMPTS", "DIED AT", "ERROR"),
                 [(r["provider"], r["event_id"], r["event_type"] or "-", str(r["attempts"]), died_at(r["processed_at"]),
                   (r["last_error"] or "")[:100]) for r in rows], right={3})


async def replay_dead(conn: asyncpg.Connection, provider: str | None = None,
                      event_type: str | None = None) -> dict[str, int]:
    """Requeue dead events (of one provider and/or type, or all); attempts restart. Returns the
    count per provider. The events keep their ids, so a destination that saw one still deduplicates it."""
    async with conn.transaction():
        ids = None
        if event_type is not None:
            ids = [r["id"] for r in await conn.fetch(db.query("dead_of_type"), provider, event_type)]
            if not ids:
                return {}
        return await INBOX.replay_dead(conn, provider, ids=ids)


async def dlq_inbox(conn: asyncpg.Connection, action: str, *, provider: str | None = None,
                    event_type: str | None = None, limit: int = 50) -> list[str]:
    """``list`` or ``replay`` dead inbox events; returns the lines to print."""
    if action == "list":
        return await list_dead(conn, provider, limit)
    if action != "replay":
        raise ValueError(f"unknown dlq action {action!r}")
    counts = await replay_dead(conn, provider, event_type)
    if not counts:
        return ["no dead events matched"]
    return [f"{name}: requeued {n} dead event(s)" for name, n in sorted(counts.items())]
