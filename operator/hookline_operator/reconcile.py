"""Make the world match a WebhookProvider's spec: signing Secret, provider row, worker Deployment.

``converge`` runs on create/update/resume and on every sync tick; it is level-based and
idempotent, and it writes only what this resource owns:

1. the signing Secret: created (owned) when missing; a user's ``secretRef`` Secret is
   read, never written; a foreign Secret on the generated name is a ResourceConflict;
2. the provider row: claimed and synced in one statement (first claimant owns the
   public name; see ``claim_provider`` in queries.sql), taken over only from an owner
   the API server says is gone;
3. the worker Deployment: created with this resource's ownerReference and kept in line
   with the template; a foreign Deployment on the name is a ResourceConflict.

What was found comes back as an ``Observation``; ``status.conditions`` turns it into
conditions. Nothing here raises for a state of the world, only for failures to see it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, NamedTuple

import asyncpg
import kopf
from kubernetes.client.exceptions import ApiException

from hookline.core import db
from hookline.core import secrets_at_rest as sealing
from hookline.core.providers import SpecError, parse_provider, stored_secrets
from hookline.core.settings import database_session_url, database_url, transaction_pooling
from hookline.core.signatures import get_scheme
from hookline_operator import placement, resources, tenancy
from hookline_operator.kube import Kube, ObservedSecret
from hookline_operator.ownership import (
    Claim,
    ClaimState,
    Resource,
    SecretSource,
    claim_outcome,
    owner_is_gone,
    owns,
    secret_source,
)
from hookline_operator.podtemplate import TemplateError, configured_template, provider_placement
from hookline_operator.scaling import ScalePolicy

log = logging.getLogger("hookline.operator")

TEMPLATE_HASH = "hookline.io/template-hash"


class SecretState(NamedTuple):
    """The signing Secret as observed (and created when missing)."""

    ready: bool
    reason: str  # CamelCase, for the SecretReady condition
    message: str
    source: SecretSource
    name: str = ""
    data: dict[str, str] = {}

    @property
    def rotatable(self) -> bool:
        return self.source is SecretSource.MANAGED


class SyncState(NamedTuple):
    """The provider row: claimed and in step with the spec, or why not."""

    synced: bool
    reason: str  # Synced, InvalidSpec, HandlerNotAllowed, NameConflict, SecretNotReady, ClaimRetry
    message: str
    claim: Claim | None = None  # None when no claim was attempted (bad spec, no secret)
    verified: LastSync | None = None  # set when the row was claimed and checked just now


class LastSync(NamedTuple):
    """What the row was last verified to hold, so an unchanged provider skips the claim statement
    (and its row lock) on most ticks."""

    fingerprint: str
    at: float  # time.monotonic()


def sync_fingerprint(res: Resource, spec: dict[str, Any], secrets: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps([res.uid, spec, secrets], sort_keys=True).encode()).hexdigest()


class WorkersState(NamedTuple):
    ok: bool
    reason: str  # WorkersCreated, WorkersReady, WaitingForName, ResourceConflict, InvalidWorkerTemplate,
    # PlacementNotAllowed
    message: str


class Observation(NamedTuple):
    secret: SecretState
    sync: SyncState
    workers: WorkersState


def announce(body: kopf.Body, reason: str, message: str, warning: bool = False) -> None:
    (kopf.warn if warning else kopf.info)(body, reason=reason, message=message)


# --- the signing Secret --------------------------------------------------------------------------


class SigningSecret(NamedTuple):
    """Where a resource's signing key lives: a Secret named by the user (read, never written) or one
    the operator creates on a generated name and owns (and may rotate)."""

    kind: str  # WebhookProvider, WebhookEndpoint: for messages
    ref_field: str  # the spec field that names a user's Secret, for messages
    name: str
    key: str
    explicit: bool  # named by the user
    scheme: str
    labels: dict[str, str]


def provider_secret(res: Resource, spec: dict[str, Any]) -> SigningSecret:
    secret_name, key = resources.secret_ref(res.name, spec)
    return SigningSecret("WebhookProvider", "spec.signature.secretRef", secret_name, key, _explicit_ref(spec),
                         _scheme(spec), {"hookline.io/provider": res.name})


def _explicit_ref(spec: dict[str, Any]) -> bool:
    return bool(((spec.get("signature") or {}).get("secretRef") or {}).get("name"))


def _scheme(spec: dict[str, Any]) -> str:
    return str((spec.get("signature") or {}).get("scheme", ""))


def describe_secret(res: Resource, spec: dict[str, Any], observed: ObservedSecret | None) -> SecretState:
    """The SecretState of a WebhookProvider's signing Secret (pure: tests call it without a cluster)."""
    return describe_signing_secret(res, provider_secret(res, spec), observed)


def describe_signing_secret(res: Resource, wanted: SigningSecret, observed: ObservedSecret | None) -> SecretState:
    """The SecretState of what is there (pure)."""
    secret_name, key = wanted.name, wanted.key
    source = secret_source(wanted.explicit, wanted.scheme, observed.owner_uids if observed else None, res.uid)
    if source is SecretSource.NONE_NEEDED:
        return SecretState(True, "NotRequired", "scheme none needs no secret", source)
    if observed is None:
        return SecretState(False, "SecretMissing", f"Secret {secret_name} does not exist", source, secret_name)
    if source is SecretSource.CONFLICT:
        return SecretState(False, "ResourceConflict",
                           f"Secret {secret_name} exists but was not created for this {wanted.kind} (no "
                           f"ownerReference to it); the operator never adopts it: set {wanted.ref_field} "
                           f"to use it as the signing secret, or delete it", source, secret_name)
    if not observed.data.get(key):
        return SecretState(False, "SecretKeyMissing", f"Secret {secret_name} has no key {key!r}", source,
                           secret_name, observed.data)
    if source is SecretSource.USER:
        return SecretState(True, "SecretFound", f"using Secret {secret_name} key {key}, provided by you: the "
                           f"operator reads it and never rotates it", source, secret_name, observed.data)
    return SecretState(True, "SecretFound", f"using Secret {secret_name} key {key}, managed by the operator",
                       source, secret_name, observed.data)


async def observe_secret(kube: Kube, res: Resource, spec: dict[str, Any]) -> SecretState:
    return await observe_signing_secret(kube, res, provider_secret(res, spec))


async def observe_signing_secret(kube: Kube, res: Resource, wanted: SigningSecret) -> SecretState:
    if wanted.scheme == "none":
        return describe_signing_secret(res, wanted, None)
    return describe_signing_secret(res, wanted, await kube.read_secret(res.namespace, wanted.name))


async def ensure_secret(kube: Kube, body: kopf.Body, res: Resource, spec: dict[str, Any]) -> SecretState:
    return await ensure_signing_secret(kube, body, res, provider_secret(res, spec))


async def ensure_signing_secret(kube: Kube, body: kopf.Body, res: Resource, wanted: SigningSecret) -> SecretState:
    """The signing Secret, created (owned by the resource) when it does not exist."""
    state = await observe_signing_secret(kube, res, wanted)
    if state.reason != "SecretMissing":
        return state
    value = get_scheme(wanted.scheme).generate_secret()
    manifest = resources.secret_manifest(res.name, wanted.name, wanted.key, value, wanted.labels)
    kopf.adopt(manifest, owner=body)
    try:
        await kube.create_secret(res.namespace, manifest)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return await observe_signing_secret(kube, res, wanted)  # created meanwhile (by whom decides the rest)
    announce(body, "SecretCreated", f"created Secret {wanted.name} with a new {wanted.scheme} secret")
    return SecretState(True, "SecretCreated", f"Secret {wanted.name} created, managed by the operator",
                       SecretSource.MANAGED, wanted.name, {wanted.key: value})


# --- the provider row ----------------------------------------------------------------------------


async def claim_row(conn: asyncpg.Connection | asyncpg.Pool, res: Resource, spec: dict[str, Any],
                    secrets: list[dict[str, Any]], replaces_uid: str | None = None) -> Claim:
    """Claim the public name for ``res`` and store the spec (its secrets sealed): one atomic statement,
    after a read of the stored secrets (kept where unchanged; the proof that adopts a row from before
    ownership: see claim_provider in queries.sql)."""
    ring = sealing.required_ring("the operator's provider sync")
    current = secrets[0]["value"] if secrets and secrets[0]["notAfter"] is None else None
    found = await conn.fetchrow(db.query("get_provider_claim_secrets"), res.name)
    stored = found["secrets"] if found is not None else []
    proof = None
    if current is not None and found is not None and found["managed_by"] is None:
        try:
            if current in (s["value"] for s in stored_secrets(ring, res.name, stored)):
                proof = stored
        except sealing.SealedValueError:
            pass  # a row whose secrets do not open proves nothing
    sealed = sealing.seal_entries(ring, secrets, sealing.provider_secrets_context(res.name), stored)
    fresh_destination_secret = ring.seal(get_scheme("standard-webhooks").generate_secret(),
                                         sealing.destination_secret_context(res.name))
    row = await conn.fetchrow(db.query("claim_provider"), res.name, spec, sealed, fresh_destination_secret,
                              res.namespace, res.name, res.uid, current is not None, replaces_uid, proof)
    return claim_outcome(row, res.uid)


async def claim_and_sync(pool: asyncpg.Pool, kube: Kube, res: Resource, spec: dict[str, Any],
                         secret: SecretState, last: LastSync | None = None, resync_after: float = 0.0
                         ) -> SyncState:
    """Claim the name and store the spec; ``last`` (what was verified before) lets an unchanged
    provider skip the statement until ``resync_after`` seconds have passed, which bounds how long
    a row changed behind the operator's back stays wrong."""
    if not secret.ready:
        return SyncState(False, "SecretNotReady", "waiting for the signing secret")
    refusal = tenancy.handler_refusal(res.namespace, spec, tenancy.configured_handler_modules())
    if refusal:
        return SyncState(False, "HandlerNotAllowed", refusal)
    key = resources.secret_ref(res.name, spec)[1]
    secrets = resources.valid_secrets(secret.data, key) if secret.data else []
    try:
        parse_provider(res.name, spec, [s["value"] for s in secrets])
    except SpecError as exc:
        return SyncState(False, "InvalidSpec", str(exc))
    fingerprint = sync_fingerprint(res, spec, secrets)
    if last is not None and last.fingerprint == fingerprint and time.monotonic() - last.at < resync_after:
        return SyncState(True, "Synced", f"provider {res.name} is in hookline.providers", Claim(ClaimState.OWNED))
    claim = await claim_row(pool, res, spec, secrets)
    if claim.state is ClaimState.CONFLICT and claim.owner_uid is not None:
        # Level-based takeover: the owner may have been deleted without releasing the name
        # (its finalizer removed by hand). Only the API server's word that it is gone counts;
        # a namespace this operator cannot read keeps the owner.
        try:
            observed_uid = await kube.provider_uid(claim.owner_namespace or "", claim.owner_name or "")
        except ApiException as exc:
            log.info("cannot check the owner of a provider name", extra={"provider": res.name, "status": exc.status})
        else:
            if owner_is_gone(claim, observed_uid):
                claim = await claim_row(pool, res, spec, secrets, replaces_uid=claim.owner_uid)
    if claim.owned:
        return SyncState(True, "Synced", f"provider {res.name} is in hookline.providers", claim,
                         LastSync(fingerprint, time.monotonic()))
    return SyncState(False, claim.state.value, claim.message(res.name), claim)


async def release_row(pool: asyncpg.Pool, res: Resource) -> bool:
    """Remove the provider row, only if this resource owns it; True when it did."""
    return bool(await pool.fetchval(db.query("release_provider"), res.name, res.uid))


# --- the worker Deployment -----------------------------------------------------------------------


def desired_deployment(res: Resource, spec: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The worker Deployment manifest (resources.worker_deployment), stamped with a hash of
    everything but replicas, so a change of spec or template is seen without a diff engine."""
    manifest = resources.worker_deployment(res.name, spec, replicas, transaction_pooling=transaction_pooling())
    shape = {k: v for k, v in manifest["spec"].items() if k != "replicas"}
    digest = hashlib.sha256(json.dumps([manifest["metadata"], shape], sort_keys=True).encode()).hexdigest()[:16]
    manifest["metadata"].setdefault("annotations", {})[TEMPLATE_HASH] = digest
    return manifest


async def ensure_workers(kube: Kube, body: kopf.Body, res: Resource, spec: dict[str, Any],
                         sync: SyncState, first_try: bool = True) -> WorkersState:
    name = resources.worker_name(res.name)
    existing = await kube.read_deployment(res.namespace, name)
    if existing is not None and not owns(existing.owner_uids, res.uid):
        return WorkersState(False, "ResourceConflict",
                            f"Deployment {name} exists and is not owned by this WebhookProvider (no ownerReference "
                            f"to it); the operator never adopts, patches or scales it: rename or delete it")
    if sync.claim is not None and sync.claim.state is ClaimState.CONFLICT:
        # Workers in this namespace must never process another owner's events.
        return WorkersState(False, "WaitingForName", "no workers while the provider name belongs to another owner")
    if existing is None:
        if sync.claim is None or not sync.claim.owned:
            return WorkersState(False, "WaitingForSync", "workers are created once the provider is synced")
        replicas = ScalePolicy.from_spec(spec).min_replicas
        manifest = desired_deployment(res, spec, replicas)
        kopf.adopt(manifest, owner=body)
        try:
            await kube.create_deployment(res.namespace, manifest)
        except ApiException as exc:
            if exc.status != 409 or not first_try:
                raise
            # Created meanwhile (a change handler and the sync timer run concurrently): judge what is there.
            return await ensure_workers(kube, body, res, spec, sync, first_try=False)
        announce(body, "WorkersCreated", f"created Deployment {name} with {replicas} replicas")
        return WorkersState(True, "WorkersCreated", f"Deployment {name} created")
    manifest = desired_deployment(res, spec, existing.replicas)
    if existing.annotations.get(TEMPLATE_HASH) != manifest["metadata"]["annotations"][TEMPLATE_HASH]:
        del manifest["spec"]["replicas"]  # replicas belong to the scaling timer
        placement.exact_in_patch(manifest["spec"]["template"]["spec"])
        await kube.patch_deployment(res.namespace, name, manifest)
        announce(body, "WorkersUpdated", f"updated the pod template of Deployment {name}")
    return WorkersState(True, "WorkersReady", f"Deployment {name} is managed by the operator")


def placement_state(spec: dict[str, Any], workers: WorkersState) -> WorkersState:
    """Running workers whose spec asked for placement the platform does not allow: they run with the
    platform's placement and the allowed additions only (never silently what was asked), and the
    resource is not Ready until the request is changed. Events keep being processed meanwhile."""
    refused = provider_placement(configured_template(), spec.get("workers") or {}).refused
    if not workers.ok or not refused:
        return workers
    return WorkersState(False, "PlacementNotAllowed",
                        f"spec.workers asks for placement the platform does not allow, so the workers run without "
                        f"it: {'; '.join(refused)}")


async def ensure_access(pool: asyncpg.Pool, kube: Kube, body: kopf.Body, res: Resource, spec: dict[str, Any],
                        sync: SyncState) -> WorkersState | None:
    """The workers' own database credential and the destination signing secret, as Secrets this
    resource owns (tenancy.py); a WorkersState when something stands in the way, else None.
    Checked when the row is (on changes and every few ticks, like the claim), not on every tick."""
    if sync.claim is None or not sync.claim.owned or sync.verified is None:
        return None
    outcomes = [await tenancy.ensure_worker_credentials(kube, pool, body, res.namespace, res.name, res.uid,
                                                        database_url(), database_session_url()),
                await tenancy.ensure_destination_secret(kube, pool, body, res.namespace, res.name, res.uid, spec)]
    for outcome in outcomes:
        if outcome is None:
            continue
        if not outcome.ok:
            return WorkersState(False, outcome.reason, outcome.message)
        if outcome.reason.endswith(("Created", "Updated")):
            announce(body, outcome.reason, outcome.message)
    return None


async def converge(pool: asyncpg.Pool, kube: Kube, body: kopf.Body, res: Resource, spec: dict[str, Any],
                   last: LastSync | None = None, resync_after: float = 0.0) -> Observation:
    secret = await ensure_secret(kube, body, res, spec)
    sync = await claim_and_sync(pool, kube, res, spec, secret, last, resync_after)
    try:
        refused = await ensure_access(pool, kube, body, res, spec, sync)
        # Not verified while access is refused, so the next tick checks again instead of skipping.
        sync = sync._replace(verified=None) if refused else sync
        workers = refused or await ensure_workers(kube, body, res, spec, sync)
        workers = placement_state(spec, workers)
    except TemplateError as exc:
        workers = WorkersState(False, "InvalidWorkerTemplate", str(exc))
    return Observation(secret, sync, workers)
