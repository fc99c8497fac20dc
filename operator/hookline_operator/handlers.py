"""kopf's entry points for WebhookProvider and WebhookEndpoint: thin functions over the modules that decide, registered
by ``register`` once the command line is parsed (their timer interval is an argument).

- startup/cleanup: the operator-level memo (pool, Kubernetes client, the maintainer whose
  statistics job runs one query per tick for every provider, the /healthz /readyz /metrics server)
  and the API server probe (apiserver_probe);
- reconcile (create/update/resume) and the ``sync`` timer: provider_status (reconcile.converge,
  then the whole ``status.conditions`` list from what was observed);
- ``scale`` timer: worker replicas from the cached statistics (replicas, scaling, budget);
- the operator's ``Maintainer`` (scope ``inbox``, core/maintenance.py): the statistics job in
  every operator, and the lease rescuer (leases) on the one leader among operators and
  ``worker --sweep`` processes; ``sync`` announces what it swept on the owning resource;
- ``annotation_tokens`` timer: replay-dlq and rotate-secret requests (tokens);
- delete: releases the provider name, only if this resource owns it.

Each timer writes only its own status fields, and only when they changed. Conditions: sync
recomputes the whole list from observation; scale sets its own Scaling entry from the same
outcome sync reads from the memo, so the writers never disagree for longer than a tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import kopf

from hookline.core import db, durability, http, pools
from hookline.core.dedicated import DedicatedConnection
from hookline.core.maintenance import Maintainer
from hookline.core.settings import transaction_pooling
from hookline.core.tasks import cancel_and_wait
from hookline_operator import apiserver_probe, budget, endpoints, leases, provider_status, stats, tenancy, tokens
from hookline_operator.conditions import set_condition
from hookline_operator.kube import GROUP, PLURAL, VERSION, Kube
from hookline_operator.memo import OperatorMemo, resource_state
from hookline_operator.ownership import resource_of
from hookline_operator.reconcile import announce, release_row
from hookline_operator.replicas import scale_workers


def register(interval: float) -> kopf.OperatorRegistry:
    """Every handler in a registry of its own, the timers at ``interval`` seconds (--interval)."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)
    # A registry of our own has none of kopf's default logins: ours is the kubernetes client's
    # (KUBECONFIG, or the in-cluster service account), as kube.py's calls use.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(apiserver_probe.start_probe)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(apiserver_probe.stop_probe)
    kopf.on.cleanup(registry=registry)(cleanup)
    for on_change in (kopf.on.resume(*resource, registry=registry), kopf.on.create(*resource, registry=registry),
                      kopf.on.update(*resource, field="spec", registry=registry)):
        on_change(reconcile)
    for timer in (sync, scale, annotation_tokens):
        kopf.timer(*resource, interval=interval, initial_delay=min(interval, 1.0), when=_not_deleting,
                   registry=registry)(timer)
    kopf.on.delete(*resource, registry=registry)(delete)
    register_endpoints(registry, interval)
    return registry


def register_endpoints(registry: kopf.OperatorRegistry, interval: float) -> None:
    """WebhookEndpoint (endpoints.py): reconciled on change, and on one timer that converges, writes
    the status and acts on the annotation requests."""
    resource = (GROUP, VERSION, endpoints.PLURAL)
    for on_change in (kopf.on.resume(*resource, registry=registry), kopf.on.create(*resource, registry=registry),
                      kopf.on.update(*resource, field="spec", registry=registry)):
        on_change(endpoint_reconcile)
    kopf.timer(*resource, interval=interval, initial_delay=min(interval, 1.0), when=_not_deleting,
               registry=registry)(endpoint_tick)
    kopf.on.delete(*resource, registry=registry)(endpoint_delete)


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


async def open_pool() -> asyncpg.Pool:
    """The operator's pool (HOOKLINE_DATABASE_URL). Lean: no RESET ALL / UNLISTEN * / CLOSE ALL / advisory
    unlock per release (four statements per acquire, per resource and tick); nothing here leaves session
    state behind."""
    try:
        return await db.create_pool(min_size=1, max_size=pools.OPERATOR - pools.LEADER_LOCK, lean=True,
                                    pinned_search_path=True, transaction_pooling=transaction_pooling())
    except db.ConnectionConfigError as exc:
        # kopf retries a failed startup handler for ever; retrying cannot mend configuration (main.run
        # turns this into the CLI's one line and exit status).
        raise kopf.PermanentError(str(exc)) from exc


async def startup(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    configure(settings)
    memo.pool = await open_pool()  # first: a database that cannot be reached by configuration ends the start
    memo.kube = Kube()
    memo.tasks.append(asyncio.create_task(
        durability.watch(memo.pool, await durability.check_at_start(memo.pool)), name="durability"))
    # Its own connection (HOOKLINE_DATABASE_SESSION_URL, else HOOKLINE_DATABASE_URL), counted in
    # pools.OPERATOR but not taken from the pool.
    memo.maintainer = Maintainer("inbox", [stats.refresher(memo.pool, memo.stats, memo.interval),
                                           leases.lease_sweeper(memo)], DedicatedConnection())
    await memo.maintainer.start()
    if memo.http_url:
        url = urlsplit(memo.http_url)
        memo.http = await http.serve(http.ops_app(memo.pool), url.hostname or "0.0.0.0", url.port or 8080)


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


async def reconcile(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo, patch: kopf.Patch,
                    **_: Any) -> None:
    await provider_status.sync_status(body, dict(spec), dict(status), memo, patch)


async def sync(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo, patch: kopf.Patch,
               **_: Any) -> None:
    # Level-based: rotated or expired secrets, a row removed by hand, a name freed by its owner's
    # deletion, a changed pod template all converge here.
    await provider_status.sync_status(body, dict(spec), dict(status), memo, patch)
    leases.announce_swept(body, memo)


async def delete(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    res = resource_of(body)
    leases.note_ownership(memo, res, {}, owned=False)
    # Its workers' role and its share of the connection budget go with it (its Secrets and
    # Deployment are garbage-collected through their owner references).
    await tenancy.remove_worker_credentials(memo.db, res.uid)
    await budget.forget(memo.db, res)
    if await release_row(memo.db, res):
        announce(body, "ProviderRemoved", f"provider {res.name} removed from hookline.providers; its stored "
                                          f"events stay")
    else:
        announce(body, "ProviderNotOwned", f"provider name {res.name} was not this resource's; nothing removed")


# --- WebhookEndpoint ---------------------------------------------------------------------------


async def endpoint_reconcile(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo,
                             patch: kopf.Patch, **_: Any) -> None:
    await endpoints.sync_status(body, dict(spec), dict(status), memo.db, memo.k8s, patch)


async def endpoint_tick(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo,
                        patch: kopf.Patch, **_: Any) -> None:
    await endpoints.sync_status(body, dict(spec), dict(status), memo.db, memo.k8s, patch)
    await endpoints.annotation_requests(body, dict(spec), dict(status), memo.db, memo.k8s, patch)


async def endpoint_delete(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    await endpoints.delete(body, memo.db)


# --- scaling -------------------------------------------------------------------------------------


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
    provider_status.write_changed(patch, now, fields)


# --- annotation tokens ---------------------------------------------------------------------------


async def annotation_tokens(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: OperatorMemo,
                            patch: kopf.Patch, **_: Any) -> None:
    if resource_state(memo).claim is None:
        return  # not synced since start: whether the name is ours is not known yet
    annotations = dict(body.get("metadata", {}).get("annotations") or {})
    now = dict(status)
    if token := tokens.pending_token(annotations, now, tokens.REPLAY_ANNOTATION, "replay"):
        patch.status["replay"] = await tokens.handle_replay(body, token, memo)
    if token := tokens.pending_token(annotations, now, tokens.ROTATE_ANNOTATION, "rotation"):
        patch.status["rotation"] = await tokens.handle_rotation(body, dict(spec), token, memo)
