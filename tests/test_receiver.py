"""The receiver over real HTTP, as a real process, on a real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import yarl

from support import senders
from support.postgres import PgServer, database_with_providers
from support.processes import ServiceProcess, hookline_cli, receiver

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def module_db(pg_server: PgServer) -> AsyncIterator[str]:
    async with database_with_providers(pg_server, senders.PROVIDERS_YAML) as url:
        yield url


@pytest.fixture(scope="module")
def service(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    proc = receiver(module_db, tmp_path_factory.mktemp("receiver-logs"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
async def conn(module_db: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(module_db)
    yield c
    await c.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    async with http.post(url, data=body, headers={"content-type": "application/json", **headers}) as r:
        return r.status, await r.json()


def new_id(prefix: str = "evt") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


async def rows(conn: asyncpg.Connection, provider: str, event_id: str) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND event_id = $2", provider, event_id))


def signed(scheme: str, event_id: str, body: bytes) -> dict[str, str]:
    return {
        "sw": lambda: senders.standard_webhooks(body, event_id),
        "stripe": lambda: senders.stripe_sig(body),
        "github": lambda: senders.github(body, event_id),
        "shopify": lambda: senders.shopify(body, event_id),
        "slack": lambda: senders.slack(body),
        "generic": lambda: {**senders.generic_hmac(body), "X-Event-Id": event_id},
        "open": lambda: {},
    }[scheme]()


def body_for(scheme: str, event_id: str) -> bytes:
    doc = {"id": event_id, "event_id": event_id, "type": "payment_intent.created",
           "data": {"object": {"id": "pi_1"}}, "event": {"type": "message"}}
    return json.dumps(doc).encode()


SCHEMES = ["sw", "stripe", "github", "shopify", "slack", "generic", "open"]


@pytest.mark.parametrize("provider", SCHEMES)
async def test_each_scheme_accepted_and_stored_exactly(provider: str, service: ServiceProcess,
                                                       http: aiohttp.ClientSession, conn: asyncpg.Connection) -> None:
    event_id = new_id()
    body = body_for(provider, event_id) + b"  \n"  # trailing bytes must survive untouched
    status, answer = await post(http, f"{service.url}/webhooks/{provider}", body, signed(provider, event_id, body))
    assert (status, answer) == (200, {"status": "accepted", "event_id": event_id})
    row = await conn.fetchrow("SELECT * FROM hookline.inbox WHERE provider = $1 AND event_id = $2",
                              provider, event_id)
    assert row["body"] == body
    assert row["status"] == "pending"
    assert row["content_type"] == "application/json"
    stored_headers = {k.lower() for k in json.loads(row["headers"])}
    for secret_header in ("webhook-signature", "stripe-signature", "x-hub-signature-256",
                          "x-shopify-hmac-sha256", "x-slack-signature", "x-signature"):
        assert secret_header not in stored_headers


async def test_event_type_and_entity_key_extracted(service: ServiceProcess, http: aiohttp.ClientSession,
                                                   conn: asyncpg.Connection) -> None:
    event_id = new_id()
    body = body_for("stripe", event_id)
    assert (await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body)))[0] == 200
    row = await conn.fetchrow("SELECT event_type, entity_key FROM hookline.inbox WHERE event_id = $1", event_id)
    assert (row["event_type"], row["entity_key"]) == ("payment_intent.created", "pi_1")
    gh_id = new_id("gh")
    gh_body = b'{"zen": "hello"}'
    gh_headers = senders.github(gh_body, gh_id, "issues")
    assert (await post(http, f"{service.url}/webhooks/github", gh_body, gh_headers))[0] == 200
    assert await conn.fetchval("SELECT event_type FROM hookline.inbox WHERE event_id = $1", gh_id) == "issues"


@pytest.mark.parametrize(
    ("provider", "make_headers", "expected_error"),
    [
        ("sw", lambda b, i: senders.standard_webhooks(b, i, secret=senders.SW_SECRET.replace("c", "d")),
         "invalid_signature"),
        ("sw", lambda b, i: senders.standard_webhooks(b + b" ", i), "invalid_signature"),
        ("sw", lambda b, i: {k: v for k, v in senders.standard_webhooks(b, i).items() if k != "webhook-signature"},
         "invalid_signature"),
        ("sw", lambda b, i: senders.standard_webhooks(b, i, ts=time.time() - 3600), "stale_timestamp"),
        ("sw", lambda b, i: senders.standard_webhooks(b, i, ts=time.time() + 3600), "stale_timestamp"),
        ("stripe", lambda b, i: senders.stripe_sig(b, secret="whsec_wrong"), "invalid_signature"),
        ("stripe", lambda b, i: senders.stripe_sig(b, ts=int(time.time()) - 301), "stale_timestamp"),
        ("stripe", lambda b, i: senders.stripe_sig(b, ts=int(time.time()) + 3600), "stale_timestamp"),
        ("stripe", lambda b, i: {"Stripe-Signature": "garbage"}, "invalid_signature"),
        ("stripe", lambda b, i: {}, "invalid_signature"),
        ("github", lambda b, i: senders.github(b, i, secret="nope"), "invalid_signature"),
        ("github", lambda b, i: senders.github(b.replace(b"evt", b"EVT"), i), "invalid_signature"),
        ("shopify", lambda b, i: senders.shopify(b, i, secret="nope"), "invalid_signature"),
        ("slack", lambda b, i: senders.slack(b, ts=int(time.time()) - 600), "stale_timestamp"),
        ("slack", lambda b, i: senders.slack(b, secret="nope"), "invalid_signature"),
        ("generic", lambda b, i: {"X-Event-Id": i, "X-Signature": "sha256=AAAA"}, "invalid_signature"),
    ],
)
async def test_bad_signatures_rejected_without_a_row(provider, make_headers, expected_error,
                                                     service, http, conn) -> None:
    event_id = new_id()
    body = body_for(provider, event_id)
    status, answer = await post(http, f"{service.url}/webhooks/{provider}", body, make_headers(body, event_id))
    assert status == 401
    assert answer["error"] == expected_error
    assert "secret" not in answer["message"].lower() or "whsec" not in answer["message"]
    assert await rows(conn, provider, event_id) == 0


async def test_rotation_both_secrets_accepted(service, http, conn) -> None:
    for secret in (senders.SW_SECRET, senders.SW_SECRET_2):
        event_id = new_id()
        body = body_for("sw", event_id)
        status, _ = await post(http, f"{service.url}/webhooks/sw", body,
                               senders.standard_webhooks(body, event_id, secret=secret))
        assert status == 200
        assert await rows(conn, "sw", event_id) == 1


async def test_duplicate_answers_200_duplicate_and_keeps_one_row(service, http, conn) -> None:
    event_id = new_id()
    body = body_for("stripe", event_id)
    first = await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body))
    again = await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body))
    assert first == (200, {"status": "accepted", "event_id": event_id})
    assert again == (200, {"status": "duplicate", "event_id": event_id})
    assert await rows(conn, "stripe", event_id) == 1


async def test_fifty_concurrent_deliveries_of_one_event_store_one_row(service, conn) -> None:
    event_id = new_id()
    body = body_for("sw", event_id)
    headers = senders.standard_webhooks(body, event_id)
    # One connection each, so the requests really arrive at once.
    async def one() -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s:
            return await post(s, f"{service.url}/webhooks/sw", body, headers)
    answers = await asyncio.gather(*(one() for _ in range(50)))
    assert all(status == 200 for status, _ in answers)
    statuses = sorted(a["status"] for _, a in answers)
    assert statuses.count("accepted") == 1
    assert statuses.count("duplicate") == 49
    assert await rows(conn, "sw", event_id) == 1


def _raw_request(port: int, head: bytes, body_chunks: list[bytes], pause: float = 0.0) -> bytes:
    """Send a request over a plain socket; stop sending body as soon as an answer arrives."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        sent = 0
        answer = b""
        for chunk in body_chunks:
            with contextlib.suppress(BlockingIOError):
                answer += sock.recv(65536)
            if answer:
                break
            try:
                sock.sendall(chunk)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            time.sleep(pause)
        sock.setblocking(True)
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer + f"\nSENT={sent}".encode()


async def test_oversize_body_rejected_before_it_is_read(service, conn) -> None:
    # maxBodyBytes is 4096 for stripe. Announce 10 MiB, send almost nothing: 413 arrives anyway.
    head = (b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10485760\r\n\r\n")
    answer = await asyncio.to_thread(_raw_request, service.port, head, [b"{" * 100] * 50, 0.02)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"payload_too_large" in answer
    sent = int(answer.rsplit(b"SENT=", 1)[1])
    assert sent < 10485760


async def test_oversize_chunked_body_rejected(service, http) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1024
    async with http.post(f"{service.url}/webhooks/stripe", data=chunks()) as r:
        assert r.status == 413
        assert (await r.json())["error"] == "payload_too_large"


async def test_body_at_the_limit_accepted(service, http, conn) -> None:
    event_id = new_id()
    prefix = json.dumps({"id": event_id, "type": "t", "pad": ""}).encode()
    body = prefix[:-2] + b"x" * (4096 - len(prefix)) + b'"}'
    assert len(body) == 4096
    status, _ = await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body))
    assert status == 200


async def test_invalid_json_and_missing_id_are_400(service, http, conn) -> None:
    body = b"{not json"
    status, answer = await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body))
    assert (status, answer["error"]) == (400, "invalid_json")
    body = b'{"type": "no.id.here"}'
    status, answer = await post(http, f"{service.url}/webhooks/stripe", body, senders.stripe_sig(body))
    assert (status, answer["error"]) == (400, "missing_event_id")
    body = b"{}"
    status, answer = await post(http, f"{service.url}/webhooks/generic", body, senders.generic_hmac(body))
    assert (status, answer["error"]) == (400, "missing_event_id")
    assert await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE event_type = 'no.id.here'") == 0


async def test_unknown_provider_and_wrong_method(service, http) -> None:
    status, answer = await post(http, f"{service.url}/webhooks/nobody", b"{}", {})
    assert (status, answer["error"]) == (404, "unknown_provider")
    async with http.get(f"{service.url}/webhooks/sw") as r:
        assert r.status == 405
        assert (await r.json())["error"] == "method_not_allowed"


async def test_webhook_paths_answered_alike_by_the_short_cut_and_the_router(service, http, conn) -> None:
    """The receiver's dispatcher takes most webhook requests past aiohttp's router; the rest go
    through it. Either way the provider name and the answer are the ones the route defines."""
    event_id = new_id()
    body = body_for("sw", event_id)
    # Percent-encoded name (short cut): decoded as the router decodes it.
    url = yarl.URL(f"{service.url}/webhooks/s%77", encoded=True)
    async with http.post(url, data=body, headers={"content-type": "application/json",
                                                   **signed("sw", event_id, body)}) as r:
        assert (r.status, await r.json()) == (200, {"status": "accepted", "event_id": event_id})
    assert await rows(conn, "sw", event_id) == 1
    # An encoded slash is part of the name (router): no such provider.
    async with http.post(yarl.URL(f"{service.url}/webhooks/sw%2Fx", encoded=True), data=b"{}") as r:
        assert (r.status, (await r.json())["error"]) == (404, "unknown_provider")
    # Expect: 100-continue (router): the body is sent only after the interim answer.
    event_id = new_id()
    body = body_for("sw", event_id)
    async with http.post(f"{service.url}/webhooks/sw", data=body, expect100=True,
                         timeout=aiohttp.ClientTimeout(total=10),
                         headers={"content-type": "application/json", **signed("sw", event_id, body)}) as r:
        assert (r.status, await r.json()) == (200, {"status": "accepted", "event_id": event_id})
    for path in ("/webhooks/", "/webhooks/sw/extra", "/webhook/sw"):
        async with http.post(f"{service.url}{path}", data=b"{}") as r:
            assert r.status == 404, path


async def test_health_and_metrics(service, http) -> None:
    async with http.get(f"{service.url}/healthz") as r:
        assert r.status == 200
    async with http.get(f"{service.url}/readyz") as r:
        assert r.status == 200
    async with http.get(f"{service.url}/metrics") as r:
        text = await r.text()
    assert 'hookline_inbox_received_total{outcome="accepted",provider="sw"}' in text
    assert "hookline_receiver_batch_size_bucket" in text
    assert "hookline_receiver_request_seconds_bucket" in text


async def test_provider_changes_apply_without_restart(service, module_db, http) -> None:
    yaml_doc = """
kind: WebhookProvider
metadata: {name: late}
spec:
  signature: {scheme: none}
  handler: "hookline.examples.handlers:log_event"
"""
    result = hookline_cli(module_db, "providers", "apply", "-f", "-", stdin=yaml_doc)
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 1.0
    while True:
        status, _ = await post(http, f"{service.url}/webhooks/late", b'{"id": "x1"}', {})
        if status == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    assert hookline_cli(module_db, "providers", "delete", "late").returncode == 0
    deadline = time.monotonic() + 1.0
    while status != 404 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status, _ = await post(http, f"{service.url}/webhooks/late", b'{"id": "x2"}', {})
    assert status == 404


async def test_postgres_down_gives_503_and_nothing_is_lost(tmp_path: Path, log_dir: Path) -> None:
    from hookline.core import migrations
    from hookline.core.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path / "pg")
    url = server.start()
    try:
        c = await asyncpg.connect(url)
        await migrations.migrate(c)
        await c.close()
        assert hookline_cli(url, "providers", "apply", "-f", "-", stdin=senders.PROVIDERS_YAML).returncode == 0
        proc = receiver(url, log_dir)
        try:
            async with aiohttp.ClientSession() as http:
                accepted_before = []
                for _ in range(5):
                    eid = new_id()
                    body = body_for("github", eid)
                    assert (await post(http, f"{proc.url}/webhooks/github", body, senders.github(body, eid)))[0] == 200
                    accepted_before.append(eid)
                await asyncio.to_thread(server.stop, "immediate")
                refused = []
                for _ in range(5):
                    eid = new_id()
                    body = body_for("github", eid)
                    async with http.post(f"{proc.url}/webhooks/github", data=body,
                                         headers=senders.github(body, eid)) as r:
                        assert r.status == 503
                        assert r.headers["Retry-After"]
                        assert (await r.json())["error"] == "unavailable"
                    refused.append((eid, body))
                async with http.get(f"{proc.url}/readyz") as r:
                    assert r.status == 503
                await asyncio.to_thread(server.start)
                # The sender retries what was refused; the service recovers by itself.
                for eid, body in refused:
                    deadline = time.monotonic() + 15
                    while True:
                        status, answer = await post(http, f"{proc.url}/webhooks/github", body,
                                                    senders.github(body, eid))
                        if status == 200 or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.2)
                    assert (status, answer["status"]) == (200, "accepted")
            c = await asyncpg.connect(url)
            stored = {r["event_id"] for r in await c.fetch("SELECT event_id FROM hookline.inbox")}
            await c.close()
            assert stored == set(accepted_before) | {eid for eid, _ in refused}
        finally:
            proc.stop()
    finally:
        server.stop("immediate")
