"""One provider's status on each reconcile and sync tick: converge the world (reconcile.converge),
then the whole ``status.conditions`` list, observedGeneration and the provider's numbers, each
field written only when it changed."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from hookline.core import db
from hookline_operator import leases, stats, tokens
from hookline_operator.conditions import Conditions, compose, database_unavailable, new_conflicts, set_condition
from hookline_operator.memo import OperatorMemo, resource_state
from hookline_operator.ownership import Claim, ClaimState, Resource, resource_of
from hookline_operator.reconcile import announce, converge

# An unchanged provider's row is re-claimed and re-checked every this many ticks (a row changed
# behind the operator's back is repaired within that time); changes are synced at once.
RESYNC_EVERY_TICKS = 6

log = logging.getLogger("hookline.operator")


async def sync_status(body: kopf.Body, spec: dict[str, Any], status_now: dict[str, Any], memo: OperatorMemo,
                      patch: kopf.Patch) -> None:
    """Converge and write conditions, observedGeneration and the provider's numbers."""
    res = resource_of(body)
    state = resource_state(memo)
    before = list(status_now.get("conditions") or [])
    try:
        observation = await converge(memo.db, memo.k8s, body, res, spec, state.last_sync,
                                     RESYNC_EVERY_TICKS * memo.interval)
    except db.DATABASE_ERRORS as exc:
        after = database_unavailable(before, f"cannot reach Postgres ({type(exc).__name__})",
                                     state.scaling, res.generation)
        write_changed(patch, status_now, {"conditions": after})
        return
    if observation.sync.claim is not None and observation.sync.claim.state is not ClaimState.RETRY:
        state.claim = observation.sync.claim  # a claim to retry decides nothing: keep the last answer
        leases.note_ownership(memo, res, spec, state.claim.owned)
    if observation.sync.verified is not None or not observation.sync.synced or not observation.workers.ok:
        state.last_sync = observation.sync.verified
    snapshot = memo.stats.fresh(memo.interval)
    owned = state.claim is not None and state.claim.owned
    problem = snapshot.handler_problems.get(res.name) if snapshot is not None and owned else None
    after = compose(before, observation, state.scaling, res.generation, problem)
    after = rotation_condition(after, body, status_now, res.generation)
    for reason, message in new_conflicts(before, after):
        announce(body, reason, message, warning=True)
        if reason == "NameConflict" and state.claim is not None:
            log_name_conflict(res, state.claim)
    fields: dict[str, Any] = {"conditions": after, "observedGeneration": res.generation}
    if state.claim is not None and not state.claim.owned:
        fields.update(stats.NOT_REPORTED)  # never another owner's numbers
    elif snapshot is not None:
        fields.update(stats.status_fields(snapshot.of(res.name)))
    write_changed(patch, status_now, fields)


def log_name_conflict(res: Resource, claim: Claim) -> None:
    """Who holds the name, for the platform team: the operator's log only (the claimant's
    condition and Event say just that it is taken)."""
    log.warning("provider name is taken by another owner",
                extra={"provider": res.name, "claimant": res.path, "owner": claim.owner})


def write_changed(patch: kopf.Patch, status_now: dict[str, Any], fields: dict[str, Any]) -> None:
    """Patch only what differs: a steady provider costs no API write (and no watch event) per tick."""
    for key, value in fields.items():
        if status_now.get(key) != value:
            patch.status[key] = value


def rotation_condition(conditions: Conditions, body: kopf.Body, status_now: dict[str, Any],
                       generation: int) -> Conditions:
    """SecretRotated, once a rotate-secret token was handled: True, or False with why it was refused."""
    rotation = status_now.get("rotation") or {}
    token = (body.get("metadata", {}).get("annotations") or {}).get(tokens.ROTATE_ANNOTATION)
    if not token or rotation.get("lastHandledToken") != token:
        return conditions
    refused = rotation.get("result") == "Refused"
    return set_condition(conditions, "SecretRotated", not refused, "RotationRefused" if refused else "Rotated",
                         str(rotation.get("message") or ""), generation)
