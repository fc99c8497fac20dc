"""Fixtures for tests against a real kube-apiserver (see tests/envtest/README.md).

`apiserver` (session): etcd + kube-apiserver with the CRDs from crds/ installed and Established.
`namespace` (function): a fresh namespace per test, so tests never see each other's objects.
`world` (module): two teams, their WebhookProviders and ServiceAccounts, and the chart's console
identity (support/console_kube.py), for the console's tests.
Every test here that uses the API server is marked `k8s`, so `pytest -m "not k8s"` leaves them out.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# tests/ is not a package; make tests/envtest/apiserver.py importable from here.
sys.path.insert(0, str(REPO / "tests" / "envtest"))

from apiserver import ApiServer  # noqa: E402

from support.kube import OWNER_REFERENCES_ENFORCED, require_assets  # noqa: E402
from support.waiting import eventually_sync  # noqa: E402

if TYPE_CHECKING:
    from support.console_kube import World


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items; mark the ones of this folder that need the API
    # server (the unit tests of the operator's pure functions and SQL run everywhere).
    for item in items:
        if HERE in item.path.parents and "apiserver" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    assets = require_assets()
    # With the admission plugin that makes an owner reference with blockOwnerDeletion need `update` on
    # webhookproviders/finalizers, as on clusters that enable it: the operator runs as the chart's Role.
    with ApiServer(assets, extra_args=[OWNER_REFERENCES_ENFORCED]) as server:
        # Server-side apply: client-side apply stores the whole CRD in an annotation, and
        # schemas with descriptions outgrow its 256 KiB limit.
        applied = server.kubectl(
            "apply", "--server-side", "--field-manager=hookline-tests", "-o", "name", "-f", str(REPO / "crds")
        )
        crds = applied.stdout.split()
        server.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
        # Established is not the end: API discovery (which resolves `whp`) and the OpenAPI
        # document (kubectl explain, client-side validation) catch up a moment later. `explain`
        # needs both; a CRD is named <plural>.<group>, which explain accepts as a resource.
        for crd in crds:
            resource = crd.split("/", 1)[1]
            eventually_sync(lambda resource=resource: server.kubectl("explain", resource, check=False).returncode == 0,
                            timeout=30, interval=0.2, what=f"{resource} visible in API discovery and OpenAPI")
        yield server


@pytest.fixture
def namespace(apiserver: ApiServer) -> str:
    # Never deleted: without kube-controller-manager a namespace would stay Terminating anyway,
    # and the whole server is thrown away at the end of the session.
    name = f"t-{uuid.uuid4().hex[:10]}"
    apiserver.kubectl("create", "namespace", name)
    return name


@pytest.fixture(scope="module")
def world(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> World:
    # Imported here: the chart's renderer it loads is for the console's tests only.
    from support.console_kube import World

    return World(apiserver, tmp_path_factory.mktemp("console-kube"))
