"""kopf handlers for WebhookProvider: thin decorators over plain functions tests can call.

- startup/cleanup: the operator-level memo (pool, Kubernetes client, the maintainer whose
  statistics job runs one query per tick for every provider, the /healthz /readyz /metrics server);
- reconcile (create/update/resume) and the ``sync`` timer: ``reconcile.converge`` and the
  whole ``status.conditions`` list computed from what was observed;
- ``scale`` timer: worker replicas from the cached statistics (``scaling``);
- the operator's ``Maintainer`` (scope ``inbox``, core/maintenance.py): the statistics job in
  every operator, and the lease rescuer on the one leader among operators and ``worker --sweep``
  processes; ``sync`` announces what it swept on the owning resource;
- ``annotation_tokens`` timer: replay-dlq and rotate-secret requests;
- delete: releases the provider name, only if this resource owns it.

Each timer writes only its own status fields, and only when they changed. Conditions: sync
recomputes the whole list from observation; scale sets its own Scaling entry from the same
outcome sync reads from the memo, so the writers never disagree for longer than a tick.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

import kopf

from hookline.core import db, http, pools
from hookline.core.dedicated import DedicatedConnection
from hookline.core.maintenance import Job, Maintainer, lease_rescuer
from hookline.core.queue import RetryPolicy, SweepResult
from hookline.core.tasks import cancel_and_wait
from hookline_operator import budget, resources, stats, tenancy, tokens
from hookline_operator import status as report
from hookline_operator.conditions import now_iso, set_condition
from hookline_operator.kube import GROUP, PLURAL, VERSION, Kube
from hookline_operator.memo import LeasesSwept, OperatorMemo, OwnedProvider, ScalingOutcome, resource_state
from hookline_operator.ownership import ClaimState, Resource
from hookline_operator.podtemplate import TemplateError, configured_template
from hookline_operator.reconcile import announce, converge, observe_secret, release_row
from hookline_operator.scaling import ScalePolicy, recommend

PAUSED_ANNOTATION = "hookline.io/paused"
# An unchanged provider's row is re-claimed and re-checked every this many ticks (a row changed
# behind the operator's back is repaired within that time); changes are synced at once.
RESYNC_EVERY_TICKS = 6

# Timer intervals are fixed when the handlers are registered (imported); main sets this first.
INTERVAL = float(os.environ.get("HOOKLINE_OPERATOR_INTERVAL", "10"))

log = logging.getLogger("hookline.operator")


def resource_of(body: kopf.Body) -> Resource:
    meta = body.get("metadata") or {}
    return Resource(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")),
                    int(meta.get("generation") or 0))


def _not_deleting(meta: kopf.Meta, **_: Any) -> bool:
    # Once deletion starts, a status patch from a timer would race kopf's finalizer removal.
    return not meta.get("deletionTimestamp")


# --- the operator's lifetime ---------------------------------------------------------------------


def configure(settings: kopf.OperatorSettings) -> None:
    # Handler state and the finalizer live under our own prefix, not kopf's.
    settings.persistence.finalizer = "hookline.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="hookline.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="hookline.io", key="last-handled-configuration")
    # No cluster-wide scanning of namespaces and CRDs: the namespaces are given on the
    # command line, so the operator needs no cluster-scoped RBAC at all.
    settings.scanning.disabled = True
    # A watch that goes silent (a half-dead connection) is dropped and re-established.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    # A resource being deleted keeps its finalizer until its timers have ended. kopf looks again
    # only cancellation_polling seconds after finding one still running (60 by default) unless
    # another event comes, and a timer that changes nothing sends none: a deletion that landed
    # during a timer's run hung for a minute. Timers end within one run, so look every second.
    settings.background.cancellation_polling = 1.0
    # Our own Events describe every action; kopf's per-handler log lines stay in the log.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    configure(settings)
    memo.kube = Kube()
    # Lean: no RESET ALL / UNLISTEN * / CLOSE ALL / advisory unlock per release (four statements per
    # acquire, per resource and tick); nothing here leaves session state behind.
    memo.pool = await db.create_pool(min_size=1, max_size=pools.OPERATOR - pools.LEADER_LOCK, lean=True,
                                     pinned_search_path=True)
    # Its own connection (HOOKLINE_DATABASE_URL), counted in pools.OPERATOR but not taken from the pool.
    memo.maintainer = Maintainer("inbox", [stats.refresher(memo.pool, memo.stats, memo.interval), lease_sweeper(memo)],
                                 DedicatedConnection())
    await memo.maintainer.start()
    if memo.http_url:
        url = urlsplit(memo.http_url)
        memo.http = await http.serve(http.ops_app(memo.pool), url.hostname or "0.0.0.0", url.port or 8080)


@kopf.on.cleanup()
async def cleanup(memo: OperatorMemo, **_: Any) -> None:
    if memo.maintainer is not None:
        await memo.maintainer.stop()  # ends its session, and the leadership with it
    await cancel_and_wait(*memo.tasks)
    if memo.http is not None:
        await memo.http.cleanup()
    if memo.pool is not None:
        await memo.pool.close()
    if memo.kube is not None:
        memo.kube.close()


# --- reconcile and sync: the world and the conditions --------------------------------------------


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
        after = report.database_unavailable(before, f"cannot reach Postgres ({type(exc).__name__})",
                                            state.scaling, res.generation)
        write_changed(patch, status_now, {"conditions": after})
        return
    if observation.sync.claim is not None and observation.sync.claim.state is not ClaimState.RETRY:
        state.claim = observation.sync.claim  # a claim to retry decides nothing: keep the last answer
        note_ownership(memo, res, spec, state.claim.owned)
    if observation.sync.verified is not None or not observation.sync.synced or not observation.workers.ok:
        state.last_sync = observation.sync.verified
    after = report.compose(before, observation, state.scaling, res.generation)
    after = rotation_condition(after, body, status_now, res.generation)
    for reason, message in report.new_conflicts(before, after):
        announce(body, reason, message, warning=True)
    fields: dict[str, Any] = {"conditions": after, "observedGeneration": res.generation}
    snapshot = memo.stats.fresh(memo.interval)
    if state.claim is not None and not state.claim.owned:
        fields.update(stats.NOT_REPORTED)  # never another owner's numbers
    elif snapshot is not None:
        fields.update(stats.status_fields(snapshot.of(res.name)))
    write_changed(patch, status_now, fields)


def write_changed(patch: kopf.Patch, status_now: dict[str, Any], fields: dict[str, Any]) -> None:
    """Patch only what differs: a steady provider costs no API write (and no watch event) per tick."""
    for key, value in fields.items():
        if status_now.get(key) != value:
            patch.status[key] = value


def rotation_condition(conditions: report.Conditions, body: kopf.Body, status_now: dict[str, Any],
                       generation: int) -> report.Conditions:
    """SecretRotated, once a rotate-secret token was handled: True, or False with why it was refused."""
    rotation = status_now.get("rotation") or {}
    token = (body.get("metadata", {}).get("annotations") or {}).get(tokens.ROTATE_ANNOTATION)
    if not token or rotation.get("lastHandledToken") != token:
        return conditions
    refused = rotation.get("result") == "Refused"
    return set_condition(conditions, "SecretRotated", not refused, "RotationRefused" if refused else "Rotated",
                         str(rotation.get("message") or ""), generation)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo, patch: kopf.Patch,
                    **_: Any) -> None:
    await sync_status(body, dict(spec), dict(status), memo, patch)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=min(INTERVAL, 1.0), when=_not_deleting)
async def sync(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo, patch: kopf.Patch,
               **_: Any) -> None:
    # Level-based: rotated or expired secrets, a row removed by hand, a name freed by its owner's
    # deletion, a changed pod template all converge here.
    await sync_status(body, dict(spec), dict(status), memo, patch)
    announce_swept(body, memo)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    res = resource_of(body)
    note_ownership(memo, res, {}, owned=False)
    # Its workers' role and its share of the connection budget go with it (its Secrets and
    # Deployment are garbage-collected through their owner references).
    await tenancy.remove_worker_credentials(memo.db, res.uid)
    await budget.forget(memo.db, res)
    if await release_row(memo.db, res):
        announce(body, "ProviderRemoved", f"provider {res.name} removed from hookline.providers; its stored "
                                          f"events stay")
    else:
        announce(body, "ProviderNotOwned", f"provider name {res.name} was not this resource's; nothing removed")


# --- scaling -------------------------------------------------------------------------------------


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


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=min(INTERVAL, 1.0), when=_not_deleting)
async def scale(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo, patch: kopf.Patch,
                **_: Any) -> None:
    outcome, replicas = await scale_workers(body, dict(spec), memo)
    resource_state(memo).scaling = outcome
    # The Scaling condition at once (sync composes the same entry from the memo, so the two
    # writers agree on it; a Ready change this write overtakes is rewritten by sync's next tick).
    now = dict(status)
    fields: dict[str, Any] = {"conditions": set_condition(list(now.get("conditions") or []), "Scaling", outcome.ok,
                                                          outcome.reason, outcome.message,
                                                          resource_of(body).generation)}
    if replicas is not None:
        fields["replicas"] = replicas
    write_changed(patch, now, fields)


# --- leases --------------------------------------------------------------------------------------


def retry_policy(spec: dict[str, Any]) -> RetryPolicy:
    retry = spec.get("retry") or {}
    default = RetryPolicy()
    return RetryPolicy(int(retry.get("maxAttempts", default.max_attempts)),
                       float(retry.get("initialDelaySeconds", default.initial_delay)),
                       float(retry.get("maxDelaySeconds", default.max_delay)))


def note_ownership(memo: OperatorMemo, res: Resource, spec: dict[str, Any], owned: bool) -> None:
    """Keep ``memo.owned`` (the rescuer's retry policies) in step with this resource's claim; a
    resource that does not own the name never removes the owner's entry."""
    if owned:
        memo.owned[res.name] = OwnedProvider(res.uid, retry_policy(spec))
    elif (entry := memo.owned.get(res.name)) is not None and entry.uid == res.uid:
        del memo.owned[res.name]
        memo.swept.pop(res.name, None)


def lease_sweeper(memo: OperatorMemo) -> Job:
    """The inbox's lease rescuer, the same job ``worker --sweep`` runs, on the elected leader only.
    Skipped while fresh statistics see no expired lease, so an idle inbox costs no query beyond the
    one statistics query per tick. Providers of no resource here get the default retry policy."""
    rescuer = lease_rescuer(memo.db, lambda: {name: p.retry for name, p in memo.owned.items()},
                            interval=memo.interval, swept=lambda result: note_swept(memo, result))

    async def rescue_when_expired() -> None:
        snapshot = memo.stats.fresh(memo.interval)
        if snapshot is not None and not any(p.expired_leases for p in snapshot.providers.values()):
            return
        await rescuer.run()

    return Job(rescuer.name, rescue_when_expired, rescuer.interval)


def note_swept(memo: OperatorMemo, result: SweepResult) -> None:
    """Remember what was swept for this operator's own providers, for their resources' Events."""
    for name in (set(result.requeued) | set(result.dead)) & set(memo.owned):
        swept = memo.swept.setdefault(name, LeasesSwept())
        swept.requeued += result.requeued.get(name, 0)
        swept.dead += result.dead.get(name, 0)


def announce_swept(body: kopf.Body, memo: OperatorMemo) -> None:
    """The LeasesRequeued Event on the resource owning the provider, once per sweep that found some."""
    res = resource_of(body)
    owner = memo.owned.get(res.name)
    if owner is None or owner.uid != res.uid or (swept := memo.swept.pop(res.name, None)) is None:
        return
    announce(body, "LeasesRequeued", f"returned {swept.requeued} expired lease(s) to pending, {swept.dead} to dead")


# --- annotation tokens ---------------------------------------------------------------------------


async def handle_replay(body: kopf.Body, token: str, memo: OperatorMemo) -> dict[str, Any]:
    res = resource_of(body)
    result, fresh = await tokens.replay(memo.db, res, token)
    if fresh and result["owned"]:
        announce(body, "DeadLettersReplayed", f"requeued {result['requeued']} dead event(s) for token {token}")
    elif fresh:
        announce(body, "ReplayRefused", f"token {token}: nothing requeued, this WebhookProvider does not own "
                                        f"provider name {res.name}", warning=True)
    return {"lastHandledToken": token, "requeued": result["requeued"], "at": result["at"]}


async def handle_rotation(body: kopf.Body, spec: dict[str, Any], token: str, memo: OperatorMemo) -> dict[str, Any]:
    res = resource_of(body)
    claim = resource_state(memo).claim
    secret = await observe_secret(memo.k8s, res, spec)
    refusal = tokens.rotation_refusal(secret, claim is not None and claim.owned)

    async def act(_conn: Any) -> dict[str, Any]:
        if refusal:
            return {"at": now_iso(), "result": "Refused", "message": refusal}
        message = await tokens.rotate(memo.k8s, res, spec, token)
        return {"at": now_iso(), "result": "Rotated", "message": message}

    result, fresh = await tokens.handle_token(memo.db, res, "rotate-secret", token, act)
    if fresh:
        announce(body, "SecretRotated" if result["result"] == "Rotated" else "RotationRefused", result["message"],
                 warning=result["result"] != "Rotated")
    return {"lastHandledToken": token, **result}


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=min(INTERVAL, 1.0), when=_not_deleting)
async def annotation_tokens(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo,
                            patch: kopf.Patch, **_: Any) -> None:
    if resource_state(memo).claim is None:
        return  # not synced since start: whether the name is ours is not known yet
    annotations = dict(body.get("metadata", {}).get("annotations") or {})
    now = dict(status)
    if token := tokens.pending_token(annotations, now, tokens.REPLAY_ANNOTATION, "replay"):
        patch.status["replay"] = await handle_replay(body, token, memo)
    if token := tokens.pending_token(annotations, now, tokens.ROTATE_ANNOTATION, "rotation"):
        patch.status["rotation"] = await handle_rotation(body, dict(spec), token, memo)
