"""Trace context end to end, across real processes: a sender's traceparent is continued by the
receiver's span, the worker's handler span is its child, the outbox event published in the handler
stores the handler span's context, the relay's delivery span is its child, and the endpoint receives
the delivery span's traceparent. The processes export with the SDK's console exporter (chosen by the
standard OTEL_TRACES_EXPORTER) into their logs, which the test parses. Without tracing (the extra
missing, or OTEL_SDK_DISABLED) nothing is stored or sent."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from hookline.core.embedded import free_port
from support.endpoints import TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.processes import ServiceProcess, hookline_cli, relay, worker
from support.waiting import eventually

SECRET = "whsec_" + base64.b64encode(b"trace-context-endpoint-secret!!").decode()
EXPORT_TO_LOGS = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def exported_spans(logs: str) -> list[dict[str, Any]]:
    """The spans the console exporter wrote (pretty-printed JSON objects) among the log lines."""
    decoder = json.JSONDecoder()
    spans, position = [], 0
    while (start := logs.find("{\n", position)) >= 0:
        try:
            found, position = decoder.raw_decode(logs, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        if isinstance(found, dict) and "context" in found and "name" in found:
            spans.append(found)
    return spans


def the_span(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    named = [s for s in spans if s["name"] == name]
    assert len(named) == 1, f"{name}: {named}"
    return named[0]


def hex_id(value: str) -> str:
    return value.removeprefix("0x")


async def run_pipeline(database_url: str, pool: asyncpg.Pool, log_dir: Path, env: dict[str, str],
                       traceparent: str | None) -> tuple[TestEndpoint, list[ServiceProcess]]:
    """Receiver, worker (a handler that publishes to the outbox) and relay; one event sent with
    ``traceparent``; returns once the endpoint has the outbox event, with the processes stopped."""
    await create_effect_tables(pool)
    apply_provider(database_url, "orders", 'signature: {scheme: none}\nhandler: "support.handlers:publish_shipped"')
    procs: list[ServiceProcess] = []
    async with TestEndpoint(SECRET) as endpoint:
        added = hookline_cli(database_url, "endpoints", "add", "partner", "--url", endpoint.url, "--secret", SECRET)
        assert added.returncode == 0, added.stderr
        try:
            port = free_port()
            ours = ServiceProcess(["receiver", "--host", "127.0.0.1", "--port", str(port)], database_url, log_dir,
                                  port=port, env=env).start("/readyz")
            procs += [ours, worker(database_url, log_dir, env=env),
                      relay(database_url, log_dir, "--allow-private-networks", env=env)]
            headers = {"traceparent": traceparent} if traceparent else {}
            async with aiohttp.ClientSession() as http, http.post(
                    f"{ours.url}/webhooks/orders", data=json.dumps({"id": "ord_1", "type": "order.paid"}),
                    headers=headers) as answer:
                assert answer.status == 200, await answer.text()
            await eventually(lambda: endpoint.delivered(), timeout=60)
        finally:
            for p in procs:
                p.stop()  # a clean exit flushes the spans still batched
    return endpoint, procs


@pytest.mark.asyncio(loop_scope="session")
async def test_one_trace_from_the_sender_to_the_endpoint(database_url: str, pool: asyncpg.Pool,
                                                         log_dir: Path) -> None:
    trace_id, sender_span = secrets.token_hex(16), secrets.token_hex(8)
    endpoint, procs = await run_pipeline(database_url, pool, log_dir, EXPORT_TO_LOGS,
                                         f"00-{trace_id}-{sender_span}-01")
    spans = exported_spans("".join(p.logs() for p in procs))
    receive, handle, deliver = (the_span(spans, n) for n in ("hookline.receive", "hookline.handle",
                                                              "hookline.deliver"))
    assert {hex_id(s["context"]["trace_id"]) for s in (receive, handle, deliver)} == {trace_id}
    assert hex_id(receive["parent_id"]) == sender_span
    assert hex_id(handle["parent_id"]) == hex_id(receive["context"]["span_id"])
    assert hex_id(deliver["parent_id"]) == hex_id(handle["context"]["span_id"])
    assert (receive["kind"], handle["kind"], deliver["kind"]) == ("SpanKind.SERVER", "SpanKind.CONSUMER",
                                                                  "SpanKind.CLIENT")
    assert receive["resource"]["attributes"]["service.name"] == "hookline-receiver"
    assert handle["attributes"]["hookline.provider"] == "orders"
    assert deliver["attributes"]["hookline.endpoint"] == "partner"

    stored = await pool.fetchval("SELECT traceparent FROM hookline.outbox")
    assert stored == f"00-{trace_id}-{hex_id(handle['context']['span_id'])}-01"
    [delivered] = endpoint.delivered()
    assert delivered.headers["traceparent"] == f"00-{trace_id}-{hex_id(deliver['context']['span_id'])}-01"


@pytest.mark.asyncio(loop_scope="session")
async def test_without_tracing_nothing_is_stored_or_sent(database_url: str, pool: asyncpg.Pool,
                                                         log_dir: Path) -> None:
    env = {**EXPORT_TO_LOGS, "OTEL_SDK_DISABLED": "true"}
    endpoint, procs = await run_pipeline(database_url, pool, log_dir, env, f"00-{'ab' * 16}-{'cd' * 8}-01")
    assert exported_spans("".join(p.logs() for p in procs)) == []
    assert await pool.fetchval("SELECT traceparent FROM hookline.outbox") is None
    assert "traceparent" not in endpoint.delivered()[0].headers


def test_without_the_extra_tracing_is_a_no_op() -> None:
    """opentelemetry made unimportable: the module loads, and spans are None."""
    probe = """
import sys
sys.modules["opentelemetry"] = None
from hookline.core import tracing
assert not tracing.available()
assert tracing.setup("worker") is False
with tracing.span("x", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01") as traceparent:
    assert traceparent is None
assert tracing.current_traceparent() is None
print("no-op")
"""
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **EXPORT_TO_LOGS}, capture_output=True,
                          text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "no-op"), done.stderr


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("malformed", ["00-not-a-trace-id-zz-01",
                                       f"00-{'0' * 32}-{'0' * 16}-01",  # all-zero ids: invalid by the spec
                                       f"00-{'ab' * 16}-{'cd' * 8}-01-trailing;junk"])
async def test_a_malformed_traceparent_is_ignored_and_a_new_trace_started(database_url: str, pool: asyncpg.Pool,
                                                                         log_dir: Path, malformed: str) -> None:
    """Tracing on, a sender's traceparent that is not one: the event is accepted and processed as
    any other, the receiver starts a new trace (its span has no parent) that the worker and relay
    continue, the stored event is intact, and no process logs an error about it."""
    endpoint, procs = await run_pipeline(database_url, pool, log_dir, EXPORT_TO_LOGS, malformed)
    logs = "".join(p.logs() for p in procs)
    spans = exported_spans(logs)
    receive, handle, deliver = (the_span(spans, n) for n in ("hookline.receive", "hookline.handle",
                                                              "hookline.deliver"))
    assert receive["parent_id"] is None
    trace_id = hex_id(receive["context"]["trace_id"])
    assert len(trace_id) == 32 and int(trace_id, 16) != 0 and trace_id not in malformed
    assert {hex_id(s["context"]["trace_id"]) for s in (handle, deliver)} == {trace_id}
    assert hex_id(handle["parent_id"]) == hex_id(receive["context"]["span_id"])
    assert hex_id(deliver["parent_id"]) == hex_id(handle["context"]["span_id"])

    stored = await pool.fetchrow("SELECT provider, event_id, status, attempts, body, headers FROM hookline.inbox")
    assert (stored["provider"], stored["event_id"], stored["status"], stored["attempts"]) == ("orders", "ord_1",
                                                                                            "done", 1)
    assert json.loads(stored["body"]) == {"id": "ord_1", "type": "order.paid"}
    # The header stored (and continued by the worker) is the receiver's own, never the malformed one.
    assert stored["headers"]["traceparent"].startswith(f"00-{trace_id}-{hex_id(receive['context']['span_id'])}-")
    assert await pool.fetchval("SELECT count(*) FROM test_effects") == 1
    assert len(endpoint.delivered()) == 1
    assert "Traceback" not in logs and '"level": "error"' not in logs
