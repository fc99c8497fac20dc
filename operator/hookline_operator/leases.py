"""The operator's share of lease rescue: the inbox's rescuer job (run by the elected leader among
operators and ``worker --sweep`` processes), the retry policies of the providers this operator
owns, and the LeasesRequeued Event on the resource whose provider was swept."""

from __future__ import annotations

from typing import Any

import kopf

from hookline.core.maintenance import Job, lease_rescuer
from hookline.core.queue import RetryPolicy, SweepResult
from hookline_operator.memo import LeasesSwept, OperatorMemo, OwnedProvider
from hookline_operator.ownership import Resource, resource_of
from hookline_operator.reconcile import announce


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
