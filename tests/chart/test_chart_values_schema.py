"""values.schema.json turns wrong values into messages that say what and where (Helm's own
validator, as `helm install` runs it)."""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml
from chartkit import (
    CHART,
    DEV_VALUES,
    MINIMAL,
    PRODUCTION_VALUES,
    Obj,
    deep_merge,
    load_values,
    render,
    validate_values,
)


def rejection(values: Obj) -> str:
    with pytest.raises(helm.HelmValuesError) as caught:
        validate_values(values)
    return str(caught.value)


@pytest.mark.parametrize(
    "values",
    [MINIMAL, load_values(DEV_VALUES), load_values(PRODUCTION_VALUES)],
    ids=["default", "dev", "production"],
)
def test_shipped_values_are_valid(values: Obj) -> None:
    validate_values(values)


def test_missing_database_secret_is_rejected() -> None:
    message = rejection({})
    assert "at '/database': missing property 'existingSecret'" in message
    assert "at '/database/existingSecret'" in rejection({"database": {"existingSecret": ""}})
    # The same message stops a real install, not only an explicit validation.
    with pytest.raises(helm.HelmError, match="existingSecret"):
        render({})


def test_the_dev_database_replaces_the_secret() -> None:
    validate_values({"devPostgres": {"enabled": True}})


@pytest.mark.parametrize("component", ["receiver", "relay"])
def test_negative_replicas_are_rejected(component: str) -> None:
    message = rejection(deep_merge(MINIMAL, {component: {"replicas": -1}}))
    assert f"at '/{component}/replicas': minimum: got -1, want 0" in message


def test_unknown_log_format_is_rejected() -> None:
    message = rejection(deep_merge(MINIMAL, {"logFormat": "xml"}))
    assert "at '/logFormat': value must be one of 'json', 'text'" in message


def test_every_problem_is_reported_at_once() -> None:
    message = rejection({"logFormat": "xml", "receiver": {"replicas": -2}})
    assert "/logFormat" in message and "/receiver/replicas" in message and "existingSecret" in message


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"recevier": {"replicas": 2}}, "'recevier'"),  # a typo is an error, not a silently ignored key
        ({"receiver": {"replicas": "2"}}, "/receiver/replicas"),
        ({"image": {"tag": "latest"}}, "/image/tag"),
        ({"image": {"digest": "sha256:short"}}, "/image/digest"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "/operator/watchNamespaces/0"),
        ({"receiver": {"ingress": {"hosts": [{"host": "h", "paths": [{"path": "x", "pathType": "Prefix"}]}]}}},
         "/receiver/ingress/hosts/0/paths/0/path"),
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"retention": {"endpoints": {"doneHours": 0}}}, "/retention/endpoints/doneHours"),
        ({"retention": {"endpoints": {"deadDay": 3}}}, "'deadDay'"),
    ],
)
def test_other_mistakes_are_named(values: Obj, where: str) -> None:
    assert where in rejection(deep_merge(MINIMAL, values))


# -- values.yaml and values.schema.json name the same keys -----------------------------------------

# Keys the schema knows that values.yaml deliberately leaves out, and why.
SCHEMA_ONLY = {
    "global": "Helm's own, shared with subcharts; the chart has none",
    "database.existingSecret": "required and without a default (a default would hide the missing Secret)",
    "receiver.podDisruptionBudget.minAvailable": "the alternative to maxUnavailable; any default would always win",
    "*.resources.claims": "a Kubernetes field of every resources block, with no default",
}
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
              type(None): "null"}


def schema_mismatches(value: Any, node: Obj, definitions: Obj, path: str) -> list[str]:
    """Where values.yaml (``value``) and the schema (``node``) disagree: a key only one of them has,
    a schema entry without a type, or a default whose type the schema refuses."""
    while "$ref" in node:
        node = definitions[node["$ref"].removeprefix("#/definitions/")]
    problems = []
    types = node.get("type")
    allowed = [types] if isinstance(types, str) else types or []
    actual = JSON_TYPES[type(value)]
    if not allowed:
        problems.append(f"{path or '/'}: the schema gives no type")
    elif actual not in allowed and not (actual == "integer" and "number" in allowed):
        problems.append(f"{path}: values.yaml has {actual}, the schema wants {types}")
    children: list[tuple[str, Any, Obj]] = []
    if isinstance(value, dict):
        properties = node.get("properties")
        for key, item in value.items():
            if properties is not None and key in properties:
                children.append((key, item, properties[key]))
            elif isinstance(node.get("additionalProperties"), dict):  # a map of free keys, e.g. nodeSelector
                children.append((key, item, node["additionalProperties"]))
            elif patterns := [s for p, s in node.get("patternProperties", {}).items() if re.search(p, key)]:
                children.append((key, item, patterns[0]))
            elif properties is not None:  # else an object Kubernetes defines, e.g. a securityContext
                problems.append(f"{path}.{key}: in values.yaml, not in values.schema.json".lstrip("."))
        for key in properties or {}:
            where = f"{path}.{key}".lstrip(".")
            if key not in value and not any(fnmatch.fnmatchcase(where, p) for p in SCHEMA_ONLY):
                problems.append(f"{where}: in values.schema.json, not in values.yaml")
    elif isinstance(value, list) and "items" in node:
        children = [(f"[{i}]", item, node["items"]) for i, item in enumerate(value)]
    for key, item, child in children:
        where = f"{path}{key}" if key.startswith("[") else f"{path}.{key}".lstrip(".")
        problems += schema_mismatches(item, child, definitions, where)
    return problems


def test_values_yaml_and_the_schema_have_the_same_keys_and_types() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema_mismatches(values, schema, schema.get("definitions", {}), "") == []


def test_the_key_comparison_sees_a_difference() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["relay"]["replica"] = 1
    del values["relay"]["replicas"]
    values["logLevel"] = 1
    del schema["properties"]["tests"]["properties"]["enabled"]["type"]
    assert schema_mismatches(values, schema, schema["definitions"], "") == [
        "logLevel: values.yaml has integer, the schema wants string",
        "relay.replica: in values.yaml, not in values.schema.json",
        "relay.replicas: in values.schema.json, not in values.yaml",
        "tests.enabled: the schema gives no type",
    ]
