"""Fixtures for the chart tests that need a real kube-apiserver (tests/envtest).

`chart_apiserver` (session): a bare etcd + kube-apiserver; the chart itself installs the CRD, which is
part of what these tests prove. Separate from tests/operator's `apiserver`, which pre-installs crds/.
Tests that use it are marked `k8s` in their module (`pytest -m "not k8s"` leaves them out).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# tests/ is not a package; make tests/envtest/apiserver.py importable from here.
sys.path.insert(0, str(REPO / "tests" / "envtest"))

from apiserver import ApiServer  # noqa: E402

from support.kube import OWNER_REFERENCES_ENFORCED, require_assets  # noqa: E402


@pytest.fixture(scope="session")
def chart_apiserver() -> Iterator[ApiServer]:
    assets = require_assets()
    with ApiServer(assets, extra_args=[OWNER_REFERENCES_ENFORCED]) as server:
        yield server

