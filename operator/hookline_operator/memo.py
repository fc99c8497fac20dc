"""The operator's state, kept in kopf memos rather than module globals.

kopf passes one ``OperatorMemo`` to the startup/cleanup handlers and gives every
resource a shallow copy of it (kopf's "memo" kwarg): shared things (the pool, the
Kubernetes client, the statistics cache) are the same objects for every resource,
while ``resource`` is assigned on each copy and so is that resource's own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web

from hookline.core.maintenance import Maintainer
from hookline.core.queue import RetryPolicy
from hookline_operator.ownership import Claim
from hookline_operator.reconcile import LastSync
from hookline_operator.scaling import Stabilizer
from hookline_operator.stats import StatsCache

if TYPE_CHECKING:
    from hookline_operator.kube import Kube


@dataclass
class ScalingOutcome:
    """The scaling timer's last decision, turned into the Scaling condition by the status writer."""

    ok: bool
    reason: str
    message: str


@dataclass
class ResourceState:
    """What the operator remembers about one WebhookProvider between ticks."""

    stabilizer: Stabilizer = field(default_factory=Stabilizer)
    claim: Claim | None = None  # the last claim decision; None until the first sync
    last_sync: LastSync | None = None  # what the provider row was last verified to hold
    scaling: ScalingOutcome | None = None
    budget_note: str = ""  # "wanted->allowed" of the last ConnectionBudget Warning, so each is announced once


@dataclass(frozen=True)
class OwnedProvider:
    """A provider name a resource of this operator owns, with its retry policy for the lease rescuer."""

    uid: str
    retry: RetryPolicy


@dataclass
class LeasesSwept:
    """Expired leases the maintainer returned for one provider, not announced on its resource yet."""

    requeued: int = 0
    dead: int = 0


@dataclass
class OperatorMemo:
    interval: float = 10.0
    http_url: str | None = None  # where /healthz, /readyz and /metrics are served
    pool: asyncpg.Pool | None = None
    kube: Kube | None = None
    stats: StatsCache = field(default_factory=StatsCache)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    maintainer: Maintainer | None = None  # the inbox lease rescuer (leader only) and the statistics
    # Shared by every resource's copy (mutated in place, never reassigned): the retry policy of each
    # provider this operator owns, for the rescuer, and what it swept, for each resource's Event.
    owned: dict[str, OwnedProvider] = field(default_factory=dict)
    swept: dict[str, LeasesSwept] = field(default_factory=dict)
    http: web.AppRunner | None = None
    resource: ResourceState | None = None  # per resource: see resource_state()

    @property
    def db(self) -> asyncpg.Pool:
        if self.pool is None:
            raise RuntimeError("the operator's database pool is not open (startup has not run)")
        return self.pool

    @property
    def k8s(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the operator's Kubernetes client is not set up (startup has not run)")
        return self.kube


def resource_state(memo: OperatorMemo) -> ResourceState:
    """This resource's state, created on first use on the resource's own copy of the memo."""
    if memo.resource is None:
        memo.resource = ResourceState()
    return memo.resource
