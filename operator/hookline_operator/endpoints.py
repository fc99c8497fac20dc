"""WebhookEndpoint: a team's receiver of outgoing webhooks (crds/webhookendpoints.hookline.io.yaml).

``converge`` runs on create/update/resume and on every tick; it is level-based and writes only what
this resource owns:

1. the signing Secret (reconcile.ensure_signing_secret): generated and owned when ``spec.secretRef``
   names none, read (never written) when it does;
2. the endpoint's row, ``NAMESPACE/NAME`` in hookline.endpoints (no other namespace can hold that
   name), written only when it differs from the spec: each write makes every relay re-read its
   endpoints;
3. its egress (``spec.tls``, ``spec.auth``, ``spec.proxy``: relay/egress.py), with the values of
   the Secrets they name, stored sealed (set_egress writes only when it changed);
4. the publisher credential: Secret ``NAME-publisher`` with a database URL whose role is a tenant of
   the namespace (tenancy.ensure_worker_credentials), so the team's service publishes to this
   namespace's endpoints, and only to them.

Then the status: Ready, SecretReady and CircuitClosed, the endpoint's numbers (``endpoint_status``),
and the annotation requests (replay-dlq, rotate-secret: tokens.py, once per token).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg
import kopf

from hookline import outbox
from hookline.core import db
from hookline.core import secrets_at_rest as sealing
from hookline.core.queue import OUTBOX
from hookline.core.settings import database_session_url, database_url
from hookline.relay import endpoints as endpoint_rows
from hookline.relay.endpoints import (
    ClientTls,
    EgressConfig,
    EgressError,
    EndpointError,
    OAuth2ClientCredentials,
    ProxyConfig,
    RateLimit,
)
from hookline_operator import resources, tenancy, tokens
from hookline_operator.conditions import Conditions, new_conflicts, now_iso, set_condition
from hookline_operator.kube import Kube
from hookline_operator.ownership import Resource, resource_of
from hookline_operator.provider_status import write_changed
from hookline_operator.reconcile import (
    SecretState,
    SigningSecret,
    announce,
    ensure_signing_secret,
    observe_signing_secret,
)

log = logging.getLogger("hookline.operator")

PLURAL = "webhookendpoints"
KIND = "WebhookEndpoint"
NOT_REPORTED = {"pending": None, "parked": None, "deadLetters": None, "deliveredLastHour": None,
                "failedLastHour": None, "lastError": None, "circuit": None}


def qualified_name(res: Resource) -> str:
    """The endpoint's name in hookline.endpoints, metrics, logs and the console."""
    return f"{res.namespace}/{res.name}"


def signing_secret(res: Resource, spec: dict[str, Any]) -> SigningSecret:
    # Not NAME-webhook-secret: a WebhookProvider of the same name in the namespace has that one.
    ref = spec.get("secretRef") or {}
    return SigningSecret(KIND, "spec.secretRef", ref.get("name") or f"{res.name}-endpoint-secret",
                         ref.get("key") or "secret", bool(ref.get("name")), "standard-webhooks",
                         {"hookline.io/endpoint": res.name})


def publisher_secret_name(name: str) -> str:
    return f"{name}-publisher"


@dataclass(frozen=True)
class EndpointSpec:
    """The spec as the row stores it, validated as the CLI validates (the CRD's schema checks first)."""

    url: str
    event_types: tuple[str, ...]
    ordered: bool
    paused: bool
    timeout_seconds: float
    max_attempts: int
    initial_delay: float
    max_delay: float
    done_hours: float | None
    dead_days: float | None
    rate_limit: RateLimit | None


def parse_spec(name: str, spec: dict[str, Any]) -> EndpointSpec:
    """Raises EndpointError naming what is wrong."""
    retry, retention, limit = spec.get("retry") or {}, spec.get("retention") or {}, spec.get("rateLimit")
    parsed = EndpointSpec(
        url=str(spec.get("url") or ""), event_types=tuple(spec.get("eventTypes") or ["*"]),
        ordered=bool(spec.get("ordered", False)), paused=bool(spec.get("paused", False)),
        timeout_seconds=float(spec.get("timeoutSeconds", 10)), max_attempts=int(retry.get("maxAttempts", 12)),
        initial_delay=float(retry.get("initialDelaySeconds", 5)), max_delay=float(retry.get("maxDelaySeconds", 3600)),
        done_hours=_number(retention.get("doneHours")), dead_days=_number(retention.get("deadDays")),
        rate_limit=None if not limit else RateLimit(_number(limit.get("perSecond")), _int(limit.get("burst")),
                                                    _int(limit.get("maxInFlight"))),
    )
    endpoint_rows.validate(name, parsed.url, parsed.event_types, None)
    endpoint_rows.validate_retention(parsed.done_hours, parsed.dead_days)
    if parsed.initial_delay > parsed.max_delay:
        raise EndpointError("spec.retry.initialDelaySeconds must not exceed spec.retry.maxDelaySeconds")
    return parsed


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# --- the row -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowState:
    ok: bool
    reason: str  # Synced, InvalidSpec, SecretNotReady, Disabled
    message: str


def _desired_columns(res: Resource, parsed: EndpointSpec) -> dict[str, Any]:
    limit = parsed.rate_limit
    return {"url": parsed.url, "event_types": list(parsed.event_types), "ordered": parsed.ordered,
            "max_attempts": parsed.max_attempts, "initial_delay_seconds": parsed.initial_delay,
            "max_delay_seconds": parsed.max_delay, "timeout_seconds": parsed.timeout_seconds,
            "retention_done_hours": parsed.done_hours, "retention_dead_days": parsed.dead_days,
            "paused": parsed.paused, "rate_per_second": limit.per_second if limit else None,
            "rate_burst": limit.burst if limit else None, "max_in_flight": limit.max_in_flight if limit else None,
            "owner_uid": res.uid}


def _differs(row: asyncpg.Record | None, columns: dict[str, Any], opened: list[dict[str, Any]] | None,
             secrets: list[dict[str, Any]]) -> bool:
    if row is None or opened != secrets:
        return True
    return any(row[column] != value for column, value in columns.items())


async def sync_row(pool: asyncpg.Pool, res: Resource, parsed: EndpointSpec, secrets: list[dict[str, Any]]) -> bool:
    """Store the endpoint as the spec says, when the row differs; True when it wrote."""
    name = qualified_name(res)
    ring = sealing.required_ring("storing a WebhookEndpoint's signing secret")
    context = sealing.endpoint_secrets_context(name)
    row = await pool.fetchrow(outbox.query("owned_endpoint"), name)
    stored = _entries(row["secrets"]) if row is not None else []
    try:
        opened = sealing.open_entries(ring, stored, context) if row is not None else None
    except sealing.SealedValueError:
        opened = None  # sealed with a key that is gone: write them again
    columns = _desired_columns(res, parsed)
    if not _differs(row, columns, opened, secrets):
        return False
    sealed = sealing.seal_entries(ring, secrets, context, stored if opened is not None else [])
    await pool.execute(
        outbox.query("sync_endpoint"), name, res.namespace, res.name, res.uid, parsed.url, list(parsed.event_types),
        parsed.ordered, json.dumps(sealed), parsed.max_attempts, parsed.initial_delay, parsed.max_delay,
        parsed.timeout_seconds, parsed.done_hours, parsed.dead_days, parsed.paused, columns["rate_per_second"],
        columns["rate_burst"], columns["max_in_flight"])
    return True


def _entries(value: Any) -> list[dict[str, Any]]:
    return json.loads(value) if isinstance(value, str) else list(value or [])


async def release_row(pool: asyncpg.Pool, res: Resource) -> bool:
    return await pool.fetchval(outbox.query("release_endpoint"), qualified_name(res), res.uid) is not None


# --- egress: client TLS, OAuth2 and the proxy, from Secrets of the namespace ------------------------


class EgressProblem(Exception):
    """Why the spec's egress cannot be used; ``reason`` for the Ready condition. Never holds a secret."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def desired_egress(kube: Kube, res: Resource, spec: dict[str, Any]) -> EgressConfig | None:
    """The endpoint's own egress as ``spec.tls``, ``spec.auth`` and ``spec.proxy`` say, with the values
    of the Secrets they name (read, never written); None: the install's egress."""
    tls, oauth2, proxy = spec.get("tls"), (spec.get("auth") or {}).get("oauth2"), spec.get("proxy")
    if not (tls or oauth2 or proxy):
        return None

    async def value(ref: dict[str, Any], key: str, field: str) -> str:
        name = str(ref.get("name") or "")
        found = await kube.read_secret(res.namespace, name)
        if found is None:
            raise EgressProblem("EgressSecretMissing", f"Secret {name} ({field}) does not exist")
        if not found.data.get(key):
            raise EgressProblem("EgressSecretMissing", f"Secret {name} ({field}) has no key {key!r}")
        return found.data[key]

    try:
        client_tls = None
        if tls:
            cert_ref, ca_ref = tls.get("clientCertificateSecretRef"), tls.get("caSecretRef")
            cert_field = "spec.tls.clientCertificateSecretRef"
            client_tls = ClientTls(
                certificate=await value(cert_ref, "tls.crt", cert_field) if cert_ref else None,
                key=await value(cert_ref, "tls.key", cert_field) if cert_ref else None,
                ca=await value(ca_ref, ca_ref.get("key") or "ca.crt", "spec.tls.caSecretRef") if ca_ref else None)
        credentials = None
        if oauth2:
            ref = oauth2["clientSecretRef"]
            credentials = OAuth2ClientCredentials(
                token_url=str(oauth2["tokenUrl"]), client_id=str(oauth2["clientId"]),
                client_secret=await value(ref, ref.get("key") or "client-secret", "spec.auth.oauth2.clientSecretRef"),
                scopes=tuple(oauth2.get("scopes") or ()), audience=oauth2.get("audience"))
        own_proxy = None
        if proxy and proxy.get("url"):
            ref = proxy.get("credentialsSecretRef")
            own_proxy = ProxyConfig(
                url=str(proxy["url"]), no_proxy=tuple(proxy.get("noProxy") or ()),
                credentials=await value(ref, ref.get("key") or "credentials", "spec.proxy.credentialsSecretRef")
                if ref else None)
        return EgressConfig(proxy=own_proxy, direct=bool(proxy and proxy.get("direct")), tls=client_tls,
                            oauth2=credentials)
    except EgressError as exc:  # its messages name no secret (relay/egress.py)
        raise EgressProblem("InvalidEgress", str(exc)) from None


async def sync_egress(pool: asyncpg.Pool, name: str, egress: EgressConfig | None) -> None:
    """Store it (set_egress writes, and wakes the relays, only when it changed)."""
    async with pool.acquire() as conn:
        try:
            await endpoint_rows.set_egress(conn, name, egress)
        except EgressError as exc:
            raise EgressProblem("InvalidEgress", str(exc)) from None


# --- converge and status -------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    secret: SecretState
    row: RowState
    publisher: tenancy.Outcome | None


async def converge(pool: asyncpg.Pool, kube: Kube, body: kopf.Body, res: Resource, spec: dict[str, Any]
                   ) -> Observation:
    secret = await ensure_signing_secret(kube, body, res, signing_secret(res, spec))
    if not secret.ready:
        return Observation(secret, RowState(False, "SecretNotReady", "waiting for the signing secret"), None)
    try:
        parsed = parse_spec(res.name, spec)
    except EndpointError as exc:
        return Observation(secret, RowState(False, "InvalidSpec", str(exc)), None)
    wanted = signing_secret(res, spec)
    secrets = resources.valid_secrets(secret.data, wanted.key)
    try:
        endpoint_rows.validate(res.name, parsed.url, (), secrets[0]["value"])
    except EndpointError:
        return Observation(secret, RowState(False, "InvalidSecret",
                                            f"Secret {wanted.name} key {wanted.key} is not a Standard Webhooks "
                                            f"secret (whsec_ + base64)"), None)
    try:
        egress = await desired_egress(kube, res, spec)
    except EgressProblem as exc:
        # The row keeps its last egress meanwhile: deliveries go as before rather than unguarded.
        return Observation(secret, RowState(False, exc.reason, str(exc)), None)
    if await sync_row(pool, res, parsed, secrets):
        announce(body, "EndpointSynced", f"endpoint {qualified_name(res)} stored as the spec says")
    try:
        await sync_egress(pool, qualified_name(res), egress)
    except EgressProblem as exc:
        return Observation(secret, RowState(False, exc.reason, str(exc)), None)
    publisher = await tenancy.ensure_worker_credentials(
        kube, pool, body, res.namespace, res.name, res.uid, database_url(), database_session_url(),
        secret_name=publisher_secret_name(res.name), kind=KIND)
    if publisher.ok and publisher.reason.endswith(("Created", "Updated")):
        announce(body, publisher.reason, publisher.message)
    return Observation(secret, RowState(True, "Synced", f"endpoint {qualified_name(res)} is in hookline.endpoints"),
                       publisher)


def compose(previous: Conditions, obs: Observation, numbers: asyncpg.Record | None, paused: bool,
            generation: int) -> Conditions:
    """The whole conditions list from what was observed (pure)."""
    conditions = set_condition(previous, "SecretReady", obs.secret.ready, obs.secret.reason, obs.secret.message,
                               generation)
    if numbers is not None:
        circuit, last_error = numbers["circuit_state"], numbers["last_error"]
        closed = circuit == "closed"
        message = ("the relays deliver normally" if closed else
                   "the relays send only probes until the endpoint answers again"
                   + (f"; last error: {last_error}" if last_error else ""))
        conditions = set_condition(conditions, "CircuitClosed", closed,
                                   "Closed" if closed else ("Probing" if circuit == "half_open" else "CircuitOpen"),
                                   message, generation)
    ready, reason, message = _ready(obs, numbers, paused)
    return set_condition(conditions, "Ready", ready, reason, message, generation)


def _ready(obs: Observation, numbers: asyncpg.Record | None, paused: bool) -> tuple[bool, str, str]:
    if not obs.secret.ready:
        return False, ("ResourceConflict" if obs.secret.reason == "ResourceConflict" else "SecretNotReady"), \
            obs.secret.message
    if not obs.row.ok:
        return False, obs.row.reason, obs.row.message
    if obs.publisher is not None and not obs.publisher.ok:
        return False, obs.publisher.reason, obs.publisher.message
    if numbers is not None and not numbers["enabled"]:
        return False, "Disabled", (f"{numbers['disabled_reason'] or 'disabled'}; its deliveries are parked "
                                   f"(hookline endpoints enable re-enables it)")
    if paused:
        return True, "Paused", "paused by spec.paused: deliveries wait, in order, until it is set to false"
    return True, "Reconciled", "endpoint is receiving this namespace's events"


async def sync_status(body: kopf.Body, spec: dict[str, Any], status_now: dict[str, Any], pool: asyncpg.Pool,
                      kube: Kube, patch: kopf.Patch) -> None:
    """Converge, then write conditions, observedGeneration and the numbers, each only when it changed."""
    res = resource_of(body)
    before = list(status_now.get("conditions") or [])
    try:
        observation = await converge(pool, kube, body, res, spec)
        numbers = await pool.fetchrow(outbox.query("endpoint_status"), qualified_name(res), res.uid)
    except db.DATABASE_ERRORS as exc:
        error = f"cannot reach Postgres ({type(exc).__name__})"
        write_changed(patch, status_now, {"conditions": set_condition(before, "Ready", False, "DatabaseUnavailable",
                                                                      error, res.generation)})
        return
    after = compose(before, observation, numbers, bool(spec.get("paused")), res.generation)
    for reason, message in new_conflicts(before, after):
        announce(body, reason, message, warning=True)
    fields: dict[str, Any] = {"conditions": after, "observedGeneration": res.generation}
    if observation.publisher is not None and observation.publisher.ok:
        fields["publisherSecret"] = publisher_secret_name(res.name)
    fields.update(NOT_REPORTED if numbers is None else {
        "circuit": numbers["circuit_state"], "pending": numbers["pending"], "parked": numbers["parked"],
        "deadLetters": numbers["dead"], "deliveredLastHour": numbers["done"], "failedLastHour": numbers["failed"],
        "lastError": numbers["last_error"]})
    write_changed(patch, status_now, fields)


# --- annotation requests -------------------------------------------------------------------------


async def handle_replay(body: kopf.Body, token: str, pool: asyncpg.Pool) -> dict[str, Any]:
    """Requeue the endpoint's dead deliveries once per token, only while this resource owns the row."""
    res = resource_of(body)
    name = qualified_name(res)

    async def requeue(conn: asyncpg.Connection) -> dict[str, Any]:
        if not await conn.fetchval(outbox.query("lock_owned_endpoint"), name, res.uid):
            return {"owned": False, "requeued": 0, "at": now_iso()}
        counts = await OUTBOX.replay_dead(conn, name)
        return {"owned": True, "requeued": counts.get(name, 0), "at": now_iso()}

    result, fresh = await tokens.handle_token(pool, res, "endpoint-replay-dlq", token, requeue)
    if fresh and result["owned"]:
        announce(body, "DeadLettersReplayed", f"requeued {result['requeued']} dead deliveries for token {token}")
    elif fresh:
        announce(body, "ReplayRefused", f"token {token}: nothing requeued, the endpoint is not synced yet",
                 warning=True)
    return {"lastHandledToken": token, "requeued": result["requeued"], "at": result["at"]}


async def handle_rotation(body: kopf.Body, spec: dict[str, Any], token: str, pool: asyncpg.Pool, kube: Kube
                          ) -> dict[str, Any]:
    """A new signing key once per token, the old one signing too for spec.rotationOverlapSeconds;
    refused (and said so) for a Secret the user provided."""
    res = resource_of(body)
    wanted = signing_secret(res, spec)
    overlap = int(spec.get("rotationOverlapSeconds", tokens.DEFAULT_OVERLAP))
    secret = await observe_signing_secret(kube, res, wanted)

    async def act(_conn: Any) -> dict[str, Any]:
        if not secret.rotatable:  # a Secret this resource does not own: the user's, or none yet
            return {"at": now_iso(), "result": "Refused",
                    "message": f"not rotated: Secret {wanted.name} was not created by the operator for this "
                               f"WebhookEndpoint, and the operator never writes it; rotate it yourself (key "
                               f"previous keeps old keys signing)"}
        message = await tokens.rotate_secret(kube, res, wanted, overlap, token)
        return {"at": now_iso(), "result": "Rotated", "message": message}

    result, fresh = await tokens.handle_token(pool, res, "endpoint-rotate-secret", token, act)
    if fresh:
        announce(body, "SecretRotated" if result["result"] == "Rotated" else "RotationRefused", result["message"],
                 warning=result["result"] != "Rotated")
    return {"lastHandledToken": token, **result}


async def annotation_requests(body: kopf.Body, spec: dict[str, Any], status_now: dict[str, Any],
                              pool: asyncpg.Pool, kube: Kube, patch: kopf.Patch) -> None:
    annotations = dict(body.get("metadata", {}).get("annotations") or {})
    if token := tokens.pending_token(annotations, status_now, tokens.REPLAY_ANNOTATION, "replay"):
        patch.status["replay"] = await handle_replay(body, token, pool)
    if token := tokens.pending_token(annotations, status_now, tokens.ROTATE_ANNOTATION, "rotation"):
        patch.status["rotation"] = await handle_rotation(body, spec, token, pool, kube)


async def delete(body: kopf.Body, pool: asyncpg.Pool) -> None:
    """The row (its deliveries with it) and the publisher role go; the Secrets are garbage-collected."""
    res = resource_of(body)
    await tenancy.remove_worker_credentials(pool, res.uid)
    if await release_row(pool, res):
        announce(body, "EndpointRemoved", f"endpoint {qualified_name(res)} removed with its pending deliveries")
