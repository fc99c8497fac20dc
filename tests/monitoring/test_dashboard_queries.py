"""Every query of the Grafana dashboard returns data, without error, from a real Prometheus that scrapes
real receiver, worker and relay processes under a little load: accepted, duplicate and refused
requests, a handler that succeeds and one that always fails (dead letters), a worker killed by its
handler (a crashed consumer, swept by the other worker), and outbox endpoints that accept, fail (500,
dead and circuit) and answer 410 Gone (disabled)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.endpoints import Answer, TestEndpoint
from support.inbox import apply_provider, create_effect_tables
from support.processes import ServiceProcess, hookline_cli, receiver, relay, worker
from support.prometheus import PrometheusError, PrometheusServer, require_binaries
from support.waiting import eventually

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "hookline" / "dashboards" / "hookline.json"
NAMESPACE = "hookline"  # the namespace label Prometheus gives every target, as Kubernetes discovery would
# Grafana's variables as a user who picked every provider and endpoint of the namespace would send them.
VARIABLES = {"$namespace": NAMESPACE, "$provider": ".*", "$endpoint": ".*", "$__rate_interval": "1m"}
SECRET = "whsec_" + "bW9uaXRvcmluZy1lbmRwb2ludC1zZWNyZXQtMDAwMQ=="


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    """(panel title / refId, PromQL with the variables substituted) for every target of every panel."""
    queries = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: unsubstituted variable in {expr}"
            queries.append((f"{panel['title']} / {target['refId']}", expr))
    return queries


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "provider", "endpoint"} <= variables
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"] and panel.get("description"), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'namespace=~"$namespace"' in target["expr"], (panel["title"], target["expr"])


@pytest.fixture
def services(database_url: str, log_dir: Path) -> Iterator[dict[str, ServiceProcess]]:
    procs: dict[str, ServiceProcess] = {}
    try:
        procs["receiver"] = receiver(database_url, log_dir)
        # Never consumes "killer": it only sweeps the lease the killed worker leaves behind.
        procs["worker"] = worker(database_url, log_dir, "--sweep", "--provider", "orders", "--provider", "poison",
                                 "--poll-interval", "0.1")
        procs["relay"] = relay(database_url, log_dir, "--allow-private-networks")
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def _label_values(server: PrometheusServer, query: str) -> list[str]:
    """Grafana's label_values(metric, label) as Prometheus's label values API answers it."""
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    assert match, query
    selector, label = match.groups()
    for name, value in VARIABLES.items():
        selector = selector.replace(name, value)
    url = f"{server.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
    with urllib.request.urlopen(url, timeout=10) as response:
        values: list[str] = json.load(response)["data"]
    return values


async def _until_data(server: PrometheusServer, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The query's result once it has data; empty when it has none after ``timeout``."""
    try:
        return await eventually(lambda: asyncio.to_thread(server.query, expr), what=expr, timeout=timeout,
                                interval=1, ignoring=())  # a PromQL error raises at once
    except AssertionError:
        return []


async def _send_load(receiver_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for i in range(30):
            body = json.dumps({"id": f"ord_{i}", "type": "order.paid"})
            async with http.post(f"{receiver_url}/webhooks/orders", data=body) as r:
                assert r.status == 200
        async with http.post(f"{receiver_url}/webhooks/orders", data='{"id": "ord_0"}') as r:
            assert (await r.json())["status"] == "duplicate"
        async with http.post(f"{receiver_url}/webhooks/nobody", data="{}") as r:
            assert r.status == 404
        for i in range(3):
            async with http.post(f"{receiver_url}/webhooks/poison", data=json.dumps({"id": f"p_{i}"})) as r:
                assert r.status == 200
        async with http.post(f"{receiver_url}/webhooks/killer", data=json.dumps({"id": "k_1"})) as r:
            assert r.status == 200


@pytest.mark.asyncio(loop_scope="session")
async def test_every_dashboard_query_returns_data(database_url: str, pool: Any, log_dir: Path,
                                                  services: dict[str, ServiceProcess]) -> None:
    binaries = require_binaries()
    await create_effect_tables(pool)
    apply_provider(database_url, "orders", 'signature: {scheme: none}\nhandler: "support.handlers:publish_shipped"')
    apply_provider(database_url, "poison", 'signature: {scheme: none}\nhandler: "support.handlers:always_fail"\n'
                   "retry: {maxAttempts: 1}")
    apply_provider(database_url, "killer", 'signature: {scheme: none}\nhandler: "support.handlers:kill_my_worker"\n'
                   "leaseSeconds: 1\nretry: {maxAttempts: 1}")
    async with (TestEndpoint(SECRET) as partner,
                TestEndpoint(SECRET, lambda n, r: Answer(status=500)) as broken,
                TestEndpoint(SECRET, lambda n, r: Answer(status=410)) as gone):
        for name, endpoint, attempts in (("partner", partner, "5"), ("broken", broken, "1"), ("gone", gone, "5")):
            added = hookline_cli(database_url, "endpoints", "add", name, "--url", endpoint.url, "--event-type",
                                 "order.*", "--secret", SECRET, "--max-attempts", attempts)
            assert added.returncode == 0, added.stderr
        targets = {role: [(proc.url.removeprefix("http://"), {"namespace": NAMESPACE, "pod": f"hookline-{role}"})]
                   for role, proc in services.items()}
        with PrometheusServer(binaries["prometheus"], targets) as prometheus:
            await _send_load(services["receiver"].url)
            # The killer's own worker dies in its handler; the sweeping worker finds the expired lease.
            killed = ServiceProcess(["worker", "--port", "0", "--provider", "killer"], database_url,
                                    log_dir).start(wait_path=None)
            try:
                await _until_data(prometheus, 'hookline_consumer_crashes_total{partition="killer"}', timeout=90)
            finally:
                killed.stop()

            empty = []
            for title, expr in panel_queries():
                try:
                    if not await _until_data(prometheus, expr):
                        empty.append(f"{title}: {expr}")
                except PrometheusError as exc:
                    pytest.fail(f"{title}: {exc}")
            assert empty == [], "panels without data:\n" + "\n".join(empty)

            # The load shows where it should: the 410 endpoint disabled, the poison events and the
            # killer's event dead, the worker processes counted.
            for expr in ('hookline_outbox_endpoint_disabled{endpoint="gone"} == 1',
                         'hookline_outbox_endpoint_disabled{endpoint="partner"} == 0',
                         'max(hookline_inbox_dead{provider="poison"}) == 3',
                         'max(hookline_inbox_dead{provider="killer"}) == 1',
                         'count(hookline_worker_concurrency > 0) == 1',
                         'sum(hookline_inbox_received_total{provider="orders", outcome="accepted"}) == 30'):
                assert await _until_data(prometheus, expr), expr

            variables = {v["name"]: v["query"]["query"] for v in dashboard()["templating"]["list"]
                         if v["type"] == "query"}
            assert NAMESPACE in _label_values(prometheus, variables["namespace"])
            assert {"orders", "poison", "killer"} <= set(_label_values(prometheus, variables["provider"]))
            assert {"partner", "broken", "gone"} <= set(_label_values(prometheus, variables["endpoint"]))
