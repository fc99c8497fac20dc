"""Fixtures for the tests that run pods on a real single-node cluster (tests/cluster/README.md).

`cluster` (session): etcd, kube-apiserver, kube-controller-manager, kube-scheduler, CoreDNS, kube-proxy,
containerd and a kubelet on this machine, with the images imported; torn down after the last test of
this folder.
Without the binaries, packages or images the tests are skipped with how to get them, unless
HOOKLINE_REQUIRE_CLUSTER=1 (CI), which makes that a failure. Every test here carries the `cluster` marker.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.tools import unavailable

HERE = Path(__file__).resolve().parent
# tests/ is not a package; make tests/cluster/cluster.py importable from here.
sys.path.insert(0, str(HERE))

from cluster import ENABLE_ADVICE, Cluster, find_parts, missing_parts  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.cluster)


# The running cluster, so that it stops when the session leaves this folder: a session fixture would
# otherwise keep a kubelet, containerd and the control plane running under the rest of the suite.
_running: list[Cluster] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _running and (nextitem is None or HERE not in nextitem.path.parents):
        _running.pop().stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    missing = missing_parts()
    if missing:
        message = f"no local cluster: missing {'; '.join(missing)}. {ENABLE_ADVICE}"
        unavailable(message, "HOOKLINE_REQUIRE_CLUSTER")
    with Cluster(find_parts()) as running:
        _running.append(running)
        yield running  # stopped by pytest_runtest_teardown, or here when the session ends first
