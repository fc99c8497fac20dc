"""The chart's PrometheusRule, as Helm renders it, passes `promtool check rules`, and `promtool test rules`
proves every alert (tests/monitoring/alerts/*.yaml): it fires when it should, with its summary,
description and runbook link, and stays silent when it should not."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.prometheus import require_binaries

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# tests/chart is not a package; its chartkit renders the chart with Helm's engine.
sys.path.insert(0, str(REPO / "tests" / "chart"))

import chartkit  # noqa: E402

ALERT_TESTS = sorted((HERE / "alerts").glob("*.yaml"))
# The values the unit tests assume: a short runbook URL and one per-provider threshold.
RULE_VALUES: dict[str, Any] = {"metrics": {"prometheusRule": {
    "enabled": True,
    "runbookUrl": "https://runbooks.test/hookline.md",
    "oldestDueSeconds": {"default": 600, "providers": {"stripe": 120}},
}}}


def rendered_rule(values: dict[str, Any] = RULE_VALUES) -> dict[str, Any]:
    rendered = chartkit.render(chartkit.deep_merge(chartkit.MINIMAL, values))
    (rule,) = rendered.find("PrometheusRule")
    return rule


def write_rule_file(folder: Path, rule: dict[str, Any]) -> Path:
    """The PrometheusRule's spec is a Prometheus rule file as it stands."""
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def alert_names(rule: dict[str, Any]) -> set[str]:
    return {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = require_binaries()["promtool"]
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("values", [
    RULE_VALUES,
    {"metrics": {"prometheusRule": {"enabled": True}}},  # the defaults: no per-provider thresholds
    {"metrics": {"prometheusRule": {"enabled": True, "oldestDueSeconds": {"providers": {"a": 1, "b-2": 30.5}}}}},
], ids=["tested-values", "defaults", "two-overrides"])
def test_rendered_rules_pass_promtool_check(tmp_path: Path, values: dict[str, Any]) -> None:
    result = promtool("check", "rules", write_rule_file(tmp_path, rendered_rule(values)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "inconsistency" not in result.stderr, result.stdout + result.stderr


def test_every_alert_has_a_runbook_section_and_its_texts() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {heading.strip().lower() for heading in re.findall(r"^## (\w+)\s*$", runbooks, re.MULTILINE)}
    for group in rendered_rule()["spec"]["groups"]:
        for rule in group["rules"]:
            annotations = rule["annotations"]
            assert annotations["summary"] and annotations["description"], rule["alert"]
            assert annotations["runbook_url"] == f"https://runbooks.test/hookline.md#{rule['alert'].lower()}"
            assert rule["alert"].lower() in anchors, f"docs/runbooks.md has no section {rule['alert']}"
            assert rule["labels"]["severity"] in ("warning", "critical")


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in ALERT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = alert_names(rendered_rule())
    assert names - firing == set(), "alerts never shown to fire"
    assert names - silent == set(), "alerts never shown to stay silent"


@pytest.mark.parametrize("test_file", ALERT_TESTS, ids=[p.stem for p in ALERT_TESTS])
def test_alert_unit_tests(tmp_path: Path, test_file: Path) -> None:
    write_rule_file(tmp_path, rendered_rule())
    shutil.copy(test_file, tmp_path / test_file.name)
    result = promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
