"""Act as a ServiceAccount of the chart: a token from the TokenRequest API and a kubeconfig for it.

For the operator's end-to-end tests, run the operator as the chart's operator ServiceAccount instead
of as the admin, so that any permission the chart's Role lacks shows up as a Forbidden error:

    kubeconfig = service_account_kubeconfig(apiserver, namespace, "hookline-operator", tmp_path)
    env = {"KUBECONFIG": str(kubeconfig)}

The RBAC objects must be installed first, e.g. with install_operator_rbac().
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from apiserver import ApiServer
from chartkit import MINIMAL, Rendered, render

# Every call the operator makes (kube.py) and kopf makes for it (watching, patching, events).
OPERATOR_NEEDS = [
    ("get", "webhookproviders.hookline.io"),
    ("list", "webhookproviders.hookline.io"),
    ("watch", "webhookproviders.hookline.io"),
    ("patch", "webhookproviders.hookline.io"),
    ("patch", "webhookproviders.hookline.io", "--subresource=status"),
    ("update", "webhookproviders.hookline.io", "--subresource=finalizers"),
    ("get", "webhookendpoints.hookline.io"),
    ("list", "webhookendpoints.hookline.io"),
    ("watch", "webhookendpoints.hookline.io"),
    ("patch", "webhookendpoints.hookline.io"),
    ("patch", "webhookendpoints.hookline.io", "--subresource=status"),
    ("update", "webhookendpoints.hookline.io", "--subresource=finalizers"),
    ("get", "secrets"),
    ("create", "secrets"),
    ("patch", "secrets"),
    ("get", "deployments.apps"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("patch", "deployments.apps", "--subresource=scale"),
    ("create", "events"),
]

# What the chart granted before it was cut to the calls above (issue 23): each must be denied.
REMOVED = [
    ("list", "deployments.apps"),
    ("watch", "deployments.apps"),
    ("delete", "deployments.apps"),
    ("update", "deployments.apps"),
    ("get", "deployments.apps", "--subresource=scale"),
    ("update", "deployments.apps", "--subresource=scale"),
    ("update", "secrets"),
    ("update", "webhookproviders.hookline.io"),
    ("get", "webhookproviders.hookline.io", "--subresource=status"),
    ("update", "webhookproviders.hookline.io", "--subresource=status"),
    ("update", "webhookendpoints.hookline.io"),
    ("delete", "webhookendpoints.hookline.io"),
    ("patch", "events"),
    ("create", "events.events.k8s.io"),
    ("patch", "events.events.k8s.io"),
]


def request_token(api: ApiServer, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
    """A bound token for the ServiceAccount, from the TokenRequest API (what the kubelet mounts)."""
    # `kubectl create token` is a thin client for POST .../serviceaccounts/<name>/token.
    result = api.kubectl("create", "token", service_account, "-n", namespace, f"--duration={seconds}s")
    return result.stdout.strip()


def service_account_kubeconfig(
    api: ApiServer, namespace: str, service_account: str, directory: Path, *, seconds: int = 3600
) -> Path:
    """Write a kubeconfig that authenticates as system:serviceaccount:<namespace>:<service_account>.

    Its context's namespace is `namespace`, like the in-cluster configuration of a pod.
    """
    token = request_token(api, namespace, service_account, seconds=seconds)
    user = f"system:serviceaccount:{namespace}:{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": api.url, "certificate-authority": str(api.ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "envtest", "user": user, "namespace": namespace}}],
        "current-context": "sa",
    }
    path = directory / f"kubeconfig-{namespace}-{service_account}.json"
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def apply_objects(api: ApiServer, objects: list[dict[str, Any]]) -> None:
    """Server-side apply, as Helm 4 does: the API server validates and defaults every field."""
    api.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def install_operator_rbac(api: ApiServer, namespace: str, *, release: str = "hookline") -> Rendered:
    """Install the chart's operator ServiceAccount, Roles and bindings (and the CRD) for a release in
    `namespace`, exactly as rendered by Helm with default values; returns the whole rendering."""
    rendered = render(MINIMAL, release=release, namespace=namespace)
    wanted = {"CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    apply_objects(api, [o for _, o in rendered.objects if o["kind"] in wanted])
    api.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/webhookproviders.hookline.io")
    return rendered


def create_namespace(api: ApiServer, prefix: str = "c") -> str:
    """A fresh namespace plus its `default` ServiceAccount.

    kube-controller-manager (absent here) creates `default` in every namespace; without it the
    ServiceAccount admission plugin rejects any Pod that names no ServiceAccount (the helm test Pod).
    """
    return ensure_namespace(api, f"{prefix}-{uuid.uuid4().hex[:8]}")


def ensure_namespace(api: ApiServer, name: str) -> str:
    """The namespace `name` with its `default` ServiceAccount, created unless they exist."""
    if api.kubectl("get", "namespace", name, check=False).returncode != 0:
        api.kubectl("create", "namespace", name)
    if api.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        api.kubectl("create", "serviceaccount", "default", "-n", name)
    return name
