"""Shared benchmark plumbing: a throwaway embedded Postgres, pgbench, percentiles, service processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from hookline.core import migrations, secrets_at_rest
from hookline.core.embedded import EmbeddedPostgres, binary, free_port


class BenchDatabase:
    """An embedded Postgres in a temp dir with a migrated ``hookline`` database."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="hookline-bench-")
        self.server = EmbeddedPostgres(Path(self.tmp.name))
        self.url = ""

    async def start(self) -> str:
        # Providers' secrets are sealed at rest: a throwaway key for this run unless one is configured
        # (the environment is inherited by every service the benchmark starts).
        if not os.environ.get(secrets_at_rest.KEYS_FILE_ENV, "").strip():
            keys = Path(self.tmp.name) / "secret-keys"
            secrets_at_rest.write_new_keys_file(keys)
            os.environ[secrets_at_rest.KEYS_FILE_ENV] = str(keys)
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
    done = subprocess.run(
        [str(binary("pgbench")), "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
         "-T", str(seconds), "-f", f.name, url],
        capture_output=True, text=True, check=False,
    )
    os.unlink(f.name)
    match = re.search(r"tps = ([\d.]+)", done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed:\n{done.stdout}\n{done.stderr[-2000:]}")
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


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each service, then wait for it (15 s, then SIGKILL)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- What a Hookline process costs under load ----------------------------------------------------------

def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a receiver with --processes N is a supervisor and N children)."""
    found = [pid]
    for tid in _listdir(f"/proc/{pid}/task"):
        for child in _read(f"/proc/{pid}/task/{tid}/children").split():
            found += process_tree(int(child))
    return found


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (e.g. the postmaster of a backend, from ``pg_backend_pid()``)."""
    return int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (Linux); 0 once it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident set size of one process in MB (Linux); 0 once it is gone."""
    match = re.search(r"VmRSS:\s+(\d+) kB", _read(f"/proc/{pid}/status"))
    return int(match.group(1)) / 1024 if match else 0.0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class Usage:
    """Samples the RSS of every process below ``roots`` while a phase runs (the largest seen per
    process) and sums their CPU time over the phases between ``start()`` and ``stop()``."""

    def __init__(self, roots: list[int], interval: float = 0.25) -> None:
        self.roots = roots
        self.interval = interval
        self.peak_rss: dict[int, float] = {}
        self.cpu = 0.0
        self._cpu_at_start: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    def pids(self) -> list[int]:
        return [pid for root in self.roots for pid in process_tree(root)]

    def start(self) -> None:
        self._cpu_at_start = {pid: cpu_seconds(pid) for pid in self.pids()}
        self._task = asyncio.create_task(self._sample())

    def rebase(self) -> None:
        """Count CPU from now on (e.g. once start-up is over and the measured work began)."""
        self._cpu_at_start = {pid: cpu_seconds(pid) for pid in self.pids()}

    async def stop(self) -> None:
        """End the phase (call while the processes still run): its CPU time is added up."""
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sample_once()
        self.cpu += sum(cpu_seconds(pid) - self._cpu_at_start.get(pid, 0.0) for pid in self.pids())

    def _sample_once(self) -> None:
        for pid in self.pids():
            self.peak_rss[pid] = max(self.peak_rss.get(pid, 0.0), rss_mb(pid))

    async def _sample(self) -> None:
        while True:
            self._sample_once()
            await asyncio.sleep(self.interval)

    @property
    def max_rss(self) -> float:
        return max(self.peak_rss.values(), default=0.0)

    def describe_rss(self) -> str:
        return ", ".join(f"{mb:.0f}" for mb in self.peak_rss.values()) + " MB"


async def checkpoint(url: str) -> None:
    """Flush dirty buffers now, so a checkpoint does not land in one phase of a comparison and not the other."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


def record(path: str | None, benchmark: str, name: str, value: float, target: str, unit: str = "") -> None:
    """Append one measured figure for ``make bench``'s summary table (no-op without ``--results``)."""
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"benchmark": benchmark, "name": name, "value": value, "target": target,
                                  "unit": unit}) + "\n")


__all__ = ["BenchDatabase", "Usage", "checkpoint", "cpu_seconds", "free_port", "percentile", "pgbench",
           "process_tree", "record", "rss_mb", "start_service", "stop_all"]
