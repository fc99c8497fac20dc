"""The operator process over TLS to Postgres (issue 27): its pool and lease connection verify-full, on
the server's side in pg_stat_ssl; a wrong CA ends it at once with the CLI's one line, not kopf's
retries of a failed startup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from apiserver import ApiServer

from support.operator import operator_env, start_operator
from support.processes import ServiceProcess, hookline_cli
from support.tls import PASSWORD_ROLE, TLSServer, tls_server
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    server = tls_server(tmp_path_factory.mktemp("tls"))
    migrated = hookline_cli(server.password_url(), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    try:
        yield server
    finally:
        server.server.stop("immediate")


async def test_the_operator_connects_over_verify_full(apiserver: ApiServer, namespace: str, tls: TLSServer,
                                                      log_dir: Path) -> None:
    operator = start_operator(apiserver, [namespace], tls.password_url(), log_dir)
    try:
        admin = await asyncpg.connect(tls.superuser_url())
        try:
            async def sessions() -> list[asyncpg.Record]:
                rows = await admin.fetch("""
                    SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename = $1""",
                    PASSWORD_ROLE)
                return rows if len(rows) >= 2 else []

            # Its pool and its maintainer's lease connection (pools.OPERATOR counts both).
            found = await eventually(sessions, what="two operator sessions", timeout=30)
            assert all(row["ssl"] for row in found), found
        finally:
            await admin.close()
    finally:
        operator.stop()


async def test_a_wrong_ca_ends_the_operator_with_one_line(apiserver: ApiServer, namespace: str, tls: TLSServer,
                                                    log_dir: Path) -> None:
    operator = ServiceProcess(["operator", "--namespace", namespace], tls.password_url(ca=tls.other_ca), log_dir,
                              env=operator_env(apiserver, [namespace], log_dir)).start(None)
    try:
        assert operator.proc is not None
        assert operator.proc.wait(60) == 2
    finally:
        operator.stop()
    lines = [line for line in operator.logs().splitlines() if line.startswith("hookline: ")]
    assert len(lines) == 1, operator.logs()
    assert "certificate verify failed" in lines[0] and f"sslrootcert {tls.other_ca}" in lines[0], lines[0]
    assert tls.password not in operator.logs()
