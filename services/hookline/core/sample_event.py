"""A fresh, signed test event for a provider, as its sender would send it: the curl ``hookline dev``
prints and the request ``hookline send-test`` sends.

The event carries its id and type wherever the provider's rules read them (a header or a JSON
pointer), so the stored event has the id the body shows and ``hookline events show`` finds it.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hookline.core.provider_spec import Provider
from hookline.core.signatures import get_scheme

SAMPLE_TYPE = "example.created"


@dataclass(frozen=True)
class SampleRequest:
    provider: str
    headers: dict[str, str]
    body: bytes

    def url(self, receiver_url: str) -> str:
        return f"{receiver_url.rstrip('/')}/webhooks/{self.provider}"

    def curl(self, receiver_url: str) -> str:
        parts = ["curl", "-sS", "-X", "POST", self.url(receiver_url)]
        for key, value in self.headers.items():
            parts += ["-H", f"{key}: {value}"]
        parts += ["--data-raw", self.body.decode("utf-8", errors="replace")]
        return " ".join(shlex.quote(p) for p in parts)


def sample_request(provider: Provider, body: bytes | None = None, now: int | None = None) -> SampleRequest:
    """A request signed now with the provider's first secret. ``body`` defaults to a small JSON
    event with a new id; a given body is sent as it is (a header-borne id is still new).
    ValueError when the provider has no secret to sign with."""
    event_id = f"evt_{uuid.uuid4().hex[:16]}"
    if body is None:
        document: dict[str, Any] = {"id": event_id, "type": SAMPLE_TYPE, "data": {"hello": "world"}}
        for rule, value in ((provider.event_id, event_id), (provider.event_type, SAMPLE_TYPE)):
            if rule is not None and rule.source == "json":
                _put(document, rule.path, value)
        body = json.dumps(document, separators=(",", ":")).encode()
    headers = {"content-type": "application/json"}
    headers.update(get_scheme(provider.signature.scheme).sign(
        provider.signature, body, msg_id=event_id, timestamp=int(time.time()) if now is None else now))
    sent = {name.lower() for name in headers}
    for rule, value in ((provider.event_id, event_id), (provider.event_type, SAMPLE_TYPE)):
        if rule is not None and rule.source == "header" and rule.path.lower() not in sent:
            headers[rule.path] = value  # e.g. X-GitHub-Event, which GitHub's signature does not cover
    return SampleRequest(provider.name, headers, body)


def _put(document: dict[str, Any], pointer: str, value: str) -> None:
    """Set ``value`` at an RFC 6901 pointer of objects, making the objects on the way."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    node = document
    for token in tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            child = node[token] = {}
        node = child
    if tokens:
        node[tokens[-1]] = value
