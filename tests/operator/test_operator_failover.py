"""The operator across a real failover (pg_auto_failover, tests/support/ha.py): its statistics resume
on the new primary, through the multi-host URL, with nothing restarted."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from apiserver import ApiServer

from support.cluster import apply, get
from support.ha import Formation
from support.inbox import insert_events
from support.operator import start_operator
from support.processes import hookline_cli
from support.waiting import eventually

pytestmark = pytest.mark.asyncio

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: failover}
spec:
  signature: {scheme: standard-webhooks}
  destination: {url: "http://payments.internal/hooks"}
  workers: {minReplicas: 0, maxReplicas: 2, targetBacklogPerReplica: 1000}
"""


async def _backlog(apiserver: ApiServer, namespace: str) -> int | None:
    status = get(apiserver, namespace, "whp", "failover").get("status") or {}
    backlog = status.get("backlog")
    return int(backlog) if backlog is not None else None


async def test_the_operators_stats_resume_on_the_new_primary(apiserver: ApiServer, namespace: str,
                                                           formation: Formation, log_dir: Path) -> None:
    migrated = hookline_cli(formation.url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    operator = start_operator(apiserver, [namespace], formation.url, log_dir)
    try:
        apply(apiserver, namespace, PROVIDER)
        await eventually(lambda: get(apiserver, namespace, "deployment", "failover-worker"), what="workers")
        conn = await asyncpg.connect(formation.url)
        try:
            await insert_events(conn, "failover", 100)
        finally:
            await conn.close()
        await eventually(lambda: _backlog(apiserver, namespace), equals=100, what="backlog 100 in status")

        old = formation.kill_primary()
        formation.wait_for_new_primary(old)
        conn = await asyncpg.connect(formation.url)
        try:
            await insert_events(conn, "failover", 50)
        finally:
            await conn.close()
        # Counted on the new primary: the operator's pool reconnected there by itself.
        await eventually(lambda: _backlog(apiserver, namespace), equals=150, timeout=120,
                         what="backlog 150 in status after the failover")
        assert operator.proc is not None and operator.proc.poll() is None  # never restarted
    finally:
        operator.stop()
