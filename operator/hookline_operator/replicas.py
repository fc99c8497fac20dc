"""One provider's worker replicas on each scale tick: the scaling decision (scaling.py) applied to
its Deployment, within the workers' connection budget (budget.py), and the outcome the Scaling
condition reports."""

from __future__ import annotations

import time
from typing import Any

import kopf

from hookline_operator import budget, resources
from hookline_operator.memo import OperatorMemo, ScalingOutcome, resource_state
from hookline_operator.ownership import Resource, resource_of
from hookline_operator.podtemplate import TemplateError, configured_template
from hookline_operator.reconcile import announce
from hookline_operator.scaling import ScalePolicy, recommend

PAUSED_ANNOTATION = "hookline.io/paused"


async def scale_workers(body: kopf.Body, spec: dict[str, Any], memo: OperatorMemo) -> tuple[ScalingOutcome, int | None]:
    """Decide and apply this provider's worker replicas; (outcome for the Scaling condition, replicas)."""
    res = resource_of(body)
    state = resource_state(memo)
    name = resources.worker_name(res.name)
    deployment = await memo.k8s.read_deployment(res.namespace, name)
    if deployment is None:
        return ScalingOutcome(False, "NoWorkers", f"Deployment {name} does not exist yet"), None
    if res.uid not in deployment.owner_uids:
        return ScalingOutcome(False, "ResourceConflict", f"Deployment {name} is not owned by this WebhookProvider; "
                                                         f"it is never scaled"), None
    current = deployment.replicas
    if state.claim is None:
        return ScalingOutcome(False, "WaitingForSync", f"not synced yet; replicas stay at {current}"), current
    snapshot = memo.stats.fresh(memo.interval)
    annotations = body.get("metadata", {}).get("annotations") or {}
    policy = ScalePolicy.from_spec(spec)
    if not state.claim.owned:
        desired, outcome = 0, ScalingOutcome(False, "NameConflict", "no workers while the provider name belongs "
                                                                    "to another owner")
    elif annotations.get(PAUSED_ANNOTATION) == "true":
        await hold_budget(memo, res, current)
        return ScalingOutcome(False, "Paused", f"{PAUSED_ANNOTATION} is set; replicas stay at {current}"), current
    elif snapshot is None:
        # Never act on what we cannot see: replicas stay as they are until Postgres answers.
        return ScalingOutcome(False, "DatabaseUnavailable", f"{memo.stats.error}; replicas left at {current}"), current
    else:
        load = snapshot.of(res.name)
        desired = state.stabilizer.desired(time.monotonic(), recommend(load.due, load.in_flight, policy), current,
                                           policy)
        outcome = ScalingOutcome(True, "Active", f"due {load.due}, in flight {load.in_flight}, retrying "
                                                 f"{load.retrying}, deferred {load.deferred}: {desired} replica(s)")
    try:
        desired, outcome = await within_budget(body, memo, res, desired, current, outcome)
    except TemplateError as exc:
        return ScalingOutcome(False, "InvalidWorkerTemplate", f"{exc}; replicas stay at {current}"), current
    if desired != current:
        await memo.k8s.scale_deployment(res.namespace, name, desired)
        announce(body, "Scaled", f"scaled {name} from {current} to {desired} replicas ({outcome.message})")
        if desired < current and budget.configured_budget() is not None:
            await budget.record(memo.db, res, desired)  # the connections are free only now
    return outcome, desired


def _stale_after(memo: OperatorMemo) -> float:
    # Every live provider refreshes its row each tick; a row this old belongs to no resource we manage.
    return max(300.0, 30 * memo.interval)


async def within_budget(body: kopf.Body, memo: OperatorMemo, res: Resource, desired: int, current: int,
                        outcome: ScalingOutcome) -> tuple[int, ScalingOutcome]:
    """``desired`` capped by the workers' connection budget (budget.py), and the outcome saying so."""
    limit = budget.configured_budget()
    if limit is None:
        return desired, outcome
    per_replica = configured_template().connections_per_replica
    decision = await budget.grant(memo.db, res, desired, current, per_replica, limit, _stale_after(memo))
    state = resource_state(memo)
    if not decision.capped:
        state.budget_note = ""
        return decision.replicas, outcome
    note = f"{desired}->{decision.replicas}"
    if state.budget_note != note:  # one Warning per new (wanted, allowed), not one per tick
        announce(body, "ConnectionBudget", decision.message, warning=True)
        state.budget_note = note
    return decision.replicas, ScalingOutcome(False, "ConnectionBudget", decision.message)


async def hold_budget(memo: OperatorMemo, res: Resource, current: int) -> None:
    """A paused provider keeps its replicas counted against the budget."""
    if budget.configured_budget() is not None:
        await budget.hold(memo.db, res, current, configured_template().connections_per_replica)
