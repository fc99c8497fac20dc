"""Two teams on the real kube-apiserver for ``hookline console --auth kubernetes`` (the API tests in
tests/operator/test_console_kube.py and the browser test beside it).

The console runs as the chart's console ServiceAccount (its ClusterRole as rendered by Helm), so a
permission the chart lacks fails in the tests too; each team owns one WebhookProvider, and a third
provider has no owner (applied with the CLI, as without Kubernetes).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import asyncpg
from apiserver import ApiServer

from hookline.console.kube import ProviderOwner
from support.inbox import apply_provider
from support.kube import kget
from support.processes import ServiceProcess, console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))
from chartkit import MINIMAL, deep_merge, render
from operator_access import apply_objects, ensure_namespace, request_token, service_account_kubeconfig

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks}}
  destination: {{url: "http://orders.example.svc/webhooks"}}
"""
CONSOLE_SA = "hookline-console"


class World:
    """Two team namespaces with a provider each, and ServiceAccounts with different rights."""

    def __init__(self, api: ApiServer, directory: Path) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.api = api
        self.team_a, self.team_b, self.system = f"team-a-{suffix}", f"team-b-{suffix}", f"hookline-{suffix}"
        for namespace in (self.team_a, self.team_b, self.system):
            ensure_namespace(api, namespace)
        # The console's identity: exactly the chart's objects for it.
        rendered = render(deep_merge(MINIMAL, {"console": {"enabled": True}}), namespace=self.system)
        apply_objects(api, [o for o in (obj for _, obj in rendered.objects)
                            if o["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
                            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "console"])
        self.kubeconfig = service_account_kubeconfig(api, self.system, CONSOLE_SA, directory)
        # Public provider names differ from the resources' names: the authorizer must ask about the
        # resource (owner_namespace/owner_name), never about the row's name.
        self.whp_a, self.whp_b = f"orders-{suffix}", f"billing-{suffix}"
        self.provider_a, self.provider_b, self.unowned = f"pub-a-{suffix}", f"pub-b-{suffix}", f"cli-{suffix}"
        api.kubectl("apply", "-n", self.team_a, "-f", "-", input=PROVIDER.format(name=self.whp_a))
        api.kubectl("apply", "-n", self.team_b, "-f", "-", input=PROVIDER.format(name=self.whp_b))
        self.uid_a = str(kget(api, self.team_a, "whp", self.whp_a)["metadata"]["uid"])
        self.providers = [ProviderOwner(self.provider_a, self.team_a, self.whp_a),
                          ProviderOwner(self.provider_b, self.team_b, self.whp_b),
                          ProviderOwner(self.unowned, None, None)]
        self.reader = self.account(self.team_a, "reader", ["get"])
        self.replayer = self.account(self.team_a, "replayer", ["get", "patch"])
        self.cluster_reader = self.account(self.team_a, "auditor", ["get", "list"], cluster_wide=True)
        self.cluster_operator = self.account(self.team_a, "platform", ["get", "list", "patch"], cluster_wide=True)

    def account(self, namespace: str, name: str, verbs: list[str], *, cluster_wide: bool = False,
                resource: str = "webhookproviders.hookline.io") -> str:
        """A ServiceAccount allowed ``verbs`` on ``resource`` (in its namespace, or everywhere);
        returns a real token for it."""
        api = self.api
        api.kubectl("create", "serviceaccount", name, "-n", namespace)
        role = f"{name}-{uuid.uuid4().hex[:6]}"
        verb_args = [f"--verb={v}" for v in verbs]
        if cluster_wide:
            api.kubectl("create", "clusterrole", role, *verb_args, f"--resource={resource}")
            api.kubectl("create", "clusterrolebinding", role, f"--clusterrole={role}",
                        f"--serviceaccount={namespace}:{name}")
        else:
            api.kubectl("create", "role", role, "-n", namespace, *verb_args, f"--resource={resource}")
            api.kubectl("create", "rolebinding", role, "-n", namespace, f"--role={role}",
                        f"--serviceaccount={namespace}:{name}")
        return request_token(api, namespace, name)

    def console_token(self) -> str:
        return request_token(self.api, self.system, CONSOLE_SA)

    async def store_providers(self, database_url: str, pool: asyncpg.Pool) -> None:
        """The three providers in the database, the teams' ones owned by their WebhookProviders as the
        operator records them (``owner_namespace/owner_name/owner_uid``)."""
        for name, namespace, owner in self.providers:
            apply_provider(database_url, name, 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"')
            if namespace is not None and owner is not None:
                uid = str(kget(self.api, namespace, "whp", owner)["metadata"]["uid"])
                await pool.execute("UPDATE hookline.providers SET managed_by = 'operator', owner_namespace = $2, "
                                   "owner_name = $3, owner_uid = $4 WHERE name = $1", name, namespace, owner, uid)

    def start_console(self, database_url: str, log_dir: Path) -> ServiceProcess:
        """A real ``hookline console --auth kubernetes`` process, outside a cluster: its kubeconfig is
        the console ServiceAccount's, and no in-cluster variables are set."""
        return console(database_url, log_dir, "--auth", "kubernetes",
                       env={"KUBECONFIG": str(self.kubeconfig), "KUBERNETES_SERVICE_HOST": ""})
