"""Signing secrets encrypted at rest: envelope encryption with AES-GCM and a key ring from a file.

Postgres never holds a key. ``HOOKLINE_SECRET_KEYS_FILE`` names a file with one key-encryption key
(KEK) per line, each the standard or URL-safe base64 of 32 random bytes; blank lines and lines
starting with ``#`` are ignored. The first key seals every new value; every key opens. Rotation:
add a new key as the first line, roll it out, run ``hookline secrets rotate-key``, remove the old key.

A sealed value is one text, ``hl1:<kek id>:<wrapped data key>:<ciphertext>`` (URL-safe base64, each
part's 12-byte nonce first). Each value has its own random 256-bit data key (DEK) that encrypts it;
the KEK wraps the DEK. Both carry the value's context (table, column, row) as associated data, so a
ciphertext copied into another row or column does not open. Rotation re-wraps only the DEK. The KEK
id is the start of a SHA-256 of the key: it says which key wrapped a value, and nothing of the key.

A value without the ``hl1:`` prefix is plaintext from before encryption at rest; it is read as it is
until ``hookline migrate`` (with a key ring) seals it in place. Writing always needs a key ring.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hookline.core.config import ConfigError
from hookline.core.settings import KEYS_FILE, keys_file

KEYS_FILE_ENV = KEYS_FILE
PREFIX = "hl1"
KEY_BYTES = 32
_NONCE_BYTES = 12


class SecretKeyError(ConfigError):
    """No usable key ring: unset, unreadable or malformed. Never carries key material."""


class SealedValueError(Exception):
    """A sealed value that does not open: its key is not in the ring, or it was altered or moved."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"hookline secret key id\0" + key).hexdigest()[:16]


@dataclass(frozen=True)
class KeyRing:
    """The key-encryption keys, the sealing one first; ``repr`` shows only their ids."""

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise SecretKeyError("a key ring needs at least one key")

    @classmethod
    def from_keys(cls, keys: Iterable[bytes]) -> KeyRing:
        return cls(tuple((key_id(k), k) for k in keys))

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for i, _ in self.keys)

    @property
    def sealing_id(self) -> str:
        return self.keys[0][0]

    def seal(self, plaintext: str, context: str) -> str:
        """``plaintext`` encrypted under a new data key, wrapped by the first key, bound to ``context``."""
        data_key = AESGCM.generate_key(bit_length=256)
        return self._envelope(self.keys[0], data_key, _encrypt(data_key, plaintext.encode(), _value_aad(context)),
                              context)

    def open(self, value: str, context: str) -> str:
        """The plaintext of a sealed ``value`` (a value from before sealing is returned as it is)."""
        if not is_sealed(value):
            return value
        _, data_key, ciphertext = self._unwrap(value, context)
        try:
            return AESGCM(data_key).decrypt(ciphertext[:_NONCE_BYTES], ciphertext[_NONCE_BYTES:],
                                            _value_aad(context)).decode()
        except InvalidTag:
            raise SealedValueError(f"the sealed {context} does not open: altered, or copied from another row"
                                   ) from None

    def needs_sealing(self, value: str) -> bool:
        """Plaintext, or sealed with a key other than the first: ``reseal`` would change it."""
        return not is_sealed(value) or value.split(":", 2)[1] != self.sealing_id

    def reseal(self, value: str, context: str) -> str:
        """``value`` wrapped by the first key: plaintext is sealed; a sealed value keeps its data key
        and ciphertext (checked first: a value that does not open is refused, never re-wrapped)."""
        if not is_sealed(value):
            return self.seal(value, context)
        if not self.needs_sealing(value):
            return value
        self.open(value, context)
        _, data_key, ciphertext = self._unwrap(value, context)
        return self._envelope(self.keys[0], data_key, ciphertext, context)

    def _envelope(self, kek: tuple[str, bytes], data_key: bytes, ciphertext: bytes, context: str) -> str:
        wrapped = _encrypt(kek[1], data_key, _wrap_aad(kek[0], context))
        return f"{PREFIX}:{kek[0]}:{_b64(wrapped)}:{_b64(ciphertext)}"

    def _unwrap(self, value: str, context: str) -> tuple[str, bytes, bytes]:
        parts = value.split(":")
        if len(parts) != 4:
            raise SealedValueError(f"the sealed {context} is malformed")
        _, kek_id, wrapped_text, ciphertext_text = parts
        kek = dict(self.keys).get(kek_id)
        if kek is None:
            raise SealedValueError(f"the sealed {context} was wrapped by key id {kek_id}, which is not in "
                                   f"{KEYS_FILE_ENV} (key ids there: {', '.join(self.ids)})")
        try:
            wrapped, ciphertext = _unb64(wrapped_text), _unb64(ciphertext_text)
            data_key = AESGCM(kek).decrypt(wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:],
                                           _wrap_aad(kek_id, context))
        except (ValueError, InvalidTag):
            raise SealedValueError(f"the sealed {context} does not open: altered, or copied from another row"
                                   ) from None
        return kek_id, data_key, ciphertext


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX + ":")


def _encrypt(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def _value_aad(context: str) -> bytes:
    return f"hookline value\0{context}".encode()


def _wrap_aad(kek_id: str, context: str) -> bytes:
    return f"hookline data key\0{kek_id}\0{context}".encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- where a value lives: its associated data ----------------------------------------------------


def provider_secrets_context(provider: str) -> str:
    return f"hookline.providers.secrets[{provider}]"


def destination_secret_context(provider: str) -> str:
    return f"hookline.providers.destination_secret[{provider}]"


def endpoint_secrets_context(endpoint: str) -> str:
    return f"hookline.endpoints.secrets[{endpoint}]"


def endpoint_egress_context(endpoint: str, field: str) -> str:
    """A secret of the endpoint's egress (``field``: proxy.credentials, tls.key, oauth2.clientSecret)."""
    return f"hookline.endpoints.egress[{endpoint}].{field}"


# The secret values of an endpoint's stored egress (relay/egress.py): section, then key.
EGRESS_SECRET_FIELDS = (("proxy", "credentials"), ("tls", "key"), ("oauth2", "clientSecret"))


def map_egress_secrets(stored: Mapping[str, Any], change: Callable[[str, str], str]) -> dict[str, Any]:
    """``stored`` (an endpoint's egress) with each secret value replaced by ``change(value, field)``
    (``field`` e.g. ``tls.key``, as ``endpoint_egress_context`` takes it): sealing, opening and
    re-wrapping walk the same fields."""
    result = {k: dict(v) if isinstance(v, dict) else v for k, v in stored.items()}
    for section, name in EGRESS_SECRET_FIELDS:
        part = result.get(section)
        if isinstance(part, dict) and part.get(name) is not None:
            part[name] = change(str(part[name]), f"{section}.{name}")
    return result


# -- secrets lists ([{"value", "notAfter"}]): only the values are sealed -------------------------


def seal_entries(ring: KeyRing, entries: Iterable[Mapping[str, Any]], context: str,
                 stored: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """``entries`` with each value sealed. A value already in ``stored`` (sealed as it is stored now)
    keeps its stored ciphertext, so rewriting an unchanged list changes nothing in the row."""
    kept: dict[str, str] = {}
    for entry in stored:
        sealed = str(entry["value"])
        if not is_sealed(sealed):
            continue  # plaintext from before sealing is never kept as it is
        try:
            kept.setdefault(ring.open(sealed, context), sealed)
        except SealedValueError:
            continue  # not reusable; the new list is sealed afresh
    return [{**entry, "value": kept.get(str(entry["value"])) or ring.seal(str(entry["value"]), context)}
            for entry in entries]


def open_entries(ring: KeyRing | None, entries: Iterable[Mapping[str, Any]], context: str) -> list[dict[str, Any]]:
    """``entries`` with each value opened; a sealed value without a key ring is a SecretKeyError."""
    return [{**entry, "value": open_value(ring, str(entry["value"]), context)} for entry in entries]


def open_value(ring: KeyRing | None, value: str, context: str) -> str:
    if ring is None and is_sealed(value):
        raise SecretKeyError(f"the {context} is encrypted at rest and {KEYS_FILE_ENV} is not set: "
                             "point it at the key file")
    return ring.open(value, context) if ring is not None else value


# -- the key file ---------------------------------------------------------------------------------


def parse_keys_file(text: str, source: str) -> KeyRing:
    """The ring of a key file; a bad line is named by its number only, never shown."""
    keys: list[bytes] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key = base64.b64decode(line.replace("-", "+").replace("_", "/") + "=" * (-len(line) % 4), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise SecretKeyError(f"{KEYS_FILE_ENV}={source}: line {number} is not a key (each line must be the "
                                 f"base64 of {KEY_BYTES} random bytes, e.g. from `openssl rand -base64 32`)")
        if key in keys:
            raise SecretKeyError(f"{KEYS_FILE_ENV}={source}: line {number} repeats an earlier key")
        keys.append(key)
    if not keys:
        raise SecretKeyError(f"{KEYS_FILE_ENV}={source}: the file holds no key")
    return KeyRing.from_keys(keys)


def load_keys_file(path: str | Path) -> KeyRing:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SecretKeyError(f"{KEYS_FILE_ENV}={path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SecretKeyError(f"{KEYS_FILE_ENV}={path}: not a text file of base64 keys") from None
    return parse_keys_file(text, str(path))


_cache: dict[str, tuple[tuple[float, int], KeyRing]] = {}


def configured_ring() -> KeyRing | None:
    """The ring of ``HOOKLINE_SECRET_KEYS_FILE``, re-read when the file changes (a mounted Secret
    updated for a rotation is picked up without a restart); None when the variable is unset."""
    configured = keys_file()
    if configured is None:
        return None
    path = str(configured)
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise SecretKeyError(f"{KEYS_FILE_ENV}={path}: cannot read it: {exc.strerror}") from None
    version = (stat.st_mtime, stat.st_size)
    cached = _cache.get(path)
    if cached is None or cached[0] != version:
        cached = (version, load_keys_file(path))
        _cache[path] = cached
    return cached[1]


def required_ring(purpose: str) -> KeyRing:
    """The configured ring, or a SecretKeyError saying what needs it: writing a secret fails closed."""
    ring = configured_ring()
    if ring is None:
        raise SecretKeyError(f"{purpose} needs the key that encrypts secrets at rest: set {KEYS_FILE_ENV} to a file "
                             "with one base64 32-byte key per line (e.g. `openssl rand -base64 32 > keys`)")
    return ring


def new_key_line() -> str:
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def write_new_keys_file(path: Path) -> None:
    """A key file with one new key, readable by its owner only (created so, never widened after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# Hookline: keys that encrypt signing secrets at rest; the first encrypts, all decrypt.\n")
        f.write(new_key_line() + "\n")
