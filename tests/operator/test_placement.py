"""What a team may add to its workers' placement (placement.py): the platform's placement is always
kept, additions are bounded by worker.tenantPlacement, and a refused request is reported, never applied.
Pure functions: no API server."""

from __future__ import annotations

from typing import Any

import pytest

from hookline_operator import placement
from hookline_operator.placement import Placement, TenantPlacement, Toleration, decide, parse_allowance
from hookline_operator.podtemplate import TemplateError, default_template, parse_template, provider_pod
from hookline_operator.reconcile import WorkersState, placement_state

PLATFORM: dict[str, Any] = {
    "nodeSelector": {"pool": "workers"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "workers", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "priorityClassName": "webhooks",
    "containers": [{"name": "worker"}],
}
GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
EVERYTHING = {"operator": "Exists"}

ALLOWANCE = parse_allowance({
    "allowedNodeSelectors": {"disk": ["ssd", "nvme"]},
    "allowedTolerations": [GPU, {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                                 "tolerationSeconds": 300}],
    "allowedPriorityClasses": ["payments-critical"],
    "allowAffinity": True,
})


def test_nothing_requested_is_the_platforms_placement() -> None:
    decided = decide(PLATFORM, {}, ALLOWANCE)
    assert decided == Placement({k: PLATFORM[k] for k in placement.FIELDS}, ())


@pytest.mark.parametrize("request_", [
    {"nodeSelector": {"disk": "ssd"}},
    {"tolerations": [GPU]},
    {"tolerations": [CONTROL_PLANE]},
    {"tolerations": [EVERYTHING]},
    {"priorityClassName": "system-cluster-critical"},
    {"affinity": {"podAffinity": {}}},
], ids=["nodeSelector", "toleration", "control-plane", "every-taint", "priorityClass", "affinity"])
def test_by_default_a_team_may_add_nothing(request_: dict[str, Any]) -> None:
    decided = decide(PLATFORM, request_, TenantPlacement())
    assert decided.fields == {k: PLATFORM[k] for k in placement.FIELDS}
    assert len(decided.refused) == 1 and "worker.tenantPlacement" in decided.refused[0]


def test_allowed_additions_are_merged_and_the_platform_kept() -> None:
    decided = decide(PLATFORM, {"nodeSelector": {"disk": "ssd"}, "tolerations": [GPU],
                                "priorityClassName": "payments-critical"}, ALLOWANCE)
    assert decided.refused == ()
    assert decided.fields["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    assert decided.fields["tolerations"] == [*PLATFORM["tolerations"], GPU]
    assert decided.fields["priorityClassName"] == "payments-critical"
    assert decided.fields["affinity"] == PLATFORM["affinity"]


def test_a_team_cannot_change_a_node_label_the_platform_sets() -> None:
    decided = decide(PLATFORM, {"nodeSelector": {"pool": "control-plane", "disk": "ssd"}},
                     parse_allowance({"allowedNodeSelectors": {"pool": ["control-plane"], "disk": ["ssd"]}}))
    assert decided.fields["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    assert decided.refused == ("nodeSelector pool=control-plane: the platform sets pool=workers",)
    # Asking for what the platform already sets is no request at all.
    assert decide(PLATFORM, {"nodeSelector": {"pool": "workers"}}, TenantPlacement()).refused == ()


def test_a_node_label_value_outside_the_list_is_refused() -> None:
    decided = decide(PLATFORM, {"nodeSelector": {"disk": "hdd"}}, ALLOWANCE)
    assert decided.fields["nodeSelector"] == {"pool": "workers"}
    assert decided.refused == ("nodeSelector disk=hdd is not in worker.tenantPlacement.allowedNodeSelectors",)


@pytest.mark.parametrize("toleration", [
    {"key": "gpu", "operator": "Exists"},  # every effect, where NoSchedule is allowed
    {"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"},
    {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
    {"key": "spot", "operator": "Equal", "value": "false", "effect": "NoExecute"},
    CONTROL_PLANE,
    EVERYTHING,
], ids=["no-effect", "equal-not-exists", "other-effect", "other-value", "control-plane", "every-taint"])
def test_tolerations_match_by_key_operator_value_and_effect(toleration: dict[str, Any]) -> None:
    decided = decide(PLATFORM, {"tolerations": [toleration]}, ALLOWANCE)
    assert decided.fields["tolerations"] == PLATFORM["tolerations"]
    assert decided.refused == (f"toleration {Toleration.of(toleration)} is not in "
                               f"worker.tenantPlacement.allowedTolerations",)


def test_operator_defaults_to_equal_and_exists_ignores_the_value() -> None:
    allowance = parse_allowance({"allowedTolerations": [{"key": "team", "value": "a", "effect": "NoSchedule"},
                                                        {"key": "gpu", "operator": "Exists", "value": "x"}]})
    wanted = [{"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"},
              {"key": "gpu", "operator": "Exists"}]
    assert decide({}, {"tolerations": wanted}, allowance) == Placement({"tolerations": wanted}, ())


def test_toleration_seconds_may_only_be_shorter_than_allowed() -> None:
    spot = {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"}
    assert decide({}, {"tolerations": [{**spot, "tolerationSeconds": 60}]}, ALLOWANCE).refused == ()
    for longer in ({**spot, "tolerationSeconds": 301}, spot):  # no tolerationSeconds: for ever
        decided = decide({}, {"tolerations": [longer]}, ALLOWANCE)
        assert decided.fields == {}
        assert decided.refused == ("toleration spot=true:NoExecute (Equal) is allowed for at most "
                                   "tolerationSeconds 300",)


def test_a_priority_class_outside_the_list_keeps_the_platforms() -> None:
    decided = decide(PLATFORM, {"priorityClassName": "system-node-critical"}, ALLOWANCE)
    assert decided.fields["priorityClassName"] == "webhooks"
    assert decided.refused == ("priorityClassName system-node-critical is not in "
                               "worker.tenantPlacement.allowedPriorityClasses",)


def test_team_affinity_can_only_narrow_the_platforms_nodes() -> None:
    team = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}
    decided = decide(PLATFORM, {"affinity": team}, ALLOWANCE)
    assert decided.refused == ()
    terms = decided.fields["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    zone = {"key": "zone", "operator": "In", "values": ["a", "b"]}
    # Each alternative the team gives is ANDed with the platform's: zone a/b stays required.
    assert terms == [{"matchExpressions": [zone, {"key": "disk", "operator": "In", "values": ["ssd"]}]},
                     {"matchExpressions": [zone, {"key": "disk", "operator": "In", "values": ["nvme"]}]}]
    assert decided.fields["affinity"]["podAntiAffinity"] == team["podAntiAffinity"]
    # The template itself is never changed.
    assert len(PLATFORM["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]) == 1


def test_pod_affinity_terms_are_joined() -> None:
    platform = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname"}]}}}
    team = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}
    decided = decide(platform, {"affinity": team}, ALLOWANCE)
    assert decided.fields["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"topologyKey": "kubernetes.io/hostname"}, {"topologyKey": "zone"}]


@pytest.mark.parametrize("affinity", [
    {"nodeAffinity": {"requiredDuringSchedulingRequiredDuringExecution": {}}},
    {"somethingNew": {}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}},
    {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"topologyKey": "zone"}}},
])
def test_an_affinity_the_merge_does_not_know_is_refused(affinity: dict[str, Any]) -> None:
    decided = decide(PLATFORM, {"affinity": affinity}, ALLOWANCE)
    assert decided.fields["affinity"] == PLATFORM["affinity"]
    assert len(decided.refused) == 1 and decided.refused[0].startswith("affinity: ")


def test_every_refusal_is_listed_and_the_allowed_rest_applied() -> None:
    decided = decide(PLATFORM, {"nodeSelector": {"disk": "ssd"}, "tolerations": [CONTROL_PLANE, GPU],
                                "priorityClassName": "system-cluster-critical"}, ALLOWANCE)
    assert decided.fields["nodeSelector"] == {"pool": "workers", "disk": "ssd"}
    assert decided.fields["tolerations"] == [*PLATFORM["tolerations"], GPU]
    assert len(decided.refused) == 2


@pytest.mark.parametrize(("doc", "message"), [
    ("nope", "expected a mapping"),
    ({"allowTolerations": []}, "unknown field(s) allowTolerations"),
    ({"allowedNodeSelectors": {"disk": "ssd"}}, "allowedNodeSelectors must map"),
    ({"allowedTolerations": ["gpu"]}, "allowedTolerations must be a list"),
    ({"allowedPriorityClasses": "high"}, "allowedPriorityClasses must be a list"),
    ({"allowAffinity": "yes"}, "allowAffinity must be true or false"),
])
def test_a_broken_allowance_stops_the_template(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_allowance(doc)
    text = f"pod: {{spec: {{containers: [{{name: worker}}]}}}}\ntenantPlacement: {doc!r}\n"
    with pytest.raises(TemplateError, match="tenantPlacement"):
        parse_template(text, "template.yaml")


def test_the_template_carries_the_allowance_and_the_default_allows_nothing() -> None:
    template = parse_template("pod: {spec: {containers: [{name: worker}]}}\n"
                              "tenantPlacement: {allowedPriorityClasses: [high]}\n")
    assert template.tenant_placement.priority_classes == {"high"}
    assert default_template().tenant_placement == TenantPlacement()
    pod = provider_pod(default_template(), {"priorityClassName": "high", "tolerations": [EVERYTHING]})
    assert "priorityClassName" not in pod["spec"] and "tolerations" not in pod["spec"]


def test_running_workers_with_a_refused_request_are_not_ready_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKLINE_WORKER_TEMPLATE", raising=False)  # the defaults: nothing allowed
    state = placement_state({"workers": {"tolerations": [CONTROL_PLANE]}},
                            WorkersState(True, "WorkersReady", "ok"))
    assert (state.ok, state.reason) == (False, "PlacementNotAllowed")
    assert "node-role.kubernetes.io/control-plane:NoSchedule (Exists) is not in" in state.message
    # A state that is already not ok says what matters more.
    waiting = WorkersState(False, "WaitingForName", "no workers")
    assert placement_state({"workers": {"tolerations": [CONTROL_PLANE]}}, waiting) == waiting
    assert placement_state({"workers": {}}, WorkersState(True, "WorkersReady", "ok")).ok


def test_a_refused_placement_is_the_ready_reason_with_one_warning() -> None:
    from test_decisions import observation  # the same observed world as the other condition tests

    from hookline_operator.conditions import compose, new_conflicts
    from hookline_operator.reconcile import SyncState

    refused = WorkersState(False, "PlacementNotAllowed", "spec.workers asks for ...")
    conditions = compose([], observation(SyncState(True, "Synced", "ok"), refused), None, 2)
    ready = next(c for c in conditions if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PlacementNotAllowed")
    assert new_conflicts([], conditions) == [("PlacementNotAllowed", "spec.workers asks for ...")]
    assert new_conflicts(conditions, conditions) == []


def test_a_patch_sets_the_placement_exactly() -> None:
    # A strategic merge patch merges maps and keeps what it leaves out: spell out replace and removal.
    pod_spec: dict[str, Any] = {"nodeSelector": {"pool": "workers"}, "tolerations": [GPU], "containers": []}
    placement.exact_in_patch(pod_spec)
    assert pod_spec == {"nodeSelector": {"pool": "workers", "$patch": "replace"}, "tolerations": [GPU],
                        "affinity": None, "priorityClassName": None, "containers": []}
