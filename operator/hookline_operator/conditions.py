"""``status.conditions``: the metav1.Condition shape, and the whole list composed from what was
observed (pure functions).

The reconcile handler and the sync timer compute the whole list from fresh observation (plus the
scaling timer's last outcome from the memo), so whichever write lands last is right. The scaling
timer sets only its Scaling entry, from that same outcome; a write of it that overtakes a newer
Ready is repaired by the next sync tick (writes compare with what the resource shows).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookline_operator.memo import ScalingOutcome
    from hookline_operator.reconcile import Observation

Conditions = list[dict[str, Any]]


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



def ready_reason(obs: Observation, handler_problem: str | None = None) -> tuple[bool, str, str]:
    """Ready, with the most useful reason first: what the user has to fix. ``handler_problem``:
    why the provider's workers cannot import its handler (their events wait, attempts not counted)."""
    if obs.secret.reason == "ResourceConflict":
        return False, "ResourceConflict", obs.secret.message
    if obs.sync.reason == "NameConflict":
        return False, "NameConflict", obs.sync.message
    if obs.workers.reason == "ResourceConflict":
        return False, "ResourceConflict", obs.workers.message
    if not obs.secret.ready:
        return False, "SecretNotReady", obs.secret.message
    if not obs.sync.synced:
        return False, obs.sync.reason, obs.sync.message
    if not obs.workers.ok:
        return False, obs.workers.reason, obs.workers.message
    if handler_problem:
        return False, "HandlerNotImportable", f"{handler_problem}; its events wait, their attempts not counted"
    return True, "Reconciled", "provider is accepting and processing events"


def compose(previous: Conditions, obs: Observation, scaling: ScalingOutcome | None, generation: int,
            handler_problem: str | None = None) -> Conditions:
    conditions = set_condition(previous, "SecretReady", obs.secret.ready, obs.secret.reason, obs.secret.message,
                               generation)
    conditions = set_condition(conditions, "Synced", obs.sync.synced, obs.sync.reason, obs.sync.message, generation)
    ready, reason, message = ready_reason(obs, handler_problem)
    conditions = set_condition(conditions, "Ready", ready, reason, message, generation)
    if scaling is not None:
        conditions = set_condition(conditions, "Scaling", scaling.ok, scaling.reason, scaling.message, generation)
    return conditions


def database_unavailable(previous: Conditions, error: str, scaling: ScalingOutcome | None,
                         generation: int) -> Conditions:
    """Postgres cannot be reached: say so; the scaling timer leaves replicas as they are."""
    conditions = set_condition(previous, "Synced", False, "DatabaseUnavailable", error, generation)
    conditions = set_condition(conditions, "Ready", False, "DatabaseUnavailable", error, generation)
    if scaling is not None:
        conditions = set_condition(conditions, "Scaling", scaling.ok, scaling.reason, scaling.message, generation)
    return conditions


def new_conflicts(before: Conditions, after: Conditions) -> list[tuple[str, str]]:
    """(reason, message) of conflicts that appeared with this write: each deserves one Warning Event,
    not one per tick."""
    ready_after = next((c for c in after if c.get("type") == "Ready"), None)
    if ready_after is None or ready_after.get("reason") not in ("NameConflict", "ResourceConflict",
                                                                "HandlerNotAllowed", "PlacementNotAllowed",
                                                                "HandlerNotImportable", "InvalidSecret",
                                                                "InvalidEgress", "EgressSecretMissing"):
        return []
    ready_before = next((c for c in before if c.get("type") == "Ready"), {})
    if (ready_before.get("reason"), ready_before.get("message")) == (ready_after["reason"], ready_after["message"]):
        return []
    return [(str(ready_after["reason"]), str(ready_after["message"]))]
