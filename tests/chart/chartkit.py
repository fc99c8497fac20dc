"""Render charts/hookline with Helm's own engine and look at the result as Kubernetes objects.

The engine is `helm-python-sdk` (Helm's Go code behind a C ABI, loaded with ctypes): the same
template functions, values coalescing and values.schema.json validation as `helm template`, without
a helm binary or a network.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hookline"
DEV_VALUES = CHART / "values-dev.yaml"
PRODUCTION_VALUES = REPO / "examples" / "values-production.yaml"
EXAMPLES = REPO / "examples"
RELEASE = "hookline"
NAMESPACE = "hookline"
# The smallest valid install: the only value without a default is the database Secret's name.
MINIMAL: dict[str, Any] = {"database": {"existingSecret": "hookline-database"}}

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """One release's rendered output: its objects (with the template each came from) and NOTES."""

    objects: list[tuple[str, Obj]]
    notes: str

    def find(self, kind: str, name: str | None = None) -> list[Obj]:
        return [o for _, o in self.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]

    def one(self, kind: str, name: str) -> Obj:
        found = self.find(kind, name)
        assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}: {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [f"{o['kind']}/{o['metadata']['name']}" for _, o in self.objects]

    def component(self, kind: str, component: str) -> list[Obj]:
        return [
            o
            for o in self.find(kind)
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]

    def workloads(self) -> Iterator[tuple[Obj, Obj]]:
        """(object, pod spec) of everything that runs containers."""
        for _, obj in self.objects:
            if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
                yield obj, obj["spec"]["template"]["spec"]
            elif obj["kind"] == "Pod":
                yield obj, obj["spec"]

    def manifest(self) -> str:
        """All objects as one multi-document YAML stream (what `helm template` prints)."""
        return yaml.safe_dump_all([o for _, o in self.objects], sort_keys=False)


def deep_merge(base: Obj, override: Obj) -> Obj:
    """Merge like Helm merges `-f a.yaml -f b.yaml`: maps recursively, everything else replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_values(*files: Path, overrides: Obj | None = None) -> Obj:
    values: Obj = {}
    for file in files:
        values = deep_merge(values, yaml.safe_load(file.read_text()) or {})
    return deep_merge(values, overrides or {})


def render(
    values: Obj | None = None,
    *,
    files: Iterable[Path] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    revision: int = 1,
    upgrade: bool = False,
) -> Rendered:
    """`helm template` for an install (or an upgrade): schema validation included, lookup empty."""
    merged = load_values(*files, overrides=values)
    with helm.Chart.load(CHART) as chart:
        out = chart.render(
            merged,
            name=release,
            namespace=namespace,
            revision=revision,
            is_install=not upgrade,
            is_upgrade=upgrade,
        )
    return _parse(out)


def render_in_cluster(kubeconfig: Path, values: Obj | None = None, *, namespace: str = NAMESPACE,
                      upgrade: bool = False) -> Rendered:
    """As `render`, but `lookup` answers from the cluster ``kubeconfig`` names (what `helm install` or
    `helm upgrade` would render there); nothing is created."""
    merged = load_values(overrides=values)
    with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config, helm.Chart.load(CHART) as chart:
        out = config.render(chart, merged, name=RELEASE, namespace=namespace, revision=2 if upgrade else 1,
                            is_install=not upgrade, is_upgrade=upgrade)
    return _parse(out)


def _parse(out: dict[str, str]) -> Rendered:
    objects: list[tuple[str, Obj]] = []
    notes = ""
    for template, text in sorted(out.items()):
        if template.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:  # skip empty documents from disabled templates
                objects.append((template, doc))
    return Rendered(objects, notes)


def render_default(**kwargs: Any) -> Rendered:
    return render(MINIMAL, **kwargs)


def render_dev(**kwargs: Any) -> Rendered:
    return render(files=[DEV_VALUES], **kwargs)


def render_production(**kwargs: Any) -> Rendered:
    return render(files=[PRODUCTION_VALUES], **kwargs)


def validate_values(values: Obj) -> None:
    """values.schema.json check alone; raises helm_python.HelmValuesError with Helm's message."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)


def lint(values: Obj) -> dict[str, Any]:
    return helm.lint(CHART, values, strict=True, namespace=NAMESPACE)


def is_hook(obj: Obj) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})
