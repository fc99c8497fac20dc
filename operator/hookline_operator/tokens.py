"""One-shot requests by annotation (Flux's requestedAt / lastHandled pattern): replay and rotation.

A new annotation value (token) is acted on once, recorded in hookline.operator_tokens
in the same transaction as the action (so a restart that lost the status write does
not act twice), and acknowledged in status. Both act only for a resource that owns its
provider name; rotation only on a Secret the operator created for this resource. A
refused request is acknowledged too, with the reason, so it is not retried forever.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import kopf

from hookline.core import db
from hookline.core.queue import INBOX
from hookline.core.signatures import get_scheme
from hookline_operator import resources
from hookline_operator.conditions import now_iso
from hookline_operator.kube import Kube
from hookline_operator.memo import OperatorMemo, resource_state
from hookline_operator.ownership import Resource, owns, resource_of
from hookline_operator.reconcile import SecretState, SigningSecret, announce, observe_secret, provider_secret

REPLAY_ANNOTATION = "hookline.io/replay-dlq"
ROTATE_ANNOTATION = "hookline.io/rotate-secret"
ROTATED_FOR = "hookline.io/rotated-for"  # on the Secret: the token it was last rotated for
DEFAULT_OVERLAP = 86400

Action = Callable[[asyncpg.Connection], Awaitable[dict[str, Any]]]


def pending_token(annotations: dict[str, str], status: dict[str, Any], annotation: str, field: str) -> str | None:
    """The annotation's token when it has not been acknowledged in status.<field> yet."""
    token = annotations.get(annotation)
    if not token or (status.get(field) or {}).get("lastHandledToken") == token:
        return None
    return token


async def handle_token(pool: asyncpg.Pool, res: Resource, kind: str, token: str, action: Action
                       ) -> tuple[dict[str, Any], bool]:
    """Run ``action(conn)`` once per (resource, kind, token), recorded in the same transaction.

    Returns (the stored result, whether it ran now); a token handled before returns its
    stored result without running again.
    """
    key = (res.name, res.uid, kind, token)
    async with pool.acquire() as conn, conn.transaction():
        if await conn.fetchval(db.query("record_operator_token"), *key):
            result = await action(conn)
            await conn.execute(db.query("set_operator_token_result"), *key, result)
            return result, True
        return dict(await conn.fetchval(db.query("get_operator_token_result"), *key)), False


async def replay_owned_dead(conn: asyncpg.Connection, name: str, owner_uid: str) -> tuple[bool, int]:
    """Requeue provider ``name``'s dead events through the one replay path (``Queue.replay_dead``,
    which wakes its workers), only while ``owner_uid`` owns the name: the provider row is locked
    FOR SHARE first, in the same transaction, so a concurrent release cannot slip in between.
    Returns (owned, requeued)."""
    async with conn.transaction():
        if not await conn.fetchval(db.query("lock_owned_provider"), name, owner_uid):
            return False, 0
        requeued = await INBOX.replay_dead(conn, partition=name)
        return True, requeued.get(name, 0)


async def replay(pool: asyncpg.Pool, res: Resource, token: str) -> tuple[dict[str, Any], bool]:
    """Requeue the provider's dead events, only while this resource owns the name."""
    async def requeue(conn: asyncpg.Connection) -> dict[str, Any]:
        owned, requeued = await replay_owned_dead(conn, res.name, res.uid)
        return {"owned": owned, "requeued": requeued, "at": now_iso()}

    return await handle_token(pool, res, "replay-dlq", token, requeue)


def rotation_refusal(secret: SecretState, owns_name: bool) -> str | None:
    """Why a rotation must not happen, or None when it may."""
    if not owns_name:
        return "not rotated: this WebhookProvider does not own its provider name (see the Ready condition)"
    if secret.source.value == "NotRequired":
        return "not rotated: scheme none has no secret"
    if not secret.rotatable:
        return (f"not rotated: Secret {secret.name} was provided through spec.signature.secretRef, not created by "
                f"the operator, and the operator never writes it; rotate it yourself (the operator picks up the "
                f"new value on its next sync)")
    return None


async def rotate(kube: Kube, res: Resource, spec: dict[str, Any], token: str) -> str:
    """Rotate a WebhookProvider's signing Secret (rotate_secret)."""
    overlap = int((spec.get("signature") or {}).get("rotationOverlapSeconds", DEFAULT_OVERLAP))
    return await rotate_secret(kube, res, provider_secret(res, spec), overlap, token)


async def rotate_secret(kube: Kube, res: Resource, wanted: SigningSecret, overlap: int, token: str) -> str:
    """A new secret once per token (the Secret's ROTATED_FOR annotation makes a retry after a crash
    a no-op); the old secret stays valid for the overlap window. Returns the Event message.
    The caller has checked that the Secret is this resource's (``rotation_refusal``)."""
    secret_name, key, scheme = wanted.name, wanted.key, wanted.scheme
    observed = await kube.read_secret(res.namespace, secret_name)
    if observed is None or not owns(observed.owner_uids, res.uid):
        raise RuntimeError(f"Secret {secret_name} is gone or no longer this resource's; not rotated")
    if observed.annotations.get(ROTATED_FOR) == token:
        return f"Secret {secret_name} was already rotated for token {token}"
    now = datetime.now(UTC)
    previous = [e for e in json.loads(observed.data.get(resources.PREVIOUS_KEY) or "[]")
                if datetime.fromisoformat(e["notAfter"]) > now]
    if observed.data.get(key):
        previous.append({"value": observed.data[key], "notAfter": (now + timedelta(seconds=overlap)).isoformat()})
    await kube.patch_secret(res.namespace, secret_name,
                            {key: get_scheme(scheme).generate_secret(), resources.PREVIOUS_KEY: json.dumps(previous)},
                            annotations={ROTATED_FOR: token})
    return f"rotated Secret {secret_name}; the previous secret stays valid for {overlap} s"


# --- the annotation timer's two requests, acknowledged on the resource -----------------------------


async def handle_replay(body: kopf.Body, token: str, memo: OperatorMemo) -> dict[str, Any]:
    res = resource_of(body)
    result, fresh = await replay(memo.db, res, token)
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
    refusal = rotation_refusal(secret, claim is not None and claim.owned)

    async def act(_conn: Any) -> dict[str, Any]:
        if refusal:
            return {"at": now_iso(), "result": "Refused", "message": refusal}
        message = await rotate(memo.k8s, res, spec, token)
        return {"at": now_iso(), "result": "Rotated", "message": message}

    result, fresh = await handle_token(memo.db, res, "rotate-secret", token, act)
    if fresh:
        announce(body, "SecretRotated" if result["result"] == "Rotated" else "RotationRefused", result["message"],
                 warning=result["result"] != "Rotated")
    return {"lastHandledToken": token, **result}
