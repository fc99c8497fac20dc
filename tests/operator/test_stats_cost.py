"""200 providers cost one statistics query per operator tick, counted by Postgres itself.

A Postgres of its own with pg_stat_statements loaded (shared_preload_libraries), the real
API server with 200 WebhookProviders, the real operator. Over a window in which every one
of the 200 resources demonstrably refreshed its status from the statistics, Postgres counts
the statements that read hookline.inbox: one per tick (the operator's own counter), not one
per provider and tick.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from apiserver import ApiServer

from hookline.core import migrations
from hookline.core.embedded import EmbeddedPostgres, free_port
from support.cluster import apply, metric
from support.operator import operator_env
from support.processes import ServiceProcess
from support.waiting import eventually

PROVIDERS = 200
INTERVAL = 5.0  # seconds per tick; 200 resources x 4 timers on a shared CI machine
TICKS = 3


def manifest(count: int) -> str:
    return "\n---\n".join(f"""
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: p{i:03d}}}
spec:
  signature: {{scheme: none}}
  destination: {{url: "http://svc.internal/p{i:03d}"}}
""" for i in range(count))


@pytest.fixture
async def counted_database(tmp_path: Path) -> AsyncIterator[str]:
    """A migrated database on a server that records every statement in pg_stat_statements."""
    server = EmbeddedPostgres(tmp_path / "pg")
    url = server.start()
    conn = await asyncpg.connect(url)
    await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    await conn.close()
    server.stop()
    server.start()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION pg_stat_statements")
        await migrations.migrate(conn)
    finally:
        await conn.close()
    try:
        yield url
    finally:
        server.stop("immediate")


async def inbox_statements(conn: asyncpg.Connection) -> dict[str, int]:
    """Executions per statement that reads or writes hookline.inbox, except this test's own."""
    rows = await conn.fetch("SELECT query, calls FROM pg_stat_statements "
                            "WHERE query LIKE '%hookline.inbox%' AND query NOT LIKE '%test: %'")
    return {r["query"]: int(r["calls"]) for r in rows}


def statuses(apiserver: ApiServer, namespace: str) -> list[dict[str, object]]:
    out = apiserver.kubectl("get", "whp", "-n", namespace, "-o", "json").stdout
    return [item.get("status", {}) for item in json.loads(out)["items"]]


def ready_count(apiserver: ApiServer, namespace: str) -> int:
    return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions", []))  # type: ignore[attr-defined]
               for s in statuses(apiserver, namespace))


@pytest.mark.timeout(1500)
async def test_two_hundred_providers_cost_one_statistics_query_per_tick(apiserver, namespace, counted_database,
                                                                       log_dir) -> None:
    apply(apiserver, namespace, manifest(PROVIDERS))
    port = free_port()
    operator = ServiceProcess(
        ["operator", "--namespace", namespace, "--liveness", f"http://127.0.0.1:{port}/healthz",
         "--interval", str(INTERVAL)],
        counted_database, log_dir, port=port,
        env=operator_env(apiserver, [namespace], log_dir),
    ).start("/healthz", timeout=60)
    conn = await asyncpg.connect(counted_database)
    try:
        # Generous: creating 200 providers' Secrets, roles and Deployments on a loaded 2-core box.
        await eventually(lambda: ready_count(apiserver, namespace) == PROVIDERS, timeout=900,
                         what=f"{PROVIDERS} providers Ready")
        # One dead event per provider (this test's statements are tagged and not counted).
        await conn.execute("/* test: */ INSERT INTO hookline.inbox (provider, event_id, body, status) "
                           "SELECT 'p' || lpad(i::text, 3, '0'), 'e', '\\x'::bytea, 'dead' "
                           "FROM generate_series(0, $1 - 1) AS i", PROVIDERS)
        await conn.execute("SELECT pg_stat_statements_reset()")
        ticks_before = metric(operator.url, "hookline_operator_stats_queries_total")
        before = await inbox_statements(conn)

        # Every resource shows its own dead letter: all 200 read the statistics in this window.
        await eventually(lambda: [s.get("deadLetters") for s in statuses(apiserver, namespace)] == [1] * PROVIDERS,
                         timeout=120, what="every provider's deadLetters = 1")
        ticks_target = ticks_before + TICKS
        await eventually(lambda: metric(operator.url, "hookline_operator_stats_queries_total") >= ticks_target,
                         timeout=120, what=f"{TICKS} more ticks")
        after = await inbox_statements(conn)
        ticks = metric(operator.url, "hookline_operator_stats_queries_total") - ticks_before
    finally:
        await conn.close()
        operator.stop()

    executed = {q: n - before.get(q, 0) for q, n in after.items() if n - before.get(q, 0)}
    stats_calls = sum(n for q, n in executed.items() if "FULL JOIN dead USING (provider)" in q)
    # The counter moves just before each query runs, so at each end of the window one tick may
    # be counted on one side and not yet on the other.
    assert ticks - 1 <= stats_calls <= ticks + 1, (stats_calls, ticks)
    assert ticks >= TICKS
    # Nothing else touched the inbox: no per-provider statement hides behind the one query.
    assert sum(executed.values()) == stats_calls, executed
