"""A real PgBouncer (Debian's /usr/sbin/pgbouncer) in front of a test Postgres, for tests/test_pooler.py.

Clients log in with scram-sha-256 against an auth_file; PgBouncer logs in to Postgres as the same user
with the same password. Every database of the server is reachable by name (the ``*`` fallback). As
root, it runs as the embedded server's system user (core/embedded.py), as PgBouncer refuses root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from hookline.core import embedded
from hookline.core.embedded import free_port
from support.engines import pgbouncer
from support.waiting import eventually_sync


class PgBouncer:
    """``with PgBouncer(server_url, "transaction") as bouncer``; ``bouncer.url_for(database_url)``."""

    def __init__(self, server_url: str, pool_mode: str, *, pool_size: int = 20) -> None:
        self.binary = pgbouncer()  # skips (or fails, as CI requires) when PgBouncer is not installed
        parts = urlsplit(server_url)
        self.user = unquote(parts.username or "postgres")
        # The server may trust us; PgBouncer's clients must still prove a password.
        self.password = unquote(parts.password or "") or "bouncer-test-password"
        self.server_host, self.server_port = parts.hostname or "127.0.0.1", parts.port or 5432
        self.pool_mode, self.pool_size = pool_mode, pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hookline-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url_for(self, database_url: str) -> str:
        """``database_url``'s database and user, through PgBouncer."""
        parts = urlsplit(database_url)
        netloc = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def _write_config(self) -> Path:
        (self.dir / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        config = self.dir / "pgbouncer.ini"
        config.write_text(f"""[databases]
* = host={self.server_host} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {self.dir / "userlist.txt"}
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 1000
logfile = {self.dir / "pgbouncer.log"}
""")
        return config

    def start(self) -> PgBouncer:
        config = self._write_config()
        command = [str(self.binary), str(config)]
        if os.geteuid() == 0:
            embedded._ensure_user(embedded.SYSTEM_USER)
            shutil.chown(self.dir, embedded.SYSTEM_USER)
            for path in self.dir.iterdir():
                shutil.chown(path, embedded.SYSTEM_USER)
            command[1:1] = ["-u", embedded.SYSTEM_USER]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        eventually_sync(self._listening, what="pgbouncer listening", timeout=15, ignoring=(OSError,))
        return self

    def _listening(self) -> bool:
        import socket

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log()}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
