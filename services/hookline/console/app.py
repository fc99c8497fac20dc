"""The console's web application: the JSON API (api.py), the pages (added by pages.py when it is
installed), the OpenAPI document, the ops routes, and the middleware every request goes through:
errors as problem+json, security headers, request metrics, and authentication.

Authentication: the token comes from ``Authorization: Bearer`` or the ``hookline_console`` session
cookie (set by the pages' login form). A state change authenticated by the cookie must also prove
it comes from a page of ours (CSRF): pages.py's ``header_csrf_check``, with the key ``csrf_key``
(shared by every replica; None: one made per process). The ops routes and /api/openapi.json need
no token."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import asyncpg
from aiohttp import web

from hookline.console import api, problems
from hookline.console.access import Authorizer
from hookline.console.pages import SESSION_COOKIE, add_pages, header_csrf_check
from hookline.console.store import Store
from hookline.core import http, metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPENAPI_PATH = "/api/openapi.json"
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", OPENAPI_PATH})
# Paths anyone may ask for without a token (the pages' login form and its static files, say);
# pages.py adds to it.
PUBLIC_PREFIXES_KEY: web.AppKey[list[str]] = web.AppKey("public_prefixes", list)
AUTHORIZER_KEY: web.AppKey[Authorizer] = web.AppKey("authorizer", object)  # type: ignore[arg-type]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def openapi_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(resources.files("hookline.console").joinpath("openapi.json").read_text())
    return document


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as problem+json; a 500 says nothing of what failed (the log does)."""
    try:
        return await handler(request)
    except problems.Problem as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        problem = problems.Problem(exc.status, exc.reason, headers={k: v for k, v in exc.headers.items()
                                                                   if k in ("Allow",)})
        return problem.response()
    except asyncpg.QueryCanceledError:
        return problems.Problem(503, "the query took too long; narrow the filters", code="timeout").response()
    except Exception:
        log.exception("console request failed", extra={"route": _route(request)})
        return problems.internal().response()


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


@web.middleware
async def request_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        route = _route(request)
        metrics.console_requests.labels(route, str(status)).inc()
        metrics.console_latency.labels(route).observe(time.perf_counter() - started)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS or any(request.path.startswith(p) for p in request.app[PUBLIC_PREFIXES_KEY]):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, bearer = header.partition(" ")
    from_cookie = False
    if header:
        if scheme.lower() != "bearer" or not bearer.strip():
            raise problems.unauthorized("the Authorization header must be: Bearer TOKEN")
        token = bearer.strip()
    elif request.cookies.get(SESSION_COOKIE):
        token, from_cookie = request.cookies[SESSION_COOKIE], True
    else:
        raise problems.unauthorized()
    access = await request.app[AUTHORIZER_KEY].authorize(token)
    if access is None:
        raise problems.unauthorized("the token is not valid (or has expired)")
    if from_cookie and request.method not in SAFE_METHODS and not header_csrf_check(request, token):
        raise problems.forbidden("a change made with the session cookie needs the page's CSRF token")
    request[api.ACCESS_KEY] = access
    return await handler(request)


def _route(request: web.Request) -> str:
    """The matched route's pattern (bounded label values), or "unmatched"."""
    resource = request.match_info.route.resource if request.match_info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"


async def openapi(_: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def create_app(store: Store, authorizer: Authorizer, pool: asyncpg.Pool | None = None, *,
               csrf_key: bytes | None = None) -> web.Application:
    """The console's application; ``pool`` (default the store's) answers /readyz; ``csrf_key`` signs
    the pages' CSRF tokens (None: a random key of this process's)."""
    app = web.Application(middlewares=[request_metrics, security_headers, errors, authenticate,
                                       api.store_errors], client_max_size=api.MAX_BODY_BYTES)
    app[api.STORE_KEY] = store
    app[AUTHORIZER_KEY] = authorizer
    app[PUBLIC_PREFIXES_KEY] = []
    http.add_ops_routes(app, pool or store.pool)
    app.router.add_get(OPENAPI_PATH, openapi)
    api.add_routes(app)
    add_pages(app, store, authorizer, csrf_key)  # the web pages, their templates and /static/ (pages.py)
    return app
