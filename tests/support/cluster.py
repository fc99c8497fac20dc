"""kubectl reads and writes the operator tests share (namespaces, manifests, events, metrics)."""

from __future__ import annotations

import re
import urllib.request
import uuid
from typing import Any

from apiserver import ApiServer

from support.kube import kget


def new_namespace(apiserver: ApiServer) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    apiserver.kubectl("create", "namespace", name)
    return name


def apply(apiserver: ApiServer, namespace: str, manifest: str) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)


def get(apiserver: ApiServer, namespace: str, *what: str) -> dict[str, Any]:
    return kget(apiserver, namespace, *what)


def metric(url: str, name: str) -> float:
    """One sample of a metric without labels from a /metrics endpoint."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    if match is None:
        raise AssertionError(f"{name} not in {url}/metrics")
    return float(match.group(1))
