"""The operator writes only Secrets and Deployments that carry its owner reference.

Real kube-apiserver, real kubectl, real Postgres, the real operator process. A Secret the
user names in secretRef is read and never written; a Deployment that merely has the
worker's name is never adopted, patched or scaled; both are said in a condition.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import ApiServer

from support.cluster import apply, get
from support.operator import condition, event_lines, start_operator
from support.processes import ServiceProcess
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def operator(apiserver: ApiServer, namespace: str, database_url: str, log_dir: Path) -> Iterator[ServiceProcess]:
    proc = start_operator(apiserver, [namespace], database_url, log_dir)
    yield proc
    proc.stop()


def provider(name: str, signature: str) -> str:
    return f"""
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {signature}
  destination: {{url: "http://payments.internal/hooks"}}
  workers: {{minReplicas: 0, maxReplicas: 5, scaleDownStabilizationSeconds: 0}}
"""


def unchanged(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return (before["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
            and not after["metadata"].get("ownerReferences"))


async def test_a_secret_ref_to_the_database_secret_is_read_but_never_rotated(apiserver, namespace,
                                                                              operator) -> None:
    apiserver.kubectl("create", "secret", "generic", "hookline-database", "-n", namespace,
                      "--from-literal=url=postgresql://hookline:pw@postgres:5432/hookline")
    before = get(apiserver, namespace, "secret", "hookline-database")
    apply(apiserver, namespace, provider("gh", "{scheme: github, secretRef: {name: hookline-database, key: url}}"))
    whp = await eventually(lambda: (o := get(apiserver, namespace, "whp", "gh"))
                           and condition(o, "Ready").get("status") == "True" and o, what="Ready")
    assert "never rotates" in condition(whp, "SecretReady")["message"]

    apiserver.kubectl("annotate", "whp", "gh", "-n", namespace, "hookline.io/rotate-secret=r1", "--overwrite")
    rotation = await eventually(lambda: get(apiserver, namespace, "whp", "gh")["status"].get("rotation"),
                                what="rotation acknowledged")
    assert (rotation["lastHandledToken"], rotation["result"]) == ("r1", "Refused")
    assert "hookline-database" in rotation["message"] and "secretRef" in rotation["message"]
    refused = await eventually(lambda: condition(get(apiserver, namespace, "whp", "gh"), "SecretRotated"),
                               what="SecretRotated condition")
    assert (refused["status"], refused["reason"]) == ("False", "RotationRefused")
    assert "hookline-database" in refused["message"]
    assert any(e.startswith("Warning RotationRefused") for e in event_lines(apiserver, namespace))
    # Acknowledged once: the same token is not retried, and the Secret was never written.
    assert unchanged(before, get(apiserver, namespace, "secret", "hookline-database"))
    assert "postgresql://" not in str(get(apiserver, namespace, "whp", "gh"))
    assert all("postgresql://" not in e for e in event_lines(apiserver, namespace))


async def test_a_foreign_deployment_with_the_workers_name_is_left_alone(apiserver, namespace, operator) -> None:
    apiserver.kubectl("create", "deployment", "payments-worker", "-n", namespace, "--image=registry.local/payments",
                      "--replicas=2")
    before = get(apiserver, namespace, "deployment", "payments-worker")
    apply(apiserver, namespace, provider("payments", "{scheme: standard-webhooks}"))
    whp = await eventually(lambda: (o := get(apiserver, namespace, "whp", "payments"))
                           and condition(o, "Ready").get("reason") == "ResourceConflict"
                           and condition(o, "Scaling").get("reason") == "ResourceConflict" and o,
                           what="ResourceConflict on Ready and Scaling")
    ready = condition(whp, "Ready")
    assert ready["status"] == "False"
    assert "Deployment payments-worker" in ready["message"] and "not owned" in ready["message"]
    assert condition(whp, "Synced")["status"] == "True"  # events are accepted and kept meanwhile
    seen = event_lines(apiserver, namespace)
    assert any(e.startswith("Warning ResourceConflict: Deployment payments-worker") for e in seen), seen
    # The scale timer has run (it wrote Scaling) with an empty backlog: still 2 replicas, untouched.
    after = get(apiserver, namespace, "deployment", "payments-worker")
    assert unchanged(before, after)
    assert after["spec"]["replicas"] == 2
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/payments"


async def test_a_foreign_secret_on_the_generated_name_is_not_adopted(apiserver, namespace, operator) -> None:
    apiserver.kubectl("create", "secret", "generic", "orders-webhook-secret", "-n", namespace,
                      "--from-literal=secret=someone-elses")
    before = get(apiserver, namespace, "secret", "orders-webhook-secret")
    apply(apiserver, namespace, provider("orders", "{scheme: github}"))
    whp = await eventually(lambda: (o := get(apiserver, namespace, "whp", "orders"))
                           and condition(o, "Ready").get("reason") == "ResourceConflict" and o, what="ResourceConflict")
    assert "Secret orders-webhook-secret" in condition(whp, "Ready")["message"]
    assert condition(whp, "Synced")["status"] == "False"
    assert unchanged(before, get(apiserver, namespace, "secret", "orders-webhook-secret"))
