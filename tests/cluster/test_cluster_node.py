"""The local cluster itself: a Ready node whose pods run the project's images, resolve Services by name
through cluster DNS and reach them through kube-proxy — what every chart pod relies on."""

from __future__ import annotations

import json
import time

import pytest

from cluster import IMAGES, NODE_NAME, Cluster

pytestmark = pytest.mark.timeout(600)

# Asks cluster DNS for the API server's Service and opens a TCP connection to it: DNS, the Service's
# endpoints (the API server's lease reconciler) and kube-proxy's rules in one go.
PROBE = """
import socket
address = socket.gethostbyname("kubernetes.default.svc.cluster.local")
socket.create_connection((address, 443), timeout=10).close()
print("reached", address)
"""


def pod_manifest(name: str) -> str:
    security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
            "containers": [{"name": "probe", "image": IMAGES["hookline-service"], "imagePullPolicy": "Never",
                            "command": ["python3", "-c", PROBE], "securityContext": security}],
        },
    })


def test_node_is_ready_and_runs_images(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert IMAGES["hookline-service"] in {n for image in node["status"]["images"] for n in image.get("names", [])}


def test_pod_reaches_a_service_by_name(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=pod_manifest("dns-probe"))
    deadline = time.monotonic() + 240
    phase = ""
    while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
        time.sleep(1)
        phase = cluster.kubectl("get", "pod", "dns-probe", "-o", "jsonpath={.status.phase}").stdout
    logs = cluster.kubectl("logs", "dns-probe", check=False)
    assert phase == "Succeeded", f"phase {phase!r}; logs: {logs.stdout}{logs.stderr}\n{cluster.diagnostics('default')}"
    assert "reached 10.0.0.1" in logs.stdout
