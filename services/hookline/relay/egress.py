"""Egress per endpoint: its own CONNECT proxy (or none), a client certificate and a CA bundle, and
OAuth2 client credentials (RFC 6749 section 4.4).

The configuration is values, not file paths (the WebhookEndpoint operator passes what it read from
Kubernetes Secrets): frozen dataclasses, validated when they are made. It is stored in
``hookline.endpoints.egress`` (migration 0032) with the non-secret fields in clear and each secret
(proxy credentials, the private key, the client secret) sealed (core/secrets_at_rest.py).

In the relay (``EgressClients``) an endpoint with its own egress gets its own ``WebhookClient``
per configuration: its SSL context is made once, not per request, and its kept-alive connections
(which carry its client certificate) are never lent to another endpoint. The private-address guard
applies to every target as without a proxy.

OAuth2: the token request goes out with the endpoint's whole egress (the same client: guard, proxy,
CA bundle and client certificate), as a form POST with ``client_secret_basic`` (RFC 6749 section
2.3.1). A token is kept until 90% of its ``expires_in`` has passed (at most a minute before it
expires; 300 s when the server gives no ``expires_in``); one fetch at a time per endpoint, concurrent
deliveries wait for it and share its outcome. A 401 from the endpoint drops that token, and the
delivery is sent once more with a new one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import re
import ssl
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from hookline.core import secrets_at_rest as sealing
from hookline.core.delivery import DeliveryErrorKind, DeliveryResult
from hookline.core.http_client import EgressProxy, WebhookClient

log = logging.getLogger(__name__)


class EgressError(ValueError):
    """An egress configuration that cannot be used; the message says why and shows no secret."""


def _clean(value: str, what: str) -> str:
    if not value or any(c in value for c in "\r\n\0"):
        raise EgressError(f"{what} must be a non-empty single line")
    return value


@dataclass(frozen=True)
class ProxyConfig:
    """An HTTP CONNECT proxy for this endpoint instead of the install's (``http://host:port``; TLS to
    the target runs inside the tunnel), with ``credentials`` (``user:password``) and hosts that go direct."""

    url: str
    credentials: str | None = field(default=None, repr=False)
    no_proxy: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            self.egress_proxy()
        except ValueError as exc:  # its messages name no secret
            raise EgressError(str(exc).replace("the egress proxy", "the endpoint's proxy")) from None

    def egress_proxy(self) -> EgressProxy:
        return EgressProxy.parse(self.url, credentials=self.credentials, no_proxy=",".join(self.no_proxy))


def _certificates(pem: str, what: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        certificates = []
    if not certificates:
        raise EgressError(f"{what} is not a PEM certificate (-----BEGIN CERTIFICATE-----)")
    return certificates


def _public_der(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


@dataclass(frozen=True)
class ClientTls:
    """TLS with this endpoint: a client certificate (PEM: the certificate, then its intermediates)
    with its private key (PEM, unencrypted), and/or a CA bundle (PEM) that verifies the endpoint
    instead of the system's trust store."""

    certificate: str | None = None
    key: str | None = field(default=None, repr=False)
    ca: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate is None) != (self.key is None):
            raise EgressError("give the client certificate and its private key together")
        if self.certificate is None and self.ca is None:
            raise EgressError("client TLS needs a client certificate with its key, or a CA bundle")
        if self.certificate is not None and self.key is not None:
            leaf = _certificates(self.certificate, "the client certificate")[0]
            try:
                key = serialization.load_pem_private_key(self.key.encode(), password=None)
            except TypeError:
                raise EgressError("the client private key is encrypted: give it unencrypted "
                                  "(it is sealed at rest)") from None
            except (ValueError, UnsupportedAlgorithm):
                raise EgressError("the client private key is not a PEM private key "
                                  "(-----BEGIN PRIVATE KEY-----)") from None
            if _public_der(key.public_key()) != _public_der(leaf.public_key()):
                raise EgressError("the private key does not belong to the client certificate "
                                  "(the first certificate of the chain)")
        if self.ca is not None:
            _certificates(self.ca, "the CA bundle")

    @property
    def subject(self) -> str | None:
        """The client certificate's subject, for listings."""
        if self.certificate is None:
            return None
        return _certificates(self.certificate, "the client certificate")[0].subject.rfc4514_string()

    def ssl_context(self) -> ssl.SSLContext:
        """The context the endpoint's connections use (made once per configuration: ~ms of CPU)."""
        try:
            context = ssl.create_default_context(cadata=self.ca) if self.ca else ssl.create_default_context()
            if self.certificate is not None and self.key is not None:
                # ssl reads a certificate chain from files only: memory-backed ones, gone when closed.
                with _memory_file(self.certificate) as cert, _memory_file(self.key) as key:
                    context.load_cert_chain(cert, key)
        except OSError as exc:  # ssl.SSLError among them; never the key's text
            reason = getattr(exc, "reason", None) or exc.strerror or exc
            raise EgressError(f"TLS refuses this client certificate, key or CA bundle: {reason}") from None
        return context


@contextlib.contextmanager
def _memory_file(text: str) -> Iterator[str]:
    """A path that reads ``text``: a memfd on Linux (never on disk), else a private temporary file."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("hookline-pem", os.MFD_CLOEXEC)
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(text.encode())
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="hookline-pem-") as directory:  # 0700
        path = Path(directory) / "pem"
        path.touch(mode=0o600)
        path.write_text(text)
        yield str(path)


_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 section 3.3 scope-token


@dataclass(frozen=True)
class OAuth2ClientCredentials:
    """The client credentials grant: a token from ``token_url`` for ``client_id`` (authenticated with
    ``client_secret`` by HTTP Basic), for ``scopes`` and ``audience`` when given."""

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scopes: tuple[str, ...] = ()
    audience: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.token_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressError("the OAuth2 token URL must be an absolute http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise EgressError("the OAuth2 token URL must not hold credentials: give the client id and secret")
        if parts.fragment:
            raise EgressError("the OAuth2 token URL must not have a #fragment")
        _clean(self.client_id, "the OAuth2 client id")
        _clean(self.client_secret, "the OAuth2 client secret")
        for scope in self.scopes:
            if not _SCOPE.fullmatch(scope):
                raise EgressError(f"the OAuth2 scope {scope[:40]!r} is not one scope token (no spaces or quotes)")
        if self.audience is not None:
            _clean(self.audience, "the OAuth2 audience")


@dataclass(frozen=True)
class EgressConfig:
    """An endpoint's own egress: ``proxy`` instead of the install's, or ``direct`` (no proxy although
    the install has one); ``tls``; ``oauth2``. Clear it with None rather than an empty one."""

    proxy: ProxyConfig | None = None
    direct: bool = False
    tls: ClientTls | None = None
    oauth2: OAuth2ClientCredentials | None = None

    def __post_init__(self) -> None:
        if self.proxy is not None and self.direct:
            raise EgressError("give a proxy or direct, not both")
        if self.proxy is None and not self.direct and self.tls is None and self.oauth2 is None:
            raise EgressError("an egress configuration needs a proxy, direct, client TLS or OAuth2 "
                              "(clear it instead to use the install's egress)")

    def describe(self) -> str:
        """One line for listings: what is configured, no secret."""
        parts = []
        if self.direct:
            parts.append("direct")
        elif self.proxy is not None:
            p = self.proxy.egress_proxy()
            parts.append(f"proxy {p.host}:{p.port}" + (" (credentials)" if p.authorization else ""))
        if self.tls is not None:
            if self.tls.subject is not None:
                parts.append(f"client cert {self.tls.subject}")
            if self.tls.ca is not None:
                parts.append("own CA")
        if self.oauth2 is not None:
            parts.append(f"oauth2 {self.oauth2.client_id}@{urlsplit(self.oauth2.token_url).hostname}")
        return ", ".join(parts)


# -- stored form: {"proxy": {...} | "none", "tls": {...}, "oauth2": {...}}, secrets sealed ---------------

def to_stored(config: EgressConfig) -> dict[str, Any]:
    """The stored form, secrets still open (``seal`` them before it is written)."""
    stored: dict[str, Any] = {}
    if config.direct:
        stored["proxy"] = "none"
    elif config.proxy is not None:
        stored["proxy"] = {"url": config.proxy.url, "credentials": config.proxy.credentials,
                           "noProxy": list(config.proxy.no_proxy)}
    if config.tls is not None:
        stored["tls"] = {"certificate": config.tls.certificate, "key": config.tls.key, "ca": config.tls.ca}
    if config.oauth2 is not None:
        o = config.oauth2
        stored["oauth2"] = {"tokenUrl": o.token_url, "clientId": o.client_id, "clientSecret": o.client_secret,
                            "scopes": list(o.scopes), "audience": o.audience}
    return stored


def from_stored(stored: Mapping[str, Any]) -> EgressConfig:
    """The configuration of a stored form whose secrets are open."""
    proxy, tls, oauth2 = stored.get("proxy"), stored.get("tls"), stored.get("oauth2")
    return EgressConfig(
        proxy=ProxyConfig(proxy["url"], proxy.get("credentials"), tuple(proxy.get("noProxy") or ()))
        if isinstance(proxy, dict) else None,
        direct=proxy == "none",
        tls=ClientTls(tls.get("certificate"), tls.get("key"), tls.get("ca")) if tls else None,
        oauth2=OAuth2ClientCredentials(oauth2["tokenUrl"], oauth2["clientId"], oauth2["clientSecret"],
                                       tuple(oauth2.get("scopes") or ()), oauth2.get("audience"))
        if oauth2 else None,
    )


def seal(name: str, config: EgressConfig, ring: sealing.KeyRing | None,
         stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The stored form with each secret sealed for endpoint ``name``. A secret equal to the one in
    ``stored`` keeps its ciphertext, so storing an unchanged configuration changes nothing in the row
    (the operator re-applies its resources)."""
    kept: dict[str, tuple[str, str]] = {}  # field -> (opened, as sealed now)
    if stored and ring is not None:
        def remember(value: str, path: str) -> str:
            if sealing.is_sealed(value):
                with contextlib.suppress(sealing.SealedValueError):
                    kept[path] = (ring.open(value, sealing.endpoint_egress_context(name, path)), value)
            return value
        sealing.map_egress_secrets(stored, remember)

    def sealed(value: str, path: str) -> str:
        old = kept.get(path)
        if old is not None and old[0] == value:
            return old[1]
        if ring is None:
            raise sealing.SecretKeyError("storing an endpoint's egress secrets needs the key that encrypts "
                                         f"secrets at rest: set {sealing.KEYS_FILE_ENV}")
        return ring.seal(value, sealing.endpoint_egress_context(name, path))

    return sealing.map_egress_secrets(to_stored(config), sealed)


def opened(name: str, stored: Mapping[str, Any], ring: sealing.KeyRing | None) -> EgressConfig:
    """The stored configuration of endpoint ``name``, secrets opened (SealedValueError, SecretKeyError)."""
    return from_stored(sealing.map_egress_secrets(stored, lambda value, path: sealing.open_value(
        ring, value, sealing.endpoint_egress_context(name, path))))


_opened: dict[tuple[str, str], EgressConfig] = {}  # (endpoint, stored text) -> opened once


def load(name: str, stored: object) -> EgressConfig | None:
    """The column's value (jsonb, or its text) opened; each stored version opened and validated once."""
    if stored is None:
        return None
    value = json.loads(stored) if isinstance(stored, str) else stored
    assert isinstance(value, dict)
    text = json.dumps(value, sort_keys=True)
    config = _opened.get((name, text))
    if config is None:
        try:
            config = opened(name, value, sealing.configured_ring())
        except (KeyError, TypeError, AttributeError) as exc:  # written by set_egress only, or by hand
            raise EgressError(f"the stored egress of {name!r} is malformed ({type(exc).__name__}: {exc})") from None
        if len(_opened) > 10_000:
            _opened.clear()
        _opened[(name, text)] = config
    return config


# -- in the relay ---------------------------------------------------------------------------------------

DEFAULT_TOKEN_SECONDS = 300.0  # a token without expires_in
MAX_TOKEN_BYTES = 65536  # the token endpoint's answer
_ERROR_CODE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it goes into a header


class TokenError(Exception):
    """No token: the token endpoint refused or was not reached. Never holds the secret or a token."""


class TokenSource:
    """One endpoint's OAuth2 token in one relay: kept until shortly before it expires, fetched once at
    a time (concurrent callers await the same fetch, and share its failure)."""

    def __init__(self, endpoint: str, credentials: OAuth2ClientCredentials, client: WebhookClient) -> None:
        self._endpoint, self._credentials, self._client = endpoint, credentials, client
        self._token: str | None = None
        self._refresh_at = 0.0
        self._fetch: asyncio.Task[str] | None = None

    async def token(self, timeout: float) -> str:
        if self._token is not None and time.monotonic() < self._refresh_at:
            return self._token
        if self._fetch is None:
            self._fetch = asyncio.ensure_future(self._request(timeout))
            self._fetch.add_done_callback(self._fetched)
        return await asyncio.shield(self._fetch)

    def _fetched(self, task: asyncio.Task[str]) -> None:
        if self._fetch is task:
            self._fetch = None
        if not task.cancelled():
            task.exception()  # retrieved: every waiter sees it; a fetch nobody awaits any more is not an error

    def close(self) -> None:
        """Stop a fetch under way (its waiters get CancelledError)."""
        if self._fetch is not None:
            self._fetch.cancel()

    def refused(self, token: str) -> None:
        """The endpoint answered 401 to ``token``: the next caller fetches a new one (once, however
        many deliveries saw the same refusal)."""
        if self._token == token:
            self._token = None

    async def _request(self, timeout: float) -> str:
        try:
            token, lifetime = await self._fetch_token(timeout)
        except TokenError as exc:
            log.warning("no OAuth2 token for the endpoint", extra={"endpoint": self._endpoint, "error": str(exc)})
            raise
        log.info("OAuth2 token fetched", extra={"endpoint": self._endpoint, "expires_in": lifetime})
        return token

    async def _fetch_token(self, timeout: float) -> tuple[str, float]:
        c = self._credentials
        form = {"grant_type": "client_credentials"}
        if c.scopes:
            form["scope"] = " ".join(c.scopes)
        if c.audience is not None:
            form["audience"] = c.audience
        # RFC 6749 section 2.3.1: each form-encoded before they are joined.
        basic = base64.b64encode(f"{quote_plus(c.client_id)}:{quote_plus(c.client_secret)}".encode()).decode()
        headers = {"authorization": f"Basic {basic}", "content-type": "application/x-www-form-urlencoded",
                   "accept": "application/json"}
        started = time.monotonic()
        result = await self._client.post(c.token_url, urlencode(form).encode(), headers, timeout=timeout,
                                         max_response_bytes=MAX_TOKEN_BYTES)
        where = f"the OAuth2 token endpoint {_without_query(c.token_url)}"
        if result.status is None:
            raise TokenError(f"{where} was not reached: {result.error}")
        answer = _json_object(result.body)
        if not result.ok:
            code = answer.get("error")
            said = f" ({code})" if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else ""
            what = f"refused the client credentials of {c.client_id!r}" if result.status in (400, 401, 403) \
                else "failed"
            raise TokenError(f"{where} {what}: HTTP {result.status}{said}")
        token, kind, expires = answer.get("access_token"), answer.get("token_type", "Bearer"), answer.get("expires_in")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise TokenError(f"{where} answered without a usable access_token")
        if not isinstance(kind, str) or kind.lower() != "bearer":
            raise TokenError(f"{where} gave a token of type {str(kind)[:20]!r}, not Bearer")
        try:
            lifetime = DEFAULT_TOKEN_SECONDS if expires is None else float(expires)
        except (TypeError, ValueError):
            lifetime = DEFAULT_TOKEN_SECONDS
        lifetime = max(lifetime, 0.0) if math.isfinite(lifetime) else DEFAULT_TOKEN_SECONDS
        self._token, self._refresh_at = token, started + lifetime - min(60.0, lifetime * 0.1)
        return token, lifetime


def _without_query(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _json_object(body: str) -> dict[str, Any]:
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class _Route:
    config: EgressConfig
    client: WebhookClient
    tokens: TokenSource | None


class EgressClients:
    """The relay's clients for endpoints with their own egress, one per endpoint and configuration
    (an endpoint without one uses the relay's shared ``default``)."""

    def __init__(self, default: WebhookClient, *, install_proxy: EgressProxy | None, connections: int) -> None:
        self.default = default
        self._install_proxy, self._connections = install_proxy, connections
        self._routes: dict[str, _Route] = {}
        self._retired: list[WebhookClient] = []

    def route(self, name: str, config: EgressConfig) -> _Route:
        route = self._routes.get(name)
        if route is not None and (route.config is config or route.config == config):
            return route
        if route is not None:
            if route.tokens is not None:
                route.tokens.close()
            self._retired.append(route.client)
        proxy = None if config.direct else config.proxy.egress_proxy() if config.proxy else self._install_proxy
        client = WebhookClient(allow_private_networks=self.default.allow_private_networks,
                               connections=self._connections, proxy=proxy,
                               ssl_context=config.tls.ssl_context() if config.tls else None)
        route = self._routes[name] = _Route(config, client,
                                            TokenSource(name, config.oauth2, client) if config.oauth2 else None)
        return route

    async def post(self, name: str, config: EgressConfig, url: str, body: bytes, headers: dict[str, str],
                   timeout: float) -> DeliveryResult:
        """POST with the endpoint's egress; with OAuth2, a bearer token, and once more after a 401."""
        try:
            route = self.route(name, config)
        except EgressError as exc:  # validated when stored; a relay's OpenSSL may still refuse it
            return DeliveryResult(None, "", 0.0, error=str(exc), error_kind=DeliveryErrorKind.TLS)
        if route.tokens is None:
            return await route.client.post(url, body, headers, timeout=timeout)
        result, token = await self._with_token(route, route.tokens, url, body, headers, timeout)
        if result.status == 401 and token is not None:  # refused: a new token, and this delivery once more
            route.tokens.refused(token)
            result, _ = await self._with_token(route, route.tokens, url, body, headers, timeout)
        return result

    @staticmethod
    async def _with_token(route: _Route, tokens: TokenSource, url: str, body: bytes, headers: dict[str, str],
                          timeout: float) -> tuple[DeliveryResult, str | None]:
        """The POST with a bearer token, and that token (None: there was none to send)."""
        started = time.perf_counter()
        try:
            token = await tokens.token(timeout)
        except TokenError as exc:
            return DeliveryResult(None, "", time.perf_counter() - started, error=str(exc),
                                  error_kind=DeliveryErrorKind.OAUTH2), None
        return await route.client.post(url, body, {**headers, "authorization": f"Bearer {token}"},
                                       timeout=timeout), token

    async def retain(self, configs: Mapping[str, EgressConfig | None]) -> None:
        """Drop the clients of endpoints deleted or changed (their next delivery makes a new one)."""
        for name in [n for n, r in self._routes.items() if configs.get(n) != r.config]:
            route = self._routes.pop(name)
            if route.tokens is not None:
                route.tokens.close()
            self._retired.append(route.client)
        retired, self._retired = self._retired, []
        for client in retired:
            await client.close()

    async def close(self) -> None:
        await self.retain({})
