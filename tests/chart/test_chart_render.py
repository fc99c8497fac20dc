"""The chart rendered by Helm's engine for default, dev and production values: lint, Kubernetes
schemas (offline, kubernetes-validate), and the rules a reviewer of a public chart checks by eye."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartkit import (
    CHART,
    DEV_VALUES,
    EXAMPLES,
    MINIMAL,
    NAMESPACE,
    PRODUCTION_VALUES,
    REPO,
    Obj,
    Rendered,
    deep_merge,
    is_hook,
    lint,
    load_values,
    render,
    render_default,
    render_dev,
    render_production,
)

# The Kubernetes version whose schemas the objects must satisfy: the envtest API server's.
K8S_VERSION = "1.37.0"
# The console on, with its Ingress: every generic rule below holds for its objects too.
CONSOLE = deep_merge(MINIMAL, {"console": {"enabled": True, "ingress": {"enabled": True}}})
RENDERERS: dict[str, Callable[[], Rendered]] = {
    "default": render_default,
    "dev": render_dev,
    "production": render_production,
    "console": lambda: render(CONSOLE),
}
VALUE_SETS: dict[str, Obj] = {
    "default": MINIMAL,
    "dev": load_values(DEV_VALUES),
    "production": load_values(PRODUCTION_VALUES),
    "console": CONSOLE,
}
# API groups kubernetes-validate has no schema for (CRD-defined kinds of other projects).
FOREIGN_GROUPS = ("monitoring.coreos.com/",)


@pytest.fixture(scope="module", params=list(RENDERERS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return RENDERERS[request.param]()


def fullname(component: str) -> str:
    return f"hookline-{component}"


def containers(pod_spec: Obj) -> list[Obj]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


# -- lint and schemas --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = lint(VALUE_SETS[name])
    # Severity 1 is informational ("icon is recommended"); warnings and errors fail (strict lint).
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], json.dumps(report, indent=2)


def test_every_object_is_valid_for_kubernetes(rendered: Rendered) -> None:
    failures = []
    for template, obj in rendered.objects:
        if obj["apiVersion"].startswith(FOREIGN_GROUPS):
            continue
        try:
            # strict: unknown fields (a typo such as `readinesProbe`) are errors, as in the API server.
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            failures.append(f"{template}: {obj['kind']}/{obj['metadata']['name']}: {err.message} at {list(err.path)}")
    assert not failures, "\n".join(failures)


def test_object_names_are_unique_and_dns_safe(rendered: Rendered) -> None:
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for _, o in rendered.objects]
    assert len(keys) == len(set(keys)), keys
    for kind, _, name in keys:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name), f"{kind}/{name}"
        if kind in ("Service", "Deployment", "StatefulSet"):
            assert len(name) <= 63, f"{kind}/{name} is longer than a DNS label"


def test_standard_labels_on_every_object(rendered: Rendered) -> None:
    for template, obj in rendered.objects:
        labels = obj["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
            "helm.sh/chart",
        ):
            assert key in labels, f"{template}: {obj['kind']}/{obj['metadata']['name']} lacks label {key}"
        if obj["kind"] != "CustomResourceDefinition" and obj["kind"] != "ServiceMonitor":
            assert "app.kubernetes.io/component" in labels, f"{template}: {obj['kind']} lacks a component label"


def test_namespaced_objects_name_their_namespace(rendered: Rendered) -> None:
    # `kubectl apply -f` of the rendered chart (GitOps tools do that) must land in the release namespace.
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for template, obj in rendered.objects:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace"), f"{template}: {obj['kind']} has no namespace"


# -- pods: security, resources, probes ---------------------------------------------------------


def test_every_pod_is_locked_down(rendered: Rendered) -> None:
    for obj, pod in rendered.workloads():
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        security = pod.get("securityContext", {})
        assert security.get("runAsNonRoot") is True, where
        assert security.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        for container in containers(pod):
            c_where = f"{where} container {container['name']}"
            sc = container.get("securityContext", {})
            assert sc.get("readOnlyRootFilesystem") is True, c_where
            assert sc.get("allowPrivilegeEscalation") is False, c_where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], c_where
            assert not sc.get("privileged"), c_where
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), f"{c_where}: {kind}"


def test_hookline_pods_get_a_writable_tmp(rendered: Rendered) -> None:
    for obj, pod in rendered.workloads():
        if obj["metadata"]["labels"]["app.kubernetes.io/component"] in ("dev-postgres", "test"):
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in containers(pod):
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{obj['metadata']['name']}/{container['name']}"
            assert "emptyDir" in volumes[mounts["/tmp"]]


def test_only_the_operator_and_the_console_have_an_api_token(rendered: Rendered) -> None:
    for obj, pod in rendered.workloads():
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        wanted = component in ("operator", "console")
        assert pod.get("automountServiceAccountToken") is wanted, obj["metadata"]["name"]
    for sa in rendered.find("ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False, sa["metadata"]["name"]


@pytest.mark.parametrize(("component", "port"), [("receiver", 8080), ("relay", 8082)])
def test_service_probes_use_the_contract_endpoints(component: str, port: int) -> None:
    deployment = render_default().one("Deployment", fullname(component))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == component
    assert f"--port={port}" in container["args"]
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # /readyz checks Postgres; liveness must not, or a database outage would restart every pod.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    env = {e["name"]: e for e in container["env"]}
    assert env["HOOKLINE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "hookline-database", "key": "url"}
    assert env["HOOKLINE_LOG_FORMAT"]["value"] == "json"


def test_relay_private_networks_flag() -> None:
    def flag(rendered: Rendered) -> str:
        env = rendered.one("Deployment", fullname("relay"))["spec"]["template"]["spec"]["containers"][0]["env"]
        return str(next(e["value"] for e in env if e["name"] == "HOOKLINE_ALLOW_PRIVATE_NETWORKS"))

    assert flag(render_default()) == "false"
    assert flag(render_dev()) == "true"


def test_relay_egress_proxy_reaches_the_relay_with_its_credentials_as_a_file() -> None:
    def relay_pod(rendered: Rendered) -> Obj:
        spec: Obj = rendered.one("Deployment", fullname("relay"))["spec"]["template"]["spec"]
        return spec

    default = relay_pod(render_default())
    assert not any(e["name"].startswith("HOOKLINE_EGRESS") for e in default["containers"][0]["env"])
    pod = relay_pod(render(deep_merge(MINIMAL, {"relay": {"egressProxy": {
        "url": "http://proxy.egress:3128", "existingSecret": "egress-credentials",
        "noProxy": ".svc.cluster.local,10.0.0.0/8"}}})))
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HOOKLINE_EGRESS_PROXY"] == "http://proxy.egress:3128"
    assert env["HOOKLINE_EGRESS_NO_PROXY"] == ".svc.cluster.local,10.0.0.0/8"
    path = env["HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "egress-proxy")
    assert path == mount["mountPath"] + "/credentials"
    volume = next(v for v in pod["volumes"] if v["name"] == "egress-proxy")
    assert volume["secret"]["secretName"] == "egress-credentials"
    assert volume["secret"]["items"] == [{"key": "credentials", "path": "credentials"}]
    with pytest.raises(Exception, match="url"):  # credentials in the URL: the schema refuses them
        render(deep_merge(MINIMAL, {"relay": {"egressProxy": {"url": "http://user:pass@proxy.egress:3128"}}}))


def test_retention_defaults_reach_the_partition_managers() -> None:
    # The relays and `worker --sweep` run the partition manager; the chart gives them its defaults.
    retention = {"doneHours": 12, "maxDoneHours": 48, "endpoints": {"doneHours": 6, "deadDays": 30}}
    rendered = render(deep_merge(MINIMAL, {"retention": retention}))
    env = {e["name"]: e.get("value") for e in
           rendered.one("Deployment", fullname("relay"))["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HOOKLINE_RETENTION_DONE_HOURS"] == "12" and env["HOOKLINE_RETENTION_DEAD_DAYS"] == "14"
    assert env["HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS"] == "6"
    assert env["HOOKLINE_ENDPOINT_RETENTION_DEAD_DAYS"] == "30"
    # The install's bound on every provider's spec.retention (migration 0025).
    assert env["HOOKLINE_RETENTION_MAX_DONE_HOURS"] == "48" and env["HOOKLINE_RETENTION_MAX_DEAD_DAYS"] == "90"


# -- operator ----------------------------------------------------------------------------------


def test_operator_runs_alone_and_knows_its_namespaces() -> None:
    operator = render_default().one("Deployment", fullname("operator"))
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    container = operator["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[:2] == ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
    assert [a for a in args if a.startswith("--namespace")] == [f"--namespace={NAMESPACE}"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HOOKLINE_WORKER_TEMPLATE"]["value"] == "/etc/hookline/worker-template/template.yaml"
    # The database Secret is read in the release namespace only; workers get their namespace's own role.
    assert not [e for e in env if "DATABASE_SECRET" in e]
    assert "HOOKLINE_DATABASE_URL" in env
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"

    production = render_production().one("Deployment", fullname("operator"))
    prod_args = production["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in prod_args if a.startswith("--namespace")] == ["--namespace=hookline", "--namespace=payments"]

    everywhere = render(deep_merge(MINIMAL, {"operator": {"watchAllNamespaces": True}}))
    all_args = everywhere.one("Deployment", fullname("operator"))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in all_args
    assert not [a for a in all_args if a.startswith("--namespace")]


def test_chart_never_templates_workers(rendered: Rendered) -> None:
    # The operator owns the per-provider worker Deployments and their replica counts.
    assert not rendered.component("Deployment", "worker")
    for obj in rendered.find("Deployment"):
        assert obj["spec"]["template"]["spec"]["containers"][0]["args"][0] != "worker"


def rules_of(rendered: Rendered, kind: str, namespace: str | None = None) -> list[Obj]:
    rules: list[Obj] = []
    for role in rendered.find(kind):
        if namespace is None or role["metadata"].get("namespace") == namespace:
            rules.extend(role["rules"])
    return rules


def test_rbac_is_namespaced_by_default() -> None:
    rendered = render_default()
    roles = rendered.find("Role")
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles] == [(NAMESPACE, fullname("operator"))]
    # Nothing cluster-scoped at all: kopf runs without CRD/namespace scanning (see operator-rbac.yaml).
    assert not rendered.find("ClusterRole") and not rendered.find("ClusterRoleBinding")
    for rule in rules_of(rendered, "Role"):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        if "secrets" in rule["resources"]:
            assert "list" not in rule["verbs"] and "watch" not in rule["verbs"], "the operator never lists Secrets"
    # Every binding's subject is the operator's ServiceAccount, never the receiver's or relay's.
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for binding in rendered.find(kind):
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": fullname("operator"), "namespace": NAMESPACE}
            ]


# (apiGroup, resource) -> verbs: every call the operator and kopf make (kube.py, kopf's patching,
# watching and event posting), nothing else. test_chart_apiserver.py asks the API server the same.
OPERATOR_RULES = {
    ("hookline.io", "webhookproviders"): {"get", "list", "watch", "patch"},
    ("hookline.io", "webhookproviders/status"): {"patch"},
    ("hookline.io", "webhookproviders/finalizers"): {"update"},
    ("hookline.io", "webhookendpoints"): {"get", "list", "watch", "patch"},
    ("hookline.io", "webhookendpoints/status"): {"patch"},
    ("hookline.io", "webhookendpoints/finalizers"): {"update"},
    ("", "secrets"): {"get", "create", "patch"},
    ("apps", "deployments"): {"get", "create", "patch"},
    ("apps", "deployments/scale"): {"patch"},
    ("", "events"): {"create"},
}


@pytest.mark.parametrize("values", [{}, {"operator": {"watchAllNamespaces": True}}], ids=["Role", "ClusterRole"])
def test_operator_rules_are_exactly_the_calls_it_makes(values: Obj) -> None:
    rendered = render(deep_merge(MINIMAL, values))
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules_of(rendered, "ClusterRole" if values else "Role"):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == OPERATOR_RULES


def test_rbac_per_watched_namespace() -> None:
    rendered = render_production()
    roles = {r["metadata"]["namespace"] for r in rendered.find("Role")}
    bindings = {b["metadata"]["namespace"] for b in rendered.find("RoleBinding")}
    assert roles == bindings == {"hookline", "payments"}
    assert not any(r["metadata"]["namespace"] == "default" for r in rendered.find("Role"))


def test_rbac_for_all_namespaces_is_a_cluster_role() -> None:
    rendered = render(deep_merge(MINIMAL, {"operator": {"watchAllNamespaces": True}}))
    assert not rendered.find("Role") and not rendered.find("RoleBinding")
    resources = {r for rule in rules_of(rendered, "ClusterRole") for r in rule["resources"]}
    assert {"webhookproviders", "webhookproviders/status", "secrets", "deployments", "events"} <= resources
    # kopf never lists namespaces when it watches the whole cluster.
    assert "namespaces" not in resources and "customresourcedefinitions" not in resources


def test_operator_disabled_renders_no_rbac() -> None:
    rendered = render(deep_merge(MINIMAL, {"operator": {"enabled": False}}))
    for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert not rendered.find(kind), kind
    assert "operator.enabled=false" in rendered.notes


# -- CRD, migrations, optional objects ---------------------------------------------------------


def test_chart_crd_copy_is_identical_to_crds_folder() -> None:
    # crds/ is the one source; the chart carries a copy that `make crds` writes (a symlink works, but
    # Helm then logs "found symbolic link in path" on every command that loads the chart).
    sources = sorted((REPO / "crds").glob("*.yaml"))
    copies = sorted((CHART / "files" / "crds").iterdir())
    assert [p.name for p in copies] == [p.name for p in sources], "run `make crds`"
    for source, copy in zip(sources, copies, strict=True):
        assert not copy.is_symlink() and copy.read_bytes() == source.read_bytes(), (
            f"{copy.relative_to(REPO)} differs from {source.relative_to(REPO)}: run `make crds`")


def test_crd_is_templated_kept_and_optional() -> None:
    crd = render_default().one("CustomResourceDefinition", "webhookproviders.hookline.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    source = yaml.safe_load((REPO / "crds" / "webhookproviders.hookline.io.yaml").read_text())
    assert crd["spec"] == source["spec"]
    without = render(deep_merge(MINIMAL, {"crds": {"install": False}}))
    assert not without.find("CustomResourceDefinition")
    # Nothing under the chart's crds/ folder, which Helm would install unconditionally.
    assert not (CHART / "crds").exists()


def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook() -> None:
    job = render_default().one("Job", fullname("migrate"))
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_dev_values_run_postgres_and_migrate_as_a_plain_job() -> None:
    rendered = render_dev(revision=3)
    assert rendered.one("StatefulSet", fullname("dev-postgres"))["spec"]["replicas"] == 1
    secret = rendered.one("Secret", fullname("dev-database"))
    assert secret["stringData"]["url"].startswith(f"postgresql://hookline:hookline-dev@{fullname('dev-postgres')}.{NAMESPACE}.svc:5432/")
    # A new Job name per revision: a Job's pod template cannot be patched on upgrade.
    job = rendered.one("Job", f"{fullname('migrate')}-3")
    assert not is_hook(job)
    receiver = rendered.one("Deployment", fullname("receiver"))["spec"]["template"]["spec"]
    env = {e["name"]: e for e in receiver["containers"][0]["env"]}
    assert env["HOOKLINE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == fullname("dev-database")
    assert env["PYTHONPATH"]["value"] == "/opt/hookline-dev/src"
    assert receiver["initContainers"][0]["name"] == "seed-dev-src"


def test_receiver_extras_follow_values() -> None:
    default = render_default()
    assert not default.find("Ingress") and not default.find("HorizontalPodAutoscaler")
    assert not default.find("ServiceMonitor")
    assert default.one("Deployment", fullname("receiver"))["spec"]["replicas"] == 2
    assert default.one("PodDisruptionBudget", fullname("receiver"))["spec"]["maxUnavailable"] == 1

    production = render_production()
    hpa = production.one("HorizontalPodAutoscaler", fullname("receiver"))
    assert hpa["spec"]["scaleTargetRef"]["name"] == fullname("receiver")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    # With an HPA the Deployment must not pin replicas, or every `helm upgrade` would reset them.
    assert "replicas" not in production.one("Deployment", fullname("receiver"))["spec"]
    assert production.one("PodDisruptionBudget", fullname("receiver"))["spec"] == {
        "minAvailable": 2,
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "hookline",
                "app.kubernetes.io/instance": "hookline",
                "app.kubernetes.io/component": "receiver",
            }
        },
    }
    ingress = production.one("Ingress", fullname("receiver"))
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/webhooks"
    monitor = production.one("ServiceMonitor", "hookline")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"


def test_image_tag_and_digest() -> None:
    def image(values: Obj) -> str:
        deployment = render(deep_merge(MINIMAL, values)).one("Deployment", fullname("receiver"))
        return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])

    assert image({}) == "ghcr.io/hookline/hookline:0.1.0"
    assert image({"image": {"tag": "1.2.3"}}) == "ghcr.io/hookline/hookline:1.2.3"
    digest = "sha256:" + "a" * 64
    assert image({"image": {"digest": digest}}) == f"ghcr.io/hookline/hookline@{digest}"


def test_helm_test_checks_receiver_readyz() -> None:
    pod = render_default().one("Pod", fullname("test-readyz"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    assert f"http://{fullname('receiver')}:80/readyz" in script


def test_notes_explain_first_webhook_and_replay(rendered: Rendered) -> None:
    notes = rendered.notes
    assert "webhook-signature: v1," in notes and "curl" in notes
    assert "hookline.io/replay-dlq=" in notes
    assert "helm test hookline" in notes


# -- examples ----------------------------------------------------------------------------------


def _structural_to_jsonschema(node: Any) -> Any:
    """The CRD's OpenAPI v3 schema as JSON Schema: `nullable` becomes a null type, x-kubernetes-*
    extensions are dropped (the API server test checks CEL rules and the rest for real)."""
    if isinstance(node, list):
        return [_structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


EXAMPLE_PROVIDERS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "values-production.yaml")


def test_examples_cover_stripe_github_and_standard_webhooks() -> None:
    schemes = {yaml.safe_load(p.read_text())["spec"]["signature"]["scheme"] for p in EXAMPLE_PROVIDERS}
    assert {"stripe", "github", "standard-webhooks"} <= schemes


@pytest.mark.parametrize("example", EXAMPLE_PROVIDERS, ids=lambda p: p.name)
def test_example_providers_match_the_crd(example: Any) -> None:
    import jsonschema

    crd = yaml.safe_load((REPO / "crds" / "webhookproviders.hookline.io.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema = _structural_to_jsonschema(version["schema"]["openAPIV3Schema"])
    for doc in yaml.safe_load_all(example.read_text()):
        assert doc["apiVersion"] == "hookline.io/v1alpha1" and doc["kind"] == "WebhookProvider"
        # Providers files may carry inline secrets; a cluster resource never does.
        assert "secrets" not in doc["spec"]["signature"]
        jsonschema.validate({k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}, schema)


# -- skaffold ----------------------------------------------------------------------------------


def test_skaffold_wires_image_chart_sync_and_kind() -> None:
    config = yaml.safe_load((REPO / "skaffold.yaml").read_text())
    artifact = config["build"]["artifacts"][0]
    image = artifact["image"]
    assert (REPO / artifact["docker"]["dockerfile"]).is_file()
    release = config["deploy"]["helm"]["releases"][0]
    assert (REPO / release["chartPath"]) == CHART
    assert [REPO / f for f in release["valuesFiles"]] == [DEV_VALUES]
    templates = release["setValueTemplates"]
    assert templates["image.repository"] == f"{{{{.IMAGE_REPO_{image}}}}}"
    assert templates["image.tag"] == f"{{{{.IMAGE_TAG_{image}}}}}"
    # The synced files land where the dev values put the source overlay.
    dev = render_dev()
    mount = next(
        m["mountPath"]
        for m in dev.one("Deployment", fullname("receiver"))["spec"]["template"]["spec"]["containers"][0][
            "volumeMounts"
        ]
        if m["name"] == "dev-src"
    )
    sources = {rule["src"] for rule in artifact["sync"]["manual"]}
    assert "services/**/*.py" in sources
    assert {rule["dest"] for rule in artifact["sync"]["manual"]} == {mount}
    assert "kind" in {p["name"] for p in config["profiles"]}
    # The port-forward names the receiver Service the dev release really creates.
    assert config["portForward"][0]["resourceName"] == dev.one("Service", fullname("receiver"))["metadata"]["name"]


def test_notes_signing_recipe_matches_standard_webhooks() -> None:
    """The shell lines NOTES.txt gives for signing produce what a Standard Webhooks library signs."""
    import subprocess
    from datetime import UTC, datetime

    from standardwebhooks import Webhook

    lines = render_default().notes.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("ID="))
    end = next(i for i, line in enumerate(lines) if line.strip().startswith("curl"))
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    script = "\n".join([f"SECRET='{secret}'", *(line.strip() for line in lines[start:end]), 'echo "$ID $TS $SIG"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split(" ")
    event_id, timestamp, body = out[0], out[1], json.dumps({"type": "demo.ping", "data": {"hello": "world"}})
    body = body.replace(", ", ",").replace(": ", ":")  # the NOTES body is compact JSON
    expected = Webhook(secret).sign(event_id, datetime.fromtimestamp(int(timestamp), tz=UTC), body)
    assert f"v1,{out[2].strip()}" == expected


# -- signing secrets at rest (values secretsAtRest) --------------------------------------------------

KEY_A, KEY_B = "A" * 42 + "E=", "B" * 42 + "E="


def _key_file_mounts(rendered: Rendered) -> dict[str, str]:
    """Component -> the Secret its HOOKLINE_SECRET_KEYS_FILE comes from, for every pod that has one."""
    found = {}
    for obj, pod in rendered.workloads():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            if "HOOKLINE_SECRET_KEYS_FILE" not in env:
                continue
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            mount = mounts[env["HOOKLINE_SECRET_KEYS_FILE"].rsplit("/", 1)[0]]
            assert mount["readOnly"] is True
            secret = volumes[mount["name"]]["secret"]
            assert [i["path"] for i in secret["items"]] == [env["HOOKLINE_SECRET_KEYS_FILE"].rsplit("/", 1)[1]]
            found[obj["metadata"]["labels"]["app.kubernetes.io/component"]] = secret["secretName"]
    return found


def test_the_key_file_reaches_receiver_relay_operator_and_migrations_and_no_worker(rendered: Rendered) -> None:
    mounts = _key_file_mounts(rendered)
    assert set(mounts) == {"receiver", "relay", "operator", "migrate"}
    template = yaml.safe_load(rendered.one("ConfigMap", fullname("worker-template"))["data"]["template.yaml"])
    assert "HOOKLINE_SECRET_KEYS_FILE" not in json.dumps(template) and "secret-keys" not in json.dumps(template)


def test_chart_managed_keys_first_encrypts_and_the_secret_precedes_the_migrate_hook() -> None:
    rendered = render(deep_merge(MINIMAL, {"secretsAtRest": {"keys": [KEY_B, KEY_A]}}))
    secret = rendered.one("Secret", fullname("secret-keys"))
    lines = [line for line in secret["stringData"]["keys"].splitlines() if line and not line.startswith("#")]
    assert lines == [KEY_B, KEY_A]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    job = rendered.one("Job", fullname("migrate"))
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert set(_key_file_mounts(rendered).values()) == {fullname("secret-keys")}


def test_new_keys_in_values_roll_every_pod_that_reads_them() -> None:
    def checksums(keys: list[str]) -> dict[str, str]:
        rendered = render(deep_merge(MINIMAL, {"secretsAtRest": {"keys": keys}}))
        return {name: rendered.one("Deployment", fullname(name))["spec"]["template"]["metadata"]["annotations"][
            "checksum/secret-keys"] for name in ("receiver", "relay", "operator")}

    before, after = checksums([KEY_A]), checksums([KEY_B, KEY_A])
    assert all(before[name] != after[name] for name in before)


def test_without_keys_one_is_generated_and_an_existing_secret_replaces_the_chart_one() -> None:
    generated = render_default().one("Secret", fullname("secret-keys"))["stringData"]["keys"]
    keys = [line for line in generated.splitlines() if line and not line.startswith("#")]
    assert len(keys) == 1 and len(base64.b64decode(keys[0])) == 32
    rendered = render(deep_merge(MINIMAL, {"secretsAtRest": {"existingSecret": "my-keys", "secretKey": "file"}}))
    assert not rendered.find("Secret", fullname("secret-keys"))
    assert set(_key_file_mounts(rendered).values()) == {"my-keys"}
    volumes = rendered.one("Deployment", fullname("receiver"))["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "secret-keys")["secret"]["items"][0]["key"] == "file"


def test_a_key_that_is_not_32_bytes_of_base64_is_refused() -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError, match="secretsAtRest"):
        render(deep_merge(MINIMAL, {"secretsAtRest": {"keys": ["too-short"]}}))


# -- a database password read from a file (values database.passwordFile) -----------------------------

def _password_file_mounts(rendered: Rendered) -> dict[str, tuple[str, str]]:
    """Component -> (Secret, key) its HOOKLINE_DATABASE_PASSWORD_FILE comes from, for every pod with one."""
    found = {}
    for obj, pod in rendered.workloads():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            if "HOOKLINE_DATABASE_PASSWORD_FILE" not in env:
                continue
            directory, filename = env["HOOKLINE_DATABASE_PASSWORD_FILE"].rsplit("/", 1)
            mount = {m["mountPath"]: m for m in container["volumeMounts"]}[directory]
            # No subPath: the kubelet rewrites the file when the Secret changes, as a refreshed token must be.
            assert mount["readOnly"] is True and "subPath" not in mount
            secret = volumes[mount["name"]]["secret"]
            (item,) = secret["items"]
            assert item["path"] == filename
            found[obj["metadata"]["labels"]["app.kubernetes.io/component"]] = (secret["secretName"], item["key"])
    return found


def test_the_database_password_file_reaches_every_process_of_the_release_and_no_worker() -> None:
    assert _password_file_mounts(render_default()) == {}
    rendered = render(deep_merge(MINIMAL, {"database": {"passwordFile": {"existingSecret": "db-token",
                                                                         "secretKey": "token"}}}))
    assert _password_file_mounts(rendered) == {name: ("db-token", "token")
                                               for name in ("receiver", "relay", "operator", "migrate")}
    template = yaml.safe_load(rendered.one("ConfigMap", fullname("worker-template"))["data"]["template.yaml"])
    assert "HOOKLINE_DATABASE_PASSWORD_FILE" not in json.dumps(template) and "db-token" not in json.dumps(template)



def test_a_password_file_with_the_dev_database_is_refused() -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError, match=r"database\.passwordFile needs database\.existingSecret"):
        render({"devPostgres": {"enabled": True}, "database": {"passwordFile": {"existingSecret": "db-token"}}})
