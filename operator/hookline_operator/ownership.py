"""Who owns what: the decisions behind "a resource touches only what is its own". Pure, no I/O.

Two kinds of ownership, each decided here and acted on elsewhere:

- the public provider name (a row in hookline.providers): the first WebhookProvider to
  claim a name owns it until it is deleted (see ``claim_provider`` in queries.sql);
- Kubernetes objects (the signing Secret, the worker Deployment): the operator writes
  only objects whose ownerReferences name this resource's uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, NamedTuple

import kopf


class Resource(NamedTuple):
    """The WebhookProvider being handled: everything that identifies it."""

    namespace: str
    name: str
    uid: str
    generation: int

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimState(Enum):
    OWNED = "Owned"  # the row is this resource's (written now or unchanged)
    CONFLICT = "NameConflict"  # someone else owns the name
    RETRY = "ClaimRetry"  # the row changed hands while we looked; decide on the next tick


class Claim(NamedTuple):
    state: ClaimState
    # Who owns the name when it is not us: for the operator's log (the platform's) and the takeover
    # check, never for the claimant's status or Events, which another team can write to probe names.
    owner: str = ""
    owner_namespace: str | None = None  # set when another WebhookProvider owns it
    owner_name: str | None = None
    owner_uid: str | None = None

    @property
    def owned(self) -> bool:
        return self.state is ClaimState.OWNED

    def message(self, provider: str) -> str:
        """For the claimant's status: whether the name is ours, never who holds it (the same words
        whichever namespace, the CLI or an old row holds it)."""
        if self.state is ClaimState.OWNED:
            return f"provider name {provider!r} belongs to this WebhookProvider"
        if self.state is ClaimState.RETRY:
            return f"provider name {provider!r} changed hands while it was being claimed; trying again"
        return (f"provider name {provider!r} (POST /webhooks/{provider}) is already taken; this resource is not "
                f"synced until the name is released, or rename this one (the operator's log names the owner "
                f"for the platform team)")


CLI_OWNER = "the hookline providers CLI (delete it there with `hookline providers delete` to hand it over)"
LEGACY_OWNER = ("a provider row written before ownership was recorded, whose signing secret is not this "
                "resource's (delete the other WebhookProvider of that name, or the row)")


def claim_outcome(row: Mapping[str, Any] | None, uid: str) -> Claim:
    """What the row ``claim_provider`` returned means for the resource with ``uid``."""
    if row is None:
        return Claim(ClaimState.RETRY)
    if row["owner_uid"] == uid:
        return Claim(ClaimState.OWNED)
    if row["owner_uid"] is not None:
        namespace, name = row["owner_namespace"], row["owner_name"]
        return Claim(ClaimState.CONFLICT, f"WebhookProvider {namespace}/{name}", namespace, name, row["owner_uid"])
    if row["managed_by"] == "cli":
        return Claim(ClaimState.CONFLICT, CLI_OWNER)
    return Claim(ClaimState.CONFLICT, LEGACY_OWNER)


def owner_is_gone(claim: Claim, observed_uid: str | None) -> bool:
    """Whether the resource holding the name no longer exists (observed_uid: what the API server
    says is at owner_namespace/owner_name now, None for nothing). A resource deleted and created
    again under the same name is a new resource: its uid differs."""
    return claim.owner_uid is not None and observed_uid != claim.owner_uid


def owns(owner_uids: frozenset[str], uid: str) -> bool:
    """Whether an object's ownerReferences name this resource."""
    return uid in owner_uids


class SecretSource(Enum):
    NONE_NEEDED = "NotRequired"  # scheme none
    MANAGED = "Managed"  # the operator created it for this resource: it may rotate it
    USER = "UserProvided"  # spec.signature.secretRef names a Secret someone else made: read only
    MISSING = "Missing"  # to be created (owned)
    CONFLICT = "ResourceConflict"  # the generated name is taken by a Secret that is not ours


def secret_source(explicit_ref: bool, scheme: str, owner_uids: frozenset[str] | None, uid: str) -> SecretSource:
    """How the signing Secret may be used. ``owner_uids`` is None when the Secret does not exist.

    A Secret named by ``secretRef`` is the user's choice and is read whoever made it,
    but only a Secret carrying this resource's ownerReference is ever written
    (rotated). Without a secretRef the operator uses a generated name; a Secret of that
    name it did not create is a clash, never adopted silently.
    """
    if scheme == "none":
        return SecretSource.NONE_NEEDED
    if owner_uids is None:
        return SecretSource.MISSING
    if owns(owner_uids, uid):
        return SecretSource.MANAGED
    return SecretSource.USER if explicit_ref else SecretSource.CONFLICT


def resource_of(body: kopf.Body) -> Resource:
    meta = body.get("metadata") or {}
    return Resource(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")),
                    int(meta.get("generation") or 0))
