"""values database.tls: Postgres's CA bundle and client certificate reach every pod that connects to
Postgres, the worker Deployments the operator makes included, at the path the URL names."""

from __future__ import annotations

import kubernetes_validate
from chartkit import MINIMAL, Obj, Rendered, deep_merge, render, render_default
from test_chart_render import K8S_VERSION
from test_chart_workers import TEMPLATE_CONFIGMAP

MOUNT = {"name": "postgres-tls", "mountPath": "/etc/hookline/postgres-tls", "readOnly": True}
TLS: Obj = {"database": {"tls": {"caSecret": "postgres-ca", "caKey": "root.pem", "clientSecret": "hookline-client"}}}
VOLUME = {"name": "postgres-tls", "projected": {"defaultMode": 0o440, "sources": [
    {"secret": {"name": "postgres-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]}},
    {"secret": {"name": "hookline-client", "items": [{"key": "tls.crt", "path": "client.crt"},
                                                      {"key": "tls.key", "path": "client.key"}]}}]}}


def _connecting(rendered: Rendered) -> dict[str, Obj]:
    """The pod specs of every workload but Helm's test Pods (they ask the services over HTTP)."""
    return {obj["metadata"]["name"]: pod for obj, pod in rendered.workloads()
            if obj["metadata"].get("annotations", {}).get("helm.sh/hook") != "test"}


def _pod_has_tls(pod_spec: Obj, where: str) -> None:
    assert [v for v in pod_spec.get("volumes", []) if v["name"] == "postgres-tls"] == [VOLUME], where
    for container in pod_spec["containers"]:
        assert MOUNT in container.get("volumeMounts", []), f"{where}: container {container['name']}"


def test_every_pod_that_connects_mounts_the_ca_and_client_certificate() -> None:
    rendered = render(deep_merge(MINIMAL, TLS))
    workloads = _connecting(rendered)
    assert {"hookline-receiver", "hookline-relay", "hookline-operator", "hookline-migrate"} <= workloads.keys()
    for name, pod in workloads.items():
        _pod_has_tls(pod, name)
    for obj, _ in rendered.workloads():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_operators_worker_deployments_mount_it_too() -> None:
    from hookline_operator import podtemplate, resources

    configmap = render(deep_merge(MINIMAL, TLS)).one("ConfigMap", TEMPLATE_CONFIGMAP)
    template = podtemplate.parse_template(configmap["data"]["template.yaml"])
    deployment = resources.worker_deployment("shop", {"leaseSeconds": 30}, 1, template)
    deployment["metadata"]["namespace"] = "team-a"
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    _pod_has_tls(deployment["spec"]["template"]["spec"], "the operator's worker Deployment")


def test_only_the_ca_without_a_client_certificate() -> None:
    rendered = render(deep_merge(MINIMAL, {"database": {"tls": {"caSecret": "postgres-ca"}}}))
    for name, pod in _connecting(rendered).items():
        volume = next(v for v in pod["volumes"] if v["name"] == "postgres-tls")
        assert volume["projected"]["sources"] == [
            {"secret": {"name": "postgres-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}], name


def test_nothing_is_mounted_by_default() -> None:
    rendered = render_default()
    for obj, pod in rendered.workloads():
        assert all(v["name"] != "postgres-tls" for v in pod.get("volumes", [])), obj["metadata"]["name"]
    template = rendered.one("ConfigMap", TEMPLATE_CONFIGMAP)["data"]["template.yaml"]
    assert "postgres-tls" not in template
