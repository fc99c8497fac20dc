"""The objects the operator owns for each provider: its signing Secret and its worker Deployment."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

MANAGED_BY = {"app.kubernetes.io/managed-by": "hookline-operator"}
PREVIOUS_KEY = "previous"  # JSON list of {"value", "notAfter"}: rotated-out secrets still valid for a while
DEFAULT_IMAGE = "ghcr.io/hookline/hookline:0.1.0"
WORKER_PORT = 8081


def secret_ref(name: str, spec: dict[str, Any]) -> tuple[str, str]:
    ref = (spec.get("signature") or {}).get("secretRef") or {}
    return ref.get("name") or f"{name}-webhook-secret", ref.get("key") or "secret"


def secret_manifest(provider: str, secret_name: str, key: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": secret_name, "labels": {**MANAGED_BY, "hookline.io/provider": provider}},
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


def _database_env() -> dict[str, Any]:
    """The worker's HOOKLINE_DATABASE_URL, from the operator's own configuration.

    Preferably a reference to a Secret (HOOKLINE_WORKER_DATABASE_SECRET, key
    HOOKLINE_WORKER_DATABASE_SECRET_KEY), which must exist in the provider's namespace.
    """
    secret = os.environ.get("HOOKLINE_WORKER_DATABASE_SECRET")
    if secret:
        key = os.environ.get("HOOKLINE_WORKER_DATABASE_SECRET_KEY", "url")
        return {"name": "HOOKLINE_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
    return {"name": "HOOKLINE_DATABASE_URL", "value": os.environ.get("HOOKLINE_DATABASE_URL", "")}


def worker_deployment(provider: str, spec: dict[str, Any], replicas: int) -> dict[str, Any]:
    lease = int(spec.get("leaseSeconds", 60))
    labels = {"app.kubernetes.io/name": "hookline", "app.kubernetes.io/component": "worker",
              "hookline.io/provider": provider, **MANAGED_BY}
    selector = {"app.kubernetes.io/component": "worker", "hookline.io/provider": provider}
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": worker_name(provider), "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(WORKER_PORT)}},
                "spec": {
                    "automountServiceAccountToken": False,
                    # Longer than a lease: in-flight events finish (or are handed back) before SIGKILL.
                    "terminationGracePeriodSeconds": lease + 30,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "worker",
                        "image": os.environ.get("HOOKLINE_WORKER_IMAGE", DEFAULT_IMAGE),
                        "args": ["worker", "--provider", provider, "--port", str(WORKER_PORT),
                                 "--grace-period", str(lease)],
                        "env": [_database_env(), {"name": "HOOKLINE_LOG_FORMAT", "value": "json"}],
                        "ports": [{"name": "http", "containerPort": WORKER_PORT}],
                        "livenessProbe": probe,
                        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": "http"}},
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
