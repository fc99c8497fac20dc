"""The chart's monitoring objects (PrometheusRule, PodMonitor, ServiceMonitor, the dashboard ConfigMap)
applied to a real kube-apiserver. The Prometheus Operator's CRDs are not part of Kubernetes;
tests/monitoring/crds holds minimal stand-ins (the PrometheusRule one types every field the chart
uses, so a malformed rule is rejected)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.kube import require_assets

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "chart"))
sys.path.insert(0, str(REPO / "tests" / "envtest"))

from apiserver import ApiServer  # noqa: E402
from chartkit import MINIMAL, deep_merge, render  # noqa: E402
from operator_access import apply_objects, create_namespace  # noqa: E402

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).resolve().parent / "crds"
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True},
                          "prometheusRule": {"enabled": True, "oldestDueSeconds": {"providers": {"stripe": 120}}},
                          "dashboard": {"enabled": True}}}


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with ApiServer(require_assets()) as server:
        server.kubectl("apply", "--server-side", "-f", str(CRDS))
        for crd in ("prometheusrules", "podmonitors", "servicemonitors"):
            server.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                           f"crd/{crd}.monitoring.coreos.com")
        yield server


def test_monitoring_objects_are_accepted(api: ApiServer) -> None:
    namespace = create_namespace(api, "monitoring")
    rendered = render(deep_merge(MINIMAL, MONITORING), namespace=namespace)
    kinds = ("PrometheusRule", "PodMonitor", "ServiceMonitor", "ConfigMap")
    objects = [o for _, o in rendered.objects if o["kind"] in kinds]
    apply_objects(api, objects)

    rule = json.loads(api.kubectl("get", "prometheusrule", "hookline", "-n", namespace, "-o", "json").stdout)
    alerts = [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert "HooklineNoWorkerForBacklog" in alerts and alerts.count("HooklineInboxOldestDueEventTooOld") == 2
    dashboard = json.loads(api.kubectl("get", "configmap", "hookline-dashboard", "-n", namespace,
                                       "-o", "json").stdout)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["hookline.json"])["uid"] == "hookline-overview"
    api.kubectl("get", "podmonitor/hookline", "servicemonitor/hookline", "-n", namespace)


def test_a_malformed_rule_is_rejected(api: ApiServer) -> None:
    namespace = create_namespace(api, "monitoring")
    rendered = render(deep_merge(MINIMAL, MONITORING), namespace=namespace)
    (rule,) = rendered.find("PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "fifteen minutes"
    result = api.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(rule), check=False)
    assert result.returncode != 0 and "for" in result.stderr, result.stderr
