"""W3C trace context across the receiver, the worker and the relay (the ``hookline[otel]`` extra).

The receiver continues a request's ``traceparent`` (or starts a trace) in its span and stores
that span's traceparent with the event; the worker's handler span continues it, and outbox
events published inside the handler store the handler span's traceparent; the relay's delivery
span continues that one and sends its own ``traceparent`` to the endpoint. Exporters are chosen
by the standard ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER``: otlp, console or none, ``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_*``, ``OTEL_BSP_*``); ``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``
or no installed exporter turns tracing off.

Without the extra (opentelemetry-api and -sdk) nothing here runs: ``span`` yields None and no
traceparent is stored or sent.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any

log = logging.getLogger(__name__)

try:  # the API only; the SDK is imported by setup() when a process traces
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

# Span kinds by name, so callers need not import opentelemetry.
SERVER, CONSUMER, CLIENT, INTERNAL = "server", "consumer", "client", "internal"

_tracer: Any = None


def available() -> bool:
    return trace is not None


def enabled() -> bool:
    return _tracer is not None


def setup(component: str) -> bool:
    """Start tracing in this process (``component``: receiver, worker, relay, dev) when the extra
    is installed, OTEL_SDK_DISABLED is not true and an exporter is available (spans nobody
    receives are not worth their cost). Returns whether tracing is on."""
    global _tracer
    if trace is None or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters()
    if not exporters:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or f"hookline-{component}"})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("hookline")
    return True


def _exporters() -> list[Any]:
    """The exporters OTEL_TRACES_EXPORTER names (default otlp), found through the entry points
    the exporter packages register; a name whose package is missing is logged and skipped."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    exporters: list[Any] = []
    for name in names:
        if name == "none":
            continue
        if name not in found:
            # A warning only when someone asked for this exporter: `make run` installs the otel extra
            # for everyone, and the unconfigured default (otlp) without its package just means no tracing.
            report = log.warning if "OTEL_TRACES_EXPORTER" in os.environ else log.debug
            report("OTEL_TRACES_EXPORTER names an exporter that is not installed; spans are not exported "
                   "there (for otlp: pip install opentelemetry-exporter-otlp)", extra={"exporter": name})
            continue
        exporters.append(found[name].load()())
    return exporters


@contextlib.contextmanager
def span(name: str, traceparent: str | None, kind: str = INTERNAL,
         attributes: Mapping[str, str | int] | None = None) -> Iterator[str | None]:
    """A span continuing ``traceparent`` (a new trace when None or malformed), current while the
    block runs; yields its own traceparent to store or send. Off: yields None and does nothing."""
    if _tracer is None:
        yield None
        return
    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent} if traceparent else {})
    with _tracer.start_as_current_span(name, context=parent, kind=getattr(trace.SpanKind, kind.upper()),
                                       attributes=dict(attributes or {})) as current:
        yield format_traceparent(current)


def current_traceparent() -> str | None:
    """The traceparent of the span current in this task (a handler's, or the application's own
    when it traces with OpenTelemetry), or None."""
    if trace is None:
        return None
    return format_traceparent(trace.get_current_span(otel_context.get_current()))


def format_traceparent(current: Any) -> str | None:
    ctx = current.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


