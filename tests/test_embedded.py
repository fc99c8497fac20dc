"""The embedded Postgres of ``hookline dev`` and the tests: it trusts nobody, and it touches the
permissions of nothing outside its data directory."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from hookline.core.embedded import PASSWORD_FILE, EmbeddedPostgres

pytestmark = pytest.mark.asyncio(loop_scope="session")


def modes(*paths: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in paths}


async def test_a_password_is_required_and_no_outside_permission_changes(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # a parent the server's user (as root: another user) cannot traverse
    data_dir = private / "data"
    before = modes(tmp_path, private, Path(tmp_path.anchor))
    server = EmbeddedPostgres(data_dir)
    url = server.start()
    try:
        assert modes(tmp_path, private, Path(tmp_path.anchor)) == before
        assert (data_dir / PASSWORD_FILE).stat().st_mode & 0o077 == 0
        conn = await asyncpg.connect(url)
        assert await conn.fetchval("SELECT current_user") == "postgres"
        await conn.close()
        without_password = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
            await asyncpg.connect(without_password, password="")
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(url.replace(server.password, "guess"))
        hba = [line for line in (server.pgdata / "pg_hba.conf").read_text().splitlines()
               if line.strip() and not line.lstrip().startswith("#")]
        assert hba and not any("trust" in line for line in hba)
    finally:
        server.stop("immediate")
    # A second instance on the same data dir finds the same cluster and password (hookline dev restarts).
    again = EmbeddedPostgres(data_dir, port=server.port)
    try:
        conn = await asyncpg.connect(again.start())
        await conn.close()
    finally:
        again.stop("immediate")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
async def test_as_root_the_server_runs_without_root_groups(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "data")
    server.start()
    try:
        pid = int((server.pgdata / "postmaster.pid").read_text().split()[0])
        status = Path(f"/proc/{pid}/status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        groups = next(line.split()[1:] for line in status.splitlines() if line.startswith("Groups:"))
        assert uid != "0"
        assert "0" not in groups
    finally:
        server.stop("immediate")
