"""The operator as a real process against the envtest API server, for any set of namespaces and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apiserver import ApiServer

from hookline.core.embedded import free_port
from support.kube import kget
from support.processes import ServiceProcess


def start_operator(apiserver: ApiServer, namespaces: list[str], database_url: str, log_dir: Path,
                   env: dict[str, str] | None = None) -> ServiceProcess:
    port = free_port()
    args = ["operator", "--liveness", f"http://127.0.0.1:{port}/healthz", "--interval", "1"]
    for namespace in namespaces:
        args += ["--namespace", namespace]
    return ServiceProcess(args, database_url, log_dir, port=port, env={
        "KUBECONFIG": str(apiserver.kubeconfig), "HOOKLINE_WORKER_IMAGE": "hookline:test", **(env or {}),
    }).start("/healthz", timeout=60)


def condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type), {})


def event_lines(apiserver: ApiServer, namespace: str) -> list[str]:
    return [f"{e['type']} {e['reason']}: {e.get('message', '')}" for e in kget(apiserver, namespace, "events")["items"]]
