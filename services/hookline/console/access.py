"""Who is asking, and what they may see: the console's authorisation, decided once per request.

An ``Authorizer`` turns a request's bearer token into an ``Access`` (or None: the token is not
valid, 401). ``TokenAuthorizer`` is the one without Kubernetes (``hookline dev``, ``--auth token``):
one generated token that may do everything. ``console/kube.py`` asks the Kubernetes API server
(TokenReview, then a SubjectAccessReview per WebhookProvider). Whatever decides, the store reads
only what the Access names (row-level security, ``store.py``), so a bug in a handler shows nothing
more.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Protocol

EVERYTHING = None  # an Access's providers: every provider, those no WebhookProvider owns included


@dataclass(frozen=True)
class Access:
    """What one request may do. ``read`` and ``replay`` are provider names (rows of hookline.providers),
    or ``EVERYTHING``; ``install_wide``: may read the install's whole outbox. ``endpoints`` and
    ``endpoint_replay``: the WebhookEndpoints (``NAMESPACE/NAME``) whose deliveries it may read and
    replay besides (their namespaces' events with them). ``subject`` says who, for the audit trail of
    replays: never a token."""

    subject: str
    read: frozenset[str] | None
    replay: frozenset[str] | None
    install_wide: bool
    endpoints: frozenset[str] = frozenset()
    endpoint_replay: frozenset[str] = frozenset()

    def may_read(self, provider: str) -> bool:
        return self.read is EVERYTHING or provider in self.read

    def may_replay(self, provider: str) -> bool:
        return self.replay is EVERYTHING or provider in self.replay

    @property
    def reads_outbox(self) -> bool:
        """Anything of the outbox at all: the whole of it, or some namespace's endpoints."""
        return self.install_wide or bool(self.endpoints)

    @property
    def replays_every_endpoint(self) -> bool:
        return self.install_wide and self.replay is EVERYTHING

    def may_replay_endpoint(self, endpoint: str) -> bool:
        return self.replays_every_endpoint or endpoint in self.endpoint_replay

    @property
    def namespaces(self) -> frozenset[str]:
        """The namespaces of the endpoints it may read, whose events it may read."""
        return frozenset(name.partition("/")[0] for name in self.endpoints if "/" in name)


class Authorizer(Protocol):
    async def authorize(self, token: str) -> Access | None:
        """The Access of a bearer token; None when the token is not valid (the request gets 401)."""
        ...


class TokenAuthorizer:
    """One shared token guards everything (no Kubernetes): generated at start unless given."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(32)

    async def authorize(self, token: str) -> Access | None:
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        return Access(subject="console-token", read=EVERYTHING, replay=EVERYTHING, install_wide=True)
