"""Webhook signature schemes: verify what senders send, and sign the way they sign.

One module, because the receiver (verify), the relay and worker destinations (sign, Standard
Webhooks), ``hookline dev`` (a signed curl example) and the operator (generate_secret) must agree
byte for byte with real senders. Each scheme follows its sender's published rules and, where one
exists, the official library (``standardwebhooks``, ``stripe``); the tests check both directions.

Rules shared by every scheme:

* the body is hashed exactly as the sender signed it: the bytes received, after the receiver has
  undone any Content-Encoding (gzip, deflate: every scheme's sender signs before compressing);
  it is never parsed and re-encoded;
* every configured secret is tried (rotation): a match on any one of them passes;
* digests are compared with :func:`hmac.compare_digest`;
* timestamped schemes check the signature first and the timestamp second, so ``stale_timestamp``
  only ever describes an authentic-but-old (or future) request - a replay or a clock problem -
  and a forgery always gets ``invalid_signature``;
* error messages name headers and describe the problem, but never contain a secret or an
  expected signature (they are returned to the caller and logged).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
import string
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Final

__all__ = [
    "INVALID_SIGNATURE",
    "SCHEMES",
    "STALE_TIMESTAMP",
    "Scheme",
    "SignatureConfig",
    "SignatureError",
    "get_scheme",
    "sign_standard_webhooks",
    "signature_headers_for",
    "validate_config",
    "verify",
]

INVALID_SIGNATURE: Final = "invalid_signature"
STALE_TIMESTAMP: Final = "stale_timestamp"
ENCODINGS: Final = ("hex", "base64")
_WHSEC: Final = "whsec_"
_DIGEST_SIZE: Final = hashlib.sha256().digest_size
# Longer timestamps are malformed, not merely stale: float(now) - int(huge) would overflow.
_MAX_TIMESTAMP_DIGITS: Final = 15


class SignatureError(Exception):
    """A request failed verification; ``code`` is the receiver's JSON ``error`` value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SignatureConfig:
    """How one provider's requests are signed. ``secrets`` are hidden from ``repr`` (logs)."""

    scheme: str
    secrets: tuple[str, ...] = field(repr=False)
    tolerance_seconds: int = 300
    header: str | None = None
    encoding: str = "hex"
    prefix: str = ""

    def __post_init__(self) -> None:
        # A bare string would be iterated as one-character secrets: refuse it loudly.
        if isinstance(self.secrets, str):
            raise TypeError("SignatureConfig.secrets must be a sequence of strings, not a string")
        if not isinstance(self.secrets, tuple):
            object.__setattr__(self, "secrets", tuple(self.secrets))


# --- small helpers ----------------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str:
    """Case-insensitive lookup that works for aiohttp's CIMultiDictProxy and plain dicts."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    if value is None or not value.strip():
        raise SignatureError(INVALID_SIGNATURE, f"missing {name} header")
    return value.strip()


def _malformed(name: str, expected: str) -> SignatureError:
    return SignatureError(INVALID_SIGNATURE, f"malformed {name} header: expected {expected}")


def _timestamp(raw: str, name: str) -> int:
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_TIMESTAMP_DIGITS):
        raise _malformed(name, "integer Unix seconds")
    return int(raw)


def _unhex(value: str) -> bytes | None:
    if len(value) != 2 * _DIGEST_SIZE or not all(c in string.hexdigits for c in value):
        return None
    return bytes.fromhex(value)


def _unb64(value: str) -> bytes | None:
    try:  # tolerate missing padding, reject anything outside the alphabet
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _wire(text: str, name: str) -> bytes:
    """The bytes a header value arrived as: aiohttp decodes header bytes with surrogateescape."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise _malformed(name, "a UTF-8 value") from None


@lru_cache(maxsize=256)
def _keyed_sha256(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 primed with ``key``; copies of it skip the key schedule (per request otherwise)."""
    return hmac.new(key, digestmod="sha256")


def _hmac(key: bytes, *parts: bytes) -> bytes:
    # Parts are fed separately so a large body is never copied into a new buffer.
    mac = _keyed_sha256(key).copy()
    for part in parts:
        mac.update(part)
    return mac.digest()


def _raw_key(secret: str) -> bytes:
    return secret.encode("utf-8")


@lru_cache(maxsize=256)
def _whsec_key(secret: str) -> bytes:
    """Standard Webhooks key: base64-decode the secret after ``whsec_``. Cached: runs per request."""
    key = _unb64(secret.removeprefix(_WHSEC))
    if not key:
        raise ValueError("standard-webhooks secret must be base64 (optionally prefixed with 'whsec_')")
    return key


def _check_tolerance(timestamp: int, now: float, tolerance: int) -> None:
    skew = now - timestamp
    if abs(skew) > tolerance:
        when = "in the past" if skew > 0 else "in the future"
        raise SignatureError(
            STALE_TIMESTAMP, f"timestamp is {abs(skew):.0f}s {when}; tolerance is {tolerance}s"
        )


@dataclass(slots=True)  # built per request: not frozen, whose __init__ is slower
class _Signed:
    """What a request claims: the HMAC input (in parts) and the signatures it presents."""

    parts: tuple[bytes, ...]
    candidates: tuple[bytes, ...]
    timestamp: int | None = None


# --- schemes ----------------------------------------------------------------------------------


class Scheme(ABC):
    """One sender's signing rules plus the defaults the receiver uses for that sender."""

    name: str
    signature_headers: frozenset[str]  # lower-case; never store these (see signature_headers_for)
    default_event_id: tuple[str, str]  # ("header", name) or ("json", RFC 6901 pointer)
    default_event_type: tuple[str, str] | None
    has_timestamp: bool = False

    @abstractmethod
    def verify(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes, now: float) -> None:
        """Return if the request is authentic and fresh, else raise :class:`SignatureError`."""

    @abstractmethod
    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        """The headers a sender would send for ``body``."""

    def generate_secret(self) -> str:
        return _random.token_hex(32)


class _HmacScheme(Scheme):
    """Template for HMAC-SHA256 schemes: subclasses only parse headers and format signatures."""

    @abstractmethod
    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed: ...

    def _key(self, secret: str) -> bytes:
        return _raw_key(secret)

    def verify(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes, now: float) -> None:
        signed = self._parse(config, headers, body)
        for secret in config.secrets:
            digest = _hmac(self._key(secret), *signed.parts)
            if any(hmac.compare_digest(digest, c) for c in signed.candidates):
                break
        else:
            raise SignatureError(INVALID_SIGNATURE, "signature does not match any configured secret")
        if signed.timestamp is not None:
            _check_tolerance(signed.timestamp, now, config.tolerance_seconds)

    @staticmethod
    def _first_key(config: SignatureConfig) -> str:
        if not config.secrets:
            raise ValueError(f"{config.scheme}: at least one secret is needed to sign")
        return config.secrets[0]


class StandardWebhooks(_HmacScheme):
    name = "standard-webhooks"
    signature_headers = frozenset({"webhook-signature"})
    default_event_id = ("header", "webhook-id")
    default_event_type = ("json", "/type")
    has_timestamp = True

    def _key(self, secret: str) -> bytes:
        return _whsec_key(secret)

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        msg_id = _header(headers, "webhook-id")
        ts = _timestamp(_header(headers, "webhook-timestamp"), "webhook-timestamp")
        raw = _header(headers, "webhook-signature")
        candidates = []
        for entry in raw.split():  # other versions (v1a, ...) are skipped, as the spec requires
            version, comma, value = entry.partition(",")
            decoded = _unb64(value) if version == "v1" and comma else None
            if decoded is not None:
                candidates.append(decoded)
        if not candidates:
            raise _malformed("webhook-signature", "space-separated 'v1,<base64>' signatures")
        return _Signed((_wire(msg_id, "webhook-id"), f".{ts}.".encode(), body), tuple(candidates), ts)

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        return sign_standard_webhooks(config.secrets, msg_id, timestamp, body)

    def generate_secret(self) -> str:
        return _WHSEC + base64.b64encode(_random.token_bytes(32)).decode("ascii")


class Stripe(_HmacScheme):
    name = "stripe"
    signature_headers = frozenset({"stripe-signature"})
    default_event_id = ("json", "/id")
    default_event_type = ("json", "/type")
    has_timestamp = True
    _ALPHABET = string.ascii_letters + string.digits

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        raw = _header(headers, "Stripe-Signature")
        ts_raw: str | None = None
        candidates = []
        for item in raw.split(","):
            key, _, value = item.strip().partition("=")
            if key == "t" and ts_raw is None:  # like stripe-python: the first t= wins
                ts_raw = value
            elif key == "v1" and (decoded := _unhex(value)) is not None:
                candidates.append(decoded)  # v0 (test-mode legacy) and unknown keys are ignored
        if ts_raw is None or not candidates:
            raise _malformed("Stripe-Signature", "'t=<timestamp>,v1=<hex>[,v1=<hex>...]'")
        ts = _timestamp(ts_raw, "Stripe-Signature")
        return _Signed((f"{ts}.".encode(), body), tuple(candidates), ts)

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        if not config.secrets:
            raise ValueError("stripe: at least one secret is needed to sign")
        prefix = f"{timestamp}.".encode()
        sigs = "".join(f",v1={_hmac(_raw_key(s), prefix, body).hex()}" for s in config.secrets)
        return {"Stripe-Signature": f"t={timestamp}{sigs}"}

    def generate_secret(self) -> str:
        # Stripe's secrets are used as raw strings, so the format only needs to look like Stripe's.
        return _WHSEC + "".join(_random.choice(self._ALPHABET) for _ in range(32))


class GitHub(_HmacScheme):
    name = "github"
    # The legacy SHA-1 header is signature-bearing too, so it must not be stored either.
    signature_headers = frozenset({"x-hub-signature-256", "x-hub-signature"})
    default_event_id = ("header", "x-github-delivery")
    default_event_type = ("header", "x-github-event")

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        raw = _header(headers, "X-Hub-Signature-256")
        algo, _, value = raw.partition("=")
        decoded = _unhex(value) if algo == "sha256" else None
        if decoded is None:
            raise _malformed("X-Hub-Signature-256", "'sha256=<hex>'")
        return _Signed((body,), (decoded,))

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        digest = _hmac(_raw_key(self._first_key(config)), body).hex()
        return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": msg_id}


class Shopify(_HmacScheme):
    name = "shopify"
    signature_headers = frozenset({"x-shopify-hmac-sha256"})
    default_event_id = ("header", "x-shopify-webhook-id")
    default_event_type = ("header", "x-shopify-topic")

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        decoded = _unb64(_header(headers, "X-Shopify-Hmac-Sha256"))
        if decoded is None:
            raise _malformed("X-Shopify-Hmac-Sha256", "base64")
        return _Signed((body,), (decoded,))

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        digest = base64.b64encode(_hmac(_raw_key(self._first_key(config)), body)).decode("ascii")
        return {"X-Shopify-Hmac-Sha256": digest, "X-Shopify-Webhook-Id": msg_id}


class Slack(_HmacScheme):
    name = "slack"
    signature_headers = frozenset({"x-slack-signature"})
    default_event_id = ("json", "/event_id")
    default_event_type = ("json", "/event/type")
    has_timestamp = True

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        ts = _timestamp(_header(headers, "X-Slack-Request-Timestamp"), "X-Slack-Request-Timestamp")
        version, _, value = _header(headers, "X-Slack-Signature").partition("=")
        decoded = _unhex(value) if version == "v0" else None
        if decoded is None:
            raise _malformed("X-Slack-Signature", "'v0=<hex>'")
        return _Signed((f"v0:{ts}:".encode(), body), (decoded,), ts)

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        digest = _hmac(_raw_key(self._first_key(config)), f"v0:{timestamp}:".encode(), body).hex()
        return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


class GenericHmac(_HmacScheme):
    """HMAC-SHA256 of the body in a configurable header, hex or base64, with an optional prefix."""

    name = "hmac-sha256"
    signature_headers = frozenset()  # the header is per provider: use signature_headers_for(config)
    default_event_id = ("json", "/id")
    default_event_type = ("json", "/type")

    @staticmethod
    def _name(config: SignatureConfig) -> str:
        if not config.header:
            raise ValueError("hmac-sha256 needs the name of the header carrying the signature")
        return config.header

    def _parse(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes) -> _Signed:
        name = self._name(config)
        raw = _header(headers, name)
        expected = f"'{config.prefix}<{config.encoding}>'"
        if not raw.startswith(config.prefix):
            raise _malformed(name, expected)
        value = raw[len(config.prefix) :]
        decoded = _unb64(value) if config.encoding == "base64" else _unhex(value)
        if decoded is None:
            raise _malformed(name, expected)
        return _Signed((body,), (decoded,))

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        digest = _hmac(_raw_key(self._first_key(config)), body)
        text = base64.b64encode(digest).decode("ascii") if config.encoding == "base64" else digest.hex()
        return {self._name(config): config.prefix + text}


class NoSignature(Scheme):
    """Accepts everything. Only reachable when a provider explicitly asks for ``none``."""

    name = "none"
    signature_headers = frozenset()
    default_event_id = ("json", "/id")
    default_event_type = ("json", "/type")

    def verify(self, config: SignatureConfig, headers: Mapping[str, str], body: bytes, now: float) -> None:
        return None

    def sign(self, config: SignatureConfig, body: bytes, *, msg_id: str, timestamp: int) -> dict[str, str]:
        return {}


SCHEMES: Mapping[str, Scheme] = MappingProxyType(
    {
        s.name: s
        for s in (StandardWebhooks(), Stripe(), GitHub(), Shopify(), Slack(), GenericHmac(), NoSignature())
    }
)


# --- module-level API -------------------------------------------------------------------------


def get_scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown signature scheme {name!r}; valid schemes: {', '.join(SCHEMES)}") from None


def verify(config: SignatureConfig, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Verify a request with the config's scheme; raises :class:`SignatureError`."""
    get_scheme(config.scheme).verify(config, headers, body, now)


def signature_headers_for(config: SignatureConfig) -> frozenset[str]:
    """Lower-case header names to drop before storing a request (adds hmac-sha256's own header)."""
    names = get_scheme(config.scheme).signature_headers
    if config.scheme == GenericHmac.name and config.header:
        names = names | {config.header.lower()}
    return names


def validate_config(config: SignatureConfig, *, secrets_loaded: bool = True) -> None:
    """Reject a config that could never verify anything, at load time rather than per request.
    ``secrets_loaded`` False: a process that never verifies (a worker) loaded none on purpose."""
    scheme = get_scheme(config.scheme)
    if any(not isinstance(s, str) or not s for s in config.secrets):
        raise ValueError(f"{scheme.name}: secrets must be non-empty strings")
    if secrets_loaded and scheme.name != NoSignature.name and not config.secrets:
        raise ValueError(f"{scheme.name}: at least one secret is required (use scheme 'none' to opt out)")
    if isinstance(config.tolerance_seconds, bool) or not isinstance(config.tolerance_seconds, int):
        raise ValueError("tolerance_seconds must be an integer")
    if config.tolerance_seconds <= 0:
        raise ValueError("tolerance_seconds must be positive")
    if config.encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, not {config.encoding!r}")
    if scheme.name == GenericHmac.name and not config.header:
        raise ValueError("hmac-sha256 needs 'header': the name of the header carrying the signature")
    if scheme.name == StandardWebhooks.name:
        for index, secret in enumerate(config.secrets):
            try:
                _whsec_key(secret)
            except ValueError:
                raise ValueError(
                    f"standard-webhooks secret #{index + 1} is not valid base64 after the 'whsec_' prefix"
                ) from None


def sign_standard_webhooks(
    secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """Standard Webhooks headers for an outgoing request, signed with every secret (rotation)."""
    if isinstance(secrets, str):
        raise TypeError("secrets must be a sequence of strings, not a string")
    if not secrets:
        raise ValueError("standard-webhooks: at least one secret is needed to sign")
    content = f"{msg_id}.{timestamp}.".encode()
    signatures = " ".join(
        "v1," + base64.b64encode(_hmac(_whsec_key(s), content, body)).decode("ascii") for s in secrets
    )
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signatures}
