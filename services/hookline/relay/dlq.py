"""Dead outbox deliveries: list them and requeue them (``hookline dlq ... --endpoint``)."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from hookline import outbox
from hookline.core.history import died_at, table
from hookline.core.queue import OUTBOX


async def dlq_outbox(conn: asyncpg.Connection, action: str, *, endpoint: str | None = None,
                     since: datetime | None = None, until: datetime | None = None, limit: int = 50) -> list[str]:
    """``list`` or ``replay`` dead deliveries, of one endpoint or all, that died within [since, until).

    Returns the lines to print. Replay restarts the attempts (the retry policy applies
    afresh) and wakes the relays; the events keep their ids, so receivers that already
    processed one (it died on a lost answer) still deduplicate it.
    """
    if action == "list":
        rows = await conn.fetch(outbox.query("list_dead_deliveries"), endpoint, since, until, limit)
        return table(("ENDPOINT", "EVENT ID", "TYPE", "ATTEMPTS", "DIED AT", "LAST ERROR"),
                     [(r["endpoint"], r["event_id"], r["event_type"], str(r["attempts"]), died_at(r["processed_at"]),
                       (r["last_error"] or "")[:100]) for r in rows], right={3})
    if action != "replay":
        raise ValueError(f"unknown dlq action {action!r}")
    counts = await OUTBOX.replay_dead(conn, endpoint, since, until)
    if not counts:
        return ["no dead deliveries matched"]
    return [f"endpoint/{name}: requeued {n} dead deliveries" for name, n in sorted(counts.items())]
