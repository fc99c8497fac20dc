"""What may be stored: the checks every event passes before it joins a group-commit batch.

A value that Postgres would refuse must be refused (or escaped) here, per request: in a
batch it would fail the statement for every other sender's event too. Postgres text and
jsonb cannot hold NUL, nor lone surrogates (which is how aiohttp hands over header bytes
that are not UTF-8), and the unique index on (provider, event_id) holds at most ~2.7 kB
per entry.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from hookline.core.jsonpointer import resolve
from hookline.core.providers import FieldRule

# Standard Webhooks allows ids of up to 256 characters; no sender we know of uses more.
# 256 characters are at most 1 kB of UTF-8, well inside the index entry limit.
MAX_EVENT_ID_LENGTH = 256
# Event types and entity keys are routing data, not payload; entity keys are indexed too.
MAX_FIELD_LENGTH = 1024


class BadEvent(Exception):
    """The request is authentic but its event cannot be stored; ``code`` is the JSON error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _has_control_or_unencodable(text: str) -> bool:
    # Cc: C0/C1 controls (NUL, CR, LF, DEL...); Cs: lone surrogates (bytes that were not UTF-8).
    if text.isascii():  # nearly every id: no surrogates, and the only controls are the unprintable ones
        return not text.isprintable()
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in text)


def check_event_id(event_id: str) -> str:
    """The id itself, or ``invalid_event_id``: it is a header value downstream and a unique-index key."""
    if len(event_id) > MAX_EVENT_ID_LENGTH:
        raise BadEvent("invalid_event_id", f"the event id is longer than {MAX_EVENT_ID_LENGTH} characters")
    if _has_control_or_unencodable(event_id):
        raise BadEvent("invalid_event_id", "the event id contains control characters or bytes that are not UTF-8")
    return event_id


def check_field(value: str, what: str) -> str:
    """An event type or entity key, or ``invalid_event`` when it cannot be stored as text."""
    if len(value) > MAX_FIELD_LENGTH:
        raise BadEvent("invalid_event", f"the {what} is longer than {MAX_FIELD_LENGTH} characters")
    if "\x00" in value or (not value.isascii() and any(unicodedata.category(c) == "Cs" for c in value)):
        raise BadEvent("invalid_event", f"the {what} contains NUL or characters that are not valid Unicode")
    return value


def escape_text(text: str) -> str:
    """``text`` made storable in jsonb: bytes that were not UTF-8 become ``\\xNN``, NUL becomes ``\\x00``.

    aiohttp decodes header bytes as UTF-8 with ``surrogateescape``, so the original bytes
    are recovered first; the escaping is for reading, not reversible.
    """
    if _plain_text(text):
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that did not come from undecodable bytes
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def storable_headers(headers: Mapping[str, str], dropped: frozenset[str]) -> dict[str, str]:
    """Headers as they are stored (jsonb): ``dropped`` names left out, the rest escaped where needed.

    A repeated header keeps its last value, as before.
    """
    kept = {k: v for k, v in headers.items() if k.lower() not in dropped}
    if _plain_text("".join(kept) + "".join(kept.values())):  # nearly always: nothing to escape
        return kept
    return {escape_text(k): escape_text(v) for k, v in headers.items() if k.lower() not in dropped}


def _plain_text(text: str) -> bool:
    return text.isascii() and "\x00" not in text


class JsonBody:
    """The body parsed as JSON at most once, and only if a rule needs it."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._parsed: Any = None
        self._done = False

    def json(self) -> Any:
        if not self._done:
            try:
                self._parsed = json.loads(self.raw)
            except RecursionError:
                raise BadEvent("invalid_json", "the body is nested too deeply to parse") from None
            except ValueError:  # includes UnicodeDecodeError and over-long integers
                raise BadEvent("invalid_json", "the body is not valid JSON") from None
            self._done = True
        return self._parsed


def extract(rule: FieldRule, headers: Mapping[str, str], body: JsonBody) -> str | None:
    """The rule's value as text, or None when it is absent, empty or not a scalar."""
    value = headers.get(rule.path) if rule.source == "header" else resolve(body.json(), rule.path)
    if value is None or isinstance(value, (dict, list, bool)):
        return None
    try:
        text = str(value)
    except ValueError:  # an integer too long to print (Python's int_max_str_digits)
        return None
    return text or None
