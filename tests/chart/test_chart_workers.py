"""What the chart tells the operator about worker pods: the worker template ConfigMap (values
`worker.*`), the connection budget (database.maxConnections) and the handler modules per namespace."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chartkit import (
    CHART,
    MINIMAL,
    Obj,
    Rendered,
    deep_merge,
    load_values,
    render,
    render_default,
    validate_values,
)
from test_chart_render import K8S_VERSION

from hookline.core import pools

TEMPLATE_CONFIGMAP = "hookline-worker-template"

WORKER_VALUES: Obj = {
    "image": "registry.example/hookline-worker:1.2.3",
    "pullPolicy": "Always",
    "imagePullSecrets": [{"name": "regcred"}],
    "concurrency": 24,
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20000, "seccompProfile": {"type": "RuntimeDefault"}},
    "containerSecurityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                 "capabilities": {"drop": ["ALL"]}},
    "serviceAccountName": "hookline-worker",
    "priorityClassName": "webhooks",
    "nodeSelector": {"pool": "workers"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "workers", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
    "extraEnv": [{"name": "TEAM_SETTING", "value": "on"}],
    "extraEnvFrom": [{"configMapRef": {"name": "handler-config"}}],
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"cost-center": "webhooks"},
}


def worker_template(rendered: Rendered) -> Obj:
    configmap = rendered.one("ConfigMap", TEMPLATE_CONFIGMAP)
    template: Obj = yaml.safe_load(configmap["data"]["template.yaml"])
    return template


def operator_pod(rendered: Rendered) -> Obj:
    pod: Obj = rendered.one("Deployment", "hookline-operator")["spec"]["template"]
    return pod


def operator_env(rendered: Rendered) -> dict[str, Any]:
    container = operator_pod(rendered)["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_default_template_follows_the_chart_wide_values() -> None:
    rendered = render_default()
    template = worker_template(rendered)
    assert template["concurrency"] == 16
    spec = template["pod"]["spec"]
    container = spec["containers"][0]
    assert container["name"] == "worker"
    assert container["image"] == "ghcr.io/hookline/hookline:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert spec["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"HOOKLINE_LOG_FORMAT", "HOOKLINE_LOG_LEVEL"} <= {e["name"] for e in container["env"]}
    # Never the database URL: the operator adds the namespace's own credential.
    assert "HOOKLINE_DATABASE_URL" not in json.dumps(template)
    assert template["pod"]["metadata"]["annotations"]["prometheus.io/port"] == "8081"


def test_every_worker_value_reaches_the_template() -> None:
    rendered = render(deep_merge(MINIMAL, {"worker": WORKER_VALUES}))
    template = worker_template(rendered)
    spec = template["pod"]["spec"]
    container = spec["containers"][0]
    assert template["concurrency"] == 24
    assert container["image"] == WORKER_VALUES["image"]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == WORKER_VALUES["resources"]
    assert container["securityContext"] == WORKER_VALUES["containerSecurityContext"]
    assert container["envFrom"] == WORKER_VALUES["extraEnvFrom"]
    assert {"name": "TEAM_SETTING", "value": "on"} in container["env"]
    assert spec["securityContext"] == WORKER_VALUES["podSecurityContext"]
    for key in ("imagePullSecrets", "serviceAccountName", "priorityClassName", "nodeSelector", "tolerations",
                "affinity", "topologySpreadConstraints"):
        assert spec[key] == WORKER_VALUES[key], key
    assert template["pod"]["metadata"]["annotations"]["example.com/owner"] == "platform"
    assert template["pod"]["metadata"]["labels"]["cost-center"] == "webhooks"


def test_worker_image_defaults_to_the_chart_image_and_its_digest() -> None:
    digest = "sha256:" + "a" * 64
    rendered = render(deep_merge(MINIMAL, {"image": {"digest": digest}, "imagePullSecrets": [{"name": "shared"}]}))
    spec = worker_template(rendered)["pod"]["spec"]
    assert spec["containers"][0]["image"] == f"ghcr.io/hookline/hookline@{digest}"
    assert spec["imagePullSecrets"] == [{"name": "shared"}]


@pytest.mark.parametrize("worker", [{}, WORKER_VALUES], ids=["default", "everything-set"])
def test_template_is_a_valid_pod_template(worker: Obj) -> None:
    template = worker_template(render(deep_merge(MINIMAL, {"worker": worker})))
    pod = template["pod"]
    labels = {"app": "w"}
    pod["metadata"]["labels"].update(labels)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "n"},
                  "spec": {"selector": {"matchLabels": labels}, "template": pod}}
    # strict: a misspelt field in the template is an error here, before any operator reads it.
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_the_operator_mounts_the_template_and_restarts_when_it_changes() -> None:
    default = render_default()
    pod = operator_pod(default)
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "worker-template")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "worker-template")
    assert volume["configMap"]["name"] == TEMPLATE_CONFIGMAP
    assert operator_env(default)["HOOKLINE_WORKER_TEMPLATE"] == f"{mount['mountPath']}/template.yaml"
    changed = render(deep_merge(MINIMAL, {"worker": {"nodeSelector": {"pool": "other"}}}))
    checksum = "checksum/worker-template"
    assert pod["metadata"]["annotations"][checksum] != operator_pod(changed)["metadata"]["annotations"][checksum]
    assert render_default().one("ConfigMap", TEMPLATE_CONFIGMAP) == default.one("ConfigMap", TEMPLATE_CONFIGMAP)


def test_no_template_without_the_operator() -> None:
    assert not render(deep_merge(MINIMAL, {"operator": {"enabled": False}})).find("ConfigMap", TEMPLATE_CONFIGMAP)


# -- the connection budget ---------------------------------------------------------------------


DEFAULTS = load_values(CHART / "values.yaml")
MIGRATE_JOB = 1  # `hookline migrate` holds one connection of its own, no pool


def fixed_connections(values: Obj) -> int:
    """database.maxConnections' documented sum, from the pool sizes the services really use: each
    Deployment's replicas plus its one surge pod, times its pool (the console's too, when it runs);
    the operator's; the migrate Job's."""
    v = deep_merge(DEFAULTS, values)
    receiver, relay, autoscaling = v["receiver"], v["relay"], v["receiver"]["autoscaling"]
    receiver_pods = autoscaling["maxReplicas"] if autoscaling["enabled"] else receiver["replicas"]
    total = (receiver_pods + 1) * pools.receiver(receiver["dbConnections"])
    if relay["enabled"]:
        total += (relay["replicas"] + 1) * pools.relay(relay["concurrency"])
    if v["console"]["enabled"]:
        total += (v["console"]["replicas"] + 1) * pools.CONSOLE
    if v["operator"]["enabled"]:
        total += pools.OPERATOR
    if v["migrate"]["enabled"]:
        total += MIGRATE_JOB
    return total


def chart_arithmetic(values: Obj) -> tuple[int, int]:
    """(fixed connections, one worker pod's) as the chart's templates count them, read from the error
    with which a budget of one connection fails the install."""
    with pytest.raises(helm.HelmError) as caught:
        render(deep_merge(MINIMAL, deep_merge(values, {"database": {"maxConnections": 1}})))
    found = re.search(r"may hold (\d+) connections, and one worker pod needs (\d+)", str(caught.value))
    assert found, str(caught.value)
    return int(found[1]), int(found[2])


# Each number of the chart's arithmetic (_helpers.tpl) moved on its own: the surge pod, each pool's
# extra connections, the relay's cap from both sides, each optional part switched off.
ARITHMETIC_CASES = {
    "default": {},
    "receiver-sized": {"receiver": {"replicas": 4, "dbConnections": 9}},
    "receiver-none": {"receiver": {"replicas": 0, "dbConnections": 1}},
    "autoscaled": {"receiver": {"replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 6}}},
    "relay-below-cap": {"relay": {"replicas": 3, "concurrency": 15}},
    "relay-at-cap": {"relay": {"concurrency": 16}},
    "relay-above-cap": {"relay": {"replicas": 0, "concurrency": 17}},
    "relay-one": {"relay": {"concurrency": 1}},
    "no-relay": {"relay": {"enabled": False}},
    "console": {"console": {"enabled": True}},
    "console-replicas": {"console": {"enabled": True, "replicas": 3}},
    "console-none": {"console": {"enabled": True, "replicas": 0}},
    "no-operator": {"operator": {"enabled": False}},
    "no-migrate": {"migrate": {"enabled": False}},
    "small-workers": {"worker": {"concurrency": 1}},
    "large-workers": {"worker": {"concurrency": 40}},
}


@pytest.mark.parametrize("values", ARITHMETIC_CASES.values(), ids=ARITHMETIC_CASES.keys())
def test_the_chart_counts_connections_as_the_services_size_their_pools(values: Obj) -> None:
    worker_concurrency = deep_merge(DEFAULTS, values)["worker"]["concurrency"]
    assert chart_arithmetic(values) == (fixed_connections(values), pools.worker(worker_concurrency))


def test_the_readme_example_is_the_default_arithmetic() -> None:
    text = " ".join((CHART / "README.md").read_text().split())
    found = re.search(r"With the defaults that is ([\d x+]+) = (\d+) before any worker; `maxConnections: (\d+)` "
                      r"leaves (\d+), i\.e\. (\w+) worker pods", text)
    assert found, "the chart README's connection budget example is gone"
    receiver, relay = DEFAULTS["receiver"], DEFAULTS["relay"]
    assert found[1].split(" + ") == [
        f"{receiver['replicas'] + 1} x {pools.receiver(receiver['dbConnections'])}",
        f"{relay['replicas'] + 1} x {pools.relay(relay['concurrency'])}",
        str(pools.OPERATOR),
        str(MIGRATE_JOB),
    ]
    fixed, maximum, left = fixed_connections({}), int(found[3]), int(found[4])
    assert int(found[2]) == fixed and left == maximum - fixed
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    assert found[5] == words[left // pools.worker(DEFAULTS["worker"]["concurrency"])]


@pytest.mark.parametrize("values", [
    {},
    {"receiver": {"replicas": 4, "dbConnections": 8}, "relay": {"replicas": 2, "concurrency": 8}},
    {"receiver": {"autoscaling": {"enabled": True, "maxReplicas": 6}}, "relay": {"concurrency": 200}},
], ids=["default", "sized", "autoscaled"])
def test_workers_get_what_the_fixed_part_leaves(values: Obj) -> None:
    values = deep_merge(values, {"database": {"maxConnections": 500}})
    rendered = render(deep_merge(MINIMAL, values))
    budget = int(operator_env(rendered)["HOOKLINE_WORKER_CONNECTION_BUDGET"])
    assert budget == 500 - fixed_connections(values)
    # The flags the pools are sized by are the ones the chart passes.
    receiver = rendered.one("Deployment", "hookline-receiver")["spec"]["template"]["spec"]["containers"][0]
    relay = rendered.one("Deployment", "hookline-relay")["spec"]["template"]["spec"]["containers"][0]
    assert f"--db-connections={values.get('receiver', {}).get('dbConnections', 4)}" in receiver["args"]
    assert f"--concurrency={values.get('relay', {}).get('concurrency', 64)}" in relay["args"]
    assert rendered.one("Deployment", "hookline-relay")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1


def test_no_budget_by_default() -> None:
    assert "HOOKLINE_WORKER_CONNECTION_BUDGET" not in operator_env(render_default())


def test_a_budget_that_leaves_no_worker_pod_fails_the_install() -> None:
    fixed = fixed_connections({})
    enough = fixed + pools.worker(16)
    render(deep_merge(MINIMAL, {"database": {"maxConnections": enough}}))
    with pytest.raises(helm.HelmError, match=rf"maxConnections={enough - 1} leaves no room for a worker pod.*"
                                             rf"may hold {fixed} connections"):
        render(deep_merge(MINIMAL, {"database": {"maxConnections": enough - 1}}))


def test_the_console_counts_against_the_budget_and_a_tight_one_fails_the_install() -> None:
    """What fits without the console no longer does with it: each console pod, and its surge pod,
    holds the pool `hookline console` opens (console/service.py POOL_CONNECTIONS)."""
    from hookline.console.service import POOL_CONNECTIONS

    assert POOL_CONNECTIONS == pools.CONSOLE
    console = {"console": {"enabled": True, "replicas": 2}}
    fixed = fixed_connections({})
    assert fixed_connections(console) == fixed + 3 * POOL_CONNECTIONS
    enough = fixed + pools.worker(16)
    render(deep_merge(MINIMAL, {"database": {"maxConnections": enough}}))
    with pytest.raises(helm.HelmError, match=rf"maxConnections={enough} leaves no room for a worker pod: receiver, "
                                             rf"relay, console, operator and migrations may hold "
                                             rf"{fixed + 3 * POOL_CONNECTIONS} connections"):
        render(deep_merge(MINIMAL, deep_merge(console, {"database": {"maxConnections": enough}})))
    roomy = enough + 3 * POOL_CONNECTIONS
    rendered = render(deep_merge(MINIMAL, deep_merge(console, {"database": {"maxConnections": roomy}})))
    assert int(operator_env(rendered)["HOOKLINE_WORKER_CONNECTION_BUDGET"]) == pools.worker(16)


# -- handler modules ---------------------------------------------------------------------------


def test_handler_modules_reach_the_operator() -> None:
    modules = {"team-a": ["team_a"], "*": ["shared.webhooks"]}
    env = operator_env(render(deep_merge(MINIMAL, {"operator": {"handlerModules": modules}})))
    assert json.loads(env["HOOKLINE_HANDLER_MODULES"]) == modules
    # The default grants no handler modules to anyone.
    assert json.loads(operator_env(render_default())["HOOKLINE_HANDLER_MODULES"]) == {}


@pytest.mark.parametrize(("values", "where"), [
    ({"operator": {"handlerModules": {"Team_A": ["x"]}}}, "/operator/handlerModules"),
    ({"operator": {"handlerModules": {"team-a": ["team-a.hooks"]}}}, "/operator/handlerModules/team-a/0"),
    ({"operator": {"handlerModules": {"team-a": "team_a"}}}, "/operator/handlerModules/team-a"),
    ({"operator": {"workerImage": "x"}}, "'workerImage'"),  # moved to worker.image
    ({"worker": {"concurrency": 0}}, "/worker/concurrency"),
    ({"worker": {"resorces": {}}}, "'resorces'"),
    ({"worker": {"pullPolicy": "Sometimes"}}, "/worker/pullPolicy"),
    ({"worker": {"nodeSelector": {"pool": 1}}}, "/worker/nodeSelector/pool"),
    ({"worker": {"tenantPlacement": {"allowTolerations": []}}}, "'allowTolerations'"),
    ({"worker": {"tenantPlacement": {"allowedNodeSelectors": {"disk": "ssd"}}}},
     "/worker/tenantPlacement/allowedNodeSelectors/disk"),
    ({"worker": {"tenantPlacement": {"allowedTolerations": [{"key": "gpu", "operator": "Any"}]}}},
     "/worker/tenantPlacement/allowedTolerations/0/operator"),
    ({"worker": {"tenantPlacement": {"allowAffinity": "yes"}}}, "/worker/tenantPlacement/allowAffinity"),
    ({"database": {"maxConnections": -1}}, "/database/maxConnections"),
    ({"receiver": {"dbConnections": 0}}, "/receiver/dbConnections"),
])
def test_worker_and_budget_mistakes_are_named(values: Obj, where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        validate_values(deep_merge(MINIMAL, values))
    assert where in str(caught.value)


@pytest.mark.parametrize("worker", [{}, WORKER_VALUES], ids=["default", "everything-set"])
def test_the_operator_builds_a_valid_deployment_from_the_template(worker: Obj) -> None:
    """What the operator makes of the chart's template (podtemplate + resources) is a Deployment the
    API server accepts, and the template cannot point workers at another database credential."""
    from hookline_operator import podtemplate, resources

    configmap = render(deep_merge(MINIMAL, {"worker": worker})).one("ConfigMap", TEMPLATE_CONFIGMAP)
    template = podtemplate.parse_template(configmap["data"]["template.yaml"])
    assert template.connections_per_replica == pools.worker(worker.get("concurrency", 16))
    spec = {"leaseSeconds": 30, "workers": {"nodeSelector": {"pool": "own"}}}
    deployment = resources.worker_deployment("shop", spec, 2, template)
    deployment["metadata"]["namespace"] = "team-a"
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]
    # Nothing in worker.tenantPlacement: the request is not applied, the platform's placement is.
    assert pod["spec"].get("nodeSelector") == worker.get("nodeSelector")
    container = pod["spec"]["containers"][0]
    database = [e for e in container["env"] if e["name"] == "HOOKLINE_DATABASE_URL"]
    assert database == [{"name": "HOOKLINE_DATABASE_URL",
                         "valueFrom": {"secretKeyRef": {"name": "shop-hookline-database", "key": "url"}}}]
    assert pod["metadata"]["labels"]["hookline.io/provider"] == "shop"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


TENANT_PLACEMENT: Obj = {
    "allowedNodeSelectors": {"disk": ["ssd", "nvme"]},
    "allowedTolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "allowedPriorityClasses": ["payments-critical"],
    "allowAffinity": False,
}


def test_tenant_placement_reaches_the_operator_and_defaults_to_nothing() -> None:
    from hookline_operator import podtemplate
    from hookline_operator.placement import TenantPlacement, Toleration

    default = worker_template(render_default())
    assert default["tenantPlacement"] == {"allowedNodeSelectors": {}, "allowedTolerations": [],
                                          "allowedPriorityClasses": [], "allowAffinity": False}
    text = render_default().one("ConfigMap", TEMPLATE_CONFIGMAP)["data"]["template.yaml"]
    assert podtemplate.parse_template(text).tenant_placement == TenantPlacement()

    rendered = render(deep_merge(MINIMAL, {"worker": {**WORKER_VALUES, "tenantPlacement": TENANT_PLACEMENT}}))
    allowance = podtemplate.parse_template(
        rendered.one("ConfigMap", TEMPLATE_CONFIGMAP)["data"]["template.yaml"]).tenant_placement
    assert allowance.node_selectors == {"disk": {"ssd", "nvme"}}
    assert list(allowance.tolerations) == [Toleration("gpu", "Exists", "", "NoSchedule")]
    assert allowance.priority_classes == {"payments-critical"} and allowance.affinity is False


def test_a_provider_adds_only_what_the_chart_allows_and_the_platform_stays() -> None:
    from hookline_operator import podtemplate, resources

    rendered = render(deep_merge(MINIMAL, {"worker": {**WORKER_VALUES, "tenantPlacement": TENANT_PLACEMENT}}))
    template = podtemplate.parse_template(rendered.one("ConfigMap", TEMPLATE_CONFIGMAP)["data"]["template.yaml"])
    control_plane = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
    gpu = TENANT_PLACEMENT["allowedTolerations"][0]
    workers = {"nodeSelector": {"disk": "ssd", "pool": "control-plane"}, "tolerations": [gpu, control_plane],
               "priorityClassName": "system-cluster-critical", "affinity": {"podAffinity": {}}}
    deployment = resources.worker_deployment("shop", {"workers": workers}, 1, template)
    deployment["metadata"]["namespace"] = "team-a"
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    assert spec["tolerations"] == [*WORKER_VALUES["tolerations"], gpu]
    assert spec["priorityClassName"] == WORKER_VALUES["priorityClassName"]
    assert spec["affinity"] == WORKER_VALUES["affinity"]
    refused = podtemplate.provider_placement(template, workers).refused
    assert len(refused) == 4, refused  # pool, the control-plane toleration, the priority class, affinity


def test_a_template_setting_its_own_database_url_is_overridden() -> None:
    from hookline_operator import podtemplate, resources

    values = {"worker": {"extraEnv": [{"name": "HOOKLINE_DATABASE_URL", "value": "postgresql://admin:pw@db/x"}]}}
    configmap = render(deep_merge(MINIMAL, values)).one("ConfigMap", TEMPLATE_CONFIGMAP)
    template = podtemplate.parse_template(configmap["data"]["template.yaml"])
    deployment = resources.worker_deployment("shop", {}, 1, template)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    database = [e for e in env if e["name"] == "HOOKLINE_DATABASE_URL"]
    assert database == [{"name": "HOOKLINE_DATABASE_URL",
                         "valueFrom": {"secretKeyRef": {"name": "shop-hookline-database", "key": "url"}}}]
    assert "admin:pw" not in str(deployment)


def test_workers_behind_a_transaction_pooler_get_their_session_url_from_their_own_secret() -> None:
    """With the operator's HOOKLINE_DATABASE_POOLING=transaction, each worker reads the session URL of
    its own role from its own Secret; a template cannot set either variable."""
    from hookline_operator import podtemplate, resources

    values = {"worker": {"extraEnv": [{"name": "HOOKLINE_DATABASE_SESSION_URL", "value": "postgresql://admin:pw@db/x"},
                                      {"name": "HOOKLINE_DATABASE_POOLING", "value": "session"}]}}
    configmap = render(deep_merge(MINIMAL, values)).one("ConfigMap", TEMPLATE_CONFIGMAP)
    template = podtemplate.parse_template(configmap["data"]["template.yaml"])
    env = resources.worker_deployment("shop", {}, 1, template, transaction_pooling=True)[
        "spec"]["template"]["spec"]["containers"][0]["env"]
    database = [e for e in env if e["name"].startswith("HOOKLINE_DATABASE_")]
    secret = "shop-hookline-database"
    assert database == [
        {"name": "HOOKLINE_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": secret, "key": "url"}}},
        {"name": "HOOKLINE_DATABASE_SESSION_URL",
         "valueFrom": {"secretKeyRef": {"name": secret, "key": "session-url"}}},
        {"name": "HOOKLINE_DATABASE_POOLING", "value": "transaction"}]
    plain = resources.worker_deployment("shop", {}, 1, template)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in plain if e["name"].startswith("HOOKLINE_DATABASE_")] == ["HOOKLINE_DATABASE_URL"]


def test_the_session_url_and_pooling_values_reach_every_database_client() -> None:
    values = {"database": {"sessionUrl": {"existingSecret": "hookline-direct"}, "pooling": "transaction"}}
    rendered = render(deep_merge(MINIMAL, values))
    clients = []
    for workload, pod_spec in rendered.workloads():
        for container in pod_spec["containers"]:
            env = {e["name"]: e for e in container.get("env") or []}
            if "HOOKLINE_DATABASE_URL" not in env:
                continue
            clients.append(workload["metadata"]["labels"].get("app.kubernetes.io/component"))
            assert env["HOOKLINE_DATABASE_SESSION_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": "hookline-direct", "key": "url"}
            assert env["HOOKLINE_DATABASE_POOLING"]["value"] == "transaction"
    assert {"receiver", "relay", "operator", "migrate"} <= set(clients), clients
    with pytest.raises(Exception, match=r"database\.pooling=transaction needs database\.sessionUrl\.existingSecret"):
        render(deep_merge(MINIMAL, {"database": {"pooling": "transaction"}}))


@pytest.mark.parametrize(("text", "message"), [
    ("concurrency: 0\npod: {spec: {containers: [{name: worker}]}}", "concurrency must be a positive integer"),
    ("pod: {spec: {containers: [{name: other}]}}", "container named 'worker'"),
    ("[not, a, mapping]", "expected a mapping"),
    ("pod: {spec: {containers: [", "not YAML"),
])
def test_a_broken_template_file_is_named(text: str, message: str) -> None:
    from hookline_operator import podtemplate

    with pytest.raises(podtemplate.TemplateError, match=message):
        podtemplate.parse_template(text, "template.yaml")


def test_worker_pods_get_the_destination_secret_as_a_file_and_never_the_key_file() -> None:
    """A tenant's workers hold no key for secrets at rest: a destination provider's workers read the
    destination signing secret from the Secret the operator mirrors it into, and whatever the template
    says, HOOKLINE_SECRET_KEYS_FILE is not in their environment."""
    from hookline_operator import podtemplate, resources

    values = {"worker": {"extraEnv": [{"name": "HOOKLINE_SECRET_KEYS_FILE", "value": "/stolen/keys"}]}}
    configmap = render(deep_merge(MINIMAL, values)).one("ConfigMap", TEMPLATE_CONFIGMAP)
    template = podtemplate.parse_template(configmap["data"]["template.yaml"])
    deployment = resources.worker_deployment("shop", {"destination": {"url": "http://d/"}}, 1, template)
    deployment["metadata"]["namespace"] = "team-a"
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert "HOOKLINE_SECRET_KEYS_FILE" not in env and "/stolen/keys" not in str(deployment)
    assert env["HOOKLINE_DESTINATION_SECRET_FILE"]["value"] == "/etc/hookline/destination/secret"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/hookline/destination")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "shop-destination-secret" and "optional" not in volume["secret"]

    handler = resources.worker_deployment("shop", {"handler": "m:f"}, 1, template)
    assert "HOOKLINE_DESTINATION_SECRET_FILE" not in str(handler) and "destination-secret" not in str(handler)
