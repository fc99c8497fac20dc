"""Every per-endpoint series of the relay exists from the endpoint's first moment, with 0, and goes
with the endpoint: a real relay process, real endpoints, its real /metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from hookline.core import metrics
from hookline.core.delivery import Outcome
from hookline.relay.breaker import CircuitState
from support.endpoints import Answer, TestEndpoint
from support.processes import hookline_cli
from support.processes import relay as relay_process
from support.waiting import eventually
from test_relay import new_secret, publish, register

ASYNC = pytest.mark.asyncio(loop_scope="session")

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]

GAUGES = ("hookline_outbox_backlog", "hookline_outbox_dead", "hookline_outbox_parked", "hookline_outbox_suspects",
          "hookline_outbox_oldest_undelivered_seconds", "hookline_outbox_endpoint_disabled",
          "hookline_relay_circuit_open", "hookline_relay_circuit_state")


def expected(endpoint: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """Every per-endpoint series the relay exports (the histogram by its count)."""
    one = frozenset({("endpoint", endpoint)})
    names = [(name, one) for name in (*GAUGES, "hookline_relay_dead_total", "hookline_relay_delivery_seconds_count")]
    names += [("hookline_relay_deliveries_total", one | {("result", str(o))}) for o in Outcome]
    names += [("hookline_relay_circuit_transitions_total", one | {("to", str(s))}) for s in CircuitState]
    return set(names)


def scrape(url: str) -> Series:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def of(series: Series, endpoint: str) -> Series:
    return {key: value for key, value in series.items() if ("endpoint", endpoint) in key[1]}


@ASYNC
async def test_a_new_endpoint_has_every_series_at_zero_and_a_failure_counts_only_itself(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    # The first answer is a 500; its retry is an hour away, so it is the only attempt.
    async with TestEndpoint(new_secret(), lambda n, r: Answer(500)) as ep:
        await register(pool, "partner", ep, initial_delay=3600, max_delay=3600)
        relay = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks")
        try:
            # The first statistics tick has run once the backlog gauge is there.
            await eventually(lambda: ("hookline_outbox_backlog", frozenset({("endpoint", "partner")}))
                             in scrape(relay.url), what="the first statistics tick")
            before = of(scrape(relay.url), "partner")
            missing = sorted(f"{name}{dict(labels)}" for name, labels in expected("partner") - set(before))
            assert missing == [], "\n".join(missing)
            assert {key: value for key, value in before.items() if key in expected("partner")} == \
                dict.fromkeys(expected("partner"), 0.0)

            await publish(pool, "t", {})
            server_error = ("hookline_relay_deliveries_total",
                            frozenset({("endpoint", "partner"), ("result", "server_error")}))
            await eventually(lambda: scrape(relay.url).get(server_error), equals=1.0, what="the failure counted")
            after = of(scrape(relay.url), "partner")
            counters = {key for key in expected("partner") if key[0].endswith("_total")} - {server_error}
            assert {key: after[key] for key in counters} == dict.fromkeys(counters, 0.0)
            assert after[("hookline_relay_delivery_seconds_count", frozenset({("endpoint", "partner")}))] == 1.0
        finally:
            assert relay.stop() == 0, relay.logs()


@ASYNC
async def test_an_endpoint_added_while_the_relay_runs_gets_its_series_and_a_deleted_one_loses_them(
        database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    async with TestEndpoint(new_secret(), lambda n, r: Answer(503)) as ep:
        await register(pool, "first", ep, initial_delay=3600, max_delay=3600)
        relay = await asyncio.to_thread(relay_process, database_url, log_dir, "--allow-private-networks")
        try:
            await publish(pool, "t", {})
            failed = ("hookline_relay_deliveries_total", frozenset({("endpoint", "first"), ("result", "server_error")}))
            await eventually(lambda: scrape(relay.url).get(failed), equals=1.0, what="first's failure counted")

            added = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "add", "second", "--url", ep.url)
            assert added.returncode == 0, added.stderr
            await eventually(lambda: expected("second") <= set(scrape(relay.url)), what="second's series")
            assert set(of(scrape(relay.url), "second").values()) == {0.0}

            deleted = await asyncio.to_thread(hookline_cli, database_url, "endpoints", "delete", "second")
            assert deleted.returncode == 0, deleted.stderr
            await eventually(lambda: of(scrape(relay.url), "second"), equals={}, what="second's series gone")
            # The endpoint that stays keeps its counts: a counter is never reset while its endpoint exists.
            assert scrape(relay.url)[failed] == 1.0
        finally:
            assert relay.stop() == 0, relay.logs()


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_declaring_again_keeps_the_counts_and_a_forgotten_name_declared_again_counts_anew() -> None:
    metrics.declare_endpoint("again")
    metrics.child(metrics.relay_deliveries, "again", "delivered").inc()
    metrics.declare_endpoint("again")
    assert _value("hookline_relay_deliveries_total", endpoint="again", result="delivered") == 1.0
    metrics.forget_endpoint("again")
    assert _value("hookline_relay_deliveries_total", endpoint="again", result="delivered") is None
    assert _value("hookline_outbox_backlog", endpoint="again") is None
    metrics.declare_endpoint("again")
    # The relay counts through metrics.child's cache: it must not hand out the forgotten child.
    metrics.child(metrics.relay_deliveries, "again", "delivered").inc()
    assert _value("hookline_relay_deliveries_total", endpoint="again", result="delivered") == 1.0
    metrics.forget_endpoint("again")


def test_the_declared_label_values_are_the_relays() -> None:
    assert set(metrics.DELIVERY_RESULTS) == {str(o) for o in Outcome}
    assert set(metrics.CIRCUIT_STATES) == {str(s) for s in CircuitState}
