"""The operator as a real process against the envtest API server, for any set of namespaces and settings.

It runs as the chart's operator, not as the admin: a ServiceAccount bound, in each namespace it
watches, to a Role holding exactly the rules the chart renders (``hookline.operatorRules``), so a
call the chart does not grant fails these tests with a Forbidden error.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

from apiserver import ApiServer

from hookline.core.embedded import free_port
from support.kube import kget
from support.processes import ServiceProcess
from support.waiting import eventually

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))
from chartkit import MINIMAL, render

# Where the tests' operator identity lives (the chart puts it in the release's namespace).
ACCOUNT_NAMESPACE = "hookline-operator-tests"
ACCOUNT = "hookline-operator"
ROLE = "hookline-operator"


@functools.cache
def chart_operator_rules() -> tuple[dict[str, Any], ...]:
    """The rules of the chart's operator Role, as Helm renders them with default values."""
    rules: list[dict[str, Any]] = render(MINIMAL).one("Role", ROLE)["rules"]
    return tuple(rules)


def grant_chart_role(apiserver: ApiServer, namespaces: list[str]) -> str:
    """Bind the operator identity to the chart's Role in each namespace; its user name."""
    if apiserver.kubectl("get", "namespace", ACCOUNT_NAMESPACE, check=False).returncode != 0:
        apiserver.kubectl("create", "namespace", ACCOUNT_NAMESPACE, check=False)  # another test may win the race
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                                      "metadata": {"name": ACCOUNT, "namespace": ACCOUNT_NAMESPACE}}]
    for namespace in namespaces:
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                        "metadata": {"name": ROLE, "namespace": namespace}, "rules": list(chart_operator_rules())})
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": {"name": ROLE, "namespace": namespace},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
                        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": ACCOUNT_NAMESPACE}]})
    apiserver.kubectl("apply", "--server-side", "--field-manager=hookline-tests", "-f", "-",
                      input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return f"system:serviceaccount:{ACCOUNT_NAMESPACE}:{ACCOUNT}"


def operator_kubeconfig(apiserver: ApiServer, namespaces: list[str], directory: Path) -> Path:
    """A kubeconfig authenticating with a TokenRequest token of the identity ``grant_chart_role`` binds."""
    user = grant_chart_role(apiserver, namespaces)
    token = apiserver.kubectl("create", "token", ACCOUNT, "-n", ACCOUNT_NAMESPACE, "--duration=3600s").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": apiserver.url,
                                                      "certificate-authority": str(apiserver.ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "envtest", "user": user}}],
        "current-context": "operator",
    }
    path = directory / f"kubeconfig-operator-{free_port()}.json"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def operator_env(apiserver: ApiServer, namespaces: list[str], log_dir: Path) -> dict[str, str]:
    """The environment that makes an operator process the chart's operator for these namespaces."""
    return {"KUBECONFIG": str(operator_kubeconfig(apiserver, namespaces, log_dir)),
            "HOOKLINE_WORKER_IMAGE": "hookline:test"}


def start_operator(apiserver: ApiServer, namespaces: list[str], database_url: str, log_dir: Path,
                   env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()) -> ServiceProcess:
    port = free_port()
    args = ["operator", "--liveness", f"http://127.0.0.1:{port}/healthz", "--interval", "1", *extra_args]
    for namespace in namespaces:
        args += ["--namespace", namespace]
    return ServiceProcess(args, database_url, log_dir, port=port, env={
        **operator_env(apiserver, namespaces, log_dir), **(env or {}),
    }).start("/healthz", timeout=60)


def timer_runs(operator: ServiceProcess, timer: str) -> int:
    """Runs of one of the operator's kopf timers (sync, scale, annotation_tokens) that have ended,
    over all its resources: kopf logs each one as "Timer 'scale' succeeded."."""
    return operator.logs().count(f"Timer '{timer}' succeeded.")


async def timer_ran(operator: ServiceProcess, timer: str, runs: int = 2) -> None:
    """Wait until ``runs`` more runs of ``timer`` have ended. With the default two, for an operator
    with one resource, one whole run began after this call: what it would do, it has done. A
    negative check waits here instead of sleeping, then asserts that nothing happened."""
    start = timer_runs(operator, timer)
    await eventually(lambda: timer_runs(operator, timer) >= start + runs, interval=0.2,
                     what=f"{runs} more runs of the operator's {timer} timer")


# kopf and the kubernetes client report a denied call as Forbidden / code 403.
FORBIDDEN = re.compile(r"forbidden|code\W{0,4}403|status\W{0,4}403|\(403\)", re.IGNORECASE)


def permission_errors(logs: str) -> list[str]:
    """The operator's log lines that report a call its Role does not allow."""
    return [line for line in logs.splitlines() if FORBIDDEN.search(line)]


def condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type), {})


def event_lines(apiserver: ApiServer, namespace: str) -> list[str]:
    return [f"{e['type']} {e['reason']}: {e.get('message', '')}" for e in kget(apiserver, namespace, "events")["items"]]
