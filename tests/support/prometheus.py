"""prometheus and promtool for the monitoring tests: from PATH, or built once by `make prometheus`
(tests/monitoring/build-prometheus.sh) into ~/.cache/hookline/prometheus/<version>.

``PrometheusServer`` runs a real Prometheus on a free loopback port, scraping static targets once a
second, with its TSDB in a temporary folder; ``query`` goes through its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from hookline.core.embedded import free_port
from support.tools import unavailable
from support.waiting import eventually_sync

# Keep in sync with PROMETHEUS_VERSION in tests/monitoring/build-prometheus.sh: it names the cache folder.
PROMETHEUS_VERSION = "3.16.0"
BINARIES = ("prometheus", "promtool")
ADVICE = (
    "no prometheus/promtool found: install Debian's `prometheus` package, or run `make prometheus` to build "
    "them once (cached in ~/.cache/hookline/prometheus)"
)


def cache_dir() -> Path:
    root = os.environ.get("HOOKLINE_PROMETHEUS_CACHE") or Path.home() / ".cache" / "hookline" / "prometheus"
    return Path(root) / PROMETHEUS_VERSION


def find_binaries() -> dict[str, Path] | None:
    """Both binaries from PATH, else from the build cache; None when either is missing."""
    on_path = {name: shutil.which(name) for name in BINARIES}
    if all(on_path.values()):
        return {name: Path(str(found)) for name, found in on_path.items()}
    cached = {name: cache_dir() / name for name in BINARIES}
    if all(os.access(path, os.X_OK) for path in cached.values()):
        return cached
    return None


def require_binaries() -> dict[str, Path]:
    """The binaries; without them the test is skipped, or fails when HOOKLINE_REQUIRE_PROMETHEUS=1."""
    found = find_binaries()
    if found is None:
        unavailable(ADVICE, "HOOKLINE_REQUIRE_PROMETHEUS")
    return found


class PrometheusError(RuntimeError):
    """Start-up or a query failed; the message says how (and carries the log's tail at start-up)."""


class PrometheusServer:
    """A real Prometheus scraping ``targets`` ({job: [(host:port, labels)]}) every second."""

    def __init__(self, binary: Path, targets: dict[str, list[tuple[str, dict[str, str]]]]) -> None:
        self.binary = binary
        self.targets = targets
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="hookline-prometheus-"))
        self._log = (self._dir / "prometheus.log").open("wb")
        self._process: subprocess.Popen[bytes] | None = None

    def _config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [address], "labels": labels}
                                                     for address, labels in targets]}
                for job, targets in self.targets.items()
            ],
        }

    def start(self, timeout: float = 30.0) -> Self:
        config = self._dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        self._process = subprocess.Popen(
            [str(self.binary), f"--config.file={config}", f"--storage.tsdb.path={self._dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            eventually_sync(self._ready, what="prometheus ready", timeout=timeout, interval=0.2, ignoring=(OSError,))
        except AssertionError as exc:
            raise PrometheusError(f"{exc}:\n{self.logs()}") from None
        return self

    def _ready(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self._process.returncode}:\n{self.logs()}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)

    def logs(self) -> str:
        self._log.flush()
        return (self._dir / "prometheus.log").read_text(errors="replace")[-4000:]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; PromQL errors and warnings raise with Prometheus's message."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{expr}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None
        if answer.get("status") != "success" or answer.get("warnings"):
            raise PrometheusError(f"{expr}: {answer}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
