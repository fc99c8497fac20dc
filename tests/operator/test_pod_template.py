"""Chart values -> the worker template ConfigMap -> the worker Deployments the operator creates, with a
provider's own overrides; a changed template reaches existing Deployments."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import ApiServer

from support.kube import kget
from support.operator import condition, event_lines, start_operator
from support.processes import ServiceProcess
from support.waiting import eventually

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))
from chartkit import MINIMAL, deep_merge, render

WORKER_VALUES: dict[str, Any] = {
    "image": "registry.example/hookline:chart-test",
    "pullPolicy": "Always",
    "imagePullSecrets": [{"name": "regcred"}],
    "concurrency": 7,
    "resources": {"requests": {"cpu": "150m", "memory": "160Mi"}, "limits": {"cpu": "3", "memory": "768Mi"}},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20001, "runAsGroup": 20001,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "containerSecurityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                 "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    "serviceAccountName": "hookline-worker",
    "priorityClassName": "webhooks",
    "nodeSelector": {"pool": "workers"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "workers", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}}}}]}},
    "extraEnv": [{"name": "TEAM_SETTING", "value": "on"}],
    "extraEnvFrom": [{"configMapRef": {"name": "handler-config"}}],
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"cost-center": "webhooks"},
    "tenantPlacement": {"allowedNodeSelectors": {"disk": ["ssd"]},
                        "allowedTolerations": [{"key": "big", "operator": "Exists", "effect": "NoSchedule"}],
                        "allowedPriorityClasses": ["payments-critical"]},
}

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks}}
  destination: {{url: "http://orders.{name}.svc/webhooks"}}
  workers:
    maxReplicas: 3
{overrides}
"""

OVERRIDES = """    resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: "4", memory: 2Gi}}
    nodeSelector: {disk: ssd}
    tolerations: [{key: big, operator: Exists, effect: NoSchedule}]
    priorityClassName: payments-critical
"""


def chart_template(worker: dict[str, Any]) -> str:
    """The bytes the chart puts in the ConfigMap the operator pod mounts."""
    rendered = render(deep_merge(MINIMAL, {"worker": worker}))
    return str(rendered.one("ConfigMap", "hookline-worker-template")["data"]["template.yaml"])


@pytest.fixture
def template_file(tmp_path: Path) -> Path:
    path = tmp_path / "worker-template" / "template.yaml"
    path.parent.mkdir()
    path.write_text(chart_template(WORKER_VALUES))
    return path


@pytest.fixture
def operator(apiserver: ApiServer, namespace: str, database_url: str, log_dir: Path,
             template_file: Path) -> Iterator[ServiceProcess]:
    proc = start_operator(apiserver, [namespace], database_url, log_dir,
                          env={"HOOKLINE_WORKER_TEMPLATE": str(template_file)})
    yield proc
    proc.stop()


def pod_template(apiserver: ApiServer, namespace: str, provider: str) -> dict[str, Any]:
    pod: dict[str, Any] = kget(apiserver, namespace, "deployment", f"{provider}-worker")["spec"]["template"]
    return pod


async def pod_of(apiserver: ApiServer, namespace: str, provider: str) -> dict[str, Any]:
    """The workers' pod template, once the operator made their Deployment."""
    return await eventually(lambda: pod_template(apiserver, namespace, provider), what=f"{provider}-worker")


async def test_chart_values_reach_the_worker_deployment(apiserver: ApiServer, namespace: str, operator: ServiceProcess,
                                                        template_file: Path) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name="plain", overrides=""))
    pod = await pod_of(apiserver, namespace, "plain")
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "worker")
    assert container["image"] == WORKER_VALUES["image"]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == WORKER_VALUES["resources"]
    assert container["securityContext"] == WORKER_VALUES["containerSecurityContext"]
    assert container["envFrom"] == WORKER_VALUES["extraEnvFrom"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TEAM_SETTING"]["value"] == "on"
    # The operator's part: the provider's own database credential, the command, probes.
    assert env["HOOKLINE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "plain-hookline-database",
                                                                         "key": "url"}
    assert container["args"][:3] == ["worker", "--provider", "plain"]
    assert container["args"][-2:] == ["--concurrency", "7"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["securityContext"]["runAsUser"] == 20001
    assert spec["automountServiceAccountToken"] is False
    for key in ("imagePullSecrets", "serviceAccountName", "priorityClassName", "nodeSelector", "tolerations",
                "affinity"):
        assert spec[key] == WORKER_VALUES[key], key
    assert "tenantPlacement" not in spec
    assert pod["metadata"]["annotations"]["example.com/owner"] == "platform"
    assert pod["metadata"]["labels"]["cost-center"] == "webhooks"
    assert pod["metadata"]["labels"]["hookline.io/provider"] == "plain"

    # A provider sets its resources and adds the placement the chart allows; the platform's stays.
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name="big", overrides=OVERRIDES))
    big = (await pod_of(apiserver, namespace, "big"))["spec"]
    big_container = next(c for c in big["containers"] if c["name"] == "worker")
    assert big_container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                          "limits": {"cpu": "4", "memory": "2Gi"}}
    assert big["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    assert big["tolerations"] == [*WORKER_VALUES["tolerations"],
                                  {"key": "big", "operator": "Exists", "effect": "NoSchedule"}]
    assert big["priorityClassName"] == "payments-critical"
    assert big["affinity"] == WORKER_VALUES["affinity"] and big_container["image"] == WORKER_VALUES["image"]
    await eventually(lambda: condition(kget(apiserver, namespace, "whp", "big"), "Ready").get("status") == "True",
                     what="big Ready")

    # helm upgrade with a new value: the mounted file changes and every worker Deployment follows.
    template_file.write_text(chart_template({**WORKER_VALUES, "nodeSelector": {"pool": "workers-v2"}}))
    await eventually(lambda: pod_template(apiserver, namespace, "plain")["spec"]["nodeSelector"],
                     equals={"pool": "workers-v2"}, what="the new template on the existing Deployment")
    await eventually(lambda: pod_template(apiserver, namespace, "big")["spec"]["nodeSelector"]
                     == {"pool": "workers-v2", "disk": "ssd"}, what="the new platform value under big's addition")


REFUSED = """    nodeSelector: {disk: ssd}
    tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
    priorityClassName: system-cluster-critical
"""


async def test_placement_outside_the_allowance_is_refused_and_never_applied(
        apiserver: ApiServer, namespace: str, operator: ServiceProcess) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name="greedy", overrides=REFUSED))
    whp = await eventually(lambda: (o := kget(apiserver, namespace, "whp", "greedy"))
                           and condition(o, "Ready").get("reason") == "PlacementNotAllowed" and o,
                           what="PlacementNotAllowed")
    message = condition(whp, "Ready")["message"]
    assert "node-role.kubernetes.io/control-plane" in message and "system-cluster-critical" in message
    assert "disk" not in message  # allowed, so applied
    # The workers run, with the platform's placement and the allowed addition only.
    spec = (await pod_of(apiserver, namespace, "greedy"))["spec"]
    assert spec["tolerations"] == WORKER_VALUES["tolerations"]
    assert spec["priorityClassName"] == WORKER_VALUES["priorityClassName"]
    assert spec["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    await eventually(lambda: any(e.startswith("Warning PlacementNotAllowed: ")
                                 for e in event_lines(apiserver, namespace)),
                     what="a Warning Event")
    # Asking only for what is allowed makes it Ready.
    apiserver.kubectl("apply", "-n", namespace, "-f", "-",
                      input=PROVIDER.format(name="greedy", overrides="    nodeSelector: {disk: ssd}\n"))
    await eventually(lambda: condition(kget(apiserver, namespace, "whp", "greedy"), "Ready").get("status") == "True",
                     what="Ready once the request is allowed")


async def test_a_broken_template_is_reported_not_applied(apiserver: ApiServer, namespace: str,
                                                         operator: ServiceProcess, template_file: Path) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name="keep", overrides=""))
    before = await pod_of(apiserver, namespace, "keep")
    template_file.write_text("concurrency: 4\npod: {spec: {containers: [{name: sidecar}]}}\n")
    whp = await eventually(lambda: (o := kget(apiserver, namespace, "whp", "keep"))
                           and condition(o, "Ready").get("reason") == "InvalidWorkerTemplate" and o,
                           what="InvalidWorkerTemplate")
    assert "container named 'worker'" in condition(whp, "Ready")["message"]
    assert pod_template(apiserver, namespace, "keep") == before


async def test_a_tightened_allowance_takes_back_what_it_allowed(apiserver: ApiServer, namespace: str,
                                                                operator: ServiceProcess, template_file: Path) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name="loose", overrides=OVERRIDES))
    await eventually(lambda: pod_template(apiserver, namespace, "loose")["spec"]["nodeSelector"].get("disk") == "ssd",
                     what="the allowed additions")
    # helm upgrade: no tenant placement allowed any more, and a platform without tolerations or priority.
    platform = {**WORKER_VALUES, "tolerations": [], "priorityClassName": "", "tenantPlacement": {}}
    template_file.write_text(chart_template(platform))
    whp = await eventually(lambda: (o := kget(apiserver, namespace, "whp", "loose"))
                           and condition(o, "Ready").get("reason") == "PlacementNotAllowed" and o,
                           what="PlacementNotAllowed after the upgrade")
    assert "disk=ssd" in condition(whp, "Ready")["message"]
    # The Deployment holds exactly the platform's placement: nothing of the team's stays behind.
    spec = await eventually(lambda: (p := pod_template(apiserver, namespace, "loose")["spec"])
                            and "priorityClassName" not in p and p, what="the priority class taken back")
    assert spec["nodeSelector"] == WORKER_VALUES["nodeSelector"]
    assert "tolerations" not in spec
    assert spec["affinity"] == WORKER_VALUES["affinity"]
