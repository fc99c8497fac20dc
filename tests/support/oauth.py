"""An OAuth2 token endpoint for tests (client credentials, client_secret_basic): a real aiohttp server
that issues tokens, can revoke them, and judges the ``Authorization: Bearer`` a receiver got."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from support.endpoints import Answer, Received


@dataclass
class TokenServer:
    """An OAuth2 token endpoint (client_secret_basic); tokens tok-1, tok-2, ... each valid until revoked."""

    clients: dict[str, str]  # client id -> secret
    expires_in: int = 3600
    delay: float = 0.3  # slow enough that concurrent deliveries overlap the fetch
    issued: list[str] = field(default_factory=list)
    forms: list[dict[str, str]] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.forms.append(form)
        await asyncio.sleep(self.delay)
        user, _, password = base64.b64decode(request.headers.get("authorization", "Basic ")[6:]).decode().partition(":")
        if form.get("grant_type") != "client_credentials" or self.clients.get(user) != password:
            return web.json_response({"error": "invalid_client", "error_description": f"bad {password}"}, status=401)
        token = f"tok-{len(self.issued) + 1}-{user}"
        self.issued.append(token)
        return web.json_response({"access_token": token, "token_type": "bearer", "expires_in": self.expires_in})

    def valid(self, received: Received) -> bool:
        bearer = received.headers.get("authorization", "")
        return bearer.startswith("Bearer ") and bearer[7:] in self.issued and bearer[7:] not in self.revoked

    def answer(self, _n: int, received: Received) -> Answer:
        return Answer(200 if self.valid(received) else 401)


@asynccontextmanager
async def token_server(clients: dict[str, str], **kwargs: object) -> AsyncIterator[TokenServer]:
    server = TokenServer(clients, **kwargs)  # type: ignore[arg-type]
    app = web.Application()
    app.router.add_post("/token", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    server.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/token"  # type: ignore[union-attr]
    try:
        yield server
    finally:
        await runner.cleanup()
