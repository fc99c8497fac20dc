"""The connection budget end to end: providers competing for it never get more worker replicas than it
holds, each gets a fair share and is told why (Scaling=False, reason ConnectionBudget, a Warning Event),
and connections a provider frees go to the one still waiting."""

from __future__ import annotations

from pathlib import Path

import asyncpg
from apiserver import ApiServer

from hookline.core import pools
from support.inbox import insert_events
from support.kube import kget
from support.operator import condition, event_lines, start_operator, timer_ran
from support.waiting import eventually

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks}}
  destination: {{url: "http://orders.example.svc/webhooks"}}
  workers: {{minReplicas: 0, maxReplicas: 5, targetBacklogPerReplica: 100, scaleDownStabilizationSeconds: 2}}
"""

PER_REPLICA = pools.worker(16)  # the default template's concurrency
BUDGET = 3 * PER_REPLICA  # room for three worker pods in all


async def test_competing_providers_share_the_budget(apiserver: ApiServer, namespace: str, database_url: str,
                                                    log_dir: Path, pool: asyncpg.Pool) -> None:
    operator = start_operator(apiserver, [namespace], database_url, log_dir,
                              env={"HOOKLINE_WORKER_CONNECTION_BUDGET": str(BUDGET)})
    names = ("alpha", "beta")
    replicas: dict[str, int] = {}
    seen_total = 0

    def observe() -> dict[str, int]:
        # The Deployments' replicas are what the budget bounds; every look checks the bound. One list is
        # one moment: reading them one by one could see one before and the other after a hand-over.
        nonlocal seen_total
        listed = kget(apiserver, namespace, "deployment")["items"]
        found = {d["metadata"]["name"]: d["spec"]["replicas"] for d in listed}
        for name in names:
            replicas[name] = found[f"{name}-worker"]
        seen_total = max(seen_total, sum(replicas.values()))
        assert sum(replicas.values()) * PER_REPLICA <= BUDGET, replicas
        return dict(replicas)

    try:
        for name in names:
            apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER.format(name=name))
        await eventually(lambda: all(kget(apiserver, namespace, "deployment", f"{n}-worker") for n in names),
                         what="both Deployments")
        # Each wants all five replicas (500 due events each); three fit.
        for name in names:
            await insert_events(pool, name, 500)
        await eventually(lambda: sorted(observe().values()) == [1, 2], what="fair shares 2 + 1")
        for name in names:
            whp = kget(apiserver, namespace, "whp", name)
            scaling = condition(whp, "Scaling")
            assert (scaling["status"], scaling["reason"]) == ("False", "ConnectionBudget"), scaling
            assert "wants 5 replica(s), the connection budget allows" in scaling["message"]
            assert f"workers may hold {BUDGET} connections" in scaling["message"]
        warnings = [e for e in event_lines(apiserver, namespace) if e.startswith("Warning ConnectionBudget")]
        assert warnings, event_lines(apiserver, namespace)
        for _ in range(2):  # the shares hold steady, tick after tick
            await timer_ran(operator, "scale", runs=2 * len(names))
            observe()
        assert sorted(replicas.values()) == [1, 2]

        # alpha's work is done: it scales to zero and beta grows into the freed connections.
        await pool.execute("UPDATE hookline.inbox SET status = 'done' WHERE provider = 'alpha'")
        await eventually(lambda: observe() == {"alpha": 0, "beta": 3}, what="beta takes the whole budget")
        scaling = condition(kget(apiserver, namespace, "whp", "alpha"), "Scaling")
        assert (scaling["status"], scaling["reason"]) == ("True", "Active"), scaling
        assert seen_total <= 3
        held = await pool.fetchval("SELECT sum(replicas * connections_per_replica) FROM hookline.worker_allocations")
        assert held == 3 * PER_REPLICA

        # A deleted provider's share is released at once.
        apiserver.kubectl("delete", "whp", "beta", "-n", namespace, "--wait=true", "--timeout=30s")
        assert await pool.fetchval("SELECT count(*) FROM hookline.worker_allocations") == 1
    finally:
        operator.stop()
