"""The worker's claim (worker.sql's claimed_events around queue.sql's claim) and the events it makes."""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from hookline.core.queue import INBOX
from hookline.worker.event import Event
from hookline.worker.service import CLAIM_EVENTS
from support.inbox import insert_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_claimed_events_lease_rows_and_make_whole_events(pool: asyncpg.Pool) -> None:
    event_ids = await insert_events(pool, "claimed-events", 3, event_type="invoice.paid", entity_key="cus_1")
    await pool.execute("UPDATE hookline.inbox SET headers = '{\"webhook-id\": \"msg_1\"}' WHERE provider = $1",
                       "claimed-events")
    rows = await INBOX.fetch_claim(pool, CLAIM_EVENTS, "claimed-events", 2, "w-claimed", 30.0)
    assert len(rows) == 2
    leased = await pool.fetch("SELECT id, status, attempts, locked_by FROM hookline.inbox WHERE provider = $1 "
                              "AND status = 'processing'", "claimed-events")
    assert sorted((r["id"], r["attempts"], r["locked_by"]) for r in leased) == sorted(
        (r["id"], 1, "w-claimed") for r in rows)
    for row in rows:
        event = Event.from_row(row)
        # from_row fills the instance without __init__: every field must be there, and equal to what
        # the dataclass's own constructor makes of the same row.
        assert {f.name for f in dataclasses.fields(Event)} <= set(vars(event))
        assert event == Event(id=row["id"], provider="claimed-events", event_id=row["event_id"],
                              event_type="invoice.paid", entity_key="cus_1", body=bytes(row["body"]),
                              headers={"webhook-id": "msg_1"}, attempts=1, received_at=row["received_at"],
                              content_type="application/json")
        assert event.event_id in event_ids and event.json() == {"id": event.event_id, "type": "invoice.paid"}
        with pytest.raises(dataclasses.FrozenInstanceError):
            event.attempts = 2  # type: ignore[misc]
