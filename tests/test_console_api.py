"""The console's JSON API through a real ``hookline console`` process on a real Postgres: tokens,
filters, pagination, hostile input, replay and the worker processing what was replayed, and the
OpenAPI document against the live routes and answers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import jsonschema
import pytest

from hookline.console import api
from hookline.console.access import TokenAuthorizer
from hookline.console.app import create_app, openapi_document
from hookline.console.store import Store
from support import processes
from support.inbox import apply_provider, create_effect_tables
from support.waiting import eventually

TOKEN = "test-console-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def console(database_url: str, log_dir: Path) -> Iterator[processes.ServiceProcess]:
    proc = processes.console(database_url, log_dir, env={"HOOKLINE_CONSOLE_TOKEN": TOKEN})
    try:
        yield proc
    finally:
        proc.stop()
    assert TOKEN not in proc.logs()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def seed(pool: asyncpg.Pool, database_url: str) -> None:
    for name in ("a", "b"):
        apply_provider(database_url, name, 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
    await pool.execute("""
        INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, body, status, processed_at,
                                    received_at, headers)
        SELECT p, p || '_evt_' || g, CASE WHEN g % 2 = 0 THEN 'order.paid' ELSE 'order.created' END, 'cust_' || g % 3,
               convert_to('{"n": ' || g || '}', 'UTF8'), CASE WHEN g % 5 = 0 THEN 'dead' ELSE 'done' END, now(),
               now() - g * interval '1 minute', '{"webhook-signature": "v1,secret", "x-plain": "ok"}'
        FROM unnest(ARRAY['a', 'b']) AS p, generate_series(1, 30) AS g
    """)


async def get(http: aiohttp.ClientSession, url: str, **params: str) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with http.get(url, headers=AUTH, params=params) as r:
        return r.status, await r.json(content_type=None), r


async def test_no_token_or_a_bad_one_is_401_and_ops_need_none(console: processes.ServiceProcess,
                                                             http: aiohttp.ClientSession) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer "}, {"Cookie": "hookline_console=nope"}):
        async with http.get(console.url + "/api/v1/providers", headers=headers) as r:
            assert r.status == 401, headers
            assert r.headers["Content-Type"].startswith("application/problem+json")
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            body = await r.json(content_type=None)
            assert body["status"] == 401 and body["title"] == "Unauthorized" and TOKEN not in json.dumps(body)
    for path in ("/healthz", "/readyz", "/metrics", "/api/openapi.json"):
        async with http.get(console.url + path) as r:
            assert r.status == 200, path
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            assert r.headers["Referrer-Policy"] == "no-referrer"


async def test_a_cookie_session_may_read_but_changes_need_the_csrf_header(
        console: processes.ServiceProcess, http: aiohttp.ClientSession, pool: asyncpg.Pool,
        database_url: str) -> None:
    await seed(pool, database_url)
    cookie = {"Cookie": f"hookline_console={TOKEN}"}
    async with http.get(console.url + "/api/v1/providers", headers=cookie) as r:
        assert r.status == 200
    body = {"filter": {}, "dry_run": True}
    async with http.post(console.url + "/api/v1/dead-letters/replay", headers=cookie, json=body) as r:
        assert r.status == 403
    async with http.post(console.url + "/api/v1/dead-letters/replay", json=body,
                         headers={**cookie, "X-Hookline-CSRF": TOKEN}) as r:
        assert r.status == 200 and (await r.json())["count"] == 12


async def test_filters_and_pages_without_repeats_or_gaps(console: processes.ServiceProcess,
                                                        http: aiohttp.ClientSession, pool: asyncpg.Pool,
                                                        database_url: str) -> None:
    await seed(pool, database_url)
    seen: list[tuple[str, str]] = []
    cursor = None
    while True:
        status, page, _ = await get(http, console.url + "/api/v1/events", limit="7",
                                    **({"cursor": cursor} if cursor else {}))
        assert status == 200, page
        seen += [(e["received_at"], f"{e['provider']}:{e['event_id']}") for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len({name for _, name in seen}) == len(seen) == 60
    assert [at for at, _ in seen] == sorted((at for at, _ in seen), reverse=True)

    cases: dict[str, tuple[dict[str, str], int]] = {
        "provider": ({"provider": "a"}, 30), "status": ({"status": "dead"}, 12),
        "type": ({"type": "order.paid", "provider": "b"}, 15), "entity": ({"entity": "cust_0"}, 20),
        "q": ({"q": "_evt_1"}, 22),  # 1, 10-19 per provider
        "received": ({"received_after": "2000-01-01T00:00:00Z", "received_before": "2000-01-02T00:00:00Z"}, 0),
    }
    for label, (params, count) in cases.items():
        status, page, _ = await get(http, console.url + "/api/v1/events", limit="200", **params)
        assert status == 200 and len(page["items"]) == count, (label, page)
    status, page, _ = await get(http, console.url + "/api/v1/dead-letters", provider="a")
    assert status == 200 and {e["status"] for e in page["items"]} == {"dead"} and len(page["items"]) == 6

    status, event, _ = await get(http, console.url + "/api/v1/events/a/a_evt_5")
    assert status == 200 and event["body_json"] == {"n": 5}
    assert event["headers"] == {"webhook-signature": "[redacted]", "x-plain": "ok"}
    for missing in ("/api/v1/events/a/nope", "/api/v1/events/zzz/a_evt_5", "/api/v1/providers/zzz"):
        status, _, r = await get(http, console.url + missing)
        assert status == 404 and r.headers["Content-Type"].startswith("application/problem+json"), missing


async def test_hostile_input_is_400_naming_the_field_and_changes_nothing(
        console: processes.ServiceProcess, http: aiohttp.ClientSession, pool: asyncpg.Pool,
        database_url: str) -> None:
    await seed(pool, database_url)
    before = await pool.fetch("SELECT id, status, attempts FROM hookline.inbox ORDER BY id")
    for params, field in (({"cursor": "garbage"}, "cursor"), ({"cursor": "W10"}, "cursor"),
                          ({"cursor": "WyJ4IiwgMV0"}, "cursor"), ({"limit": str(10**9)}, "limit"),
                          ({"limit": "-1"}, "limit"), ({"limit": "0"}, "limit"),
                          ({"received_after": "yesterday"}, "received_after"),
                          ({"received_before": "2026-01-01T00:00:00"}, "received_before"),
                          ({"q": "x" * 5000}, "q"), ({"status": "<script>"}, "status"),
                          ({"provider": "p" * 5000}, "provider"), ({"nonsense": "1"}, "nonsense")):
        status, problem, r = await get(http, console.url + "/api/v1/events", **params)
        assert status == 400, (params, problem)
        assert r.headers["Content-Type"].startswith("application/problem+json")
        assert problem["field"] == field and "<script>" not in problem["detail"], problem
    # Beyond aiohttp's 8 KiB request line the server refuses it before any handler runs.
    async with http.get(console.url + "/api/v1/events", headers=AUTH, params={"q": "x" * 100_000}) as r:
        assert r.status in (400, 414)
    for body, field in (({"dry_run": "yes", "filter": {}}, "dry_run"), ({"ids": [1]}, "ids"),
                        ({"filter": {"status": "done"}}, "filter"), ({}, "filter"), ([1], "body")):
        async with http.post(console.url + "/api/v1/dead-letters/replay", headers=AUTH, json=body) as r:
            assert r.status == 400, body
            assert (await r.json(content_type=None))["field"] == field
    async with http.post(console.url + "/api/v1/dead-letters/replay", headers=AUTH, data=b"{" * 100_000) as r:
        assert r.status == 413
    async with http.post(console.url + "/api/v1/dead-letters/replay", headers=AUTH, data=b"{not json") as r:
        assert r.status == 400
    async with http.delete(console.url + "/api/v1/events", headers=AUTH) as r:
        assert r.status == 405 and r.headers["Content-Type"].startswith("application/problem+json")
    assert await pool.fetch("SELECT id, status, attempts FROM hookline.inbox ORDER BY id") == before


async def test_replay_counts_first_then_the_worker_processes_the_replayed(
        console: processes.ServiceProcess, http: aiohttp.ClientSession, pool: asyncpg.Pool,
        database_url: str, log_dir: Path) -> None:
    await seed(pool, database_url)
    await create_effect_tables(pool)
    request = {"provider": "a", "filter": {"type": "order.paid"}, "dry_run": True}
    async with http.post(console.url + "/api/v1/dead-letters/replay", headers=AUTH, json=request) as r:
        assert r.status == 200 and await r.json() == {"dry_run": True, "count": 3, "more": False}
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 12
    async with http.post(console.url + "/api/v1/dead-letters/replay", headers=AUTH,
                         json={**request, "dry_run": False}) as r:
        assert r.status == 200 and (await r.json())["count"] == 3
    async with http.post(console.url + "/api/v1/events/b/b_evt_5/replay", headers=AUTH) as r:
        assert r.status == 200 and (await r.json())["count"] == 1
    worker = processes.worker(database_url, log_dir)
    try:
        async def processed() -> bool:
            return await pool.fetchval("SELECT count(*) FROM test_effects") == 4
        await eventually(processed, what="the replayed events processed", timeout=30)
    finally:
        worker.stop()
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 8
    assert await pool.fetchval("SELECT count(*) FROM hookline.attempts WHERE outcome = 'replayed' "
                               "AND worker = 'console:console-token'") == 4
    _, event, _ = await get(http, console.url + "/api/v1/events/b/b_evt_5")
    assert [a["outcome"] for a in event["attempt_log"]][-2:] == ["replayed", "done"]


def _schema_for(document: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    # The document is the root, so its "#/components/..." references resolve.
    return jsonschema.Draft202012Validator({**document, **schema})


async def test_the_openapi_document_is_the_live_routes_and_their_answers(
        console: processes.ServiceProcess, http: aiohttp.ClientSession, pool: asyncpg.Pool, database_url: str,
        ) -> None:
    document = openapi_document()
    jsonschema.Draft202012Validator.check_schema({k: v for k, v in document["components"]["schemas"].items()})
    app = create_app(Store(pool), TokenAuthorizer(TOKEN))
    routed = {(r.method, re.sub(r"\{(\w+):.*?\}(?=/|$)", r"{\1}", r.resource.canonical.removeprefix(api.PREFIX)))
              for r in app.router.routes() if r.resource is not None
              and r.resource.canonical.startswith(api.PREFIX) and r.method != "HEAD"}
    described = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert routed == described

    await seed(pool, database_url)
    for path, params in (("/providers", {}), ("/providers/a", {}), ("/events", {"limit": "3"}),
                         ("/events/a/a_evt_5", {}), ("/dead-letters", {}), ("/endpoints", {}), ("/deliveries", {}),
                         ("/events", {"limit": "0"}), ("/providers/zzz", {})):
        status, body, _ = await get(http, console.url + api.PREFIX + path, **params)
        template = next(p for p in document["paths"] if _matches(p, path))
        response = document["paths"][template]["get"]["responses"][str(status)]
        if "$ref" in response:
            response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
        content_type = next(iter(response["content"]))
        _schema_for(document, response["content"][content_type]["schema"]).validate(body)


def _matches(template: str, path: str) -> bool:
    t, p = template.strip("/").split("/"), path.strip("/").split("/")
    return len(t) == len(p) and all(a == b or a.startswith("{") for a, b in zip(t, p, strict=True))


async def test_the_cli_reads_and_replays_through_the_api(console: processes.ServiceProcess, pool: asyncpg.Pool,
                                                         database_url: str) -> None:
    await seed(pool, database_url)
    # No database for the CLI: a wrong URL proves everything goes through the console.
    nowhere = "postgresql://nobody@127.0.0.1:1/none"
    env = {"HOOKLINE_CONSOLE_TOKEN": TOKEN}
    listed = processes.hookline_cli(nowhere, "events", "list", "--api", console.url, "--provider", "a",
                                    "--status", "dead", env=env)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 7 and "a_evt_30" in listed.stdout and "b_evt" not in listed.stdout
    shown = processes.hookline_cli(nowhere, "events", "show", "a", "a_evt_5", "--api", console.url, env=env)
    assert shown.returncode == 0 and "[redacted]" in shown.stdout and "secret" not in shown.stdout, shown
    dead = processes.hookline_cli(nowhere, "dlq", "list", "--api", console.url, "--provider", "b", env=env)
    assert dead.returncode == 0 and len(dead.stdout.splitlines()) == 7, dead
    replayed = processes.hookline_cli(nowhere, "dlq", "replay", "--api", console.url, "--provider", "b", env=env)
    assert replayed.returncode == 0 and "b: requeued 6 dead event(s)" in replayed.stdout, replayed
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 6
    refused = processes.hookline_cli(nowhere, "events", "list", "--api", console.url,
                                     env={"HOOKLINE_CONSOLE_TOKEN": "not-the-token-at-all"})
    assert refused.returncode == 1 and "401" in refused.stderr and TOKEN not in refused.stderr


def test_a_short_token_or_a_bad_port_stops_it_with_one_line(database_url: str) -> None:
    for env, args, says in (({"HOOKLINE_CONSOLE_TOKEN": "short"}, (), "HOOKLINE_CONSOLE_TOKEN is too short"),
                            ({}, ("--port", "70000"), "--port must be from 1 to 65535")):
        result = processes.hookline_cli(database_url, "console", *args, env=env)
        assert result.returncode == 2 and says in result.stderr, result
        assert len(result.stderr.strip().splitlines()) == 1 and "short" not in result.stdout


def test_a_csrf_key_file_that_holds_no_key_stops_it_with_one_line(database_url: str, tmp_path: Path) -> None:
    """Each message names the file and what is wrong, never the key itself."""
    cases = {
        "short": (b"s3cret-but-short\n", "is too short: give at least 32 characters"),
        "spaced": (b"correct horse battery staple and more words", "must be one line of printable"),
        "two-lines": (b"k" * 40 + b"\n" + b"k" * 40 + b"\n", "must be one line of printable"),
        "binary": (b"\xff\xfe" + b"k" * 40, "holds bytes other than ASCII"),
    }
    for name, (content, says) in cases.items():
        (tmp_path / name).write_bytes(content)
        result = processes.hookline_cli(database_url, "console",
                                        env={"HOOKLINE_CONSOLE_CSRF_KEY_FILE": str(tmp_path / name)})
        assert result.returncode == 2 and says in result.stderr and str(tmp_path / name) in result.stderr, result
        assert len(result.stderr.strip().splitlines()) == 1
        assert content.decode(errors="replace").split()[0] not in result.stderr + result.stdout
    missing = processes.hookline_cli(database_url, "console",
                                     env={"HOOKLINE_CONSOLE_CSRF_KEY_FILE": str(tmp_path / "nowhere")})
    assert missing.returncode == 2 and "cannot read" in missing.stderr, missing
    audience = processes.hookline_cli(database_url, "console", "--audience", "hookline-console")
    assert audience.returncode == 2 and "needs --auth kubernetes" in audience.stderr, audience
