"""Where a provider's worker pods may run: the platform's placement, plus what a team may add. Pure, no I/O.

The chart's ``worker.{nodeSelector,tolerations,affinity,priorityClassName}`` is the platform's
placement and is always kept. A WebhookProvider's ``spec.workers`` may add to it only what
``worker.tenantPlacement`` lists; by default nothing (a team could otherwise tolerate the
control plane's taints or take the highest PriorityClass). A request outside the allowance is
never applied: the workers run with the platform's placement plus the allowed additions, and
the resource says what was refused (``Ready=False``, reason ``PlacementNotAllowed``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName")
VALUES = "worker.tenantPlacement"  # where the allowance is set, for messages

# The parts of a Kubernetes Affinity a team may add to, each combined so it only narrows.
_NODE_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_POD_KINDS = ("podAffinity", "podAntiAffinity")


class Toleration(NamedTuple):
    """A toleration as matched: key, operator, value, effect ("" for "every effect")."""

    key: str
    operator: str
    value: str
    effect: str

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Toleration:
        operator = str(raw.get("operator") or "Equal")
        value = "" if operator == "Exists" else str(raw.get("value") or "")
        return cls(str(raw.get("key") or ""), operator, value, str(raw.get("effect") or ""))

    def __str__(self) -> str:
        what = self.key or "every taint"
        if self.operator == "Equal":
            what += f"={self.value}"
        return f"{what}:{self.effect or 'every effect'} ({self.operator})"


@dataclass(frozen=True)
class TenantPlacement:
    """What a provider may add to its workers' placement (chart values ``worker.tenantPlacement``)."""

    node_selectors: Mapping[str, frozenset[str]] = field(default_factory=dict)  # label key -> values allowed
    tolerations: Mapping[Toleration, int | None] = field(default_factory=dict)  # -> longest tolerationSeconds
    priority_classes: frozenset[str] = frozenset()
    affinity: bool = False


class Placement(NamedTuple):
    fields: dict[str, Any]  # the pod spec's placement fields: the platform's plus the allowed additions
    refused: tuple[str, ...]  # one sentence per request that was not applied


def parse_allowance(doc: Any) -> TenantPlacement:
    """``worker.tenantPlacement`` as the chart renders it; ValueError names what is wrong."""
    if doc in (None, {}):
        return TenantPlacement()
    if not isinstance(doc, dict):
        raise ValueError("expected a mapping")
    unknown = set(doc) - {"allowedNodeSelectors", "allowedTolerations", "allowedPriorityClasses", "allowAffinity"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
    selectors = doc.get("allowedNodeSelectors") or {}
    if not isinstance(selectors, dict) or not all(isinstance(v, list) for v in selectors.values()):
        raise ValueError("allowedNodeSelectors must map each label key to a list of allowed values")
    tolerations = doc.get("allowedTolerations") or []
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise ValueError("allowedTolerations must be a list of tolerations")
    classes = doc.get("allowedPriorityClasses") or []
    if not isinstance(classes, list):
        raise ValueError("allowedPriorityClasses must be a list of PriorityClass names")
    affinity = doc.get("allowAffinity", False)
    if not isinstance(affinity, bool):
        raise ValueError("allowAffinity must be true or false")
    return TenantPlacement(
        node_selectors={str(k): frozenset(str(v) for v in values) for k, values in selectors.items()},
        tolerations={Toleration.of(t): _seconds(t) for t in tolerations},
        priority_classes=frozenset(str(c) for c in classes),
        affinity=affinity,
    )


def _seconds(raw: Mapping[str, Any]) -> int | None:
    seconds = raw.get("tolerationSeconds")
    return None if seconds is None else int(seconds)


def decide(platform: Mapping[str, Any], requested: Mapping[str, Any], allowed: TenantPlacement) -> Placement:
    """The placement of a provider's pods: ``platform`` (the template's pod spec) kept, what
    ``requested`` (``spec.workers``) adds merged in where ``allowed`` permits it."""
    fields = {f: copy.deepcopy(platform[f]) for f in FIELDS if platform.get(f) not in (None, "", {}, [])}
    refused: list[str] = []
    if wanted := requested.get("nodeSelector"):
        fields["nodeSelector"] = _node_selector(fields.get("nodeSelector") or {}, wanted, allowed, refused)
    if wanted := requested.get("tolerations"):
        fields["tolerations"] = _tolerations(fields.get("tolerations") or [], wanted, allowed, refused)
    if (wanted := requested.get("priorityClassName")) and wanted != fields.get("priorityClassName"):
        if wanted in allowed.priority_classes:
            fields["priorityClassName"] = wanted
        else:
            refused.append(f"priorityClassName {wanted} is not in {VALUES}.allowedPriorityClasses")
    if wanted := requested.get("affinity"):
        if not allowed.affinity:
            refused.append(f"affinity: {VALUES}.allowAffinity is false")
        elif problem := _affinity_problem(wanted):
            refused.append(f"affinity: {problem}")
        else:
            fields["affinity"] = merge_affinity(fields.get("affinity") or {}, wanted)
    return Placement({k: v for k, v in fields.items() if v not in ({}, [])}, tuple(refused))


def _node_selector(platform: dict[str, str], wanted: Mapping[str, Any], allowed: TenantPlacement,
                   refused: list[str]) -> dict[str, str]:
    merged = dict(platform)
    for key, value in sorted(wanted.items()):
        if key in platform:
            if platform[key] != value:  # a team narrows where its pods run, never moves them off the platform's
                refused.append(f"nodeSelector {key}={value}: the platform sets {key}={platform[key]}")
        elif str(value) in allowed.node_selectors.get(key, frozenset()):
            merged[key] = str(value)
        else:
            refused.append(f"nodeSelector {key}={value} is not in {VALUES}.allowedNodeSelectors")
    return merged


def _tolerations(platform: list[dict[str, Any]], wanted: list[Any], allowed: TenantPlacement,
                 refused: list[str]) -> list[dict[str, Any]]:
    merged = list(platform)
    for raw in wanted:
        if raw in merged:
            continue
        toleration = Toleration.of(raw)
        seconds = _seconds(raw)
        if toleration not in allowed.tolerations:
            refused.append(f"toleration {toleration} is not in {VALUES}.allowedTolerations")
        elif (limit := allowed.tolerations[toleration]) is not None and (seconds is None or seconds > limit):
            refused.append(f"toleration {toleration} is allowed for at most tolerationSeconds {limit}")
        else:
            merged.append(copy.deepcopy(raw))
    return merged


def _affinity_problem(affinity: Any) -> str:
    """Why a team's affinity cannot be merged (empty when it can): only the shapes merge_affinity
    knows are accepted, so nothing unexamined reaches the pod."""
    if not isinstance(affinity, dict):
        return "not a mapping"
    unknown = set(affinity) - {"nodeAffinity", *_POD_KINDS}
    if unknown:
        return f"unknown field(s) {', '.join(sorted(unknown))}"
    for kind, part in affinity.items():
        if not isinstance(part, dict) or set(part) - {_NODE_REQUIRED, _PREFERRED}:
            return f"{kind} may hold only {_NODE_REQUIRED} and {_PREFERRED}"
        required = part.get(_NODE_REQUIRED)
        if kind == "nodeAffinity":
            terms = (required or {}).get("nodeSelectorTerms") if isinstance(required, dict) else None
            if required is not None and not (isinstance(terms, list) and all(isinstance(t, dict) for t in terms)):
                return f"nodeAffinity.{_NODE_REQUIRED} must hold a list nodeSelectorTerms"
        elif required is not None and not isinstance(required, list):
            return f"{kind}.{_NODE_REQUIRED} must be a list"
        if not isinstance(part.get(_PREFERRED) or [], list):
            return f"{kind}.{_PREFERRED} must be a list"
    return ""


def merge_affinity(platform: Mapping[str, Any], team: Mapping[str, Any]) -> dict[str, Any]:
    """Both affinities at once. Lists of pod (anti-)affinity terms and of preferences are all
    honoured, so they are joined; required node terms are alternatives (any one suffices), so
    each platform term is ANDed with each team term: a team can only narrow the nodes."""
    merged = copy.deepcopy(dict(platform))
    for kind, part in team.items():
        into = merged.setdefault(kind, {})
        if kind == "nodeAffinity" and part.get(_NODE_REQUIRED):
            ours = (into.get(_NODE_REQUIRED) or {}).get("nodeSelectorTerms") or []
            theirs = part[_NODE_REQUIRED].get("nodeSelectorTerms") or []
            into[_NODE_REQUIRED] = {"nodeSelectorTerms": and_terms(ours, theirs)}
        elif part.get(_NODE_REQUIRED):
            into[_NODE_REQUIRED] = [*(into.get(_NODE_REQUIRED) or []), *copy.deepcopy(part[_NODE_REQUIRED])]
        if part.get(_PREFERRED):
            into[_PREFERRED] = [*(into.get(_PREFERRED) or []), *copy.deepcopy(part[_PREFERRED])]
    return merged


def and_terms(platform: list[dict[str, Any]], team: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms meaning "one of ``platform`` and one of ``team``"."""
    if not platform or not team:
        return copy.deepcopy(platform or team)
    return [{key: [*copy.deepcopy(ours.get(key) or []), *copy.deepcopy(theirs.get(key) or [])]
             for key in ("matchExpressions", "matchFields") if ours.get(key) or theirs.get(key)}
            for ours in platform for theirs in team]


def exact_in_patch(pod_spec: dict[str, Any]) -> None:
    """Make a strategic merge patch carrying ``pod_spec`` set the placement exactly as decided: the
    API server merges maps and keeps fields a patch leaves out, which would keep a team's earlier
    (or no longer allowed) node label, affinity or priority class on the Deployment."""
    for name in FIELDS:
        value = pod_spec.get(name)
        if value in (None, "", {}, []):
            pod_spec[name] = None  # removes the field
        elif isinstance(value, dict):
            pod_spec[name] = {**value, "$patch": "replace"}
