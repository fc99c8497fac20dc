"""kopf handlers for WebhookProvider: level-based, idempotent, every action an Event.

``reconcile`` (create/update/resume) makes the world match the spec: the signing
Secret exists, the provider row in Postgres holds the spec and the valid secrets,
the worker Deployment exists. ``refresh`` (a timer) does what depends on time and
load: annotation tokens (replay, rotation), expired leases, status numbers and
worker replicas. Both are safe to run any number of times.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import kopf

from hookline.core import db
from hookline.core import providers as provider_store
from hookline.core.maintenance import sweep_once
from hookline.core.providers import Provider, SpecError, parse_provider
from hookline.core.queue import INBOX, RetryPolicy
from hookline.core.signatures import get_scheme
from hookline_operator import kube, resources
from hookline_operator.conditions import now_iso, set_condition
from hookline_operator.scaling import ScalePolicy, Stabilizer, recommend

GROUP, VERSION, PLURAL = "hookline.io", "v1alpha1", "webhookproviders"
REPLAY_ANNOTATION = "hookline.io/replay-dlq"
ROTATE_ANNOTATION = "hookline.io/rotate-secret"
PAUSED_ANNOTATION = "hookline.io/paused"
ROTATED_FOR = "hookline.io/rotated-for"
DEFAULT_OVERLAP = 86400

INTERVAL = float(os.environ.get("HOOKLINE_OPERATOR_INTERVAL", "10"))

log = logging.getLogger("hookline.operator")


class State:
    """What the operator keeps in memory: the pool and each provider's scaling history."""

    pool: asyncpg.Pool
    stabilizers: dict[str, Stabilizer]


STATE = State()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
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
    # Our own Events describe every action; kopf's per-handler log lines stay in the log.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    kube.load_config()
    STATE.pool = await db.create_pool(min_size=1, max_size=5)
    STATE.stabilizers = {}


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await STATE.pool.close()


def _event(body: kopf.Body, reason: str, message: str, warning: bool = False) -> None:
    (kopf.warn if warning else kopf.info)(body, reason=reason, message=message)


# --- the signing secret ------------------------------------------------------------------------


async def ensure_secret(body: kopf.Body, name: str, namespace: str, spec: dict[str, Any]) -> SecretState:
    """The signing secret, created (owned by the resource) when it does not exist."""
    state = await observe_secret(namespace, name, spec)
    if state[1] != "SecretMissing":
        return state
    scheme = spec["signature"]["scheme"]
    secret_name, key = resources.secret_ref(name, spec)
    value = get_scheme(scheme).generate_secret()
    manifest = resources.secret_manifest(name, secret_name, key, value)
    kopf.adopt(manifest, owner=body)
    await kube.create_secret(namespace, manifest)
    _event(body, "SecretCreated", f"created Secret {secret_name} with a new {scheme} secret")
    return True, "SecretCreated", f"Secret {secret_name} created", {key: value}


async def rotate_secret(body: kopf.Body, name: str, namespace: str, spec: dict[str, Any], token: str) -> bool:
    """Generate a new secret once per token; the old one stays valid for the overlap window."""
    scheme = (spec.get("signature") or {}).get("scheme", "")
    if scheme == "none":
        return False
    secret_name, key = resources.secret_ref(name, spec)
    if (await kube.read_secret_annotations(namespace, secret_name)).get(ROTATED_FOR) == token:
        return True  # rotated already; we died before recording it
    data = await kube.read_secret(namespace, secret_name) or {}
    overlap = int((spec.get("signature") or {}).get("rotationOverlapSeconds", DEFAULT_OVERLAP))
    not_after = (datetime.now(UTC) + timedelta(seconds=overlap)).isoformat()
    previous = [e for e in json.loads(data.get(resources.PREVIOUS_KEY) or "[]")
                if datetime.fromisoformat(e["notAfter"]) > datetime.now(UTC)]
    if data.get(key):
        previous.append({"value": data[key], "notAfter": not_after})
    await kube.patch_secret(namespace, secret_name,
                            {key: get_scheme(scheme).generate_secret(), resources.PREVIOUS_KEY: json.dumps(previous)},
                            annotations={ROTATED_FOR: token})
    _event(body, "SecretRotated", f"rotated Secret {secret_name}; the previous secret stays valid for {overlap} s")
    return True


# --- Postgres ------------------------------------------------------------------------------------


async def sync_provider(name: str, spec: dict[str, Any], data: dict[str, str]
                        ) -> tuple[Provider | None, str, str]:
    """Validate the spec with its secrets and store it; (provider or None, reason, message)."""
    key = resources.secret_ref(name, spec)[1]
    secrets = resources.valid_secrets(data, key) if data else []
    try:
        provider = parse_provider(name, spec, [s["value"] for s in secrets])
    except SpecError as exc:
        return None, "InvalidSpec", str(exc)
    async with STATE.pool.acquire() as conn:
        await provider_store.upsert(conn, name, spec, secrets)
    return provider, "Synced", f"provider {name} is in hookline.providers"


SecretState = tuple[bool, str, str, dict[str, str]]  # ready, reason, message, data


async def observe_secret(namespace: str, name: str, spec: dict[str, Any]) -> SecretState:
    """The signing secret as it is now (reconcile creates it when missing; this only looks)."""
    if (spec.get("signature") or {}).get("scheme") == "none":
        return True, "NotRequired", "scheme none needs no secret", {}
    secret_name, key = resources.secret_ref(name, spec)
    data = await kube.read_secret(namespace, secret_name)
    if data is None:
        return False, "SecretMissing", f"Secret {secret_name} does not exist", {}
    if not data.get(key):
        return False, "SecretKeyMissing", f"Secret {secret_name} has no key {key!r}", data
    return True, "SecretFound", f"using Secret {secret_name} key {key}", data


async def sync_and_report(name: str, spec: dict[str, Any], secret: SecretState, conditions: list[dict[str, Any]],
                          generation: int | None) -> tuple[Provider | None, list[dict[str, Any]]]:
    """Sync the provider row and set SecretReady, Synced and Ready from what was observed."""
    secret_ok, reason, message, data = secret
    conditions = set_condition(conditions, "SecretReady", secret_ok, reason, message, generation)
    provider = None
    if secret_ok:
        provider, reason, message = await sync_provider(name, spec, data)
    else:
        reason, message = "SecretNotReady", "waiting for the signing secret"
    conditions = set_condition(conditions, "Synced", provider is not None, reason, message, generation)
    ready = provider is not None
    conditions = set_condition(conditions, "Ready", ready, "Reconciled" if ready else "NotReady",
                               "provider is accepting and processing events" if ready else message, generation)
    return provider, conditions


def condition_message(conditions: list[dict[str, Any]], type: str) -> str:
    return next((str(c.get("message", "")) for c in conditions if c.get("type") == type), "")


async def handle_token(provider: str, kind: str, token: str, action: Any) -> tuple[dict[str, Any], bool]:
    """Run ``action(conn)`` once per (provider, kind, token), recorded in the same transaction.

    Returns (the stored result, whether it ran now); a token handled before (e.g. before a
    restart that lost the status write) returns its stored result without running again.
    """
    async with STATE.pool.acquire() as conn, conn.transaction():
        inserted = await conn.fetchval(
            "INSERT INTO hookline.operator_tokens (provider, kind, token) VALUES ($1, $2, $3) "
            "ON CONFLICT DO NOTHING RETURNING true", provider, kind, token)
        if inserted:
            result = await action(conn)
            await conn.execute("UPDATE hookline.operator_tokens SET result = $4 "
                               "WHERE provider = $1 AND kind = $2 AND token = $3", provider, kind, token, result)
            return dict(result), True
        row = await conn.fetchrow("SELECT result FROM hookline.operator_tokens "
                                  "WHERE provider = $1 AND kind = $2 AND token = $3", provider, kind, token)
        return dict(row["result"]), False


# --- handlers ------------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(body: kopf.Body, spec: kopf.Spec, name: str, namespace: str | None, meta: kopf.Meta,
                    status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    assert namespace is not None  # WebhookProvider is namespaced
    generation = meta.get("generation")
    conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
    spec_dict = dict(spec)

    secret = await ensure_secret(body, name, namespace, spec_dict)
    provider, conditions = await sync_and_report(name, spec_dict, secret, conditions, generation)
    if secret[0] and provider is None:
        _event(body, "InvalidSpec", condition_message(conditions, "Synced"), warning=True)

    deployment_name = resources.worker_name(name)
    existing = await kube.read_deployment(namespace, deployment_name)
    policy = ScalePolicy.from_spec(spec_dict)
    if existing is None:
        manifest = resources.worker_deployment(name, spec_dict, policy.min_replicas)
        kopf.adopt(manifest, owner=body)
        await kube.create_deployment(namespace, manifest)
        _event(body, "WorkersCreated", f"created Deployment {deployment_name} with {policy.min_replicas} replicas")
    else:
        # Everything but replicas: those belong to the scaling timer.
        manifest = resources.worker_deployment(name, spec_dict, existing.spec.replicas or 0)
        del manifest["spec"]["replicas"]
        await kube.patch_deployment(namespace, deployment_name, manifest)

    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, name: str, **_: Any) -> None:
    async with STATE.pool.acquire() as conn:
        await provider_store.delete(conn, name)
    STATE.stabilizers.pop(name, None)
    _event(body, "ProviderRemoved", f"provider {name} removed from hookline.providers; its stored events stay")


def _not_deleting(meta: kopf.Meta, **_: Any) -> bool:
    # Once deletion starts, a status patch from the timer would race kopf's finalizer removal.
    return not meta.get("deletionTimestamp")


DATABASE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=min(INTERVAL, 1.0), when=_not_deleting)
async def refresh(body: kopf.Body, spec: kopf.Spec, name: str, namespace: str | None, meta: kopf.Meta,
                  status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    assert namespace is not None
    conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
    try:
        conditions = await _refresh(body, dict(spec), name, namespace, meta, status, patch, conditions)
    except DATABASE_ERRORS as exc:
        # Never act on what we cannot see: replicas stay as they are until Postgres answers.
        conditions = set_condition(conditions, "Scaling", False, "DatabaseUnavailable",
                                   f"cannot read the backlog ({type(exc).__name__}); replicas left as they are",
                                   meta.get("generation"))
    patch.status["conditions"] = conditions


async def _refresh(body: kopf.Body, spec: dict[str, Any], name: str, namespace: str, meta: kopf.Meta,
                   status: kopf.Status, patch: kopf.Patch, conditions: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    generation = meta.get("generation")
    annotations = meta.get("annotations") or {}

    # Replay: once per new token (Flux's requestedAt / lastHandled pattern).
    token = annotations.get(REPLAY_ANNOTATION)
    if token and (status.get("replay") or {}).get("lastHandledToken") != token:
        async def replay(conn: asyncpg.Connection) -> dict[str, Any]:
            counts = await INBOX.replay_dead(conn, name)
            await conn.execute("SELECT pg_notify('hookline_inbox', $1)", name)
            return {"requeued": counts.get(name, 0), "at": now_iso()}
        result, fresh = await handle_token(name, "replay-dlq", token, replay)
        patch.status["replay"] = {"lastHandledToken": token, "requeued": result["requeued"], "at": result["at"]}
        if fresh:
            _event(body, "DeadLettersReplayed", f"requeued {result['requeued']} dead event(s) for token {token}")

    # Rotation: a new secret, the old one valid for the overlap window.
    token = annotations.get(ROTATE_ANNOTATION)
    if (token and (status.get("rotation") or {}).get("lastHandledToken") != token
            and await rotate_secret(body, name, namespace, spec, token)):
        async def record(_conn: asyncpg.Connection) -> dict[str, Any]:
            return {"at": now_iso()}
        result, _fresh = await handle_token(name, "rotate-secret", token, record)
        patch.status["rotation"] = {"lastHandledToken": token, "at": result["at"]}

    # Level-based re-sync: rotated or expired secrets, or a row removed by hand, converge here;
    # and the readiness conditions are recomputed from what is observed, so a status write that
    # raced with reconcile's is repaired on the next tick.
    provider, conditions = await sync_and_report(name, spec, await observe_secret(namespace, name, spec),
                                                 conditions, generation)

    # Expired leases back to pending, the attempt counted.
    swept = await sweep_once(STATE.pool, {name: provider.retry if provider else RetryPolicy()}, partition=name)
    if swept.total:
        _event(body, "LeasesRequeued", f"returned {swept.requeued.get(name, 0)} expired lease(s) to pending, "
                                       f"{swept.dead.get(name, 0)} to dead")
    stats = (await INBOX.stats(STATE.pool)).get(name)
    in_flight = (await INBOX.in_flight(STATE.pool)).get(name, 0)
    backlog = stats.backlog if stats else 0
    patch.status["backlog"] = backlog
    patch.status["oldestPendingSeconds"] = round(stats.oldest_pending_seconds) if stats else 0
    patch.status["deadLetters"] = stats.dead if stats else 0

    deployment_name = resources.worker_name(name)
    deployment = await kube.read_deployment(namespace, deployment_name)
    if deployment is None:
        return conditions  # reconcile creates it
    current = deployment.spec.replicas or 0
    patch.status["replicas"] = current
    if annotations.get(PAUSED_ANNOTATION) == "true":
        return set_condition(conditions, "Scaling", False, "Paused",
                             f"{PAUSED_ANNOTATION} is set; replicas stay at {current}", generation)
    policy = ScalePolicy.from_spec(spec)
    stabilizer = STATE.stabilizers.setdefault(name, Stabilizer())
    desired = stabilizer.desired(time.monotonic(), recommend(backlog, in_flight, policy), current, policy)
    if desired != current:
        await kube.scale_deployment(namespace, deployment_name, desired)
        patch.status["replicas"] = desired
        _event(body, "Scaled", f"scaled {deployment_name} from {current} to {desired} replicas "
                               f"(backlog {backlog}, in flight {in_flight})")
    return set_condition(conditions, "Scaling", True, "Active",
                         f"backlog {backlog}, in flight {in_flight}, {desired} replica(s)", generation)
