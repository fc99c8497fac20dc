"""values.schema.json turns wrong values into messages that say what and where (Helm's own
validator, as `helm install` runs it)."""

from __future__ import annotations

import helm_python as helm
import pytest
from chartkit import DEV_VALUES, MINIMAL, PRODUCTION_VALUES, Obj, deep_merge, load_values, render, validate_values


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
