"""The transactional outbox: publish outgoing webhooks in the caller's own transaction.

    async with conn.transaction():
        await conn.execute("UPDATE invoices SET status = 'paid' WHERE id = $1", invoice_id)
        await hookline.outbox.publish(conn, "invoice.paid", {"id": invoice_id},
                                      aggregate_type="invoice", aggregate_id=str(invoice_id))

The event and its deliveries are rows written by the SQL function
``hookline.publish`` (one implementation for every language; see
``core/sql/migrations/0003_outbox.sql``), so they commit or roll back with the
caller's change: no webhook for a change that rolled back, none lost because the
process died after the commit. The relay (``hookline relay``) sends them.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from hookline.core import db, tracing

__all__ = ["publish", "query"]


async def publish(conn: asyncpg.Connection, event_type: str, payload: Any, *, aggregate_type: str | None = None,
                  aggregate_id: str | None = None, endpoint: str | None = None, namespace: str | None = None
                  ) -> str:
    """Write an event to the outbox on ``conn`` (inside the caller's transaction); return its id.

    The id (``msg_...``) is the ``webhook-id`` every delivery attempt carries, so
    receivers can deduplicate on it. ``payload`` must be JSON-serialisable; it
    becomes ``data`` in the delivered envelope. Events with the same
    ``(aggregate_type, aggregate_id)`` reach ``--ordered`` endpoints in commit
    order. ``endpoint`` sends the event to that endpoint only.

    An event belongs to a namespace and reaches only that namespace's endpoints (WebhookEndpoint
    resources). Logged in as a tenant (a WebhookProvider's workers, or the namespace's publisher
    Secret), it is the tenant's namespace, and naming another is refused; the platform's own login
    publishes to the install-wide endpoints (made with ``hookline endpoints add``), or to those of
    ``namespace``. ``endpoint`` is a name within the event's namespace.
    """
    # Sent as text and cast in SQL, so it works whether or not the caller's
    # connection has a jsonb codec installed (ours does; a plain asyncpg one does not).
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    # The current span's trace context (a handler's, say) goes with the event to its deliveries.
    event_id: str = await conn.fetchval(query("publish"), event_type, body, aggregate_type, aggregate_id, endpoint,
                                        tracing.current_traceparent(), namespace)
    return event_id


def query(name: str) -> str:
    """The named statement from ``core/sql/outbox.sql``."""
    return db.query(name, "outbox.sql")
