"""Every Prometheus metric Hookline exports, in one place (prefix ``hookline_``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, disable_created_metrics

# The *_created series double the output and nobody alerts on them.
disable_created_metrics()  # type: ignore[no-untyped-call]

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
