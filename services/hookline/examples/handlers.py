"""Example inbox handlers: ``handler: "hookline.examples.handlers:log_event"``."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("hookline.examples")


async def log_event(event: Any, conn: Any) -> None:
    """Log the event; a real handler would change its own tables on ``conn`` (same transaction)."""
    log.info("handled event", extra={"provider": event.provider, "event_id": event.event_id,
                                     "event_type": event.event_type})
