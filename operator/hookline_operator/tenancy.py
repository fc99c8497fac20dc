"""What a namespace can reach: its workers' own database role, its handler modules, its secrets.

- Each WebhookProvider's workers log in as their own Postgres role, which row-level security
  limits to the providers of the resource's namespace (migration 0006). The operator creates the
  role (only a SCRAM verifier of the password reaches Postgres) and writes its URL into a Secret
  it owns in that namespace; the full-privilege URL never leaves the release namespace.
- ``spec.handler`` may name only modules the chart grants the namespace (operator.handlerModules).
- The secret the workers sign destination calls with is written to a Secret the operator owns,
  so the destination can verify them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import asyncpg

from hookline.core import db, settings
from hookline.core import secrets_at_rest as sealing
from hookline_operator import resources

HANDLER_MODULES_ENV = settings.HANDLER_MODULES
ANY_NAMESPACE = "*"
SCRAM_ITERATIONS = 4096


class Outcome(NamedTuple):
    ok: bool
    reason: str
    message: str


class SecretApi(Protocol):
    """The Kubernetes calls this module needs (hookline_operator.kube.Kube provides them)."""

    async def read_secret(self, namespace: str, name: str) -> Any: ...

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def patch_secret(self, namespace: str, name: str, string_data: dict[str, str],
                           annotations: dict[str, str] | None = None) -> None: ...


# -- the workers' database role ----------------------------------------------------------------


def role_name(database: str, uid: str) -> str:
    """The role of one WebhookProvider's workers: stable, unique per database and resource."""
    digest = hashlib.sha256(f"{database}/{uid}".encode()).hexdigest()
    return f"hookline_w_{digest[:24]}"


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for ``password`` (RFC 5802/7677, as libpq's
    PQencryptPasswordConn builds it), so that the password itself is never sent to the server."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def tenant_url(base_url: str, role: str, password: str) -> str:
    """``base_url`` (the operator's own) with the tenant's user and password instead of its own."""
    parts = urlsplit(base_url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"))


def password_in(url: str | None, role: str) -> str | None:
    """The password of ``url`` when it logs in as ``role``; None otherwise."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.username is None or unquote(parts.username) != role or not parts.password:
        return None
    return unquote(parts.password)


def _secret_manifest(labels: dict[str, str], name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "labels": {**resources.MANAGED_BY, **labels, "hookline.io/credential": "database"}},
        "stringData": data,
    }


def _credential_data(base_url: str, session_base_url: str | None, role: str, password: str) -> dict[str, str]:
    """The workers' URL and, when the operator has a session URL (a transaction-mode pooler in front),
    the same role's session URL: one password for both."""
    data = {resources.DATABASE_SECRET_KEY: tenant_url(base_url, role, password)}
    if session_base_url:
        data[resources.SESSION_URL_SECRET_KEY] = tenant_url(session_base_url, role, password)
    return data


async def ensure_worker_credentials(kube: SecretApi, conn: asyncpg.Connection | asyncpg.Pool, owner: Any,
                                    namespace: str, provider: str, uid: str, base_url: str,
                                    session_base_url: str | None = None, *, secret_name: str | None = None,
                                    kind: str = "WebhookProvider") -> Outcome:
    """The provider's workers' role logs in with the password in their Secret, which exists.

    ``owner`` is the WebhookProvider body (for the owner reference). A Secret of that name that is
    not this resource's is never touched (ResourceConflict). The Secret is the password's one home,
    written first; the role follows it. Reconcile and the sync timer may run this at once for one
    resource: whichever creates the Secret wins, and both then give the role that Secret's password.
    The same serves a WebhookEndpoint's publisher credential (``kind``, its ``secret_name``): a
    tenant role of the namespace either way.
    """
    secret_name = secret_name or resources.database_secret_name(provider)
    role = role_name(urlsplit(base_url).path.lstrip("/") or "postgres", uid)
    existing = await kube.read_secret(namespace, secret_name)
    who = "workers log in" if kind == "WebhookProvider" else "publishers log in"
    outcome = Outcome(True, "CredentialsReady", f"{who} as database role {role} (Secret {secret_name})")
    if existing is None:
        label = {"hookline.io/provider" if kind == "WebhookProvider" else "hookline.io/endpoint": provider}
        manifest = _secret_manifest(label, secret_name,
                                    _credential_data(base_url, session_base_url, role, secrets.token_urlsafe(32)))
        if await _create_owned(kube, namespace, manifest, owner):
            outcome = Outcome(True, "CredentialsCreated", f"created Secret {secret_name} for database role {role}")
        existing = await kube.read_secret(namespace, secret_name)
        if existing is None:
            return Outcome(False, "CredentialsPending", f"Secret {secret_name} was deleted while it was written")
    if uid not in existing.owner_uids:
        return Outcome(False, "ResourceConflict",
                       f"Secret {secret_name} exists and is not owned by this {kind}; "
                       "the operator never adopts it: delete or rename it")
    url = existing.data.get(resources.DATABASE_SECRET_KEY)
    password = password_in(url, role) or unquote(urlsplit(url or "").password or "") or secrets.token_urlsafe(32)
    wanted = _credential_data(base_url, session_base_url, role, password)
    if any(existing.data.get(key) != value for key, value in wanted.items()):
        # Another database host, or edited by hand: keep the password if there is one.
        await kube.patch_secret(namespace, secret_name, wanted)
        outcome = Outcome(True, "CredentialsUpdated", f"updated Secret {secret_name} for database role {role}")
    # Level-based: the role is (re)made whenever it is missing (a restored database) or was last
    # given another password than the Secret's; otherwise a tick costs one cheap query.
    if not await conn.fetchval(db.query("tenant_ready", "tenancy.sql"), role, password_digest(password)):
        refused = await ensure_role(conn, role, namespace, uid, password)
        if refused:
            return refused
    return outcome


def password_digest(password: str) -> str:
    """What hookline.tenants records of the password the role was last given (to notice a change)."""
    return hashlib.sha256(password.encode()).hexdigest()


async def _create_owned(kube: SecretApi, namespace: str, manifest: dict[str, Any], owner: Any) -> bool:
    """Create the Secret owned by ``owner``; False when it exists already (created meanwhile)."""
    import kopf
    from kubernetes.client.exceptions import ApiException

    kopf.adopt(manifest, owner=owner)
    try:
        await kube.create_secret(namespace, manifest)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


async def ensure_role(conn: asyncpg.Connection | asyncpg.Pool, role: str, namespace: str, uid: str,
                      password: str) -> Outcome | None:
    """Create or converge the role; an Outcome saying why when the operator may not."""
    try:
        await conn.execute(db.query("ensure_tenant", "tenancy.sql"), role, namespace, uid, scram_verifier(password),
                           password_digest(password))
    except asyncpg.InsufficientPrivilegeError as exc:
        return Outcome(False, "DatabasePermissionDenied",
                       f"cannot create the workers' database role {role}: {exc} (the operator's database role "
                       "needs CREATEROLE and must own the hookline tables)")
    return None


async def remove_worker_credentials(conn: asyncpg.Connection | asyncpg.Pool, uid: str) -> None:
    """Drop the role of a deleted resource's workers (its Secret goes with the resource)."""
    await conn.execute(db.query("drop_tenant", "tenancy.sql"), uid)


# -- handler modules ---------------------------------------------------------------------------


def configured_handler_modules() -> dict[str, list[str]] | None:
    """operator.handlerModules from the chart; None (no limit) when the operator runs without it."""
    return settings.handler_modules()


def module_allowed(module: str, prefix: str) -> bool:
    """``prefix`` names a package (or module): itself and everything below it, never a sibling."""
    package = prefix.rstrip(".")
    return package == "" or module == package or module.startswith(package + ".")


def handler_refusal(namespace: str, spec: Mapping[str, Any],
                    policy: Mapping[str, list[str]] | None) -> str | None:
    """Why ``spec.handler`` may not run for this namespace, or None when it may."""
    handler = spec.get("handler")
    if not handler or policy is None:
        return None
    module = str(handler).partition(":")[0]
    prefixes = policy.get(namespace, policy.get(ANY_NAMESPACE, []))
    if any(module_allowed(module, p) for p in prefixes):
        return None
    allowed = ", ".join(repr(p) for p in prefixes) if prefixes else "none"
    return (f"handler module {module!r} is not allowed in namespace {namespace} (allowed module prefixes: "
            f"{allowed}; the chart value operator.handlerModules grants them)")


# -- the destination signing secret ------------------------------------------------------------


async def ensure_destination_secret(kube: SecretApi, conn: asyncpg.Connection | asyncpg.Pool, owner: Any,
                                    namespace: str, provider: str, uid: str, spec: Mapping[str, Any]
                                    ) -> Outcome | None:
    """Mirror the provider's destination signing secret into a Secret this resource owns.

    None when there is nothing to mirror (a handler provider, or the row is not this resource's).
    """
    if not spec.get("destination"):
        return None
    stored = await conn.fetchval(db.query("destination_secret", "tenancy.sql"), provider, uid)
    if not stored:
        return None
    value = sealing.open_value(sealing.required_ring("mirroring the destination secret"), stored,
                               sealing.destination_secret_context(provider))
    name = resources.destination_secret_name(provider)
    existing = await kube.read_secret(namespace, name)
    if existing is None:
        if await _create_owned(kube, namespace, resources.secret_manifest(provider, name, "secret", value), owner):
            return Outcome(True, "DestinationSecretCreated",
                           f"created Secret {name}: the destination verifies the workers' Standard Webhooks "
                           "signatures with its key `secret`")
        existing = await kube.read_secret(namespace, name)
        if existing is None:
            return Outcome(False, "DestinationSecretPending", f"Secret {name} was deleted while it was written")
    if uid not in existing.owner_uids:
        return Outcome(False, "ResourceConflict", f"Secret {name} exists and is not owned by this WebhookProvider; "
                                                  "the operator never adopts it: delete or rename it")
    if existing.data.get("secret") != value:
        await kube.patch_secret(namespace, name, {"secret": value})
    return Outcome(True, "DestinationSecretReady", f"destination signing secret in Secret {name}")
