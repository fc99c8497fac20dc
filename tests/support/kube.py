"""Helpers for tests against the real kube-apiserver (tests/envtest)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# tests/envtest is not a package; make its apiserver module importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envtest"))

from apiserver import ApiServer, find_assets

from support.tools import unavailable

ADVICE = (
    "no kube-apiserver/etcd/kubectl found: run `make envtest` to build them once "
    "(cached in ~/.cache/hookline/envtest), or point KUBEBUILDER_ASSETS at them"
)

# kube-apiserver flag: owner references with blockOwnerDeletion need `update` on the owner's
# finalizers, as on clusters that enable the plugin; tests running the operator as its Role use it.
OWNER_REFERENCES_ENFORCED = "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"


def require_assets() -> Path:
    """The envtest binaries; without them the test is skipped, or fails when HOOKLINE_REQUIRE_K8S=1."""
    assets = find_assets()
    if assets is None:
        unavailable(ADVICE, "HOOKLINE_REQUIRE_K8S")
    return assets


def kget(api: ApiServer, namespace: str, *what: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(api.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)
    return result

