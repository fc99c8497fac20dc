"""The console's JSON API under ``/api/v1`` (described by ``openapi.json``; docs/console.md states
its compatibility promise). Every handler reads the request's ``Access`` (set by app.py's auth
middleware) and calls the store, which reads only what that Access may; what it may not read is
answered 404, never told apart from what does not exist."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hookline.console import problems
from hookline.console.access import Access
from hookline.console.store import BadRequest, EventFilter, Forbidden, NotFound, Store, parse_limit

PREFIX = "/api/v1"
ACCESS_KEY: web.RequestKey[Access] = web.RequestKey("access", Access)
STORE_KEY: web.AppKey[Store] = web.AppKey("store", Store)
MAX_BODY_BYTES = 64 * 1024  # a replay's JSON body
EVENT_FILTERS = ("provider", "status", "type", "entity", "received_after", "received_before", "q")


def _store(request: web.Request) -> Store:
    return request.app[STORE_KEY]


def _access(request: web.Request) -> Access:
    return request[ACCESS_KEY]


def _page(items: list[dict[str, Any]], cursor: str | None) -> web.Response:
    return web.json_response({"items": items, "next_cursor": cursor})


def _filters(request: web.Request) -> EventFilter:
    unknown = set(request.query) - {*EVENT_FILTERS, "limit", "cursor"}
    if unknown:
        raise problems.bad_request(sorted(unknown)[0], f"unknown parameter {sorted(unknown)[0][:40]!r}")
    return EventFilter.parse({k: request.query[k] for k in EVENT_FILTERS if k in request.query})


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise problems.Problem(413, f"the body is over {MAX_BODY_BYTES} bytes", code="payload-too-large")
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise problems.Problem(413, f"the body is over {MAX_BODY_BYTES} bytes", code="payload-too-large")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise problems.bad_request("body", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise problems.bad_request("body", "the body must be a JSON object")
    return body


async def list_providers(request: web.Request) -> web.Response:
    return web.json_response({"items": await _store(request).providers(_access(request))})


async def get_provider(request: web.Request) -> web.Response:
    return web.json_response(await _store(request).provider(_access(request), request.match_info["name"]))


async def list_events(request: web.Request) -> web.Response:
    items, cursor = await _store(request).events(_access(request), _filters(request),
                                                 parse_limit(request.query.get("limit")),
                                                 request.query.get("cursor"))
    return _page(items, cursor)


async def get_event(request: web.Request) -> web.Response:
    return web.json_response(await _store(request).event(_access(request), request.match_info["provider"],
                                                         request.match_info["event_id"]))


async def replay_event(request: web.Request) -> web.Response:
    provider = request.match_info["provider"]
    body = await _body(request)
    result = await _store(request).replay(_access(request), provider=provider,
                                          ids=[request.match_info["event_id"]], dry_run=_dry_run(body))
    return web.json_response(result)


async def list_dead_letters(request: web.Request) -> web.Response:
    items, cursor = await _store(request).dead_letters(_access(request), _filters(request),
                                                       parse_limit(request.query.get("limit")),
                                                       request.query.get("cursor"))
    return _page(items, cursor)


async def replay_dead_letters(request: web.Request) -> web.Response:
    body = await _body(request)
    unknown = set(body) - {"provider", "ids", "filter", "dry_run"}
    if unknown:
        raise problems.bad_request(sorted(unknown)[0], f"unknown field {sorted(unknown)[0][:40]!r}")
    provider = _text(body, "provider")
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise problems.bad_request("ids", "ids must be a list of event ids (strings)")
    raw_filter = body.get("filter")
    if raw_filter is not None and (not isinstance(raw_filter, dict)
                                   or not all(isinstance(v, str) for v in raw_filter.values())):
        raise problems.bad_request("filter", "filter must be an object of strings (the events list's filters)")
    if ids is None and raw_filter is None:
        raise problems.bad_request("filter", "say what to replay: ids (with provider) or filter ({} for all)")
    filters = None
    if raw_filter is not None:
        unknown = set(raw_filter) - set(EVENT_FILTERS) - {"status"}
        if unknown or "status" in raw_filter:
            raise problems.bad_request("filter", f"filter takes {', '.join(f for f in EVENT_FILTERS if f != 'status')}")
        filters = EventFilter.parse({**raw_filter, **({"provider": provider} if provider else {})})
    result = await _store(request).replay(_access(request), provider=provider, ids=ids, filters=filters,
                                          dry_run=_dry_run(body))
    return web.json_response(result)


async def list_endpoints(request: web.Request) -> web.Response:
    return web.json_response({"items": await _store(request).endpoints(_access(request))})


async def list_deliveries(request: web.Request) -> web.Response:
    allowed = {"endpoint", "status", "type", "q", "limit", "cursor"}
    unknown = set(request.query) - allowed
    if unknown:
        raise problems.bad_request(sorted(unknown)[0], f"unknown parameter {sorted(unknown)[0][:40]!r}")
    items, cursor = await _store(request).deliveries(
        _access(request), {k: v for k, v in request.query.items() if k in ("endpoint", "status", "type", "q")},
        parse_limit(request.query.get("limit")), request.query.get("cursor"))
    return _page(items, cursor)


async def get_delivery(request: web.Request) -> web.Response:
    return web.json_response(await _store(request).delivery(_access(request), int(request.match_info["id"])))


async def replay_deliveries(request: web.Request) -> web.Response:
    body = await _body(request)
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                 for i in ids)):
        raise problems.bad_request("ids", "ids must be a list of delivery ids (numbers)")
    endpoint = _text(body, "endpoint")
    if ids is None and endpoint is None and body.get("all") is not True:
        raise problems.bad_request("ids", "say what to replay: ids, endpoint, or all: true")
    result = await _store(request).replay_deliveries(_access(request), ids=ids, endpoint=endpoint,
                                                     dry_run=_dry_run(body))
    return web.json_response(result)


async def send_test_event(request: web.Request) -> web.Response:
    return web.json_response(await _store(request).send_test_event(_access(request), request.match_info["name"]),
                             status=202)


def _dry_run(body: dict[str, Any]) -> bool:
    value = body.get("dry_run", False)
    if not isinstance(value, bool):
        raise problems.bad_request("dry_run", "dry_run must be true or false")
    return value


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or not value or len(value) > 1000):
        raise problems.bad_request(name, f"{name} must be a non-empty string")
    return value


@web.middleware
async def store_errors(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """The store's refusals as problems."""
    try:
        return await handler(request)
    except BadRequest as exc:
        raise problems.bad_request(exc.field, str(exc)) from None
    except NotFound as exc:
        raise problems.not_found(str(exc)) from None
    except Forbidden as exc:
        raise problems.forbidden(str(exc)) from None


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.Response]]]] = [
    ("GET", "/providers", list_providers),
    ("GET", "/providers/{name}", get_provider),
    ("GET", "/events", list_events),
    ("POST", "/events/{provider}/{event_id:.+}/replay", replay_event),
    ("GET", "/events/{provider}/{event_id:.+}", get_event),
    ("GET", "/dead-letters", list_dead_letters),
    ("POST", "/dead-letters/replay", replay_dead_letters),
    ("GET", "/endpoints", list_endpoints),
    ("POST", "/endpoints/{name:.+}/test", send_test_event),
    ("GET", "/deliveries", list_deliveries),
    ("GET", r"/deliveries/{id:\d{1,20}}", get_delivery),
    ("POST", "/deliveries/replay", replay_deliveries),
]


def add_routes(app: web.Application) -> None:
    for method, path, handler in ROUTES:
        app.router.add_route(method, PREFIX + path, handler)
