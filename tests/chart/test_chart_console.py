"""The chart's console: off by default; when on, one Deployment running `hookline console` with the
database like every process, its Service, an optional Ingress, and a ClusterRole that may only create
TokenReviews, SubjectAccessReviews and Events (proven with `kubectl auth can-i` on a real API server).
Every replica reads one CSRF key from a Secret the chart makes once (and keeps, found with `lookup` on
a real API server) or the user gives; audiences reach `--audience`. The authorizer itself runs as
this role in tests/operator/test_console_kube.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import helm_python as helm
import pytest
from apiserver import ApiServer
from chartkit import MINIMAL, Obj, Rendered, deep_merge, render, render_default, render_in_cluster, validate_values
from operator_access import apply_objects, create_namespace

from hookline.core.settings import CONSOLE_CSRF_KEY_FILE, console_csrf_key

CONSOLE = deep_merge(MINIMAL, {"console": {"enabled": True}})
NAME = "hookline-console"
CSRF_SECRET = "hookline-console-csrf"

# Exactly what console/kube.py calls.
CONSOLE_RULES = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


def console_objects(rendered: Rendered) -> list[Obj]:
    return rendered.component("Deployment", "console") + [
        o for _, o in rendered.objects
        if o["kind"] != "Deployment" and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "console"
    ]


def container(rendered: Rendered) -> Obj:
    deployment = rendered.one("Deployment", NAME)
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(found)


def test_the_console_is_off_by_default() -> None:
    assert console_objects(render_default()) == []


def test_the_console_runs_with_kubernetes_auth_and_the_contract_probes() -> None:
    rendered = render(CONSOLE)
    console = container(rendered)
    assert console["args"] == ["console", "--host=0.0.0.0", "--port=8090", "--auth=kubernetes"]
    assert console["ports"] == [{"name": "http", "containerPort": 8090, "protocol": "TCP"}]
    assert console["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert console["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {e["name"]: e for e in console["env"]}
    assert env["HOOKLINE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "hookline-database", "key": "url"}
    # It decrypts no signing secret: no key file.
    assert "HOOKLINE_SECRET_KEYS_FILE" not in env
    pod = rendered.one("Deployment", NAME)["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == NAME
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8090"
    service = rendered.one("Service", NAME)
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "console"
    assert rendered.find("Ingress", NAME) == []


def test_the_console_ingress_follows_values() -> None:
    rendered = render(deep_merge(CONSOLE, {"console": {"ingress": {
        "enabled": True, "className": "nginx", "tls": [{"hosts": ["console.example.com"], "secretName": "c-tls"}],
        "hosts": [{"host": "console.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}]}}}))
    ingress = rendered.one("Ingress", NAME)
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["console.example.com"], "secretName": "c-tls"}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "console.example.com"
    assert rule["http"]["paths"][0]["backend"] == {"service": {"name": NAME, "port": {"name": "http"}}}
    # An Ingress without the console would route to nothing.
    assert render(deep_merge(MINIMAL, {"console": {"ingress": {"enabled": True}}})).find("Ingress", NAME) == []


def test_the_console_reads_the_password_file_and_postgres_tls_like_the_other_processes() -> None:
    rendered = render(deep_merge(CONSOLE, {"database": {
        "passwordFile": {"existingSecret": "db-token", "secretKey": "token"},
        "tls": {"caSecret": "pg-ca", "clientSecret": "pg-client"}}}))
    console = container(rendered)
    env = {e["name"]: e.get("value") for e in console["env"]}
    assert env["HOOKLINE_DATABASE_PASSWORD_FILE"] == "/etc/hookline/database-password/password"
    mounts = {m["mountPath"]: m["name"] for m in console["volumeMounts"]}
    assert {"/etc/hookline/database-password", "/etc/hookline/postgres-tls", "/tmp"} <= set(mounts)
    volumes = {v["name"]: v for v in rendered.one("Deployment", NAME)["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/hookline/database-password"]]["secret"]["secretName"] == "db-token"
    sources = volumes[mounts["/etc/hookline/postgres-tls"]]["projected"]["sources"]
    assert {s["secret"]["name"] for s in sources} == {"pg-ca", "pg-client"}


def test_the_console_role_is_exactly_the_calls_it_makes() -> None:
    rendered = render(CONSOLE, namespace="hookline")
    (role,) = rendered.component("ClusterRole", "console")
    assert role["rules"] == CONSOLE_RULES
    assert role["metadata"]["name"] == "hookline-console-hookline"  # one per release namespace
    (binding,) = rendered.component("ClusterRoleBinding", "console")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "hookline"}]
    assert rendered.component("Role", "console") == [] and rendered.component("RoleBinding", "console") == []
    (account,) = rendered.component("ServiceAccount", "console")
    assert account["automountServiceAccountToken"] is False  # only its pod mounts the token


def test_metrics_discovery_includes_the_console() -> None:
    rendered = render(deep_merge(CONSOLE, {"metrics": {"serviceMonitor": {"enabled": True}}}))
    (monitor,) = rendered.find("ServiceMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    assert "console" in expression["values"]


@pytest.mark.parametrize("bad", [
    {"console": {"enabled": "yes"}},
    {"console": {"replica": 2}},
    {"console": {"service": {"type": "External"}}},
    {"console": {"ingress": {"hosts": [{"host": "x", "paths": [{"path": "no-slash", "pathType": "Prefix"}]}]}}},
    {"console": {"auth": {"audiences": "hookline-console"}}},
    {"console": {"auth": {"audiences": [" padded"]}}},
    {"console": {"csrf": {"existingSecret": "Not_A_Name"}}},
    {"console": {"csrf": {"secretKey": ""}}},
])
def test_the_values_schema_refuses_bad_console_values(bad: Obj) -> None:
    with pytest.raises(helm.HelmValuesError):
        validate_values(deep_merge(MINIMAL, bad))


# -- least privilege, asked of the real authorizer ----------------------------------------------

CONSOLE_NEEDS = [
    ("create", "tokenreviews.authentication.k8s.io"),
    ("create", "subjectaccessreviews.authorization.k8s.io"),
    ("create", "events"),
    ("patch", "events"),
]
CONSOLE_MUST_NOT = [
    ("get", "webhookproviders.hookline.io"),
    ("list", "webhookproviders.hookline.io"),
    ("patch", "webhookproviders.hookline.io"),
    ("get", "secrets"),
    ("list", "secrets"),
    ("list", "events"),
    ("delete", "events"),
    ("create", "events.events.k8s.io"),
    ("create", "serviceaccounts/token"),
    ("create", "localsubjectaccessreviews.authorization.k8s.io"),
    ("impersonate", "users"),
    ("impersonate", "serviceaccounts"),
    ("get", "pods"),
    ("list", "namespaces"),
    ("*", "*"),
]


@pytest.fixture(scope="module")
def console_release(chart_apiserver: ApiServer) -> str:
    namespace = create_namespace(chart_apiserver, "console")
    rendered = render(CONSOLE, namespace=namespace)
    # With the CRD, so that kubectl resolves webhookproviders.hookline.io and the denials below are real.
    apply_objects(chart_apiserver, rendered.find("CustomResourceDefinition") + console_objects(rendered))
    chart_apiserver.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/webhookproviders.hookline.io")
    return namespace


def can_i(api: ApiServer, who: str, verb: str, resource: str, namespace: str) -> bool:
    result = api.kubectl("auth", "can-i", verb, resource, f"--as={who}", "-n", namespace, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


@pytest.mark.k8s
def test_the_console_may_review_tokens_and_access_and_record_events_anywhere(
        chart_apiserver: ApiServer, console_release: str) -> None:
    who = f"system:serviceaccount:{console_release}:{NAME}"
    team = create_namespace(chart_apiserver, "team")  # Events go to the WebhookProvider's namespace
    for namespace in (console_release, team):
        denied = [n for n in CONSOLE_NEEDS if not can_i(chart_apiserver, who, n[0], n[1], namespace)]
        assert not denied, f"the console lacks {denied} in {namespace}"


@pytest.mark.k8s
def test_the_console_may_do_nothing_else(chart_apiserver: ApiServer, console_release: str) -> None:
    who = f"system:serviceaccount:{console_release}:{NAME}"
    team = create_namespace(chart_apiserver, "team")
    for namespace in (console_release, team):
        allowed = [n for n in CONSOLE_MUST_NOT if can_i(chart_apiserver, who, n[0], n[1], namespace)]
        assert not allowed, f"the console may {allowed} in {namespace}"
    deployment = json.loads(chart_apiserver.kubectl("get", "deployment", NAME, "-n", console_release,
                                                    "-o", "json").stdout)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "console"


def test_the_notes_say_how_to_open_the_console_only_when_it_is_on() -> None:
    assert "console" not in render_default().notes.lower()
    notes = render(CONSOLE).notes
    assert "port-forward service/hookline-console 8090:80" in notes and "kubectl create token" in notes
    published = render(deep_merge(CONSOLE, {"console": {"ingress": {"enabled": True, "tls": [{"hosts": ["x"]}]}}}))
    assert "https://hookline.example.com/" in published.notes


# -- one CSRF key for every replica, audiences --------------------------------------------------


def csrf_key_of(rendered: Rendered, secret: str = CSRF_SECRET) -> str:
    data = rendered.one("Secret", secret)["data"]
    return base64.b64decode(data["key"]).decode()


def test_every_replica_reads_the_csrf_key_from_the_chart_secret(tmp_path: Path) -> None:
    rendered = render(deep_merge(CONSOLE, {"console": {"replicas": 3}}))
    console = container(rendered)
    env = {e["name"]: e.get("value") for e in console["env"]}
    path = Path(env[CONSOLE_CSRF_KEY_FILE])
    (mount,) = [m for m in console["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in rendered.one("Deployment", NAME)["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == CSRF_SECRET
    assert secret["items"] == [{"key": "key", "path": path.name}]
    # What the chart makes is a key the console accepts (and not one fixed in the chart).
    key = csrf_key_of(rendered)
    (tmp_path / "key").write_text(key)
    assert console_csrf_key({CONSOLE_CSRF_KEY_FILE: str(tmp_path / "key")}) == key.encode()
    assert csrf_key_of(render(CONSOLE)) != key
    # Never in the pod spec itself, nor in the NOTES.
    assert key not in json.dumps(rendered.one("Deployment", NAME)) and key not in rendered.notes
    assert rendered.find("Secret", CSRF_SECRET)[0]["metadata"]["labels"]["app.kubernetes.io/component"] == "console"
    assert not render_default().find("Secret", CSRF_SECRET)


def test_an_existing_csrf_secret_replaces_the_chart_one() -> None:
    rendered = render(deep_merge(CONSOLE, {"console": {"csrf": {"existingSecret": "my-csrf", "secretKey": "k"}}}))
    assert not rendered.find("Secret", CSRF_SECRET)
    volumes = rendered.one("Deployment", NAME)["spec"]["template"]["spec"]["volumes"]
    (secret,) = [v["secret"] for v in volumes if v["name"] == "console-csrf"]
    assert secret["secretName"] == "my-csrf" and secret["items"] == [{"key": "k", "path": "key"}]


@pytest.mark.k8s
def test_the_chart_keeps_the_csrf_key_it_made_across_upgrades(chart_apiserver: ApiServer) -> None:
    """`lookup` against a real API server: the first install makes a key, every later render (an
    upgrade, more replicas) brings the same one back, so open forms keep working."""
    namespace = create_namespace(chart_apiserver, "csrf")
    first = render_in_cluster(chart_apiserver.kubeconfig, CONSOLE, namespace=namespace)
    key = csrf_key_of(first)
    assert csrf_key_of(render_in_cluster(chart_apiserver.kubeconfig, CONSOLE, namespace=namespace)) != key
    apply_objects(chart_apiserver, first.find("Secret", CSRF_SECRET))
    scaled = deep_merge(CONSOLE, {"console": {"replicas": 4}})
    upgraded = render_in_cluster(chart_apiserver.kubeconfig, scaled, namespace=namespace, upgrade=True)
    assert csrf_key_of(upgraded) == key


def test_audiences_reach_the_console_as_flags() -> None:
    rendered = render(deep_merge(CONSOLE, {"console": {"auth": {"audiences": ["hookline-console", "hookline-ui"]}}}))
    assert container(rendered)["args"] == ["console", "--host=0.0.0.0", "--port=8090", "--auth=kubernetes",
                                           "--audience=hookline-console", "--audience=hookline-ui"]
