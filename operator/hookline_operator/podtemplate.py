"""The worker pod template: from the chart (a mounted ConfigMap), with a provider's own overrides.

The chart renders values ``worker.*`` into ``template.yaml``: ``concurrency``, a PodTemplateSpec
with one container named ``worker``, and ``tenantPlacement`` (what a provider may add to the pods'
placement, see placement.py). The operator completes that container (command, ports, probes,
the namespace's database Secret) in ``resources.worker_deployment``. Without a file (the operator run
outside the chart) the defaults below apply, the image from ``HOOKLINE_WORKER_IMAGE``, and providers
may add no placement at all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hookline.core import pools, settings
from hookline_operator import placement

TEMPLATE_ENV = settings.WORKER_TEMPLATE
DEFAULT_IMAGE = "ghcr.io/hookline/hookline:0.1.0"
DEFAULT_CONCURRENCY = 16
CONTAINER = "worker"


class TemplateError(Exception):
    """The worker template file is unusable; the message says where."""


@dataclass(frozen=True)
class WorkerTemplate:
    concurrency: int
    pod: dict[str, Any]  # a PodTemplateSpec: metadata, spec with a container named "worker"
    tenant_placement: placement.TenantPlacement = field(default_factory=placement.TenantPlacement)

    @property
    def connections_per_replica(self) -> int:
        return pools.worker(self.concurrency)

    def container(self, pod: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = next(c for c in pod["spec"]["containers"] if c.get("name") == CONTAINER)
        return found


def default_template() -> WorkerTemplate:
    """Today's secure defaults, for an operator that runs without the chart."""
    return WorkerTemplate(concurrency=DEFAULT_CONCURRENCY, pod={
        "metadata": {"labels": {}, "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8081",
                                                    "prometheus.io/path": "/metrics"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": CONTAINER,
                "image": settings.worker_image(DEFAULT_IMAGE),
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"cpu": "1", "memory": "512Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "env": [{"name": "HOOKLINE_LOG_FORMAT", "value": "json"}],
            }],
        },
    })


def parse_template(text: str, source: str = "worker template") -> WorkerTemplate:
    """Check the shape the operator relies on; anything else is passed to Kubernetes as written."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TemplateError(f"{source}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise TemplateError(f"{source}: expected a mapping with `concurrency` and `pod`")
    concurrency = doc.get("concurrency", DEFAULT_CONCURRENCY)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise TemplateError(f"{source}: concurrency must be a positive integer, not {concurrency!r}")
    pod = doc.get("pod")
    spec = pod.get("spec") if isinstance(pod, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not any(isinstance(c, dict) and c.get("name") == CONTAINER
                                                   for c in containers):
        raise TemplateError(f"{source}: pod.spec.containers must hold a container named {CONTAINER!r}")
    assert isinstance(pod, dict)
    try:
        tenant_placement = placement.parse_allowance(doc.get("tenantPlacement"))
    except ValueError as exc:
        raise TemplateError(f"{source}: tenantPlacement: {exc}") from None
    return WorkerTemplate(concurrency=concurrency, pod=pod, tenant_placement=tenant_placement)


_cache: dict[str, tuple[float, WorkerTemplate]] = {}


def configured_template() -> WorkerTemplate:
    """The template file named by HOOKLINE_WORKER_TEMPLATE (re-read when it changes), or the defaults."""
    configured = settings.worker_template_file()
    if configured is None:
        return default_template()
    path = str(configured)
    try:
        mtime = Path(path).stat().st_mtime
    except OSError as exc:
        raise TemplateError(f"{TEMPLATE_ENV}={path}: {exc.strerror}") from None
    cached = _cache.get(path)
    if cached is None or cached[0] != mtime:
        cached = (mtime, parse_template(Path(path).read_text(), path))
        _cache[path] = cached
    return cached[1]


def provider_pod(template: WorkerTemplate, workers: dict[str, Any]) -> dict[str, Any]:
    """A copy of the template's pod with the provider's ``spec.workers`` overrides applied."""
    pod = copy.deepcopy(template.pod)
    pod.setdefault("metadata", {})
    apply_placement(pod["spec"], provider_placement(template, workers))
    if workers.get("resources"):
        template.container(pod)["resources"] = copy.deepcopy(workers["resources"])
    return pod


def provider_placement(template: WorkerTemplate, workers: dict[str, Any]) -> placement.Placement:
    """The platform's placement (the template's) plus what ``spec.workers`` may add to it."""
    return placement.decide(template.pod["spec"], workers, template.tenant_placement)


def apply_placement(pod_spec: dict[str, Any], decided: placement.Placement) -> None:
    for name in placement.FIELDS:
        pod_spec.pop(name, None)
    pod_spec.update(decided.fields)
