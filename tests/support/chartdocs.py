"""The chart README, ``charts/hookline/README.md``, as helm-docs writes it from ``README.md.gotmpl`` and
the ``# --`` comments in ``values.yaml``. ``make chart-docs`` writes it; tests/chart/test_chart_docs.py
fails when the file and what helm-docs writes disagree.

helm-docs is compiled once by tests/chart/build-helm-docs.sh (``make helm-docs``, part of ``make test``)
into ~/.cache/hookline/helm-docs/<version>. Only that pinned version is used, never one from PATH:
another version may lay the table out differently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support.tools import unavailable

# Keep in sync with HELM_DOCS_VERSION in tests/chart/build-helm-docs.sh: it names the cache folder.
HELM_DOCS_VERSION = "1.14.2"
CHART = Path(__file__).resolve().parents[2] / "charts" / "hookline"
README_TEMPLATE = "README.md.gotmpl"
ADVICE = (
    "no helm-docs found: run `make helm-docs` to build it once (cached in ~/.cache/hookline/helm-docs), "
    "or point HOOKLINE_HELM_DOCS_CACHE at a folder holding <version>/helm-docs"
)


def find_binary() -> Path | None:
    root = os.environ.get("HOOKLINE_HELM_DOCS_CACHE") or Path.home() / ".cache" / "hookline" / "helm-docs"
    binary = Path(root) / HELM_DOCS_VERSION / "helm-docs"
    return binary if os.access(binary, os.X_OK) else None


def require_binary() -> Path:
    """helm-docs; without it the test is skipped, or fails when HOOKLINE_REQUIRE_K8S=1 (CI), which
    covers every Kubernetes tool built from the Go module proxy."""
    binary = find_binary()
    if binary is None:
        unavailable(ADVICE, "HOOKLINE_REQUIRE_K8S")
    return binary


def render(binary: Path, template: str | None = None, chart: Path = CHART) -> str:
    """What helm-docs writes for ``chart`` from ``template`` (default: the chart's README.md.gotmpl),
    run on a copy of the chart so that nothing in the working tree changes."""
    with tempfile.TemporaryDirectory(prefix="hookline-chart-docs-") as tmp:
        copy = Path(tmp) / chart.name
        shutil.copytree(chart, copy)
        template_file = README_TEMPLATE
        if template is not None:
            template_file = "hookline-test.gotmpl"
            (copy / template_file).write_text(template)
        (copy / "README.md").unlink(missing_ok=True)
        done = subprocess.run(
            [str(binary), "--chart-search-root", str(copy), "--template-files", template_file,
             "--output-file", "README.md", "--sort-values-order", "file", "--log-level", "warning"],
            capture_output=True, text=True)
        if done.returncode != 0 or not (copy / "README.md").exists():
            raise RuntimeError(f"helm-docs failed (exit {done.returncode}): {done.stderr.strip()}")
        return (copy / "README.md").read_text()


def main() -> None:
    binary = find_binary()
    if binary is None:
        sys.exit(ADVICE)
    (CHART / "README.md").write_text(render(binary))
    print(f"wrote {CHART / 'README.md'} with helm-docs {HELM_DOCS_VERSION}")


if __name__ == "__main__":
    main()
