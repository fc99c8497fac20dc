"""The embedded Postgres of ``hookline dev`` and the tests: it trusts nobody, and it touches the
permissions of nothing outside its data directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import asyncpg
import pytest

from hookline.core.embedded import (
    OWNER_PID_FILE,
    PASSWORD_FILE,
    EmbeddedPostgres,
    ServerInUse,
    free_port,
    install_dir,
)

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


@pytest.mark.skipif(os.geteuid() != 0, reason="the binaries are copied only for the system user root runs Postgres as")
async def test_as_root_binaries_under_a_private_directory_are_run_from_a_copy(tmp_path: Path) -> None:
    """A checkout in root's home (mode 0700) or a `mktemp -d`: the system user cannot traverse to
    the virtualenv's binaries. They are copied once, root-owned and closed to writers, and reused."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    # The wheel's layout: the package's pginstall/ and, beside the package, its shared libraries.
    wheel = install_dir().parent
    install = private / "site-packages" / wheel.name / "pginstall"
    shutil.copytree(install_dir(), install, symlinks=True)
    shutil.copytree(wheel.parent / f"{wheel.name}.libs", private / "site-packages" / f"{wheel.name}.libs")
    before = modes(tmp_path, private, install)
    servers = [EmbeddedPostgres(tmp_path / f"data-{n}", install=install) for n in range(2)]
    try:
        for server in servers:
            conn = await asyncpg.connect(server.start())
            assert await conn.fetchval("SELECT 1") == 1
            await conn.close()
        # Both ran from the same copy, outside the private directory, which nobody opened up.
        copies = {Path(os.readlink(f"/proc/{postmaster_pid(s)}/exe")).parents[1] for s in servers}
        assert len(copies) == 1
        [copy] = copies
        assert private not in copy.parents and copy.stat().st_uid == 0
        assert copy.stat().st_mode & 0o022 == 0
        assert modes(tmp_path, private, install) == before
    finally:
        for server in servers:
            server.stop("immediate")


# Starts a server in DATA_DIR on PORT, says so, then waits to be killed without stopping it.
OWNER = """
import sys, time
from hookline.core.embedded import EmbeddedPostgres
EmbeddedPostgres(sys.argv[1], port=int(sys.argv[2])).start()
print("started", flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process that nobody has reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.pgdata / "postmaster.pid").read_text().split()[0])


async def test_a_server_left_by_a_killed_process_is_stopped_and_one_still_in_use_is_not(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    owner = await asyncio.create_subprocess_exec(sys.executable, "-c", OWNER, str(data_dir), str(port),
                                                 stdout=asyncio.subprocess.PIPE)
    try:
        assert owner.stdout is not None and (await owner.stdout.readline()).strip() == b"started"
        server = EmbeddedPostgres(data_dir, port=port)  # as the next `hookline dev` would
        orphan = postmaster_pid(server)
        # Its owner still runs: the server is not ours to stop, and the error says whose it is.
        with pytest.raises(ServerInUse, match=f"process {owner.pid}"):
            server.start()
        conn = await asyncpg.connect(server.url)  # untouched
        await conn.close()
        owner.kill()  # as a closed terminal or kill -9 would: the server outlives it
        await owner.wait()
        url = server.start()
        assert postmaster_pid(server) != orphan and not running(orphan)
        conn = await asyncpg.connect(url)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
    finally:
        if owner.returncode is None:
            owner.kill()
            await owner.wait()
        EmbeddedPostgres(data_dir, port=port).stop("immediate")
    assert not (data_dir / OWNER_PID_FILE).exists()
