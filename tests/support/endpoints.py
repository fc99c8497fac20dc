"""A real HTTP endpoint on localhost that receives outbox deliveries, for relay tests.

Every request is verified with the official ``standardwebhooks`` library and with
``svix``'s verifier: the relay's signatures are checked by code we did not write.
``behaviour`` decides each answer, so tests can script failures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import standardwebhooks
from aiohttp import web
from svix.webhooks import Webhook as SvixWebhook

from hookline.core.embedded import free_port


@dataclass
class Received:
    webhook_id: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    status: int = 0


# (request number for this webhook-id starting at 1, received) -> (status, headers, delay before answering)
Behaviour = Callable[[int, Received], "Answer | Awaitable[Answer]"]


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class TestEndpoint:
    """``async with TestEndpoint(secret) as ep``; ``ep.url`` to register; ``ep.received`` to inspect."""

    __test__ = False

    def __init__(self, secret: str, behaviour: Behaviour | None = None) -> None:
        self.secret = secret
        self.behaviour = behaviour
        self.port = free_port()
        self.received: list[Received] = []
        self.effects: list[str] = []  # webhook-ids whose effect was applied: a receiver deduplicating on webhook-id
        self._done: set[str] = set()
        self.invalid: list[str] = []
        self.first_request = asyncio.Event()
        self._seen: dict[str, int] = {}
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            standardwebhooks.Webhook(self.secret).verify(raw, headers)
            SvixWebhook(self.secret).verify(raw, headers)
        except Exception as exc:
            self.invalid.append(f"{type(exc).__name__}: {exc}")
            return web.json_response({"error": "invalid signature"}, status=401)
        if headers.get("content-type") != "application/json":
            self.invalid.append(f"content-type {headers.get('content-type')}")
        item = Received(headers["webhook-id"], json.loads(raw), headers, time.monotonic())
        self.received.append(item)
        self.first_request.set()
        self._seen[item.webhook_id] = n = self._seen.get(item.webhook_id, 0) + 1
        answer = Answer()
        if self.behaviour is not None:
            result = self.behaviour(n, item)
            answer = await result if asyncio.iscoroutine(result) else result  # type: ignore[assignment]
        if answer.delay:
            await asyncio.sleep(answer.delay)
        item.status = answer.status
        # The receiving side's business effect, deduplicated on webhook-id.
        if 200 <= answer.status < 300 and item.webhook_id not in self._done:
            self._done.add(item.webhook_id)
            self.effects.append(item.webhook_id)
        return web.Response(status=answer.status, headers=answer.headers, text="ok" if answer.status < 300 else "no")

    def delivered(self) -> list[Received]:
        """First successful receipt per webhook-id, in arrival order."""
        seen: set[str] = set()
        out = []
        for r in self.received:
            if 200 <= r.status < 300 and r.webhook_id not in seen:
                seen.add(r.webhook_id)
                out.append(r)
        return out

    async def __aenter__(self) -> TestEndpoint:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner:
            await self._runner.cleanup()

