"""Every Prometheus metric Hookline exports, in one place (prefix ``hookline_``)."""

from __future__ import annotations

import functools
from typing import TypeVar

import asyncpg
from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics import MetricWrapperBase

# The *_created series double the output and nobody alerts on them.
disable_created_metrics()  # type: ignore[no-untyped-call]

M = TypeVar("M", bound=MetricWrapperBase)


@functools.lru_cache(maxsize=4096)
def child(metric: M, *labels: str) -> M:
    """``metric.labels(*labels)``, looked up once per label set: the receiver and the relay count per
    event, and ``labels`` validates, locks and hashes every time. Only for label sets of bounded number
    (providers, endpoints, outcomes); ``forget_endpoint`` empties the cache, whose children it removes."""
    return metric.labels(*labels)


_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

inbox_received = Counter(
    "hookline_inbox_received_total",
    "Webhook requests answered by the receiver, by provider and outcome.",
    ["provider", "outcome"],
)
receiver_latency = Histogram(
    "hookline_receiver_request_seconds",
    "Time from request start to response for POST /webhooks/{provider}.",
    ["provider"],
    buckets=_LATENCY_BUCKETS,
)
receiver_batch_size = Histogram(
    "hookline_receiver_batch_size",
    "Events stored per group-commit transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
receiver_buffered_bodies = Gauge(
    "hookline_receiver_buffered_bodies",
    "Request bodies this receiver process holds (being read or waiting to be stored); capped by "
    "--max-buffered-bodies.",
)
receiver_buffered_bytes = Gauge(
    "hookline_receiver_buffered_bytes",
    "Bytes of request bodies this receiver process holds; capped by --max-buffered-bytes.",
)
http_connections_timed_out = Counter(
    "hookline_http_connections_timed_out_total",
    "Connections closed because their request headers were not complete in time (or never began).",
)

worker_events = Counter(
    "hookline_worker_events_total",
    "Inbox events processed by workers, by provider and result (done, retry, deferred, dead, lost, unknown: "
    "the effect happened but its completion could not be written; put_back: its handler could not be imported, "
    "the attempt not counted).",
    ["provider", "result"],
)
handler_duration = Histogram(
    "hookline_worker_handler_seconds",
    "Time spent in the handler or destination call per event.",
    ["provider"],
    buckets=_LATENCY_BUCKETS,
)
worker_batch_reruns = Counter(
    "hookline_worker_transaction_batch_reruns",
    "Transaction batches rolled back and run again with a savepoint per event, because a handler failed, "
    "a lease was lost or a handler left the transaction aborted.",
)
worker_batch_size = Histogram(
    "hookline_worker_transaction_batch_events",
    "Transactional handler events committed per transaction (each in its own savepoint).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
inbox_backlog = Gauge("hookline_inbox_backlog", "Inbox events a worker could take now: due ones plus those in flight.",
                      ["provider"])
inbox_oldest_pending = Gauge(
    "hookline_inbox_oldest_pending_seconds", "Age of the oldest due pending inbox event.", ["provider"]
)
inbox_dead = Gauge("hookline_inbox_dead", "Dead inbox events.", ["provider"])
inbox_retrying = Gauge(
    "hookline_inbox_retrying", "Pending inbox events backing off after a failed attempt (not due yet).", ["provider"]
)
inbox_deferred = Gauge(
    "hookline_inbox_deferred", "Pending inbox events deferred until their entity's predecessor applies.", ["provider"]
)
inbox_in_flight = Gauge("hookline_inbox_in_flight", "Inbox events leased by a worker right now.", ["provider"])
operator_stats_queries = Counter(
    "hookline_operator_stats_queries_total",
    "Inbox statistics queries the operator ran: one per tick for all providers together.",
)
leases_swept = Counter(
    "hookline_leases_swept_total", "Expired leases returned to pending or dead by the sweeper.",
    ["queue", "partition", "result"],
)
consumer_crashes = Counter(
    "hookline_consumer_crashes_total",
    "Consumers (worker or relay processes) whose leases expired unfinished, as the sweeper saw them: a crash, a "
    "kill or a stall longer than the lease; counted once per consumer and sweep.",
    ["queue", "partition"],
)
suspects_claimed = Counter(
    "hookline_suspects_claimed_total",
    "Suspects (rows whose last lease expired) claimed to run alone in their consumer.",
    ["queue", "partition"],
)
inbox_suspects = Gauge("hookline_inbox_suspects", "Pending inbox events waiting to run alone (suspects).",
                       ["provider"])

relay_deliveries = Counter(
    "hookline_relay_deliveries_total",
    "Outbox delivery attempts by endpoint and result (delivered, server_error, rate_limited, client_error, "
    "no_response, blocked, gone).",
    ["endpoint", "result"],
)
relay_dead = Counter("hookline_relay_dead_total", "Deliveries that used up their attempts.", ["endpoint"])
relay_latency = Histogram(
    "hookline_relay_delivery_seconds", "Time from sending a delivery to its HTTP answer.", ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
outbox_backlog = Gauge("hookline_outbox_backlog", "Pending outbox deliveries.", ["endpoint"])
outbox_oldest_undelivered = Gauge(
    "hookline_outbox_oldest_undelivered_seconds",
    "Age of the oldest event an endpoint has not received yet (pending, in flight or parked).", ["endpoint"],
)
outbox_dead = Gauge("hookline_outbox_dead", "Dead outbox deliveries (replayable).", ["endpoint"])
outbox_suspects = Gauge("hookline_outbox_suspects", "Pending deliveries waiting to run alone (suspects).",
                        ["endpoint"])
outbox_parked = Gauge("hookline_outbox_parked", "Deliveries parked while their endpoint is disabled.", ["endpoint"])
relay_circuit_open = Gauge(
    "hookline_relay_circuit_open", "1 while the endpoint's circuit breaker is open or half-open (probing only).",
    ["endpoint"]
)
relay_circuit_state = Gauge(
    "hookline_relay_circuit_state", "The endpoint's circuit breaker: 0 closed, 1 half-open (probing), 2 open.",
    ["endpoint"]
)
relay_circuit_transitions = Counter(
    "hookline_relay_circuit_transitions_total",
    "Circuit breaker transitions by endpoint and new state (closed, open, half_open); each transition is "
    "counted by the one relay that made it.",
    ["endpoint", "to"],
)
outbox_endpoint_disabled = Gauge(
    "hookline_outbox_endpoint_disabled",
    "1 while the endpoint is disabled (it answered 410 Gone, or an operator disabled it); its deliveries are parked.",
    ["endpoint"],
)

# The label values every endpoint's series are declared with: core/delivery.py's Outcome and
# relay/breaker.py's CircuitState (tests/test_relay_metrics.py keeps them equal).
DELIVERY_RESULTS = ("delivered", "server_error", "rate_limited", "client_error", "no_response", "blocked", "gone")
CIRCUIT_STATES = ("closed", "open", "half_open")
_PER_ENDPOINT = (relay_dead, relay_latency, outbox_backlog, outbox_oldest_undelivered, outbox_dead, outbox_suspects,
                 outbox_parked, relay_circuit_open, relay_circuit_state, outbox_endpoint_disabled)
_declared_endpoints: set[str] = set()


def _endpoint_label_sets(name: str) -> list[tuple[MetricWrapperBase, tuple[str, ...]]]:
    """Every series of one endpoint: the one place that knows them."""
    return ([(relay_deliveries, (name, result)) for result in DELIVERY_RESULTS]
            + [(relay_circuit_transitions, (name, to)) for to in CIRCUIT_STATES]
            + [(metric, (name,)) for metric in _PER_ENDPOINT])


def declare_endpoint(name: str) -> None:
    """Create every series of endpoint ``name`` at 0, so that dashboards and alerts see 0 rather than no
    data while nothing went wrong. A series that exists already keeps its value (counters stay counters)."""
    for metric, labels in _endpoint_label_sets(name):
        metric.labels(*labels)
    _declared_endpoints.add(name)


def forget_endpoint(name: str) -> None:
    """Remove every series of endpoint ``name`` (it was deleted): no stale series stays behind."""
    for metric, labels in _endpoint_label_sets(name):
        metric.remove(*labels)
    child.cache_clear()  # it may hold the removed children; counting into them would be lost
    _declared_endpoints.discard(name)


def sync_endpoints(names: set[str]) -> set[str]:
    """Declare the endpoints of ``names`` not declared yet and forget the declared ones no longer in it;
    nothing to do (a set difference) when the endpoints did not change. Returns the newly declared."""
    new = names - _declared_endpoints
    for name in new:
        declare_endpoint(name)
    for name in _declared_endpoints - names:
        forget_endpoint(name)
    return new


def endpoint_declared(name: str) -> bool:
    return name in _declared_endpoints


operator_dependency_up = Gauge(
    "hookline_operator_dependency_up",
    "1 when the operator's last call to the dependency (postgres, kubernetes) was answered, else 0.",
    ["dependency"],
)
worker_concurrency = Gauge(
    "hookline_worker_concurrency",
    "Events this worker process may handle at once; 0 in processes that are not workers (count the ones above 0 "
    "to count worker processes).",
)

# Connection pools of this process, read at scrape time (asyncpg pools cannot be weakly referenced,
# so closed pools are dropped when read).
_pools: list[asyncpg.Pool] = []
db_pool_connections = Gauge(
    "hookline_db_pool_connections", "Postgres connections of this process's pools, by state (in_use, idle).",
    ["state"],
)
db_pool_max_connections = Gauge(
    "hookline_db_pool_max_connections", "The most Postgres connections this process's pools may open."
)


def track_pool(pool: asyncpg.Pool) -> None:
    """Report ``pool`` in the hookline_db_pool_* gauges while it is open."""
    _open_pools().append(pool)  # pruned here too, so closed pools never pile up unscraped


def _open_pools() -> list[asyncpg.Pool]:
    _pools[:] = [pool for pool in _pools if not pool.is_closing()]
    return _pools


def _in_use() -> float:
    return float(sum(pool.get_size() - pool.get_idle_size() for pool in _open_pools()))


db_pool_connections.labels("in_use").set_function(_in_use)
db_pool_connections.labels("idle").set_function(lambda: float(sum(p.get_idle_size() for p in _open_pools())))
db_pool_max_connections.set_function(lambda: float(sum(p.get_max_size() for p in _open_pools())))

# The partition manager (core/partitions.py: the inbox, the outbox and its deliveries), on the
# "partitions" maintenance leader.
partitions_created = Counter("hookline_partitions_created_total",
                             "Partitions created ahead of time by the partition manager.", ["table"])
partitions_dropped = Counter("hookline_partitions_dropped_total",
                             "Partitions dropped whole because nothing in them had to be kept.", ["table"])
retention_rows = Counter(
    "hookline_retention_rows_total",
    "Rows removed by retention: dropped with a partition, deleted in batches (a partition with survivors), "
    "and dedup keys expired.", ["table", "how"])
partition_rows_kept = Gauge(
    "hookline_partition_rows_kept",
    "Pending, processing and dead rows keeping partitions past their retention from being dropped "
    "(their neighbours are deleted in batches instead).", ["table"])
partition_rows_in_default = Gauge(
    "hookline_partition_default_rows",
    "Rows in a table's default partition (no partition covered their time: the manager fell behind).", ["table"])

# What the database does to keep an acknowledged commit (core/durability.py), read by every service at
# start and every minute.
DURABILITY_WARNINGS = ("fsync_off", "full_page_writes_off", "synchronous_commit_off", "no_synchronous_standby",
                       "standby_not_awaited", "synchronous_standby_disconnected")
database_synchronous_standbys = Gauge(
    "hookline_database_synchronous_standbys",
    "Synchronous standbys connected to the database now, as this process's role can see them.")
database_durability_warning = Gauge(
    "hookline_database_durability_warning",
    "1 while the database's settings let a failover or crash lose acknowledged events, by reason "
    "(docs/postgres.md); 0 otherwise.", ["reason"])

console_requests = Counter(
    "hookline_console_requests_total",
    "Requests the console answered, by route (its pattern, not the path) and status",
    ["route", "status"],
)
console_latency = Histogram(
    "hookline_console_request_duration_seconds",
    "How long the console took to answer, by route (its pattern)",
    ["route"],
)
