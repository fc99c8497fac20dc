"""The WebhookProvider parser (core/provider_spec.py): every way a spec can be wrong gives an error
that names the field, and every good spec comes back as the provider it describes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookline.core.provider_spec import (
    DEFAULT_MAX_BODY,
    Destination,
    FieldRule,
    Ordering,
    Provider,
    Retention,
    SpecError,
    Transition,
    load_documents,
    parse_provider,
    split_file_secrets,
)
from hookline.core.queue import RetryPolicy

SECRETS = ["a-signing-secret"]
# The smallest good spec; each bad case below changes one fragment of it.
BASE: dict[str, Any] = {"signature": {"scheme": "github"}, "handler": "payments.webhooks:on_event"}
DROP = object()  # as a fragment value: remove the key


def spec_with(fragment: Mapping[str, Any], base: Mapping[str, Any] = BASE) -> dict[str, Any]:
    """``base`` with ``fragment`` merged in: objects merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in fragment.items():
        if value is DROP:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = spec_with(value, merged[key])
        else:
            merged[key] = value
    return merged


NO_HANDLER = {"handler": DROP}
ORDERING = {"entityKey": {"jsonPointer": "/id"}, "transitions": [{"on": "created", "to": "open"}]}

BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    # signature
    ("signature missing", {"signature": DROP}, "spec.signature is required"),
    ("signature not an object", {"signature": "github"}, "spec.signature is required"),
    ("scheme missing", {"signature": {"scheme": DROP}}, "spec.signature.scheme is required"),
    ("scheme not a string", {"signature": {"scheme": 7}}, "spec.signature.scheme must be a string, not a number"),
    ("scheme unknown", {"signature": {"scheme": "rot13"}}, "spec.signature.scheme: unknown signature scheme 'rot13'"),
    ("tolerance zero", {"signature": {"toleranceSeconds": 0}},
     "spec.signature.toleranceSeconds must be between 1 and 86400, not 0"),
    ("tolerance a day and a second", {"signature": {"toleranceSeconds": 86401}},
     "spec.signature.toleranceSeconds must be between 1 and 86400, not 86401"),
    ("tolerance a boolean", {"signature": {"toleranceSeconds": True}},
     "spec.signature.toleranceSeconds must be a number, not True"),
    ("tolerance a string", {"signature": {"toleranceSeconds": "300"}},
     "spec.signature.toleranceSeconds must be a number, not a string"),
    ("header not a string", {"signature": {"header": ["X-Sig"]}}, "spec.signature.header must be a string, not a list"),
    ("encoding not a string", {"signature": {"encoding": 16}},
     "spec.signature.encoding must be a string, not a number"),
    ("encoding unknown", {"signature": {"encoding": "base32"}}, "spec.signature: encoding must be one of"),
    ("prefix not a string", {"signature": {"prefix": False}}, "spec.signature.prefix must be a string, not a boolean"),
    ("hmac-sha256 without header", {"signature": {"scheme": "hmac-sha256"}}, "hmac-sha256 needs 'header'"),
    # eventId / eventType
    ("eventId not an object", {"eventId": "/id"}, "spec.eventId must be an object with jsonPointer or header"),
    ("eventId with neither", {"eventId": {"path": "/id"}}, "spec.eventId needs exactly one of jsonPointer or header"),
    ("eventId with both", {"eventId": {"jsonPointer": "/id", "header": "X-Id"}},
     "spec.eventId needs exactly one of jsonPointer or header"),
    ("eventId pointer without slash", {"eventId": {"jsonPointer": "id"}},
     "spec.eventId.jsonPointer must be a JSON pointer like /id, not 'id'"),
    ("eventId pointer not a string", {"eventId": {"jsonPointer": 3}},
     "spec.eventId.jsonPointer must be a JSON pointer"),
    ("eventId header empty", {"eventId": {"header": ""}}, "spec.eventId.header must be a header name"),
    ("eventId header not a string", {"eventId": {"header": 5}}, "spec.eventId.header must be a header name"),
    ("eventType not an object", {"eventType": ["/type"]},
     "spec.eventType must be an object with jsonPointer or header"),
    ("eventType pointer bad", {"eventType": {"jsonPointer": "type"}},
     "spec.eventType.jsonPointer must be a JSON pointer"),
    # destination or handler
    ("destination not an object", {**NO_HANDLER, "destination": "http://x"}, "spec.destination needs a url"),
    ("destination without url", {**NO_HANDLER, "destination": {"timeoutSeconds": 3}}, "spec.destination needs a url"),
    ("destination url not http", {**NO_HANDLER, "destination": {"url": "ftp://files/x"}},
     "spec.destination.url must be an http(s) URL, not 'ftp://files/x'"),
    ("destination timeout too short", {**NO_HANDLER, "destination": {"url": "http://x", "timeoutSeconds": 0.05}},
     "spec.destination.timeoutSeconds must be between 0.1 and 300, not 0.05"),
    ("destination timeout a string", {**NO_HANDLER, "destination": {"url": "http://x", "timeoutSeconds": "10"}},
     "spec.destination.timeoutSeconds must be a number"),
    ("handler without function", {"handler": "payments.webhooks"},
     "spec.handler must look like 'package.module:function', not 'payments.webhooks'"),
    ("handler with a call", {"handler": "payments:on_event()"},
     "spec.handler must look like 'package.module:function'"),
    ("handler not a string", {"handler": 42}, "spec.handler must be a string, not a number"),
    ("destination and handler", {"destination": {"url": "http://x"}}, "mutually exclusive: choose one"),
    ("neither destination nor handler", NO_HANDLER, "spec needs a destination"),
    # retry
    ("retry not an object", {"retry": [12]}, "spec.retry must be an object, not a list"),
    ("maxAttempts zero", {"retry": {"maxAttempts": 0}}, "spec.retry.maxAttempts must be between 1 and 1000, not 0"),
    ("maxAttempts a boolean", {"retry": {"maxAttempts": False}}, "spec.retry.maxAttempts must be a number, not False"),
    ("initialDelaySeconds negative", {"retry": {"initialDelaySeconds": -1}},
     "spec.retry.initialDelaySeconds must be between 0 and 86400, not -1"),
    ("maxDelaySeconds over a week", {"retry": {"maxDelaySeconds": 7 * 86400 + 1}},
     "spec.retry.maxDelaySeconds must be between 0 and 604800"),
    ("initial delay above max delay", {"retry": {"initialDelaySeconds": 60, "maxDelaySeconds": 30}},
     "spec.retry.initialDelaySeconds must not exceed maxDelaySeconds"),
    # ordering
    ("ordering not an object", {"ordering": ["created"]}, "spec.ordering must be an object"),
    ("ordering without entityKey", {"ordering": {"transitions": ORDERING["transitions"]}},
     "spec.ordering.entityKey is required"),
    ("ordering without transitions", {"ordering": {"entityKey": {"jsonPointer": "/id"}}},
     "spec.ordering.transitions must be a non-empty list"),
    ("ordering with no transitions", {"ordering": {**ORDERING, "transitions": []}},
     "spec.ordering.transitions must be a non-empty list"),
    ("transition not an object", {"ordering": {**ORDERING, "transitions": ["created->open"]}},
     "spec.ordering.transitions[0] needs 'on' (an event type) and 'to' (a state)"),
    ("transition without to", {"ordering": {**ORDERING, "transitions": [{"on": "a", "to": "x"}, {"on": "b"}]}},
     "spec.ordering.transitions[1] needs 'on'"),
    ("transition on not a string", {"ordering": {**ORDERING, "transitions": [{"on": 1, "to": "x"}]}},
     "spec.ordering.transitions[0] needs 'on'"),
    ("transition from not a list", {"ordering": {**ORDERING, "transitions": [{"on": "a", "from": "x", "to": "y"}]}},
     "spec.ordering.transitions[0].from must be a list of states (null for 'no state yet')"),
    ("transition from a number", {"ordering": {**ORDERING, "transitions": [{"on": "a", "from": [1], "to": "y"}]}},
     "spec.ordering.transitions[0].from must be a list of states"),
    ("entityKey not a rule", {"ordering": {**ORDERING, "entityKey": "/id"}},
     "spec.ordering.entityKey must be an object with jsonPointer or header"),
    ("maxDeferralSeconds over 30 days", {"ordering": {**ORDERING, "maxDeferralSeconds": 30 * 86400 + 1}},
     "spec.ordering.maxDeferralSeconds must be between 0 and 2592000"),
    # replayProtection
    ("replayProtection not an object", {"replayProtection": 3600}, "spec.replayProtection must be an object"),
    ("replayProtection without window", {"replayProtection": {}},
     "spec.replayProtection.bodyHashWindowSeconds must be between 1 and 2592000, not 0"),
    ("replay window a boolean", {"replayProtection": {"bodyHashWindowSeconds": True}},
     "spec.replayProtection.bodyHashWindowSeconds must be a number"),
    # retention
    ("retention not an object", {"retention": 72}, "spec.retention must be an object"),
    ("retention unknown setting", {"retention": {"doneDays": 3}},
     "spec.retention.doneDays is not a retention setting (doneHours, deadDays, dedupDays)"),
    ("doneHours zero", {"retention": {"doneHours": 0}},
     "spec.retention.doneHours must be between 0.001 and 87600, not 0"),
    ("deadDays over ten years", {"retention": {"deadDays": 3651}},
     "spec.retention.deadDays must be between 0.001 and 3650, not 3651"),
    ("dedupDays a string", {"retention": {"dedupDays": "30d"}},
     "spec.retention.dedupDays must be a number, not a string"),
    ("dedupDays a boolean", {"retention": {"dedupDays": True}}, "spec.retention.dedupDays must be a number"),
    # limits
    ("maxBodyBytes zero", {"maxBodyBytes": 0}, "spec.maxBodyBytes must be between 1 and 67108864, not 0"),
    ("maxBodyBytes over 64 MiB", {"maxBodyBytes": 64 * 1024 * 1024 + 1}, "spec.maxBodyBytes must be between 1 and"),
    ("maxBodyBytes a string", {"maxBodyBytes": "1MiB"}, "spec.maxBodyBytes must be a number, not a string"),
    ("leaseSeconds zero", {"leaseSeconds": 0}, "spec.leaseSeconds must be between 1 and 3600, not 0"),
    ("leaseSeconds over an hour", {"leaseSeconds": 3601}, "spec.leaseSeconds must be between 1 and 3600, not 3601"),
]


@pytest.mark.parametrize(("fragment", "message"), [(f, m) for _, f, m in BAD_SPECS], ids=[c for c, _, _ in BAD_SPECS])
def test_bad_spec_names_the_field(fragment: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_provider("acme", spec_with(fragment), SECRETS)
    assert message in str(raised.value)


@pytest.mark.parametrize("name", ["Acme", "acme_pay", "-acme", "acme-", "", "a" * 64, "acme.pay", 7])
def test_bad_name_must_be_a_dns_label(name: Any) -> None:
    with pytest.raises(SpecError, match="must be a DNS label"):
        parse_provider(name, BASE, SECRETS)


@pytest.mark.parametrize("spec", [None, ["signature"], "scheme: github"])
def test_spec_must_be_an_object(spec: Any) -> None:
    with pytest.raises(SpecError, match=r"^spec must be an object$"):
        parse_provider("acme", spec, SECRETS)


def test_signing_scheme_needs_a_secret() -> None:
    with pytest.raises(SpecError, match="at least one secret is required"):
        parse_provider("acme", BASE, [])
    assert parse_provider("acme", spec_with({"signature": {"scheme": "none"}}), []).signature.secrets == ()


def test_the_first_faulty_field_is_reported() -> None:
    # Parts are checked in the resource's order: signature before destination before retry.
    spec = spec_with({"signature": {"toleranceSeconds": 0}, "handler": "bad", "retry": {"maxAttempts": 0}})
    with pytest.raises(SpecError, match="toleranceSeconds"):
        parse_provider("acme", spec, SECRETS)


def test_full_spec_round_trips() -> None:
    spec = {
        "signature": {"scheme": "stripe", "toleranceSeconds": 120},
        "eventId": {"jsonPointer": "/id"},
        "eventType": {"header": "X-Event-Type"},
        "maxBodyBytes": 2048,
        "destination": {"url": "https://payments.internal/webhooks", "timeoutSeconds": 2.5},
        "retry": {"maxAttempts": 5, "initialDelaySeconds": 1, "maxDelaySeconds": 60},
        "leaseSeconds": 30,
        "ordering": {
            "entityKey": {"jsonPointer": "/data/object/id"},
            "maxDeferralSeconds": 600,
            "transitions": [
                {"on": "payment_intent.created", "from": [None], "to": "created"},
                # YAML 1.1 reads a bare `on:` as true; kubectl passes it on as "true".
                {True: "payment_intent.succeeded", "from": ["created"], "to": "succeeded"},
                {"true": "payment_intent.refunded", "from": ["succeeded"], "to": "refunded"},
            ],
        },
        "replayProtection": {"bodyHashWindowSeconds": 900},
        "retention": {"doneHours": 0.5, "deadDays": 30, "dedupDays": 90},
    }
    provider = parse_provider("stripe", spec, ["sk_1", "sk_2"], destination_secret="whsec_dest")
    assert provider == Provider(
        name="stripe",
        signature=provider.signature,
        event_id=FieldRule("json", "/id"),
        event_type=FieldRule("header", "X-Event-Type"),
        max_body_bytes=2048,
        destination=Destination("https://payments.internal/webhooks", 2.5),
        handler=None,
        retry=RetryPolicy(max_attempts=5, initial_delay=1, max_delay=60),
        lease_seconds=30,
        ordering=Ordering(FieldRule("json", "/data/object/id"), 600, (
            Transition("payment_intent.created", (None,), "created"),
            Transition("payment_intent.succeeded", ("created",), "succeeded"),
            Transition("payment_intent.refunded", ("succeeded",), "refunded"),
        )),
        replay_window_seconds=900,
        retention=Retention(done_hours=0.5, dead_days=30, dedup_days=90),
        destination_secret="whsec_dest",
    )
    assert (provider.signature.scheme, provider.signature.secrets, provider.signature.tolerance_seconds) == (
        "stripe", ("sk_1", "sk_2"), 120)
    assert provider.spec is spec


def test_defaults_come_from_the_scheme_and_the_contract() -> None:
    provider = parse_provider("gh", BASE, SECRETS)
    assert (provider.event_id, provider.event_type) == (FieldRule("header", "x-github-delivery"),
                                                        FieldRule("header", "x-github-event"))
    assert (provider.max_body_bytes, provider.lease_seconds, provider.retry) == (DEFAULT_MAX_BODY, 60, RetryPolicy())
    assert (provider.ordering, provider.replay_window_seconds, provider.destination) == (None, None, None)
    assert provider.retention == Retention()  # the install's defaults (chart retention.*)
    assert provider.signature.tolerance_seconds == 300
    transition = parse_provider("gh", spec_with({"ordering": ORDERING}), SECRETS).ordering
    assert transition is not None and transition.transitions == (Transition("created", (None,), "open"),)
    assert transition.max_deferral_seconds == 3600


def test_file_secrets_are_split_off() -> None:
    raw = spec_with({"signature": {"secrets": ["one", "two"]}})
    spec, secrets = split_file_secrets(raw)
    assert secrets == ["one", "two"] and "secrets" not in spec["signature"]
    assert "secrets" in raw["signature"], "the caller's spec is left as it was"
    assert split_file_secrets(BASE) == (BASE, None)


@pytest.mark.parametrize("secrets", ["one", [""], ["one", 2], None])
def test_file_secrets_must_be_non_empty_strings(secrets: Any) -> None:
    with pytest.raises(SpecError, match=r"spec\.signature\.secrets must be a list of non-empty strings"):
        split_file_secrets(spec_with({"signature": {"secrets": secrets}}))


PROVIDERS_FILE = """\
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: stripe}
spec: {signature: {scheme: stripe}, handler: "payments:on_stripe"}
---
metadata: {name: github}
spec: {signature: {scheme: github}, handler: "payments:on_github"}
"""


def test_providers_file_documents_in_order() -> None:
    assert load_documents(PROVIDERS_FILE) == [
        ("stripe", {"signature": {"scheme": "stripe"}, "handler": "payments:on_stripe"}),
        ("github", {"signature": {"scheme": "github"}, "handler": "payments:on_github"}),
    ]
    assert load_documents("---\n---\n") == []


@pytest.mark.parametrize(("text", "message"), [
    ("metadata: {name: [", "not valid YAML"),
    ("- a list", "document 1: expected a WebhookProvider object"),
    ("kind: Secret\nmetadata: {name: x}\nspec: {}", "document 1: kind must be WebhookProvider, not 'Secret'"),
    ("spec: {}", "document 1: metadata.name is required"),
    ("metadata: {name: 5}\nspec: {}", "document 1: metadata.name is required"),
    ("metadata: {name: a}\nspec: {}\n---\nmetadata: {name: b}", "document 2 (b): spec is required"),
])
def test_bad_providers_file(text: str, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        load_documents(text)
    assert message in str(raised.value)


FILE_HEAD = "metadata: {name: pay}\nspec:\n  destination: {url: 'http://d/'}\n"


@pytest.mark.parametrize(("spec", "message"), [
    ("  signature: {scheme: none}\n  retyr: {maxAttempts: 3}\n",
     "spec.retyr is not a field (did you mean spec.retry?)"),
    ("  signature: {scheme: stripe, tolerance: 60, secrets: [whsec_abc]}\n",
     "spec.signature.tolerance is not a field (did you mean spec.signature.toleranceSeconds?)"),
    ("  signature: {scheme: none}\n  workers: {tolerations: [{key: a, efect: NoSchedule}]}\n",
     "spec.workers.tolerations[0].efect is not a field (did you mean spec.workers.tolerations[0].effect?)"),
    ("  signature: {scheme: stripe, secretRef: {name: s, key: k}}\n",
     "spec.signature.secretRef names a Kubernetes Secret, which only the operator reads"),
    ("  signature: {scheme: standard-webhooks, secrets: ['whsec_...']}\n",
     "spec.signature.secrets[0] is a placeholder"),
    ("  signature: {scheme: none}\n  ordering:\n    entityKey: {jsonPointer: /id}\n    transitions:\n"
     "      - {'on': a.paid, from: [created], to: paid}\n",
     "'a.paid' starts from 'created', which no transition leads to"),
])
def test_a_providers_file_that_could_never_work_is_refused(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        load_documents(FILE_HEAD + spec)
    assert message in str(raised.value)
    assert "whsec_abc" not in str(raised.value)


def test_a_providers_file_with_every_field_is_accepted() -> None:
    spec = ("  signature: {scheme: none, toleranceSeconds: 60}\n  retry: {maxAttempts: 3}\n"
            "  workers: {nodeSelector: {any/label: x}, resources: {limits: {cpu: '1'}}}\n"
            "  ordering:\n    entityKey: {jsonPointer: /id}\n    transitions:\n"
            "      - {'on': a.created, from: [null], to: created}\n"
            "      - {'on': a.paid, from: [created], to: paid}\n")
    assert [name for name, _spec in load_documents(FILE_HEAD + spec)] == ["pay"]


def crd_keys(schema: dict[str, Any]) -> Any:
    """The CRD's spec schema in SPEC_KEYS's shape."""
    if schema.get("type") == "array" and "properties" in schema.get("items", {}):
        return [crd_keys(schema["items"])]
    if "properties" in schema:
        return {key: crd_keys(child) for key, child in schema["properties"].items()}
    if schema.get("type") == "object":
        return {}
    return None


def test_the_providers_file_knows_the_fields_the_crd_declares() -> None:
    from hookline.core.provider_spec import SPEC_KEYS

    crd = yaml.safe_load((Path(__file__).parents[1] / "crds" / "webhookproviders.hookline.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert crd_keys(schema) == SPEC_KEYS


def test_public_names_stay_importable_from_providers() -> None:
    from hookline.core import provider_spec, providers

    for name in ("SpecError", "Provider", "FieldRule", "Transition", "Ordering", "Destination", "parse_provider",
                 "split_file_secrets", "load_documents", "NAME_RE", "HANDLER_RE", "DEFAULT_MAX_BODY"):
        assert getattr(providers, name) is getattr(provider_spec, name), name
