"""The few Kubernetes API calls the operator makes beyond kopf's own, on the official client.

One ``Kube`` holds one API client (one connection pool) for the operator's lifetime;
it lives in the operator's kopf memo. The client is synchronous, so each call runs
in a thread of the client's own pool (asyncio's default pool has cpu + 4 threads, which a few
hundred resources' timers saturate) and the event loop never blocks on the API server. Reads return small
typed observations (what the operator decides on), not the client's models.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "hookline.io", "v1alpha1", "webhookproviders"
THREADS = 16  # concurrent API calls; the HTTP connection pool is as large, so none is discarded


class ObservedSecret(NamedTuple):
    name: str
    data: dict[str, str]  # decoded values
    owner_uids: frozenset[str]  # metadata.ownerReferences[].uid
    annotations: dict[str, str]


class ObservedDeployment(NamedTuple):
    name: str
    replicas: int
    owner_uids: frozenset[str]
    annotations: dict[str, str]


def load_config() -> None:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # KUBECONFIG read now: the library reads it only once, when it is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)  # type: ignore[no-untyped-call]


def _owner_uids(metadata: Any) -> frozenset[str]:
    return frozenset(ref.uid for ref in (metadata.owner_references or []))


class Kube:
    """Typed, non-blocking access to Secrets, Deployments and WebhookProviders."""

    def __init__(self) -> None:
        load_config()
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = THREADS
        self._executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="kube")
        # Typed as Any: the client's models are not what callers see (they get the tuples above).
        self._api: Any = client.ApiClient(configuration)
        self._core: Any = client.CoreV1Api(self._api)
        self._apps: Any = client.AppsV1Api(self._api)
        self._custom: Any = client.CustomObjectsApi(self._api)

    def close(self) -> None:
        self._api.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    async def read_secret(self, namespace: str, name: str) -> ObservedSecret | None:
        """The Secret, its data decoded, or None when it does not exist."""
        try:
            secret = await self._call(self._core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        return ObservedSecret(name, data, _owner_uids(secret.metadata), dict(secret.metadata.annotations or {}))

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        await self._call(self._core.create_namespaced_secret, namespace, body)

    async def patch_secret(self, namespace: str, name: str, string_data: dict[str, str],
                           annotations: dict[str, str] | None = None) -> None:
        body: dict[str, Any] = {"stringData": string_data}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        await self._call(self._core.patch_namespaced_secret, name, namespace, body)

    async def read_deployment(self, namespace: str, name: str) -> ObservedDeployment | None:
        try:
            found = await self._call(self._apps.read_namespaced_deployment, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return ObservedDeployment(name, int(found.spec.replicas or 0), _owner_uids(found.metadata),
                                  dict(found.metadata.annotations or {}))

    async def create_deployment(self, namespace: str, body: dict[str, Any]) -> None:
        await self._call(self._apps.create_namespaced_deployment, namespace, body)

    async def patch_deployment(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        await self._call(self._apps.patch_namespaced_deployment, name, namespace, body)

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        await self._call(self._apps.patch_namespaced_deployment_scale, name, namespace,
                                {"spec": {"replicas": replicas}})

    async def provider_uid(self, namespace: str, name: str) -> str | None:
        """The uid of WebhookProvider namespace/name, None when it does not exist.

        Any other failure (403 for a namespace this operator may not read, a timeout)
        raises: the caller must not conclude that the resource is gone.
        """
        try:
            found = await self._call(self._custom.get_namespaced_custom_object,
                                            GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return str(found["metadata"]["uid"])
