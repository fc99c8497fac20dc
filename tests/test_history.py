"""Event history: the attempt log written by the queue's own booking statements (bounded per
run), `hookline events list/show` with redacted headers, `hookline deliveries show` with each
answer, and `hookline dlq replay --event` through the one replay path."""

from __future__ import annotations

import json
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hookline import outbox
from hookline.core.queue import INBOX, OUTBOX, RetryPolicy
from hookline.relay import endpoints
from support.endpoints import Answer, Received, TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.processes import hookline_cli, relay, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

SECRET = "whsec_c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1sZWFr"
ENDPOINT_SECRET = "whsec_" + "aGlzdG9yeS1lbmRwb2ludC1zZWNyZXQtMTIzNDU2Nzg="
HEADERS = {"Stripe-Signature": "t=1,v1=abcdef", "Authorization": "Bearer hunter2", "X-Forwarded-Secretish": SECRET,
           "Content-Type": "application/json", "User-Agent": "Stripe/1.0"}


async def receive(pool: asyncpg.Pool, provider: str, event_id: str, body: bytes = b'{"id": "evt"}') -> int:
    row_id: int = await pool.fetchval(
        "INSERT INTO hookline.inbox (provider, event_id, event_type, headers, body, content_type) "
        "VALUES ($1, $2, 'invoice.paid', $3, $4, 'application/json') RETURNING id",
        provider, event_id, HEADERS, body)
    return row_id


async def fail_until_dead(pool: asyncpg.Pool, provider: str, worker: str, failures: int) -> None:
    """Claim and fail the provider's one event ``failures`` times, the last one burying it."""
    for attempt in range(1, failures + 1):
        [row] = await INBOX.claim(pool, provider, 1, f"{worker}-{attempt}", 60)
        if attempt < failures:
            assert await INBOX.retry(pool, row["id"], row["attempts"], f"{worker}-{attempt}", 0, f"HTTP 503 #{attempt}")
        else:
            assert await INBOX.bury(pool, row["id"], row["attempts"], f"{worker}-{attempt}", "gave up")


async def test_show_prints_state_redacted_headers_body_and_every_attempt(pool: asyncpg.Pool,
                                                                         database_url: str) -> None:
    await receive(pool, "stripe", "evt_1", b'{"id": "evt_1", "amount": 42}')
    await fail_until_dead(pool, "stripe", "worker-a", 3)

    result = hookline_cli(database_url, "events", "show", "stripe", "evt_1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("event stripe:evt_1 (id ")
    assert "status:         dead" in out
    assert "Stripe-Signature: [redacted]" in out and "Authorization: [redacted]" in out
    assert "X-Forwarded-Secretish: [redacted]" in out and "User-Agent: Stripe/1.0" in out
    assert SECRET not in out and "hunter2" not in out and "abcdef" not in out
    assert '{"id": "evt_1", "amount": 42}' in out
    attempts = [line.split() for line in out.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
    assert [(a[0], a[2], a[3]) for a in attempts] == [("1", "retry", "worker-a-1"), ("2", "retry", "worker-a-2"),
                                                      ("3", "dead", "worker-a-3")]
    assert "HTTP 503 #2" in out and "gave up" in out

    missing = hookline_cli(database_url, "events", "show", "stripe", "evt_nope")
    assert (missing.returncode, missing.stderr.strip()) == (1, "hookline: no inbox event stripe:evt_nope")


async def test_list_filters_by_provider_status_and_time(pool: asyncpg.Pool, database_url: str) -> None:
    await receive(pool, "stripe", "evt_dead")
    await fail_until_dead(pool, "stripe", "w", 1)
    await receive(pool, "stripe", "evt_new")
    await receive(pool, "github", "gh_1")

    def listed(*args: str) -> list[str]:
        result = hookline_cli(database_url, "events", "list", *args)
        assert result.returncode == 0, result.stderr
        return [line.split()[2] for line in result.stdout.splitlines()[1:]]

    assert listed() == ["gh_1", "evt_new", "evt_dead"]
    assert listed("--provider", "stripe") == ["evt_new", "evt_dead"]
    assert listed("--status", "dead") == ["evt_dead"]
    assert listed("--since", "2999-01-01T00:00:00Z") == []
    assert listed("--limit", "1") == ["gh_1"]
    bad = hookline_cli(database_url, "events", "list", "--status", "lost")
    assert bad.returncode == 2 and "invalid choice: 'lost'" in bad.stderr


async def test_the_log_keeps_twenty_attempts_of_a_run_and_the_last(pool: asyncpg.Pool) -> None:
    row_id = await receive(pool, "stripe", "evt_many")
    await fail_until_dead(pool, "stripe", "w", 25)
    logged = await pool.fetch("SELECT attempt, outcome FROM hookline.attempts WHERE row_id = $1 ORDER BY attempt",
                              row_id)
    assert [a["attempt"] for a in logged] == [*range(1, 21), 25]
    assert logged[-1]["outcome"] == "dead"


async def test_replay_one_event_by_reference(pool: asyncpg.Pool, database_url: str) -> None:
    row_id = await receive(pool, "stripe", "evt_r")
    await receive(pool, "stripe", "evt_other")
    for event in ("evt_r", "evt_other"):
        await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 12 WHERE event_id = $1", event)

    result = hookline_cli(database_url, "dlq", "replay", "--event", "stripe:evt_r")
    assert (result.returncode, result.stdout.strip()) == (0, "stripe:evt_r: requeued (attempts start again)")
    states = {r["event_id"]: (r["status"], r["attempts"])
              for r in await pool.fetch("SELECT event_id, status, attempts FROM hookline.inbox")}
    assert states == {"evt_r": ("pending", 0), "evt_other": ("dead", 12)}

    again = hookline_cli(database_url, "dlq", "replay", "--event", str(row_id))
    assert again.returncode == 1
    assert "event stripe:evt_r is pending, not dead" in again.stderr
    for ref, message in (("nocolon", "names no event"), ("99999", "no inbox event id 99999")):
        failed = hookline_cli(database_url, "dlq", "replay", "--event", ref)
        assert failed.returncode == 1 and message in failed.stderr, failed.stderr
    mixed = hookline_cli(database_url, "dlq", "replay", "--event", "stripe:evt_r", "--provider", "stripe")
    assert mixed.returncode == 2 and "--event names one inbox event" in mixed.stderr


async def test_deliveries_show_each_answer(pool: asyncpg.Pool, database_url: str) -> None:
    async with pool.acquire() as conn:
        await endpoints.add(conn, "billing", "https://billing.example.com/hooks")
        async with conn.transaction():
            event_id = await outbox.publish(conn, "invoice.paid", {"amount": 42}, aggregate_type="invoice",
                                            aggregate_id="in_1")
    for status, latency in ((503, 120.0), (200, 35.0)):
        [delivery] = await OUTBOX.claim(pool, "billing", 1, "relay-x", 60)
        async with pool.acquire() as conn, conn.transaction():
            if status == 200:
                assert await OUTBOX.complete(conn, [(delivery["id"], delivery["attempts"])], "relay-x")
            else:
                assert await OUTBOX.retry(conn, delivery["id"], delivery["attempts"], "relay-x", 0, "HTTP 503")
            await conn.execute(outbox.query("record_responses"), [delivery["id"]], [status], ["ok"], [latency])

    for ref in (event_id, str(delivery["id"])):
        result = hookline_cli(database_url, "deliveries", "show", ref)
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert out.startswith(f"delivery {delivery['id']} of event {event_id} (invoice.paid) to endpoint billing")
        assert "status:         done" in out and "aggregate:      invoice:in_1" in out
        assert json.loads(out.split("payload:")[1].splitlines()[0]) == {"amount": 42}
        attempts = [line.split() for line in out.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
        assert [(a[0], a[2], a[3], a[4], a[5]) for a in attempts] == [("1", "retry", "relay-x", "503", "120"),
                                                                      ("2", "done", "relay-x", "200", "35")]
    missing = hookline_cli(database_url, "deliveries", "show", "msg_nothing")
    assert missing.returncode == 1 and "no delivery 'msg_nothing'" in missing.stderr


async def test_a_real_worker_logs_each_attempt_of_a_failing_handler(pool: asyncpg.Pool, database_url: str,
                                                                    log_dir: Path) -> None:
    """The batched (event, conn) path of a real worker process: its failures booked inside the
    batch's transaction are logged, with the worker's lease-holder name."""
    await create_effect_tables(pool)
    apply_provider(database_url, "poison", 'signature: {scheme: none}\nhandler: "support.handlers:always_fail"\n'
                   "retry: {maxAttempts: 3, initialDelaySeconds: 0.05, maxDelaySeconds: 0.1}")
    await receive(pool, "poison", "evt_poison", b'{"data": {}}')
    proc = worker(database_url, log_dir, "--provider", "poison")
    try:
        await eventually(lambda: pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = 'evt_poison'"),
                         equals="dead")
    finally:
        proc.stop()
    out = hookline_cli(database_url, "events", "show", "poison", "evt_poison").stdout
    attempts = [line.split() for line in out.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
    assert [(a[0], a[2]) for a in attempts] == [("1", "retry"), ("2", "retry"), ("3", "dead")], out
    assert {a[3] for a in attempts} == {attempts[0][3]} and attempts[0][3].startswith(socket.gethostname())
    assert out.count("KeyError") >= 3


async def test_a_role_with_only_a_tenants_privileges_books_outcomes(pool: asyncpg.Pool) -> None:
    """Tenant worker roles may update the inbox but have no privilege on the attempt log: the
    booking statements log through hookline.log_attempts, which writes it with its owner's rights.
    The role gets exactly a tenant's privileges (hookline.grant_tenant_privileges, migration 0025)."""
    row_id = await receive(pool, "stripe", "evt_tenant")
    [row] = await INBOX.claim(pool, "stripe", 1, "tenant-worker", 60)
    async with pool.acquire() as conn:
        await conn.execute("CREATE ROLE hookline_test_tenant NOLOGIN; "
                           "SELECT hookline.grant_tenant_privileges('hookline_test_tenant')")
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL ROLE hookline_test_tenant")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with conn.transaction():
                        await conn.fetch("SELECT * FROM hookline.attempts")
                assert await INBOX.complete(conn, [(row_id, row["attempts"])], "tenant-worker") == {row_id}
        finally:
            await conn.execute("DROP OWNED BY hookline_test_tenant; DROP ROLE hookline_test_tenant")
    logged = await pool.fetchrow("SELECT worker, outcome FROM hookline.attempts WHERE row_id = $1", row_id)
    assert tuple(logged) == ("tenant-worker", "done")


def events_show_json(database_url: str, provider: str, event_id: str) -> dict[str, Any]:
    result = hookline_cli(database_url, "events", "show", provider, event_id, "-o", "json")
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def milliseconds_between(earlier: str, later: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds() * 1000


async def test_a_real_worker_logs_each_attempts_latency_and_json_shows_it(pool: asyncpg.Pool, database_url: str,
                                                                         log_dir: Path) -> None:
    """Handler time (claim to outcome) of every inbox attempt, on the transactional path (retries,
    then done) and the one-parameter path (batched completions): logged by the booking statements
    of a real worker, printed by `events show` and in its JSON."""
    await create_effect_tables(pool)
    apply_provider(database_url, "flaky", 'signature: {scheme: none}\nhandler: "support.handlers:fail_until_third"\n'
                   "retry: {maxAttempts: 5, initialDelaySeconds: 0.05, maxDelaySeconds: 0.1}")
    apply_provider(database_url, "plain", 'signature: {scheme: none}\nhandler: "support.handlers:external_effect"')
    await receive(pool, "flaky", "evt_flaky", b'{"data": {}}')
    await receive(pool, "plain", "evt_plain", b'{"data": {}}')
    proc = worker(database_url, log_dir)
    try:
        for event in ("evt_flaky", "evt_plain"):
            await eventually(lambda event=event: pool.fetchval(
                "SELECT status FROM hookline.inbox WHERE event_id = $1", event), equals="done")
    finally:
        proc.stop()

    flaky = events_show_json(database_url, "flaky", "evt_flaky")
    assert {"id", "provider", "event_id", "event_type", "status", "attempts", "received_at", "processed_at",
            "last_error", "suspect", "headers", "content_type", "body_bytes", "body_preview",
            "attempt_log"} <= set(flaky)
    assert (flaky["provider"], flaky["event_id"], flaky["status"], flaky["attempts"]) == ("flaky", "evt_flaky",
                                                                                          "done", 3)
    assert flaky["headers"]["Authorization"] == "[redacted]" and flaky["body_preview"] == '{"data": {}}'
    log = flaky["attempt_log"]
    assert [(a["attempt"], a["outcome"]) for a in log] == [(1, "retry"), (2, "retry"), (3, "done")]
    assert "failing attempt 2 on purpose" in log[1]["error"] and log[2]["error"] is None
    [plain] = events_show_json(database_url, "plain", "evt_plain")["attempt_log"]
    assert (plain["attempt"], plain["outcome"]) == (1, "done")
    for attempt in [*log, plain]:
        assert set(attempt) == {"attempt", "at", "outcome", "worker", "http_status", "latency_ms", "error"}
        assert attempt["http_status"] is None  # an inbox attempt has no HTTP answer
        # Claimed after the event arrived, so no attempt can have taken longer than that.
        assert 0 < attempt["latency_ms"] <= milliseconds_between(flaky["received_at"], attempt["at"])

    text = hookline_cli(database_url, "events", "show", "flaky", "evt_flaky").stdout
    rows = [line.split() for line in text.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
    assert [float(r[5]) > 0 for r in rows] == [True, True, True], text


async def test_the_lease_rescuer_logs_an_expired_attempt_with_its_holder_and_latency(pool: asyncpg.Pool) -> None:
    row_id = await receive(pool, "stripe", "evt_stalled")
    [row] = await INBOX.claim(pool, "stripe", 1, "stalled-worker", 60)
    await pool.execute("UPDATE hookline.inbox SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
                       row_id)
    swept = await INBOX.sweep_expired(pool, {"stripe": RetryPolicy(max_attempts=5)})
    assert swept.requeued == {"stripe": 1}
    logged = await pool.fetchrow("SELECT attempt, worker, outcome, error, latency_ms FROM hookline.attempts "
                                 "WHERE queue = 'inbox' AND row_id = $1", row_id)
    assert (logged["attempt"], logged["worker"], logged["outcome"]) == (row["attempts"], "stalled-worker", "expired")
    assert "lease expired during attempt 1 (worker stalled-worker" in logged["error"]
    assert logged["latency_ms"] > 0


async def test_a_real_relay_logs_the_http_status_and_latency_of_every_outcome(pool: asyncpg.Pool,
                                                                             database_url: str,
                                                                             log_dir: Path) -> None:
    """done, retry, dead and parked deliveries through a real relay and a real endpoint: each
    attempt's answer is in its own columns of the log, and `deliveries show -o json` has them."""

    def answer(n: int, received: Received) -> Answer:
        kind = received.body["data"]["kind"]
        if kind == "late":
            return Answer(503 if n == 1 else 200)
        return Answer(410 if kind == "gone" else 500)

    async with TestEndpoint(ENDPOINT_SECRET, answer) as endpoint:
        for name in ("flaky", "gone"):
            added = hookline_cli(database_url, "endpoints", "add", name, "--url", endpoint.url, "--secret",
                                 ENDPOINT_SECRET, "--max-attempts", "2", "--retry-initial-delay", "0.05",
                                 "--retry-max-delay", "0.1")
            assert added.returncode == 0, added.stderr
        published: dict[str, str] = {}
        async with pool.acquire() as conn, conn.transaction():
            for kind, name in (("late", "flaky"), ("broken", "flaky"), ("gone", "gone")):
                published[kind] = await outbox.publish(conn, "invoice.paid", {"kind": kind}, endpoint=name)
        proc = relay(database_url, log_dir, "--allow-private-networks")
        try:
            await eventually(lambda: pool.fetchval(
                  "SELECT array_agg(status ORDER BY endpoint, status) = '{dead,done,parked}' FROM hookline.deliveries"),
                  timeout=60)
        finally:
            proc.stop()

    expected = {"late": [("retry", 503), ("done", 200)], "broken": [("retry", 500), ("dead", 500)],
                "gone": [("parked", 410)]}
    for kind, attempts in expected.items():
        result = hookline_cli(database_url, "deliveries", "show", published[kind], "-o", "json")
        assert result.returncode == 0, result.stderr
        [delivery] = json.loads(result.stdout)["deliveries"]
        assert {"id", "event_id", "event_type", "endpoint", "status", "attempts", "last_status", "last_latency_ms",
                "last_error", "payload_preview", "attempt_log"} <= set(delivery)
        assert delivery["event_id"] == published[kind]
        log = delivery["attempt_log"]
        assert [(a["outcome"], a["http_status"]) for a in log] == attempts, log
        assert all(a["latency_ms"] is not None and a["latency_ms"] > 0 for a in log), log
        assert [a["attempt"] for a in log] == list(range(1, len(attempts) + 1))
