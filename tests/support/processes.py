"""Real Hookline processes for tests: started with the real CLI, stopped with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hookline.core.embedded import free_port
from support.waiting import eventually_sync

# Worker processes import test handlers from tests/support.
TESTS_DIR = str(Path(__file__).resolve().parent.parent)


class ServiceProcess:
    """``python -m hookline <args>`` with HOOKLINE_DATABASE_URL set, logging to a file."""

    def __init__(self, args: list[str], database_url: str, log_dir: Path, *, port: int | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.args = args
        self.cwd = cwd
        self.port = port
        self.log_path = log_dir / f"{args[0]}-{time.monotonic_ns()}.log"
        self.env = {**os.environ, "HOOKLINE_DATABASE_URL": database_url, "HOOKLINE_LOG_FORMAT": "text",
                    "PYTHONPATH": TESTS_DIR, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_path: str | None = "/healthz", timeout: float = 30.0) -> ServiceProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "hookline", *self.args], env=self.env, cwd=self.cwd,
                                     stdout=log, stderr=subprocess.STDOUT)
        if wait_path and self.port:
            try:
                eventually_sync(lambda: self._answers(wait_path), what=f"{self.args} answering {wait_path}",
                                timeout=timeout, ignoring=(OSError,))
            except AssertionError as exc:
                raise RuntimeError(f"{exc}:\n{self.logs()}") from None
        return self

    def _answers(self, path: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.args} exited with {self.proc.returncode}:\n{self.logs()}")
        with urllib.request.urlopen(self.url + path, timeout=1) as r:
            return bool(r.status == 200)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def worker(database_url: str, log_dir: Path, *extra: str, env: dict[str, str] | None = None,
           wait: bool = True) -> ServiceProcess:
    """A worker process, started and (``wait``) healthy; a worker meant to die by itself may do so
    before its health check is answered, so it is not waited for."""
    port = free_port()
    return ServiceProcess(["worker", "--port", str(port), "--host", "127.0.0.1", *extra], database_url, log_dir,
                          port=port, env=env).start("/healthz" if wait else None)


def receiver(database_url: str, log_dir: Path, *extra: str) -> ServiceProcess:
    port = free_port()
    return ServiceProcess(["receiver", "--host", "127.0.0.1", "--port", str(port), *extra],
                          database_url, log_dir, port=port).start("/readyz")


def relay(database_url: str, log_dir: Path, *extra: str, env: dict[str, str] | None = None) -> ServiceProcess:
    port = free_port()
    return ServiceProcess(["relay", "--host", "127.0.0.1", "--port", str(port), "--poll-interval", "0.2", *extra],
                          database_url, log_dir, port=port, env=env).start("/readyz")


def console(database_url: str, log_dir: Path, *extra: str, env: dict[str, str] | None = None) -> ServiceProcess:
    port = free_port()
    return ServiceProcess(["console", "--host", "127.0.0.1", "--port", str(port), *extra],
                          database_url, log_dir, port=port, env=env).start("/readyz")


def hookline_cli(database_url: str, *args: str, stdin: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a one-shot ``hookline`` command and return its result (never raises on failure); ``env``:
    more of the environment (None for a name: not set)."""
    environ = {**os.environ, "HOOKLINE_DATABASE_URL": database_url, "HOOKLINE_LOG_FORMAT": "text",
               "PYTHONPATH": TESTS_DIR, **(env or {})}
    return subprocess.run([sys.executable, "-m", "hookline", *args], env=environ, input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)
