"""The console's web pages: server-rendered HTML over the same store as the JSON API.

Every page reads without JavaScript (GET forms, links that can be pasted); the vendored htmx only
makes navigation smoother. Payloads are hostile: every value goes through Jinja2's autoescape
(never ``|safe`` on data), bodies are decoded with replacement characters, and JSON is
pretty-printed here, in Python, within depth and size bounds. State changes are POST forms carrying
a CSRF token bound to the session cookie; replays first show how many rows they will touch (the
store's dry-run count) and only the confirmation form replays. The strict CSP allows no inline
script or style.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
import jinja2
from aiohttp import web

from hookline.console.access import Access, Authorizer
from hookline.console.api import ACCESS_KEY
from hookline.console.store import BadRequest, EventFilter, Forbidden, NotFound, Store
from hookline.core.history import redact_headers

SESSION_COOKIE = "hookline_console"  # holds the pasted token; the API's middleware reads it too
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-Hookline-CSRF"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "frame-ancestors 'none'; form-action 'self'")
PAGE_SIZE = 50
# Bounds on what one page renders: a 5 MB string or JSON nested 10,000 deep is shown cut, never
# recursed into or sent whole.
MAX_JSON_DEPTH = 32
MAX_STRING_CHARS = 2_000
MAX_BODY_CHARS = 100_000
EVENT_FILTERS = ("provider", "status", "type", "entity", "received_after", "received_before", "q")
DELIVERY_FILTERS = ("endpoint", "status", "type", "q")

PAGE_GETS = frozenset({"providers", "events", "event", "dead_letters", "endpoints", "deliveries", "delivery"})
# POST routes that check the form's CSRF token themselves (the app's middleware cannot read a form).
FORM_POSTS = frozenset({"replay_dead_letters", "replay_deliveries", "send_test_event"})
PUBLIC_PREFIXES = ["/login", "/logout", "/static/"]  # the app's middleware lets these through unauthenticated

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")


STORE_KEY: web.AppKey[Store] = web.AppKey("pages_store", Store)
AUTHORIZER_KEY: web.AppKey[Authorizer] = web.AppKey("pages_authorizer", Authorizer)
CSRF_SECRET_KEY: web.AppKey[bytes] = web.AppKey("pages_csrf_secret", bytes)


class PageError(Exception):
    """Bad input to a page (a filter, a cursor, a form): shown as a page with the status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- rendering hostile values -------------------------------------------------------------------

def decode_body(body: bytes | str | None) -> tuple[str, bool]:
    """The body as text, and whether it was not valid UTF-8 (its bad bytes then show as U+FFFD)."""
    if body is None:
        return "", False
    if isinstance(body, str):
        return body, False
    try:
        return body.decode("utf-8"), False
    except UnicodeDecodeError:
        return body.decode("utf-8", errors="replace"), True


def bounded(value: Any, depth: int = 0) -> Any:
    """A copy of parsed JSON cut to MAX_JSON_DEPTH levels and MAX_STRING_CHARS per string."""
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_CHARS else (
            f"{value[:MAX_STRING_CHARS]}… [{len(value) - MAX_STRING_CHARS:,} more characters not shown]")
    if not isinstance(value, (dict, list)):
        return value
    if depth >= MAX_JSON_DEPTH:
        return f"… [nested deeper than {MAX_JSON_DEPTH} levels, not shown]"
    if isinstance(value, dict):
        return {bounded(key, depth + 1): bounded(item, depth + 1) for key, item in value.items()}
    return [bounded(item, depth + 1) for item in value]


def body_view(event: dict[str, Any]) -> dict[str, Any]:
    """What the event page shows of a stored body: pretty JSON when it parsed, else the text (its
    undecodable bytes already U+FFFD); each cut to the bounds above."""
    text = str(event.get("body") or "")
    notes: list[str] = []
    if event.get("body_valid_utf8") is False:
        notes.append("The body is not valid UTF-8: bytes that do not decode are shown as \ufffd.")
    if event.get("body_truncated"):
        notes.append(f"The body has {event.get('body_bytes')} bytes; only the first part was loaded.")
    shown, is_json = text, bool(event.get("body_is_json"))
    if is_json:
        shown = json.dumps(bounded(event.get("body_json")), indent=2, ensure_ascii=False)
    elif text.lstrip()[:1] in ("{", "[") and not event.get("body_truncated"):
        notes.append("The body does not parse as JSON (or is nested too deep to): shown as received.")
    if len(shown) > MAX_BODY_CHARS:
        notes.append(f"Only the first {MAX_BODY_CHARS:,} of {len(shown):,} characters are shown.")
        shown = shown[:MAX_BODY_CHARS]
    return {"text": shown, "is_json": is_json, "notes": notes}


def short(value: Any, limit: int = 120) -> str:
    """A cell's text: at most ``limit`` characters (an event id or type can be megabytes)."""
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


# --- sessions and CSRF --------------------------------------------------------------------------

def csrf_token(secret: bytes, session_token: str) -> str:
    """The CSRF token of one session: an HMAC of its cookie, so a form from another session fails."""
    return hmac.new(secret, session_token.encode(), hashlib.sha256).hexdigest()


def _session_token(request: web.Request) -> tuple[str | None, bool]:
    """The request's token, and whether it came from the cookie (only those need a CSRF token)."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None, False
    return request.cookies.get(SESSION_COOKIE) or None, True


def header_csrf_check(request: web.Request, token: str) -> bool:
    """The app's check of a cookie-authenticated change, before any handler runs (app.py's
    ``authenticate``): the session's CSRF token in the header ``X-Hookline-CSRF``. The pages' own
    POST routes carry it in a form field, which only their handler can read: each checks it first
    (``csrf_check``)."""
    if request.match_info.route.name in FORM_POSTS:
        return True
    sent = request.headers.get(CSRF_HEADER, "").encode()
    # The session's token itself proves as much (no other site can read the HttpOnly cookie); the
    # pages send the HMAC so that the token is never written into a page.
    return (hmac.compare_digest(sent, csrf_token(request.app[CSRF_SECRET_KEY], token).encode())
            or hmac.compare_digest(sent, token.encode()))


async def csrf_check(request: web.Request) -> bool:
    """Whether a cookie-authenticated POST carries its session's CSRF token (header or form field)."""
    token, from_cookie = _session_token(request)
    if not from_cookie:
        return True
    if token is None:
        return False
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.post()
        field = form.get(CSRF_FIELD)
        sent = field if isinstance(field, str) else None
    expected = csrf_token(request.app[CSRF_SECRET_KEY], token)
    return sent is not None and hmac.compare_digest(sent.encode(), expected.encode())


async def _access(request: web.Request) -> tuple[Access, str]:
    """The request's Access (the app's middleware authorised it) and its session token."""
    token, _ = _session_token(request)
    access = request.get(ACCESS_KEY)
    if access is None or token is None:
        raise web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
    return access, token


@web.middleware
async def login_redirect(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A page asked for without a (valid) session goes to the login form; the API keeps its 401."""
    response = await handler(request)
    if (response.status == 401 and request.method == "GET" and request.match_info.route.name in PAGE_GETS):
        redirect = web.Response(status=303, headers={"Location": "/login?" + urlencode({"next": request.path_qs})})
        secure(redirect)
        return redirect
    return response


def _same_origin(request: web.Request) -> bool:
    """A login POST from this console's own page (Origin, when the browser sends one, names this host)."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
    return origin == f"{request.scheme}://{request.host}"


def _safe_next(target: str | None) -> str:
    """Where to go after login: a path on this console only (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# --- pages --------------------------------------------------------------------------------------


def page(handler: Handler) -> Handler:
    """A page route: bad input and the store's refusals answer as a page with their status."""
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except PageError as exc:
            return _render(request, "error.html", {"status": exc.status, "message": exc.message}, status=exc.status)
        except BadRequest as exc:
            return _render(request, "error.html", {"status": 400, "message": str(exc)}, status=400)
        except NotFound:
            return _render(request, "error.html", {"status": 404, "message": "Nothing here you may read."}, status=404)
        except Forbidden as exc:
            return _render(request, "error.html", {"status": 403, "message": str(exc)}, status=403)
    return answer


def _render(request: web.Request, template: str, context: dict[str, Any], *, token: str | None = None,
            status: int = 200) -> web.Response:
    context.setdefault("csrf", csrf_token(request.app[CSRF_SECRET_KEY], token) if token else "")
    context.setdefault("path", request.path)
    context.setdefault("short", short)
    response = aiohttp_jinja2.render_template(template, request, context, status=status)
    secure(response)
    return response


def secure(response: web.StreamResponse) -> None:
    """The pages' headers: the strict CSP, no sniffing, no framing, no referrer, no caching."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers.setdefault("Cache-Control", "no-store")


def _filters(request: web.Request, names: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name in names if (value := request.query.get(name, "").strip())}


def _next_link(request: web.Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {name: value for name, value in request.query.items() if name not in ("cursor", "replayed", "sent")}
    return f"{request.path}?{urlencode({**query, 'cursor': cursor})}"


@page
async def providers_page(request: web.Request) -> web.StreamResponse:
    access, token = await _access(request)
    providers = await request.app[STORE_KEY].providers(access)
    return _render(request, "providers.html", {"subject": access.subject, "providers": providers}, token=token)


async def _event_list(request: web.Request, template: str, *, dead: bool) -> web.StreamResponse:
    access, token = await _access(request)
    store = request.app[STORE_KEY]
    filters = _filters(request, EVENT_FILTERS)
    parsed = EventFilter.parse(filters)
    cursor = request.query.get("cursor") or None
    if dead:
        events, next_cursor = await store.dead_letters(access, parsed, PAGE_SIZE, cursor)
    else:
        events, next_cursor = await store.events(access, parsed, PAGE_SIZE, cursor)
    providers = [p["name"] for p in await store.providers(access)]
    replayed = request.query.get("replayed", "")
    return _render(request, template, {
        "subject": access.subject, "events": events, "filters": filters, "providers": providers,
        "next": _next_link(request, next_cursor), "replayed": int(replayed) if replayed.isdigit() else None,
        "may_replay": access.may_replay,
    }, token=token)


@page
async def events_page(request: web.Request) -> web.StreamResponse:
    return await _event_list(request, "events.html", dead=False)


@page
async def dead_letters_page(request: web.Request) -> web.StreamResponse:
    return await _event_list(request, "dead_letters.html", dead=True)


@page
async def event_page(request: web.Request) -> web.StreamResponse:
    access, token = await _access(request)
    provider, event_id = request.match_info["provider"], request.match_info["event_id"]
    event = await request.app[STORE_KEY].event(access, provider, event_id)
    headers = redact_headers(dict(event.get("headers") or {}))  # again: no secret reaches a page
    return _render(request, "event.html", {
        "subject": access.subject, "event": event, "headers": headers, "body": body_view(event),
        "attempts": event.get("attempt_log") or [], "may_replay": access.may_replay(provider),
    }, token=token)


@page
async def replay_dead_letters(request: web.Request) -> web.StreamResponse:
    """POST: without ``confirm`` shows how many would be replayed (the store's dry run); with it, replays."""
    access, token = await _checked_form(request)
    form = await request.post()
    provider = str(form.get("provider") or "").strip()
    if not provider:
        raise PageError(400, "Choose the provider whose dead letters to replay.")
    ids = [str(value) for value in form.getall("id", [])]
    selection = form.get("all") == "1"
    if not ids and not selection:
        raise PageError(400, "Choose the dead letters to replay, or all that match the filter.")
    filters = {name: str(form[name]) for name in EVENT_FILTERS if name != "status" and form.get(name)}
    filters["provider"] = provider
    parsed = EventFilter.parse(filters) if selection else None
    chosen = None if selection else ids

    async def replay(dry_run: bool) -> dict[str, Any]:
        return await request.app[STORE_KEY].replay(access, provider=provider, ids=chosen, filters=parsed,
                                                   dry_run=dry_run)
    return await _confirm_then_replay(request, access, token, replay, "confirm.html", {
        "provider": provider, "ids": ids, "selection": selection, "filters": filters,
    }, "/dead-letters?" + urlencode({"provider": provider}))


async def _confirm_then_replay(request: web.Request, access: Access, token: str,
                               replay: Callable[[bool], Awaitable[dict[str, Any]]], confirm_template: str,
                               context: dict[str, Any], back: str) -> web.StreamResponse:
    """A replay form's answer: without ``confirm`` the page saying how many it would replay (a dry
    run); with it, the replay, then back to ``back`` saying how many it did."""
    form = await request.post()
    if form.get("confirm") != "yes":
        would = await replay(True)
        return _render(request, confirm_template, {
            "subject": access.subject, "count": would["count"], "more": would.get("more"), **context,
        }, token=token)
    done = await replay(False)
    raise web.HTTPSeeOther(f"{back}{'&' if '?' in back else '?'}{urlencode({'replayed': done['count']})}")


def _may_change_outbox(access: Access, endpoint: str | None = None) -> bool:
    """Replaying deliveries and sending test events: of every endpoint with install-wide rights, of a
    namespace's endpoint with patch on its WebhookEndpoint (as the store checks)."""
    if endpoint is None:
        return access.replays_every_endpoint or bool(access.endpoint_replay)
    return access.may_replay_endpoint(endpoint)


async def _checked_form(request: web.Request) -> tuple[Access, str]:
    """A page's POST: its Access and token once the form's CSRF token matched (else 403, nothing done)."""
    access, token = await _access(request)
    if not await csrf_check(request):
        raise PageError(403, "This form has expired or did not come from this console: reload the page and try again.")
    return access, token


@page
async def endpoints_page(request: web.Request) -> web.StreamResponse:
    access, token = await _access(request)
    endpoints = [{**e, "may_change": _may_change_outbox(access, e["name"])}
                 for e in await request.app[STORE_KEY].endpoints(access)]
    return _render(request, "endpoints.html", {
        "subject": access.subject, "endpoints": endpoints, "reads_outbox": access.reads_outbox,
        "may_change": any(e["may_change"] for e in endpoints),
    }, token=token)


@page
async def send_test_event(request: web.Request) -> web.StreamResponse:
    """POST: a ``hookline.test`` event through the outbox to this endpoint only."""
    access, _ = await _checked_form(request)
    endpoint = request.match_info["name"]
    await request.app[STORE_KEY].send_test_event(access, endpoint)
    raise web.HTTPSeeOther("/deliveries?" + urlencode({"endpoint": endpoint, "sent": 1}))


@page
async def replay_deliveries(request: web.Request) -> web.StreamResponse:
    """POST: the dead deliveries of one endpoint, or one delivery (``id``); without ``confirm``
    shows how many first."""
    access, token = await _checked_form(request)
    form = await request.post()
    endpoint = str(form.get("endpoint") or "").strip() or None
    raw_id = str(form.get("id") or "").strip()
    if raw_id and not (raw_id.isdigit() and len(raw_id) <= 19):
        raise PageError(400, "That is not a delivery id.")
    ids = [int(raw_id)] if raw_id else None
    if endpoint is None and ids is None:
        raise PageError(400, "Choose the endpoint whose dead deliveries to replay, or one delivery.")

    async def replay(dry_run: bool) -> dict[str, Any]:
        return await request.app[STORE_KEY].replay_deliveries(access, ids=ids, endpoint=endpoint, dry_run=dry_run)
    back = f"/deliveries/{raw_id}" if ids else "/deliveries?" + urlencode({"endpoint": endpoint})
    return await _confirm_then_replay(request, access, token, replay, "confirm_deliveries.html",
                                      {"endpoint": endpoint, "id": raw_id}, back)


@page
async def deliveries_page(request: web.Request) -> web.StreamResponse:
    access, token = await _access(request)
    filters = _filters(request, DELIVERY_FILTERS)
    deliveries, next_cursor = await request.app[STORE_KEY].deliveries(
        access, filters, PAGE_SIZE, request.query.get("cursor") or None)
    replayed = request.query.get("replayed", "")
    return _render(request, "deliveries.html", {
        "subject": access.subject, "deliveries": deliveries, "filters": filters,
        "next": _next_link(request, next_cursor), "reads_outbox": access.reads_outbox,
        "may_change": _may_change_outbox(access, filters.get("endpoint") or None),
        "sent": request.query.get("sent") == "1",
        "replayed": int(replayed) if replayed.isdigit() else None,
    }, token=token)


@page
async def delivery_page(request: web.Request) -> web.StreamResponse:
    access, token = await _access(request)
    delivery = await request.app[STORE_KEY].delivery(access, int(request.match_info["id"]))
    replayed = request.query.get("replayed", "")
    return _render(request, "delivery.html", {
        "subject": access.subject, "delivery": delivery, "body": body_view(delivery),
        "attempts": delivery.get("attempt_log") or [],
        "may_change": _may_change_outbox(access, delivery["endpoint"]),
        "replayed": int(replayed) if replayed.isdigit() else None,
    }, token=token)


@page
async def login_page(request: web.Request) -> web.StreamResponse:
    return _render(request, "login.html", {"next": _safe_next(request.query.get("next")), "error": None})


@page
async def login(request: web.Request) -> web.StreamResponse:
    """POST: a pasted token becomes an HttpOnly, SameSite=Strict session cookie when it is valid."""
    if not _same_origin(request):
        raise PageError(403, "The login form must be sent from this console's own page.")
    form = await request.post()
    token = str(form.get("token") or "").strip()
    target = _safe_next(str(form.get("next") or ""))
    access = await request.app[AUTHORIZER_KEY].authorize(token) if token else None
    if access is None:
        return _render(request, "login.html", {"next": target, "error": "That token was not accepted."}, status=401)
    response = web.HTTPSeeOther(target)
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict", path="/",
                        secure=request.secure)
    secure(response)
    raise response


@page
async def logout(request: web.Request) -> web.StreamResponse:
    """POST (with the CSRF token): forgets the session cookie."""
    token, from_cookie = _session_token(request)
    if token and from_cookie and not await csrf_check(request):
        raise PageError(403, "This form has expired or did not come from this console: reload the page and try again.")
    response = web.HTTPSeeOther("/login")
    response.del_cookie(SESSION_COOKIE, path="/")
    secure(response)
    raise response


def add_pages(app: web.Application, store: Store, authorizer: Authorizer, csrf_key: bytes | None = None) -> None:
    """The page routes, their templates and /static/ on the console app (``app.create_app``), whose
    middleware authenticates every page but the login form's and checks CSRF with ours. ``csrf_key``
    signs the CSRF tokens: the same in every replica, or a form one rendered fails on another."""
    from hookline.console import app as console_app  # here: app.py imports this module

    app[console_app.PUBLIC_PREFIXES_KEY].extend(PUBLIC_PREFIXES)
    app.middlewares.insert(0, login_redirect)
    app[STORE_KEY] = store
    app[AUTHORIZER_KEY] = authorizer
    # Without a shared key, one per process: a restart expires open forms.
    app[CSRF_SECRET_KEY] = csrf_key if csrf_key is not None else secrets.token_bytes(32)
    aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                         undefined=jinja2.ChainableUndefined)
    app.router.add_get("/", providers_page, name="providers")
    app.router.add_get("/events", events_page, name="events")
    app.router.add_get("/events/{provider}/{event_id:.+}", event_page, name="event")
    app.router.add_get("/dead-letters", dead_letters_page, name="dead_letters")
    app.router.add_post("/dead-letters/replay", replay_dead_letters, name="replay_dead_letters")
    app.router.add_get("/endpoints", endpoints_page, name="endpoints")
    app.router.add_post("/endpoints/{name:.+}/test", send_test_event, name="send_test_event")
    app.router.add_get("/deliveries", deliveries_page, name="deliveries")
    app.router.add_get(r"/deliveries/{id:\d{1,20}}", delivery_page, name="delivery")
    app.router.add_post("/deliveries/replay", replay_deliveries, name="replay_deliveries")
    app.router.add_get("/login", login_page, name="login")
    app.router.add_post("/login", login, name="login_post")
    app.router.add_post("/logout", logout, name="logout")
    app.router.add_static("/static/", STATIC, name="static")
