"""The console's pages against hostile payloads, on a real Postgres over real HTTP.

Events are stored as a hostile sender could have them stored (script tags in the body, the headers,
the event type and the event id; a 5 MB string; bytes that are not UTF-8; JSON nested 10,000 deep)
and every page must show them escaped, bounded and without a secret, under the strict CSP. A
cookie-authenticated POST without its CSRF token is refused and replays nothing; replicas that share
the CSRF key (HOOKLINE_CONSOLE_CSRF_KEY_FILE) accept each other's forms, others refuse them.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from hookline import outbox
from hookline.console.access import Access, TokenAuthorizer
from hookline.console.app import create_app
from hookline.console.pages import CSP, MAX_BODY_CHARS, SESSION_COOKIE, csrf_token
from hookline.console.store import Store
from hookline.core.embedded import free_port
from support.inbox import apply_provider
from support.processes import ServiceProcess, hookline_cli
from support.processes import console as console_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN = "console-test-token-0123456789"
SCRIPT = "<script>alert(1)</script>"
SECRET = "whsec_MfKQ9r8GKYqrTlsupersecret"
HUGE = "A" * (5 * 1024 * 1024)
DEEP = "[" * 10_000 + "]" * 10_000
SOMEWHAT_DEEP = json.dumps(json.loads("[" * 60 + "\"bottom\"" + "]" * 60))
OUR_SCRIPT = '<script src="/static/htmx.min.js" defer></script>'


async def store_event(pool: asyncpg.Pool, event_id: str, body: bytes, *, event_type: str = "test.event",
                      status: str = "pending", headers: dict[str, str] | None = None) -> None:
    await pool.execute("""
        INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, headers, body, content_type,
                                    status, attempts, processed_at, last_error)
        VALUES ('hostile', $1, $2, $3, $4::text::jsonb, $5, 'application/json', $6,
                CASE WHEN $6 = 'dead' THEN 3 ELSE 0 END, CASE WHEN $6 = 'dead' THEN now() END,
                CASE WHEN $6 = 'dead' THEN $7 END)""",
                       event_id, event_type, SCRIPT, json.dumps(headers or {}), body, status, f"KeyError {SCRIPT}")


@pytest.fixture
def store(pool: asyncpg.Pool) -> Store:
    return Store(pool)


@pytest.fixture
async def console(database_url: str, pool: asyncpg.Pool, store: Store) -> AsyncIterator[str]:
    """The console's app (API, pages, its middleware) on a real HTTP server over the real store, with
    one hostile provider's events."""
    apply_provider(database_url, "hostile", 'signature: {scheme: none}\nhandler: "support.handlers:always_fail"')
    await store_event(pool, f"evt_{SCRIPT}", json.dumps({"note": SCRIPT}).encode(), event_type=SCRIPT,
                      headers={"x-note": SCRIPT, "webhook-signature": f"v1,{SECRET}", "x-innocent": SECRET})
    await store_event(pool, "evt_huge", json.dumps({"huge": HUGE}).encode())
    await store_event(pool, "evt_long", json.dumps({"long": HUGE[:500_000]}).encode())
    await store_event(pool, "evt_bytes", b'{"ok": "\xff\xfe' + SCRIPT.encode() + b'"}')
    await store_event(pool, "evt_deep", DEEP.encode())
    await store_event(pool, "evt_somewhat_deep", SOMEWHAT_DEEP.encode())
    await store_event(pool, "evt_dead", b'{"data": {}}', status="dead")
    runner = web.AppRunner(create_app(store, TokenAuthorizer(TOKEN)))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookies={SESSION_COOKIE: TOKEN})


async def page(url: str, path: str) -> tuple[aiohttp.ClientResponse, str]:
    async with session() as http, http.get(url + path, allow_redirects=False) as response:
        return response, await response.text()


def no_script_from_data(html: str) -> None:
    """The only script element is the console's own (the vendored htmx)."""
    assert html.count("<script") == 1 and OUR_SCRIPT in html, re.findall(r"<script[^>]*>", html)
    assert SECRET not in html


async def test_pages_show_hostile_values_escaped_under_the_csp(console: str) -> None:
    for path in ("/", "/events", "/events?provider=hostile&q=%3Cscript", "/dead-letters", "/endpoints",
                 "/deliveries", f"/events/hostile/{quote('evt_' + SCRIPT, safe='')}"):
        response, html = await page(console, path)
        assert response.status == 200, (path, html[:2000])
        assert response.headers["Content-Security-Policy"] == CSP
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        no_script_from_data(html)

    _, events = await page(console, "/events?provider=hostile")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in events
    _, one = await page(console, f"/events/hostile/{quote('evt_' + SCRIPT, safe='')}")
    assert one.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # id, type, entity, header, body
    assert "[redacted]" in one  # the signature header, and the header whose value looks like a secret


async def test_a_huge_string_is_cut_and_the_page_stays_small(console: str) -> None:
    response, html = await page(console, "/events/hostile/evt_huge")
    assert response.status == 200
    assert len(html) < MAX_BODY_CHARS + 50_000
    assert "only the first part was loaded" in html and f"Only the first {MAX_BODY_CHARS:,} of" in html
    no_script_from_data(html)
    # Under the store's load limit the body parses; its one long string is cut, not the page.
    response, html = await page(console, "/events/hostile/evt_long")
    assert response.status == 200
    assert len(html) < 50_000 and "more characters not shown" in html


async def test_invalid_utf8_shows_replacement_characters(console: str) -> None:
    response, html = await page(console, "/events/hostile/evt_bytes")
    assert response.status == 200
    assert "not valid UTF-8" in html and "\ufffd" in html
    assert "&lt;script&gt;" in html
    no_script_from_data(html)


async def test_deep_json_is_not_recursed_into(console: str) -> None:
    response, html = await page(console, "/events/hostile/evt_deep")
    assert response.status == 200
    assert "nested too deep" in html
    response, html = await page(console, "/events/hostile/evt_somewhat_deep")
    assert response.status == 200
    assert "nested deeper than" in html and "bottom" not in html


async def test_without_a_session_every_page_sends_to_the_login_form(console: str) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/events", "/events/hostile/evt_dead", "/dead-letters"):
            async with http.get(console + path, allow_redirects=False) as response:
                assert response.status == 303
                assert response.headers["Location"].startswith("/login?next=")
        async with http.get(console + "/login?next=//evil.example/x") as response:
            html = await response.text()
            assert response.headers["Content-Security-Policy"] == CSP
            assert 'name="next" value="/"' in html and "evil.example" not in html


async def test_login_sets_a_strict_http_only_cookie_and_refuses_a_bad_token(console: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(console + "/login", data={"token": "wrong", "next": "/events"},
                             allow_redirects=False) as response:
            assert response.status == 401
            assert SESSION_COOKIE not in response.cookies
        async with http.post(console + "/login", data={"token": TOKEN}, allow_redirects=False,
                             headers={"Origin": "http://evil.example"}) as response:
            assert response.status == 403
            assert SESSION_COOKIE not in response.cookies
        async with http.post(console + "/login", data={"token": TOKEN, "next": "/events"},
                             allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == "/events"
            cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain http here; over https the cookie is Secure


async def test_replay_needs_the_csrf_token_and_a_confirmation(console: str, pool: asyncpg.Pool, store: Store) -> None:
    form = {"provider": "hostile", "id": "evt_dead"}
    told: list[tuple[str, dict[str, dict[str, int]]]] = []  # the hooks (a Kubernetes Event) hear of page replays

    async def hook(access: Access, what: dict[str, dict[str, int]]) -> None:
        told.append((access.subject, what))

    store.replay_hooks.append(hook)

    async def status() -> str:
        return str(await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'evt_dead'"))

    async with session() as http:
        for bad in ({}, {"csrf": "0" * 64}, {"csrf": csrf_token(b"another secret", TOKEN)}):
            async with http.post(console + "/dead-letters/replay", data={**form, **bad, "confirm": "yes"},
                                 allow_redirects=False) as response:
                assert response.status == 403, await response.text()
        assert await status() == "dead"

        _, dead_letters = await page(console, "/dead-letters?provider=hostile")
        match = re.search(r'name="csrf" value="([0-9a-f]{64})"', dead_letters)
        assert match is not None
        csrf = match.group(1)
        async with http.post(console + "/dead-letters/replay", data={**form, "csrf": csrf},
                             allow_redirects=False) as response:
            confirm = await response.text()
            assert response.status == 200
        assert "Replay 1 dead letter?" in confirm and 'name="confirm" value="yes"' in confirm
        assert await status() == "dead" and told == []  # a dry run so far

        async with http.post(console + "/dead-letters/replay", data={**form, "csrf": csrf, "confirm": "yes"},
                             allow_redirects=False) as response:
            assert response.status == 303
            location = response.headers["Location"]
        assert location == "/dead-letters?provider=hostile&replayed=1"
        assert await status() == "pending"
        assert told == [("console-token", {"providers": {"hostile": 1}})]
        _, done = await page(console, location)
        assert "1 dead letter replayed" in done


async def test_an_api_change_with_the_cookie_needs_the_csrf_header(console: str, pool: asyncpg.Pool) -> None:
    replay = {"provider": "hostile", "ids": ["evt_dead"]}
    async with session() as http:
        async with http.post(console + "/api/v1/dead-letters/replay", json=replay) as response:
            assert response.status == 403
            assert response.content_type == "application/problem+json"
        async with http.post(console + "/api/v1/dead-letters/replay", json=replay,
                             headers={"X-Hookline-CSRF": csrf_token(b"another process", TOKEN)}) as response:
            assert response.status == 403
        assert await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'evt_dead'") == "dead"
        _, html = await page(console, "/dead-letters")
        match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
        assert match is not None
        async with http.post(console + "/api/v1/dead-letters/replay", json={**replay, "dry_run": True},
                             headers={"X-Hookline-CSRF": match.group(1)}) as response:
            assert response.status == 200, await response.text()


async def test_replay_of_a_provider_one_may_not_read_is_refused(console: str, pool: asyncpg.Pool) -> None:
    _, html = await page(console, "/dead-letters")
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match is not None
    async with session() as http, http.post(console + "/dead-letters/replay", allow_redirects=False, data={
            "provider": "nosuch", "id": "evt_dead", "csrf": match.group(1)}) as response:
        assert response.status == 404
    assert await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'evt_dead'") == "dead"


async def test_a_test_event_and_a_delivery_replay_need_the_csrf_token(console: str, pool: asyncpg.Pool,
                                                                      database_url: str) -> None:
    added = hookline_cli(database_url, "endpoints", "add", "partner", "--url", "http://127.0.0.1:9/hooks")
    assert added.returncode == 0, added.stderr

    async def test_events() -> int:
        return int(await pool.fetchval("SELECT count(*) FROM hookline.outbox WHERE event_type = 'hookline.test'"))

    _, endpoints = await page(console, "/endpoints")
    no_script_from_data(endpoints)
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', endpoints)
    assert match is not None and 'action="/endpoints/partner/test"' in endpoints
    async with session() as http:
        async with http.post(console + "/endpoints/partner/test", data={}, allow_redirects=False) as response:
            assert response.status == 403
        assert await test_events() == 0
        async with http.post(console + "/endpoints/partner/test", data={"csrf": match.group(1)},
                             allow_redirects=False) as response:
            assert response.status == 303
            assert response.headers["Location"] == "/deliveries?endpoint=partner&sent=1"
        assert await test_events() == 1

        async with http.post(console + "/deliveries/replay", data={"endpoint": "partner"},
                             allow_redirects=False) as response:
            assert response.status == 403
        async with http.post(console + "/deliveries/replay", data={"endpoint": "partner", "csrf": match.group(1)},
                             allow_redirects=False) as response:
            assert response.status == 200
            assert "Replay 0 dead deliveries?" in await response.text()


async def test_logout_needs_the_csrf_token_and_forgets_the_cookie(console: str) -> None:
    _, html = await page(console, "/")
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match is not None
    async with session() as http:
        async with http.post(console + "/logout", data={}, allow_redirects=False) as response:
            assert response.status == 403  # another site cannot log a user out either
        async with http.post(console + "/logout", data={"csrf": match.group(1)}, allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == "/login"
            assert response.cookies[SESSION_COOKIE].value == ""


async def test_a_delivery_page_shows_its_attempts_escaped_and_replays_that_delivery(
        console: str, pool: asyncpg.Pool, store: Store, database_url: str) -> None:
    added = hookline_cli(database_url, "endpoints", "add", "partner", "--url", "http://127.0.0.1:9/hooks")
    assert added.returncode == 0, added.stderr
    async with pool.acquire() as conn:
        await outbox.publish(conn, SCRIPT, {"note": SCRIPT}, endpoint="partner")
    delivery_id = await pool.fetchval(
        "UPDATE hookline.deliveries SET status = 'dead', attempts = 2, last_status = 500, last_response = $1, "
        "last_error = $1 RETURNING id", f"{SCRIPT} {SECRET}")
    await pool.execute("INSERT INTO hookline.attempts (queue, row_id, part, attempt, outcome, error, http_status) "
                       "VALUES ('deliveries', $1, 'partner', 2, 'dead', $2, 500)", delivery_id, f"HTTP 500 {SCRIPT}")
    told: list[dict[str, dict[str, int]]] = []

    async def hook(access: Access, what: dict[str, dict[str, int]]) -> None:
        told.append(what)

    store.replay_hooks.append(hook)

    _, deliveries = await page(console, "/deliveries")
    assert f'href="/deliveries/{delivery_id}"' in deliveries
    response, html = await page(console, f"/deliveries/{delivery_id}")
    assert response.status == 200 and response.headers["Content-Security-Policy"] == CSP
    assert html.count("<script") == 1 and OUR_SCRIPT in html  # the payload, the answer and the error, escaped
    assert "&lt;script&gt;" in html and "HTTP 500" in html and "dead" in html
    for missing in ("/deliveries/999999999", "/deliveries/99999999999999999999"):
        response, _ = await page(console, missing)
        assert response.status == 404
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{console}/api/v1/deliveries/{delivery_id}",
                            headers={"Authorization": f"Bearer {TOKEN}"}) as api_response:
            shown = await api_response.json()
        assert shown["body_json"] == {"note": SCRIPT} and shown["attempt_log"][0]["outcome"] == "dead"

    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert csrf is not None and f'name="id" value="{delivery_id}"' in html
    async with session() as http:
        form = {"id": str(delivery_id), "csrf": csrf.group(1)}
        async with http.post(console + "/deliveries/replay", data=form, allow_redirects=False) as response:
            assert response.status == 200 and "Replay 1 dead delivery?" in await response.text()
        assert told == []
        async with http.post(console + "/deliveries/replay", data={**form, "confirm": "yes"},
                             allow_redirects=False) as response:
            assert response.status == 303
            assert response.headers["Location"] == f"/deliveries/{delivery_id}?replayed=1"
        async with http.post(console + "/deliveries/replay", data={"id": "12x", "csrf": csrf.group(1)},
                             allow_redirects=False) as response:
            assert response.status == 400
    assert await pool.fetchval("SELECT status FROM hookline.deliveries WHERE id = $1", delivery_id) == "pending"
    assert told == [{"endpoints": {"partner": 1}}]
    assert await pool.fetchval("SELECT worker FROM hookline.attempts WHERE queue = 'deliveries' AND row_id = $1 "
                               "AND outcome = 'replayed'", delivery_id) == "console:console-token"


# -- replicas: one CSRF key (real `hookline console` processes) ------------------------------------

KEY_A = "a" * 24 + "0123456789abcdef0123456789abcdef"
KEY_B = "b" * 24 + "0123456789abcdef0123456789abcdef"


@pytest.fixture
def replicas(database_url: str, log_dir: Path, tmp_path: Path) -> Iterator[tuple[ServiceProcess, ...]]:
    """Three console processes on one database: two with key A (replicas of one Deployment), one with key B."""
    files = {}
    for name, key in (("a", KEY_A), ("b", KEY_B)):
        files[name] = tmp_path / f"csrf-{name}"
        files[name].write_text(key + "\n")
    with ExitStack() as stack:
        started = []
        for name in ("a", "a", "b"):
            proc = console_process(database_url, log_dir, env={"HOOKLINE_CONSOLE_TOKEN": TOKEN,
                                                               "HOOKLINE_CONSOLE_CSRF_KEY_FILE": str(files[name])})
            stack.callback(proc.stop)
            started.append(proc)
        yield tuple(started)
        logs = "".join(proc.logs() for proc in started)
    assert KEY_A not in logs and KEY_B not in logs and TOKEN not in logs


async def test_replicas_with_one_csrf_key_accept_each_others_forms_and_others_refuse(
        replicas: tuple[ServiceProcess, ...], database_url: str, pool: asyncpg.Pool) -> None:
    first, second, other = replicas
    apply_provider(database_url, "hostile", 'signature: {scheme: none}\nhandler: "support.handlers:always_fail"')
    await store_event(pool, "evt_dead", b'{"data": {}}', status="dead")
    async with session() as http:
        async with http.get(first.url + "/dead-letters?provider=hostile") as response:
            html = await response.text()
            assert response.status == 200, html
        match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
        assert match is not None
        assert KEY_A not in html  # the key signs the field, never shows in it
        form = {"provider": "hostile", "id": "evt_dead", "csrf": match.group(1)}
        # The form one replica rendered, sent (as a browser behind a load balancer would) to another.
        async with http.post(second.url + "/dead-letters/replay", data=form, allow_redirects=False) as response:
            assert response.status == 200, await response.text()
            assert "Replay 1 dead letter?" in await response.text()
        async with http.post(other.url + "/dead-letters/replay", data=form, allow_redirects=False) as response:
            assert response.status == 403, await response.text()
        async with http.post(other.url + "/api/v1/dead-letters/replay", allow_redirects=False,
                             json={"provider": "hostile", "ids": ["evt_dead"], "dry_run": True},
                             headers={"X-Hookline-CSRF": match.group(1)}) as response:
            assert response.status == 403
    assert await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'evt_dead'") == "dead"
