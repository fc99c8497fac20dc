"""Shared benchmark plumbing: a throwaway embedded Postgres, pgbench, percentiles, service processes."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from hookline.core import migrations
from hookline.core.embedded import EmbeddedPostgres, binary, free_port


class BenchDatabase:
    """An embedded Postgres in a temp dir with a migrated ``hookline`` database."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="hookline-bench-")
        self.server = EmbeddedPostgres(Path(self.tmp.name))
        self.url = ""

    async def start(self) -> str:
        await asyncio.to_thread(self.server.start)
        conn = await asyncpg.connect(self.server.url)
        await conn.execute("CREATE DATABASE hookline")
        await conn.close()
        self.url = self.server.url_for("hookline")
        conn = await asyncpg.connect(self.url)
        await migrations.migrate(conn)
        await conn.close()
        return self.url

    def stop(self) -> None:
        self.server.stop("immediate")
        self.tmp.cleanup()


def pgbench(url: str, script: str, *, clients: int, seconds: int, threads: int = 2) -> float:
    """Run a custom pgbench script; return transactions per second (excluding connection time)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o644)
    out = subprocess.run(
        [str(binary("pgbench")), "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
         "-T", str(seconds), "-f", f.name, url],
        capture_output=True, text=True, check=True,
    ).stdout
    os.unlink(f.name)
    match = re.search(r"tps = ([\d.]+)", out)
    if not match:
        raise RuntimeError(f"unexpected pgbench output:\n{out}")
    return float(match.group(1))


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def start_service(args: list[str], url: str, port: int | None = None, log: Path | None = None
                  ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HOOKLINE_DATABASE_URL": url, "HOOKLINE_LOG_FORMAT": "text",
           "HOOKLINE_LOG_LEVEL": "WARNING"}
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "hookline", *args], env=env, stdout=out, stderr=out)
    if port:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    return proc
            except OSError:
                time.sleep(0.1)
        proc.kill()
        raise RuntimeError(f"{args} did not become ready")
    return proc


__all__ = ["BenchDatabase", "free_port", "percentile", "pgbench", "start_service"]
