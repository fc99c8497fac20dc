"""Status conditions in the metav1.Condition shape, with transition times kept when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: list[dict[str, Any]], type: str, status: bool, reason: str, message: str,
                  generation: int | None) -> list[dict[str, Any]]:
    """A new conditions list with ``type`` set in place (appended when new), so writers that set
    different types keep one order; lastTransitionTime moves only when status flips."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type), None)
    changed = previous is None or previous.get("status") != value
    condition = {
        "type": type,
        "status": value,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now_iso() if changed or previous is None else previous.get("lastTransitionTime"),
        "observedGeneration": generation or 0,
    }
    if previous is None:
        return [*conditions, condition]
    return [condition if c.get("type") == type else c for c in conditions]
