"""The few Kubernetes API calls the operator makes beyond kopf's own, on the official client.

The client is synchronous; each call runs in a thread so the operator's event loop
never blocks on the API server.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def load_config() -> None:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


def _core() -> Any:
    return client.CoreV1Api()


def _apps() -> Any:
    return client.AppsV1Api()


async def read_secret(namespace: str, name: str) -> dict[str, str] | None:
    """The Secret's data decoded, or None when it does not exist."""
    try:
        secret = await asyncio.to_thread(_core().read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


async def create_secret(namespace: str, body: dict[str, Any]) -> None:
    await asyncio.to_thread(_core().create_namespaced_secret, namespace, body)


async def patch_secret(namespace: str, name: str, string_data: dict[str, str],
                       annotations: dict[str, str] | None = None) -> None:
    body: dict[str, Any] = {"stringData": string_data}
    if annotations:
        body["metadata"] = {"annotations": annotations}
    await asyncio.to_thread(_core().patch_namespaced_secret, name, namespace, body)


async def read_secret_annotations(namespace: str, name: str) -> dict[str, str]:
    secret = await asyncio.to_thread(_core().read_namespaced_secret, name, namespace)
    return dict(secret.metadata.annotations or {})


async def read_deployment(namespace: str, name: str) -> Any | None:
    try:
        return await asyncio.to_thread(_apps().read_namespaced_deployment, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def create_deployment(namespace: str, body: dict[str, Any]) -> None:
    await asyncio.to_thread(_apps().create_namespaced_deployment, namespace, body)


async def patch_deployment(namespace: str, name: str, body: dict[str, Any]) -> None:
    await asyncio.to_thread(_apps().patch_namespaced_deployment, name, namespace, body)


async def scale_deployment(namespace: str, name: str, replicas: int) -> None:
    await asyncio.to_thread(_apps().patch_namespaced_deployment_scale, name, namespace,
                            {"spec": {"replicas": replicas}})
