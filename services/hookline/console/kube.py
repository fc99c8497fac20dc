"""The console's authorisation by Kubernetes: a TokenReview, then SubjectAccessReviews per provider.

A request's bearer token (a ServiceAccount token, or an OIDC token the API server accepts) is
validated with a TokenReview, which the console's own ServiceAccount creates. The user it names is
then asked about, one SubjectAccessReview per provider and verb:

- ``get`` on ``webhookproviders.hookline.io`` named ``owner_name`` in ``owner_namespace``: may read
  that provider's events;
- ``patch`` on the same: may replay them;
- providers no WebhookProvider owns (applied with ``hookline providers apply``) belong to nobody's
  namespace: reading them needs ``list`` on webhookproviders in every namespace (a cluster-wide
  reader, who also gets ``install_wide``: the whole outbox), replaying them needs ``patch`` in every
  namespace as well;
- ``get`` / ``patch`` on ``webhookendpoints.hookline.io`` named NAME in NAMESPACE: may read / replay
  (and send a test event to) endpoint NAMESPACE/NAME, and read its namespace's events.

Wiring (``hookline console --auth kubernetes``)::

    authorizer = KubernetesAuthorizer()                 # in-cluster, else KUBECONFIG / ~/.kube/config
    authorizer.provider_source = store.provider_owners  # async () -> rows (name, owner_namespace, owner_name)
    access = await authorizer.authorize(token)          # the Authorizer protocol (console/access.py)
    ...
    await authorizer.close()

The calls are plain HTTPS with aiohttp to the API server the loaded configuration names (its CA,
its credentials), so no thread per request. Decisions are cached per token digest (never the
token) for ``ttl`` seconds, at most ``cache_size`` tokens; at most ``concurrency`` reviews run at
once. An API server that fails or cannot be reached denies (and is logged, without the token).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from hookline.console.access import Access

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "hookline.io", "v1alpha1", "webhookproviders", "WebhookProvider"
ENDPOINTS, ENDPOINT_KIND = "webhookendpoints", "WebhookEndpoint"
REPORTING_COMPONENT = "hookline-console"
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # the kubelet rotates a projected token well before it expires
REQUEST_TIMEOUT_SECONDS = 5.0
MAX_SUBJECT_CHARS = 253  # what an Event message quotes of a user name


class ProviderOwner(NamedTuple):
    """One row of hookline.providers as the authorizer needs it: owner_* are None for a provider
    no WebhookProvider owns."""

    name: str
    owner_namespace: str | None
    owner_name: str | None


ProviderSource = Callable[[], Awaitable[Iterable[tuple[str, str | None, str | None]]]]
# (name, namespace, resource name) of every endpoint a WebhookEndpoint is: NAMESPACE/NAME.
EndpointSource = Callable[[], Awaitable[Iterable[tuple[str, str, str]]]]


class KubeConfigError(RuntimeError):
    """Neither an in-cluster ServiceAccount nor a usable kubeconfig."""


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how the console proves who it is: ``credential()`` gives the
    Authorization header's value (or None with a client certificate), asked at each request
    because bound ServiceAccount tokens rotate."""

    host: str
    ssl_context: ssl.SSLContext
    credential: Callable[[], str | None]

    @classmethod
    def load(cls) -> Connection:
        """In-cluster (the pod's ServiceAccount), else the kubeconfig of KUBECONFIG or ~/.kube/config."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (IN_CLUSTER / "token").exists():
            return cls.in_cluster()
        return cls.from_kubeconfig()

    @classmethod
    def in_cluster(cls, folder: Path = IN_CLUSTER) -> Connection:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        return cls(f"https://{host}:{port}", context, _TokenFile(folder / "token").bearer)

    @classmethod
    def from_kubeconfig(cls) -> Connection:
        try:  # the operator extra: only out of cluster (a developer's machine, the tests)
            from kubernetes import client, config
        except ImportError as exc:
            raise KubeConfigError("not in a cluster, and reading a kubeconfig needs the `kubernetes` package "
                                  "(pip install 'hookline[operator]')") from exc
        configuration = client.Configuration()
        try:
            # KUBECONFIG read now: the library reads it once, when it is first imported.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,  # type: ignore[no-untyped-call]
                                    client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise KubeConfigError(f"no usable kubeconfig (KUBECONFIG or ~/.kube/config): {exc}") from exc
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if not configuration.verify_ssl:  # the kubeconfig says insecure-skip-tls-verify
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)

        def credential() -> str | None:
            # Calls the configuration's refresh hook (exec plugins, OIDC) when it has one.
            value = configuration.get_api_key_with_prefix("BearerToken")
            return str(value) if value else None

        return cls(str(configuration.host).rstrip("/"), context, credential)


class _TokenFile:
    """The pod's projected ServiceAccount token, re-read now and then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD_SECONDS

    def bearer(self) -> str:
        if time.monotonic() - self._read_at >= TOKEN_REREAD_SECONDS:
            self._token = self.path.read_text().strip()
            self._read_at = time.monotonic()
        return f"Bearer {self._token}"


class User(NamedTuple):
    """Who a TokenReview says the token belongs to: what a SubjectAccessReview asks about."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]


class Review(NamedTuple):
    """One question: may the user ``verb`` webhookproviders (or ``resource``) named ``name`` in
    ``namespace`` (``namespace`` "" and ``name`` "": in every namespace)."""

    verb: str
    namespace: str
    name: str
    resource: str = PLURAL


CLUSTER_LIST = Review("list", "", "")
CLUSTER_GET = Review("get", "", "")
CLUSTER_PATCH = Review("patch", "", "")


@dataclass
class _Decisions:
    """What one token is: its user (None: not a valid token), and the reviews answered so far."""

    expires: float
    user: User | None
    allowed: dict[Review, bool] = field(default_factory=dict)


class KubernetesAuthorizer:
    """An ``Authorizer`` (console/access.py) that asks the Kubernetes API server; see the module text.

    ``provider_source`` (settable after construction) is an async callable returning the providers
    as rows ``(name, owner_namespace, owner_name)``; ``authorize(token)`` needs it, while
    ``authorize_for(token, providers)`` takes the rows from its caller. ``audiences``: what the
    TokenReview requires the token to be meant for (empty: the API server's own audiences).
    """

    def __init__(
        self,
        connection: Connection | None = None,
        *,
        provider_source: ProviderSource | None = None,
        audiences: Sequence[str] = (),
        ttl: float = 10.0,
        cache_size: int = 1024,
        concurrency: int = 8,
    ) -> None:
        self.connection = connection or Connection.load()
        self.provider_source = provider_source
        self.endpoint_source: EndpointSource | None = None  # none: no namespace's outbox is shown
        self.audiences = tuple(audiences)
        self.ttl = ttl
        self.cache_size = cache_size
        self.concurrency = concurrency
        self._cache: OrderedDict[bytes, _Decisions] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def authorize(self, token: str) -> Access | None:
        if self.provider_source is None:
            raise RuntimeError("KubernetesAuthorizer.provider_source is not set: nothing to authorise against")
        endpoints = await self.endpoint_source() if self.endpoint_source is not None else ()
        return await self.authorize_for(token, await self.provider_source(), endpoints)

    async def authorize_for(self, token: str, providers: Iterable[tuple[str, str | None, str | None]],
                            endpoints: Iterable[tuple[str, str, str]] = ()) -> Access | None:
        """The Access of ``token`` over ``providers`` (rows name, owner_namespace, owner_name) and the
        WebhookEndpoints ``endpoints`` (rows name, namespace, resource name): ``get`` on a resource
        reads it, ``patch`` replays it. None when the API server does not accept the token."""
        if not token:
            return None
        decisions = await self._decisions(token)
        if decisions.user is None:
            return None
        rows = [ProviderOwner(*row) for row in providers]
        # First what the user may do everywhere: a cluster-wide grant answers every provider at once,
        # so a platform team's token costs three reviews, not two per provider.
        await self._review(decisions, {CLUSTER_LIST, CLUSTER_GET, CLUSTER_PATCH})
        allowed = decisions.allowed.get
        cluster_reader = allowed(CLUSTER_LIST, False)
        get_everywhere, patch_everywhere = allowed(CLUSTER_GET, False), allowed(CLUSTER_PATCH, False)
        wanted: set[Review] = set()
        for row in rows:
            if row.owner_namespace and row.owner_name:
                if not get_everywhere:
                    wanted.add(Review("get", row.owner_namespace, row.owner_name))
                if not patch_everywhere:
                    wanted.add(Review("patch", row.owner_namespace, row.owner_name))
        await self._review(decisions, wanted)
        read: set[str] = set()
        replay: set[str] = set()
        for row in rows:
            if row.owner_namespace and row.owner_name:
                if get_everywhere or allowed(Review("get", row.owner_namespace, row.owner_name), False):
                    read.add(row.name)
                if patch_everywhere or allowed(Review("patch", row.owner_namespace, row.owner_name), False):
                    replay.add(row.name)
            else:  # no namespace owns it: only for who may see and change every namespace's
                if cluster_reader:
                    read.add(row.name)
                if cluster_reader and patch_everywhere:
                    replay.add(row.name)
        endpoint_read, endpoint_replay = await self._endpoint_rights(decisions, list(endpoints))
        return Access(subject=decisions.user.username, read=frozenset(read), replay=frozenset(replay),
                      install_wide=cluster_reader, endpoints=endpoint_read, endpoint_replay=endpoint_replay)

    async def _endpoint_rights(self, decisions: _Decisions, rows: list[tuple[str, str, str]]
                               ) -> tuple[frozenset[str], frozenset[str]]:
        """The endpoints the user may get and may patch: one review per resource and verb, unless a
        grant in every namespace answers them all."""
        if not rows:
            return frozenset(), frozenset()
        everywhere = {verb: Review(verb, "", "", ENDPOINTS) for verb in ("get", "patch")}
        await self._review(decisions, set(everywhere.values()))
        wanted = {Review(verb, namespace, name, ENDPOINTS) for _, namespace, name in rows for verb in everywhere
                  if not decisions.allowed.get(everywhere[verb], False)}
        await self._review(decisions, wanted)

        def may(verb: str, namespace: str, name: str) -> bool:
            return decisions.allowed.get(everywhere[verb], False) or decisions.allowed.get(
                Review(verb, namespace, name, ENDPOINTS), False)

        return (frozenset(row[0] for row in rows if may("get", row[1], row[2])),
                frozenset(row[0] for row in rows if may("patch", row[1], row[2])))

    async def record_replay(self, owner_namespace: str, owner_name: str, owner_uid: str, subject: str,
                            count: int, *, kind: str = KIND) -> bool:
        """A core/v1 Event on the WebhookProvider (or ``kind``) ``owner_namespace/owner_name``: reason
        Replayed, "replayed N event(s) on behalf of SUBJECT". False (and a log line) when the API server
        refused it: the replay is done and recorded in the attempt log either way."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{owner_name[:200]}.", "namespace": owner_namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "namespace": owner_namespace,
                               "name": owner_name, "uid": owner_uid},
            "type": "Normal",
            "reason": "Replayed",
            "action": "Replay",
            "message": f"replayed {count} {'event(s)' if kind == KIND else 'delivery(ies)'} on behalf of "
                       f"{subject[:MAX_SUBJECT_CHARS]}",
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._post(f"/api/v1/namespaces/{owner_namespace}/events", body)
        except (aiohttp.ClientError, TimeoutError, KubeApiError) as exc:
            log.warning("could not record the replay on %s %s/%s as a Kubernetes Event: %s",
                        kind, owner_namespace, owner_name, _describe(exc))
            return False
        return True

    # -- reviews --------------------------------------------------------------------------------
    async def _decisions(self, token: str) -> _Decisions:
        key = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        found = self._cache.get(key)
        if found is not None and found.expires > now:
            self._cache.move_to_end(key)
            return found
        try:
            user = await self._token_review(token)
        except (aiohttp.ClientError, TimeoutError, KubeApiError) as exc:
            # Not cached: the next request asks again.
            log.warning("TokenReview failed, the request is denied: %s", _describe(exc))
            return _Decisions(expires=now, user=None)
        decisions = _Decisions(expires=now + self.ttl, user=user)
        self._cache[key] = decisions
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return decisions

    async def _token_review(self, token: str) -> User | None:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        answer = await self._post("/apis/authentication.k8s.io/v1/tokenreviews",
                                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            return None
        if self.audiences and not set(self.audiences) & set(status.get("audiences") or ()):
            return None
        user = status.get("user") or {}
        if not user.get("username"):
            return None
        return User(str(user["username"]), str(user.get("uid") or ""), tuple(user.get("groups") or ()),
                    {str(k): [str(v) for v in vs] for k, vs in (user.get("extra") or {}).items()})

    async def _review(self, decisions: _Decisions, wanted: set[Review]) -> None:
        """Answer the reviews ``decisions`` has no answer for yet, ``concurrency`` at a time."""
        assert decisions.user is not None
        user = decisions.user
        missing = [review for review in wanted if review not in decisions.allowed]
        answers = await asyncio.gather(*(self._access_review(user, review) for review in missing))
        for review, allowed in zip(missing, answers, strict=True):
            if allowed is not None:  # a failed review denies this request only
                decisions.allowed[review] = allowed

    async def _access_review(self, user: User, review: Review) -> bool | None:
        attributes = {"verb": review.verb, "group": GROUP, "version": VERSION, "resource": review.resource}
        if review.namespace:
            attributes["namespace"] = review.namespace
        if review.name:
            attributes["name"] = review.name
        spec: dict[str, Any] = {"user": user.username, "groups": list(user.groups), "resourceAttributes": attributes}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        try:
            async with self._semaphore:
                answer = await self._post("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                          {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                           "spec": spec})
        except (aiohttp.ClientError, TimeoutError, KubeApiError) as exc:
            log.warning("SubjectAccessReview (%s %s %s/%s) failed, denied: %s", user.username, review.verb,
                        review.namespace or "*", review.name or "*", _describe(exc))
            return None
        return bool((answer.get("status") or {}).get("allowed"))

    # -- HTTP ------------------------------------------------------------------------------------
    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.connection.ssl_context, limit=self.concurrency + 2),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
            )
        headers = {"Accept": "application/json"}
        credential = self.connection.credential()
        if credential:
            headers["Authorization"] = credential
        async with self._session.post(self.connection.host + path, json=body, headers=headers) as response:
            if response.status >= 300:
                # The API server's Status message (e.g. "... is forbidden"), never the request body.
                text = (await response.text())[:500]
                raise KubeApiError(response.status, _status_message(text))
            answer: dict[str, Any] = await response.json()
            return answer


class KubeApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _status_message(text: str) -> str:
    try:
        return str(json.loads(text).get("message") or text)
    except (ValueError, AttributeError):
        return text


def _describe(exc: BaseException) -> str:
    # ClientResponseError and friends name the URL and status, never headers or the body sent.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
