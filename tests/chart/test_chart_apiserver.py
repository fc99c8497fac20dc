"""The rendered chart against a real kube-apiserver: every object accepted, least privilege proven
with `kubectl auth can-i`, and the real operator run with its ServiceAccount's token."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from apiserver import ApiServer
from chartkit import (
    EXAMPLES,
    MINIMAL,
    Obj,
    Rendered,
    deep_merge,
    render,
    render_default,
    render_dev,
    render_production,
)
from operator_access import (
    OPERATOR_NEEDS,
    REMOVED,
    apply_objects,
    create_namespace,
    ensure_namespace,
    install_operator_rbac,
    request_token,
    service_account_kubeconfig,
)

from hookline.core.embedded import free_port
from support.inbox import insert_events
from support.kube import kget
from support.processes import ServiceProcess
from support.waiting import eventually

pytestmark = pytest.mark.k8s

OPERATOR_SA = "hookline-operator"


def install(api: ApiServer, rendered: Rendered) -> None:
    objects = [o for _, o in rendered.objects]
    # The CRD first and Established, as Helm orders it; then everything else in one request.
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    if crds:
        apply_objects(api, crds)
        api.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/webhookproviders.hookline.io")
    apply_objects(api, [o for o in objects if o["kind"] != "CustomResourceDefinition"])


def resource_of(obj: Obj) -> str:
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()


def assert_all_present(api: ApiServer, rendered: Rendered) -> None:
    for _, obj in rendered.objects:
        args = ["get", f"{resource_of(obj)}/{obj['metadata']['name']}", "-o", "json"]
        if "namespace" in obj["metadata"]:
            args += ["-n", obj["metadata"]["namespace"]]
        live = json.loads(api.kubectl(*args).stdout)
        assert live["metadata"]["labels"]["app.kubernetes.io/instance"] == obj["metadata"]["labels"][
            "app.kubernetes.io/instance"
        ]


@pytest.fixture(scope="module")
def release(chart_apiserver: ApiServer) -> tuple[str, Rendered]:
    """The default chart installed into a fresh namespace: (namespace, what was rendered)."""
    namespace = create_namespace(chart_apiserver, "release")
    rendered = render_default(namespace=namespace)
    install(chart_apiserver, rendered)
    return namespace, rendered


def test_default_chart_is_accepted(chart_apiserver: ApiServer, release: tuple[str, Rendered]) -> None:
    _, rendered = release
    kinds = {o["kind"] for _, o in rendered.objects}
    # Hooks (the migrate Job, the helm test Pod) are real objects too and were applied with the rest.
    assert {"CustomResourceDefinition", "Deployment", "Service", "Job", "Pod", "Role", "RoleBinding"} <= kinds
    assert_all_present(chart_apiserver, rendered)


def test_dev_chart_is_accepted(chart_apiserver: ApiServer) -> None:
    namespace = create_namespace(chart_apiserver, "dev")
    rendered = render_dev(namespace=namespace)
    install(chart_apiserver, rendered)
    assert_all_present(chart_apiserver, rendered)


def test_production_chart_is_accepted(chart_apiserver: ApiServer) -> None:
    # examples/values-production.yaml watches `hookline` and `payments`; the release goes to hookline.
    for namespace in ("hookline", "payments"):
        ensure_namespace(chart_apiserver, namespace)
    rendered = render_production(namespace="hookline")
    # No Prometheus Operator here: its kinds do not exist in this API server (they are applied against
    # stand-in CRDs in tests/monitoring/test_monitoring_objects.py).
    prometheus_operator_kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    rendered = Rendered([(t, o) for t, o in rendered.objects if o["kind"] not in prometheus_operator_kinds],
                        rendered.notes)
    install(chart_apiserver, rendered)
    assert_all_present(chart_apiserver, rendered)


@pytest.mark.parametrize(
    "example", sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "values-production.yaml"), ids=lambda p: p.name
)
def test_example_providers_are_accepted(
    chart_apiserver: ApiServer, release: tuple[str, Rendered], example: Path
) -> None:
    namespace, _ = release
    # Server-side dry run: the CRD's schema, defaults and CEL rules, exactly as on `kubectl apply`.
    chart_apiserver.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example))


# -- least privilege, asked of the real authorizer ----------------------------------------------


def can_i(api: ApiServer, who: str, verb: str, resource: str, namespace: str, *extra: str) -> bool:
    result = api.kubectl("auth", "can-i", verb, resource, f"--as={who}", "-n", namespace, *extra, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


OPERATOR_MUST_NOT = [
    *REMOVED,
    ("list", "secrets"),  # enumerating Secrets would expose every credential in the namespace
    ("watch", "secrets"),
    ("delete", "secrets"),
    ("create", "webhookproviders.hookline.io"),
    ("delete", "webhookproviders.hookline.io"),
    ("get", "pods"),
    ("create", "pods"),
    ("create", "pods/exec"),
    ("get", "configmaps"),
    ("create", "serviceaccounts/token"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io"),
    ("impersonate", "users"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("get", "customresourcedefinitions.apiextensions.k8s.io"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ("list", "namespaces"),
    ("create", "daemonsets.apps"),
    ("create", "jobs.batch"),
    ("*", "*"),
]


def test_operator_can_do_its_job_in_its_namespace(chart_apiserver: ApiServer, release: tuple[str, Rendered]) -> None:
    namespace, _ = release
    who = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    denied = [n for n in OPERATOR_NEEDS if not can_i(chart_apiserver, who, n[0], n[1], namespace, *n[2:])]
    assert not denied, f"the operator lacks {denied}"


def test_operator_cannot_do_anything_else(chart_apiserver: ApiServer, release: tuple[str, Rendered]) -> None:
    namespace, _ = release
    who = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    allowed = [n for n in OPERATOR_MUST_NOT if can_i(chart_apiserver, who, n[0], n[1], namespace, *n[2:])]
    assert not allowed, f"the operator may {allowed}"


def test_removed_verbs_are_denied_and_used_ones_allowed_with_the_real_token(
    chart_apiserver: ApiServer, release: tuple[str, Rendered]
) -> None:
    """The same questions asked as the operator itself (its TokenRequest token), not by impersonation."""
    namespace, _ = release
    token = request_token(chart_apiserver, namespace, OPERATOR_SA)

    def self_can_i(verb: str, resource: str, *extra: str) -> bool:
        result = chart_apiserver.kubectl("auth", "can-i", verb, resource, "-n", namespace, *extra, token=token,
                                         check=False)
        assert result.stdout.strip() in ("yes", "no"), result.stderr
        return result.stdout.strip() == "yes"

    assert [n for n in OPERATOR_NEEDS if not self_can_i(*n)] == []
    assert [n for n in [*REMOVED, ("list", "secrets"), ("watch", "secrets")] if self_can_i(*n)] == []


def test_owner_references_need_the_one_update_the_chart_grants(
    chart_apiserver: ApiServer, release: tuple[str, Rendered]
) -> None:
    """With OwnerReferencesPermissionEnforcement (on in this API server, as on many clusters), an owned
    object with blockOwnerDeletion, as kopf.adopt writes it, needs `update` on webhookproviders/finalizers."""
    api = chart_apiserver
    namespace, rendered = release
    rules = rendered.one("Role", OPERATOR_SA)["rules"]
    without = [r for r in rules if "webhookproviders/finalizers" not in r["resources"]]
    assert len(without) == len(rules) - 1
    name = "no-finalizers"
    apply_objects(api, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace}, "rules": without},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ])

    def owned_secret(secret: str) -> str:
        owner = {"apiVersion": "hookline.io/v1alpha1", "kind": "WebhookProvider", "name": "acme",
                 "uid": "8b7c9a1e-0000-4000-8000-000000000001", "controller": True, "blockOwnerDeletion": True}
        return json.dumps({"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "v"},
                           "metadata": {"name": secret, "namespace": namespace, "ownerReferences": [owner]}})

    denied = api.kubectl("create", "-f", "-", input=owned_secret("denied"), token=request_token(api, namespace, name),
                         check=False)
    assert denied.returncode != 0 and "blockOwnerDeletion" in denied.stderr, denied
    api.kubectl("create", "-f", "-", input=owned_secret("allowed"), token=request_token(api, namespace, OPERATOR_SA))


def test_a_cluster_wide_operator_has_the_same_verbs_everywhere_and_no_more(chart_apiserver: ApiServer) -> None:
    namespace = create_namespace(chart_apiserver, "all")
    rendered = render(deep_merge(MINIMAL, {"operator": {"watchAllNamespaces": True}}), namespace=namespace)
    apply_objects(chart_apiserver, [o for _, o in rendered.objects
                                    if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")])
    who = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    anywhere = create_namespace(chart_apiserver, "team")
    assert [n for n in OPERATOR_NEEDS if not can_i(chart_apiserver, who, n[0], n[1], anywhere, *n[2:])] == []
    allowed = [n for n in OPERATOR_MUST_NOT if can_i(chart_apiserver, who, n[0], n[1], anywhere, *n[2:])]
    assert not allowed, f"the cluster-wide operator may {allowed}"


def test_operator_has_nothing_outside_its_namespaces(chart_apiserver: ApiServer, release: tuple[str, Rendered]) -> None:
    namespace, _ = release
    other = create_namespace(chart_apiserver, "other")
    chart_apiserver.kubectl("create", "secret", "generic", "not-yours", "-n", other, "--from-literal=k=v")
    who = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    for verb, resource in [
        ("get", "secrets"),
        ("create", "secrets"),
        ("get", "webhookproviders.hookline.io"),
        ("list", "webhookproviders.hookline.io"),
        ("create", "deployments.apps"),
        ("patch", "deployments.apps"),
        ("create", "events"),
    ]:
        assert not can_i(chart_apiserver, who, verb, resource, other), f"{verb} {resource} in {other}"
    assert not can_i(chart_apiserver, who, "get", "secrets", other, "--all-namespaces")
    # And with its real token, not impersonation: the API server answers 403.
    token = request_token(chart_apiserver, namespace, OPERATOR_SA)
    result = chart_apiserver.kubectl("get", "secret", "not-yours", "-n", other, token=token, check=False)
    assert result.returncode != 0 and "Forbidden" in result.stderr, result


@pytest.mark.parametrize("component", ["receiver", "relay"])
def test_receiver_and_relay_have_no_api_access(
    chart_apiserver: ApiServer, release: tuple[str, Rendered], component: str
) -> None:
    namespace, _ = release
    name = f"hookline-{component}"
    account = json.loads(chart_apiserver.kubectl("get", "serviceaccount", name, "-n", namespace, "-o", "json").stdout)
    assert account["automountServiceAccountToken"] is False
    pod_spec = json.loads(
        chart_apiserver.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout
    )["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    who = f"system:serviceaccount:{namespace}:{name}"
    for verb, resource in [
        ("get", "secrets"),
        ("list", "pods"),
        ("get", "configmaps"),
        ("get", "webhookproviders.hookline.io"),
        ("list", "deployments.apps"),
        ("create", "events"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ]:
        assert not can_i(chart_apiserver, who, verb, resource, namespace), f"{name} may {verb} {resource}"
    # No binding anywhere in the cluster names it.
    for kind in ("rolebindings", "clusterrolebindings"):
        bindings = json.loads(chart_apiserver.kubectl("get", kind, "-A", "-o", "json").stdout)["items"]
        for binding in bindings:
            for subject in binding.get("subjects") or []:
                assert (subject.get("name"), subject.get("namespace")) != (name, namespace), binding["metadata"]


def test_watch_namespaces_grant_exactly_those(chart_apiserver: ApiServer) -> None:
    namespace = "hookline"  # installed by the production test or created here
    for ns in ("hookline", "payments"):
        ensure_namespace(chart_apiserver, ns)
    rendered = render_production(namespace=namespace)
    rbac = [o for _, o in rendered.objects if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    apply_objects(chart_apiserver, rbac)
    who = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    for ns in ("hookline", "payments"):
        assert can_i(chart_apiserver, who, "create", "secrets", ns)
        assert can_i(chart_apiserver, who, "watch", "webhookproviders.hookline.io", ns)
    assert not can_i(chart_apiserver, who, "get", "secrets", "default")


# -- the real operator, as its ServiceAccount ---------------------------------------------------


def ready(obj: dict[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def scanning_hint(logs: str) -> str:
    """Name the fix when kopf asks for what the chart deliberately does not grant."""
    if re.search(r'cannot (list|watch) resource "(namespaces|customresourcedefinitions)"', logs):
        return (
            "kopf is scanning namespaces/CRDs, which needs cluster-wide read access the chart does not grant: "
            "the operator's startup handler should set settings.scanning.disabled = True\n"
        )
    return ""


PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: acme}
spec:
  signature: {scheme: standard-webhooks, secretRef: {name: acme-webhook, key: secret}}
  handler: "support.handlers:record_effect"
  leaseSeconds: 5
  workers: {minReplicas: 0, maxReplicas: 3, targetBacklogPerReplica: 100, scaleDownStabilizationSeconds: 3}
"""


@pytest.mark.asyncio(loop_scope="session")
async def test_operator_runs_with_the_chart_service_account(
    chart_apiserver: ApiServer, database_url: str, pool: asyncpg.Pool, log_dir: Path, tmp_path: Path
) -> None:
    """Provider created -> secret generated -> synced -> scaled -> replayed -> rotated, all by the
    operator authenticated with a TokenRequest token of the chart's ServiceAccount: any missing
    permission would surface as a Forbidden error in its log or a step that never happens."""
    api = chart_apiserver
    namespace = create_namespace(api, "op")
    install_operator_rbac(api, namespace)
    kubeconfig = service_account_kubeconfig(api, namespace, OPERATOR_SA, tmp_path)
    port = free_port()
    operator = ServiceProcess(
        ["operator", "--namespace", namespace, "--liveness", f"http://127.0.0.1:{port}/healthz", "--interval", "1"],
        database_url,
        log_dir,
        port=port,
        env={"KUBECONFIG": str(kubeconfig), "HOOKLINE_WORKER_IMAGE": "hookline:test"},
    )
    operator.start("/healthz", timeout=60)
    try:
        api.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER)
        whp = await eventually(lambda: (o := kget(api, namespace, "whp", "acme")) and ready(o) and o, what="Ready")
        secret = kget(api, namespace, "secret", "acme-webhook")
        assert secret["metadata"]["ownerReferences"][0]["uid"] == whp["metadata"]["uid"]
        assert base64.b64decode(secret["data"]["secret"]).startswith(b"whsec_")
        deployment = kget(api, namespace, "deployment", "acme-worker")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "hookline:test"

        await insert_events(pool, "acme", 150)  # backlog 150 / 100 per replica -> 2 workers
        await eventually(lambda: kget(api, namespace, "deployment", "acme-worker")["spec"]["replicas"] == 2,
                         what="scaled to 2")

        await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 3 WHERE provider = 'acme'")
        api.kubectl("annotate", "whp", "acme", "-n", namespace, "hookline.io/replay-dlq=r1", "--overwrite")
        def replay_status() -> Any:
            return kget(api, namespace, "whp", "acme")["status"].get("replay") or {}

        replay = await eventually(lambda: replay_status().get("lastHandledToken") == "r1" and replay_status(),
                                  what="replay")
        assert replay["requeued"] == 150

        api.kubectl("annotate", "whp", "acme", "-n", namespace, "hookline.io/rotate-secret=k1", "--overwrite")
        def rotation_token() -> Any:
            return (kget(api, namespace, "whp", "acme")["status"].get("rotation") or {}).get("lastHandledToken")

        await eventually(lambda: rotation_token() == "k1", what="rotation handled")
        # Its Events were written too (core/v1 or events.k8s.io, both granted).
        reasons = {e["reason"] for e in kget(api, namespace, "events")["items"]}
        assert reasons, "the operator posted no Events"

        api.kubectl("delete", "whp", "acme", "-n", namespace, "--wait=false")
        await eventually(lambda: api.kubectl("get", "whp", "acme", "-n", namespace, check=False).returncode != 0,
                         what="deleted")
        await asyncio.sleep(1)
    except AssertionError as err:  # the operator's own account of what went wrong
        logs = operator.logs()
        raise AssertionError(f"{err}\n{scanning_hint(logs)}--- operator log (last lines):\n{logs[-6000:]}") from err
    finally:
        operator.stop()
    logs = operator.logs()
    # kopf and the kubernetes client report a denied call as Forbidden / code 403.
    denied = re.search(r"forbidden|code\W{0,4}403|status\W{0,4}403|\(403\)", logs, re.IGNORECASE)
    assert not denied, f"{scanning_hint(logs)}the operator hit a permission error:\n{logs[-5000:]}"
