"""The objects the operator owns for each provider: its signing Secret and its worker Deployment."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hookline_operator.podtemplate import WorkerTemplate, configured_template, provider_pod

MANAGED_BY = {"app.kubernetes.io/managed-by": "hookline-operator"}
PREVIOUS_KEY = "previous"  # JSON list of {"value", "notAfter"}: rotated-out secrets still valid for a while
WORKER_PORT = 8081
DATABASE_SECRET_KEY = "url"
SESSION_URL_SECRET_KEY = "session-url"  # beside it when the operator runs with HOOKLINE_DATABASE_SESSION_URL
# Tenant workers read the destination signing secret from the Secret the operator mirrors it into
# (tenancy.ensure_destination_secret), mounted here: they hold no key to open the column.
DESTINATION_SECRET_DIR = "/etc/hookline/destination"
DESTINATION_SECRET_FILE_ENV = "HOOKLINE_DESTINATION_SECRET_FILE"


def secret_ref(name: str, spec: dict[str, Any]) -> tuple[str, str]:
    ref = (spec.get("signature") or {}).get("secretRef") or {}
    return ref.get("name") or f"{name}-webhook-secret", ref.get("key") or "secret"


def secret_manifest(provider: str, secret_name: str, key: str, value: str,
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Secret the operator owns; labelled with its provider (or ``labels``: an endpoint's)."""
    own = labels if labels is not None else {"hookline.io/provider": provider}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": secret_name, "labels": {**MANAGED_BY, **own}},
        "stringData": {key: value},
    }


def valid_secrets(data: dict[str, str], key: str, now: datetime | None = None) -> list[dict[str, Any]]:
    """The secrets to store for the provider: the current one, then rotated-out ones not yet expired."""
    now = now or datetime.now(UTC)
    secrets: list[dict[str, Any]] = [{"value": data[key], "notAfter": None}] if data.get(key) else []
    for entry in json.loads(data.get(PREVIOUS_KEY) or "[]"):
        if datetime.fromisoformat(entry["notAfter"]) > now:
            secrets.append({"value": entry["value"], "notAfter": entry["notAfter"]})
    return secrets


def worker_name(provider: str) -> str:
    return f"{provider}-worker"


def database_secret_name(provider: str) -> str:
    """The Secret with the URL of the provider's workers' own database role (see tenancy.py)."""
    return f"{provider}-hookline-database"


def destination_secret_name(provider: str) -> str:
    """The Secret with the key the workers sign destination calls with."""
    return f"{provider}-destination-secret"


def worker_deployment(provider: str, spec: dict[str, Any], replicas: int,
                      template: WorkerTemplate | None = None, *, transaction_pooling: bool = False) -> dict[str, Any]:
    """The provider's worker Deployment: the chart's pod template, the provider's overrides, and
    what the operator decides (command, probes, ports, the namespace's own database Secret; with
    ``transaction_pooling``, the operator's HOOKLINE_DATABASE_POOLING=transaction, the workers' session
    URL from the same Secret)."""
    template = template or configured_template()
    lease = int(spec.get("leaseSeconds", 60))
    selector = {"app.kubernetes.io/component": "worker", "hookline.io/provider": provider}
    labels = {"app.kubernetes.io/name": "hookline", **selector, **MANAGED_BY}
    pod = provider_pod(template, spec.get("workers") or {})
    pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), **labels}
    pod_spec = pod["spec"]
    # Workers never talk to the Kubernetes API, whatever ServiceAccount they run as.
    pod_spec["automountServiceAccountToken"] = False
    # Longer than a lease: in-flight events finish (or are handed back) before SIGKILL.
    pod_spec["terminationGracePeriodSeconds"] = lease + 30
    pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), {"name": "tmp", "emptyDir": {}}]
    container = template.container(pod)
    _complete_container(container, provider, lease, template.concurrency, transaction_pooling)
    if spec.get("destination"):
        _mount_destination_secret(pod_spec, container, provider)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": worker_name(provider), "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # Never a surge pod: the connection budget counts replicas, and a queue tolerates a pod less.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": pod,
        },
    }


def _complete_container(container: dict[str, Any], provider: str, lease: int, concurrency: int,
                        transaction_pooling: bool) -> None:
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    container["args"] = ["worker", "--provider", provider, "--port", str(WORKER_PORT),
                         "--grace-period", str(lease), "--concurrency", str(concurrency)]
    secret = database_secret_name(provider)
    database = [{"name": "HOOKLINE_DATABASE_URL",
                 "valueFrom": {"secretKeyRef": {"name": secret, "key": DATABASE_SECRET_KEY}}}]
    if transaction_pooling:
        database += [{"name": "HOOKLINE_DATABASE_SESSION_URL",
                      "valueFrom": {"secretKeyRef": {"name": secret, "key": SESSION_URL_SECRET_KEY}}},
                     {"name": "HOOKLINE_DATABASE_POOLING", "value": "transaction"}]
    # The provider's own credential, first and only: a template cannot point workers elsewhere. Never the
    # key that opens secrets at rest: a tenant's code runs in these pods.
    ours = {"HOOKLINE_DATABASE_URL", "HOOKLINE_DATABASE_SESSION_URL", "HOOKLINE_DATABASE_POOLING",
            "HOOKLINE_SECRET_KEYS_FILE"}
    container["env"] = [*database, *(e for e in container.get("env") or [] if e.get("name") not in ours)]
    container["ports"] = [{"name": "http", "containerPort": WORKER_PORT}]
    container["livenessProbe"] = probe
    container["readinessProbe"] = {**probe, "httpGet": {"path": "/readyz", "port": "http"}}
    container["volumeMounts"] = [*(container.get("volumeMounts") or []), {"name": "tmp", "mountPath": "/tmp"}]


def _mount_destination_secret(pod_spec: dict[str, Any], container: dict[str, Any], provider: str) -> None:
    """The mirrored destination secret as a file (updated in place when it is rotated). Not optional:
    a pod waits for the Secret rather than sending unsigned destination calls."""
    pod_spec["volumes"].append({"name": "destination-secret", "secret": {
        "secretName": destination_secret_name(provider), "items": [{"key": "secret", "path": "secret"}]}})
    container["volumeMounts"].append({"name": "destination-secret", "mountPath": DESTINATION_SECRET_DIR,
                                      "readOnly": True})
    container["env"] = [*(e for e in container["env"] if e.get("name") != DESTINATION_SECRET_FILE_ENV),
                        {"name": DESTINATION_SECRET_FILE_ENV, "value": f"{DESTINATION_SECRET_DIR}/secret"}]
