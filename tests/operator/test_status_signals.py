"""Status numbers that mean what they say and that the API server accepts.

The edge cases go through the real API server's validation of the CRD (a rejected
status patch would leave status stale forever); the future-retries case runs the real
operator end to end: accepted, age never negative, no workers for work that cannot start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from apiserver import ApiServer

from hookline.core.inbox_stats import NO_EVENTS, ProviderStats
from hookline_operator.conditions import compose
from hookline_operator.kube import ObservedSecret
from hookline_operator.memo import ScalingOutcome
from hookline_operator.ownership import Claim, ClaimState, Resource
from hookline_operator.reconcile import Observation, SyncState, WorkersState, describe_secret
from hookline_operator.stats import INT64_MAX, status_fields
from support.cluster import apply, get
from support.inbox import insert_events
from support.operator import condition, start_operator
from support.processes import ServiceProcess
from support.waiting import eventually

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: signals}
spec:
  signature: {scheme: standard-webhooks}
  destination: {url: "http://payments.internal/hooks"}
  workers: {minReplicas: 0, maxReplicas: 5, targetBacklogPerReplica: 100, scaleDownStabilizationSeconds: 0}
"""

EDGE_CASES = {
    "no events": NO_EVENTS,
    "only future retries": ProviderStats(retrying=3, oldest_due_seconds=-3600.0),
    "only deferred": ProviderStats(deferred=2),
    "only dead": ProviderStats(dead=7),
    "huge counts": ProviderStats(due=10**30, oldest_due_seconds=1e30, retrying=10**20, deferred=10**19,
                                 in_flight=INT64_MAX, dead=10**25),
}


def conditions_for(stats: ProviderStats) -> list[dict[str, Any]]:
    res = Resource("ns", "signals", "uid", 1)
    secret = describe_secret(res, {"signature": {"scheme": "standard-webhooks"}},
                             ObservedSecret("signals-webhook-secret", {"secret": "x"}, frozenset({"uid"}), {}))
    observation = Observation(secret, SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED)),
                              WorkersState(True, "WorkersReady", "ok"))
    scaling = ScalingOutcome(True, "Active", f"due {stats.due}, in flight {stats.in_flight}: " + "x" * 5000)
    return compose([], observation, scaling, 1)


def patch_status(apiserver: ApiServer, namespace: str, status: dict[str, Any]) -> dict[str, Any]:
    result = apiserver.kubectl("patch", "whp", "signals", "-n", namespace, "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": status}), "-o", "json", check=False)
    assert result.returncode == 0, result.stderr
    written: dict[str, Any] = json.loads(result.stdout)["status"]
    return written


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_every_status_the_operator_writes_passes_the_crds_validation(apiserver, namespace, case) -> None:
    apply(apiserver, namespace, PROVIDER)
    stats = EDGE_CASES[case]
    fields = status_fields(stats)
    written = patch_status(apiserver, namespace, {**fields, "conditions": conditions_for(stats), "replicas": 0,
                                                  "observedGeneration": 1})
    assert {k: written[k] for k in fields} == fields
    assert fields["oldestPendingSeconds"] >= 0
    if case == "only future retries":
        assert (fields["backlog"], fields["retrying"], fields["oldestPendingSeconds"]) == (0, 3, 0)


def test_acknowledgements_pass_validation_too(apiserver, namespace) -> None:
    apply(apiserver, namespace, PROVIDER)
    written = patch_status(apiserver, namespace, {
        "replay": {"lastHandledToken": "t" * 256, "requeued": INT64_MAX, "at": "2026-01-01T00:00:00Z"},
        "rotation": {"lastHandledToken": "r1", "at": "2026-01-01T00:00:00Z", "result": "Refused",
                     "message": "not rotated: " + "m" * 900},
    })
    assert written["rotation"]["result"] == "Refused"


def test_a_negative_number_would_be_rejected(apiserver, namespace) -> None:
    # The guard the operator's clamping keeps us away from: this is what the old code ran into.
    apply(apiserver, namespace, PROVIDER)
    result = apiserver.kubectl("patch", "whp", "signals", "-n", namespace, "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": {"oldestPendingSeconds": -3}}), check=False)
    assert result.returncode != 0 and "oldestPendingSeconds" in result.stderr


UNPROCESSABLE = re.compile(r"Unprocessable|(?<![\d.])422(?!\d)")


@pytest.fixture
def operator(apiserver: ApiServer, namespace: str, database_url: str, log_dir: Path) -> Iterator[ServiceProcess]:
    proc = start_operator(apiserver, [namespace], database_url, log_dir)
    yield proc
    proc.stop()


async def test_future_retries_are_reported_apart_and_scale_nothing(apiserver, namespace, operator, pool) -> None:
    apply(apiserver, namespace, PROVIDER)
    await eventually(lambda: get(apiserver, namespace, "deployment", "signals-worker"), what="workers Deployment")
    await insert_events(pool, "signals", 250)
    await pool.execute("UPDATE hookline.inbox SET attempts = 1, next_attempt_at = now() + interval '1 hour'")
    status = await eventually(lambda: (s := get(apiserver, namespace, "whp", "signals")["status"])
                              and s.get("retrying") == 250 and s, what="retrying 250 in status")
    assert (status["backlog"], status["oldestPendingSeconds"], status["inFlight"]) == (0, 0, 0)
    scaling = await eventually(lambda: condition(get(apiserver, namespace, "whp", "signals"), "Scaling"),
                               what="Scaling condition")
    assert scaling["reason"] == "Active" and "retrying 250" in scaling["message"], scaling
    assert get(apiserver, namespace, "deployment", "signals-worker")["spec"]["replicas"] == 0
    # The status patch was accepted: no 422 anywhere but in a timestamp's milliseconds ("01:46:29.422").
    assert not UNPROCESSABLE.search(operator.logs()), operator.logs()[-3000:]
    async with aiohttp.ClientSession() as http, http.get(f"{operator.url}/metrics") as response:
        exported = await response.text()
    for line in ('hookline_inbox_retrying{provider="signals"} 250.0', 'hookline_inbox_backlog{provider="signals"} 0.0',
                 'hookline_inbox_oldest_pending_seconds{provider="signals"} 0.0'):
        assert line in exported, line

    # The same events once due: backlog, a real age, and workers.
    await pool.execute("UPDATE hookline.inbox SET next_attempt_at = now() - interval '30 seconds'")
    status = await eventually(lambda: (s := get(apiserver, namespace, "whp", "signals")["status"])
                              and s.get("backlog") == 250 and s, what="backlog 250")
    assert status["retrying"] == 0 and status["oldestPendingSeconds"] >= 30
    await eventually(lambda: get(apiserver, namespace, "deployment", "signals-worker")["spec"]["replicas"] == 3,
                     what="3 replicas for 250 due events")


async def test_a_handler_its_workers_cannot_import_is_the_ready_reason(apiserver, namespace, operator,
                                                                      pool) -> None:
    """A worker that cannot import the provider's handler records it (hookline.report_handler_problem,
    as the worker calls it); Ready says so, with one Warning Event, and is True again once it imports."""
    handler = "team_hooks.payments:on_event"
    apply(apiserver, namespace, PROVIDER.replace('destination: {url: "http://payments.internal/hooks"}',
                                                 f'handler: "{handler}"'))
    await eventually(lambda: condition(get(apiserver, namespace, "whp", "signals"), "Ready").get("status") == "True",
                     what="Ready before any problem")
    await pool.execute("SELECT hookline.report_handler_problem('signals', $1, $2, 'worker-1')", handler,
                       "ModuleNotFoundError: No module named 'team_hooks'")
    ready = await eventually(lambda: (c := condition(get(apiserver, namespace, "whp", "signals"), "Ready"))
                             and c.get("reason") == "HandlerNotImportable" and c,
                             what="Ready=False, HandlerNotImportable")
    assert ready["status"] == "False"
    assert f"handler {handler} cannot be imported (ModuleNotFoundError: No module named 'team_hooks')" \
        in ready["message"], ready
    await eventually(lambda: "HandlerNotImportable" in apiserver.kubectl("get", "events", "-n", namespace,
                                                                          "-o", "json").stdout,
                     what="one Warning Event")

    await pool.execute("SELECT hookline.report_handler_problem('signals', $1, NULL, 'worker-1')", handler)
    await eventually(lambda: condition(get(apiserver, namespace, "whp", "signals"), "Ready").get("status") == "True",
                     what="Ready again once the handler imports")
