"""The WebhookProvider CRD (crds/webhookproviders.hookline.io.yaml) on a real kube-apiserver:
schema defaults, CEL rules and their messages, explain output, printer columns and RBAC."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
from apiserver import ApiServer

from support.waiting import eventually_sync

Spec = dict[str, Any]

MINIMAL_SPEC: Spec = {
    "signature": {"scheme": "stripe", "secretRef": {"name": "stripe-webhook"}},
    "destination": {"url": "http://payments.default.svc/webhooks/stripe"},
}

# The example from CONTRACT.md, everything spelled out.
CONTRACT_SPEC: Spec = {
    "signature": {
        "scheme": "stripe",
        "secretRef": {"name": "stripe-webhook", "key": "secret"},
        "toleranceSeconds": 300,
    },
    "eventId": {"jsonPointer": "/id"},
    "eventType": {"jsonPointer": "/type"},
    "maxBodyBytes": 1048576,
    "destination": {"url": "http://payments.default.svc/webhooks/stripe", "timeoutSeconds": 10},
    "retry": {"maxAttempts": 12, "initialDelaySeconds": 5, "maxDelaySeconds": 3600},
    "leaseSeconds": 60,
    "ordering": {
        "entityKey": {"jsonPointer": "/data/object/id"},
        "maxDeferralSeconds": 3600,
        "transitions": [
            {"on": "payment_intent.created", "from": [None], "to": "created"},
            {"on": "payment_intent.succeeded", "from": ["created"], "to": "succeeded"},
        ],
    },
    "workers": {
        "minReplicas": 0,
        "maxReplicas": 10,
        "targetBacklogPerReplica": 100,
        "scaleDownStabilizationSeconds": 300,
    },
}


def manifest(name: str, spec: Spec) -> str:
    # JSON rather than YAML: no YAML 1.1 surprises (an unquoted `on:` key is the boolean true).
    return json.dumps(
        {"apiVersion": "hookline.io/v1alpha1", "kind": "WebhookProvider", "metadata": {"name": name}, "spec": spec}
    )


def create(api: ApiServer, namespace: str, name: str, spec: Spec, *flags: str) -> subprocess.CompletedProcess[str]:
    return api.kubectl("create", "-n", namespace, *flags, "-f", "-", input=manifest(name, spec), check=False)


def patch_status(api: ApiServer, namespace: str, name: str, status: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    patch = json.dumps({"status": status})
    args = ("patch", "whp", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)
    return api.kubectl(*args, check=False)


def get(api: ApiServer, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(api.kubectl("get", "whp", name, "-n", namespace, "-o", "json").stdout)
    return obj


def test_valid_provider_is_accepted_and_defaulted(apiserver: ApiServer, namespace: str) -> None:
    created = create(apiserver, namespace, "stripe", MINIMAL_SPEC)
    assert created.returncode == 0, created.stderr

    spec = get(apiserver, namespace, "stripe")["spec"]
    assert spec["signature"] == {
        "scheme": "stripe",
        "secretRef": {"name": "stripe-webhook", "key": "secret"},
        "toleranceSeconds": 300,
        "rotationOverlapSeconds": 86400,
    }
    assert spec["destination"]["timeoutSeconds"] == 10
    assert spec["maxBodyBytes"] == 1048576
    assert spec["leaseSeconds"] == 60
    # retry and workers default to {} so their own defaults always land in the stored object.
    assert spec["retry"] == {"maxAttempts": 12, "initialDelaySeconds": 5, "maxDelaySeconds": 3600}
    assert spec["workers"] == {
        "minReplicas": 0,
        "maxReplicas": 10,
        "targetBacklogPerReplica": 100,
        "scaleDownStabilizationSeconds": 300,
    }


def test_contract_example_round_trips(apiserver: ApiServer, namespace: str) -> None:
    created = create(apiserver, namespace, "stripe", CONTRACT_SPEC, "--validate=strict")
    assert created.returncode == 0, created.stderr
    spec = get(apiserver, namespace, "stripe")["spec"]
    expected = copy.deepcopy(CONTRACT_SPEC)
    expected["signature"]["rotationOverlapSeconds"] = 86400
    assert spec == expected  # nothing pruned; `from: [null]` keeps its null


ORDERED_YAML = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: ordered}
spec:
  signature: {scheme: stripe}
  handler: "mypackage.handlers:on_stripe"
  ordering:
    entityKey: {jsonPointer: /data/object/id}
    transitions:
      - {"on": payment_intent.created,   from: [null],    to: created}
      - {"on": payment_intent.succeeded, from: [created], to: succeeded}
"""


def test_yaml_transitions_need_a_quoted_on_key(apiserver: ApiServer, namespace: str) -> None:
    ok = apiserver.kubectl("create", "-n", namespace, "-f", "-", input=ORDERED_YAML, check=False)
    assert ok.returncode == 0, ok.stderr
    assert get(apiserver, namespace, "ordered")["spec"]["ordering"]["transitions"][0]["from"] == [None]
    # YAML 1.1 (kubectl, PyYAML) reads a bare `on` key as the boolean true: the CRD cannot help
    # here, the manifest must quote it. This pins down the error users then get.
    bare = ORDERED_YAML.replace('"on"', "on").replace("name: ordered", "name: bare")
    rejected = apiserver.kubectl("create", "-n", namespace, "-f", "-", input=bare, check=False)
    assert rejected.returncode != 0
    assert 'unknown field "spec.ordering.transitions[0].true"' in rejected.stderr


def test_handler_instead_of_destination_is_accepted(apiserver: ApiServer, namespace: str) -> None:
    spec: Spec = {"signature": {"scheme": "github"}, "handler": "mypackage.handlers:on_github"}
    created = create(apiserver, namespace, "github", spec)
    assert created.returncode == 0, created.stderr


DELETE = object()


def changed(spec: Spec, changes: dict[str, Any]) -> Spec:
    """A copy of spec with each dotted path set to its value (DELETE removes the key)."""
    spec = copy.deepcopy(spec)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return spec


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "min-replicas-above-max": (
        {"workers": {"minReplicas": 5, "maxReplicas": 2}},
        "workers.minReplicas must not exceed workers.maxReplicas",
    ),
    "destination-and-handler": (
        {"handler": "mypackage.handlers:on_stripe"},
        "destination and handler are mutually exclusive",
    ),
    "neither-destination-nor-handler": (
        {"destination": DELETE},
        "one of destination (forward over HTTP) or handler (Python callable) is required",
    ),
    "unknown-scheme": ({"signature.scheme": "md5"}, 'spec.signature.scheme: Unsupported value: "md5"'),
    "hmac-sha256-without-header": (
        {"signature.scheme": "hmac-sha256"},
        "signature.header is required when signature.scheme is hmac-sha256",
    ),
    "negative-lease": ({"leaseSeconds": -1}, "spec.leaseSeconds in body should be greater than or equal to 5"),
    "initial-delay-above-max": (
        {"retry": {"initialDelaySeconds": 7200}},
        "retry.initialDelaySeconds must not exceed retry.maxDelaySeconds",
    ),
    "event-id-two-sources": (
        {"eventId": {"jsonPointer": "/id", "header": "X-Event-Id"}},
        "eventId: set exactly one of jsonPointer or header",
    ),
    "event-id-no-source": ({"eventId": {}}, "eventId: set exactly one of jsonPointer or header"),
    "destination-not-http": (
        {"destination.url": "ftp://example.com/hook"},
        "destination.url must be an absolute http:// or https:// URL",
    ),
    "handler-not-module-function": (
        {"destination": DELETE, "handler": "not a callable"},
        "spec.handler in body should match",
    ),
    "body-limit-too-big": (
        {"maxBodyBytes": 67108865},
        "spec.maxBodyBytes in body should be less than or equal to 67108864",
    ),
    "ordering-without-transitions": (
        {"ordering": {"entityKey": {"jsonPointer": "/id"}}},
        "spec.ordering.transitions: Required value",
    ),
}


@pytest.mark.parametrize(("changes", "message"), INVALID.values(), ids=INVALID.keys())
def test_invalid_provider_is_rejected(
    apiserver: ApiServer, namespace: str, changes: dict[str, Any], message: str
) -> None:
    spec = changed(MINIMAL_SPEC, changes)
    result = create(apiserver, namespace, "bad", spec)
    assert result.returncode != 0, f"accepted: {spec}"
    assert "is invalid" in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("validate", ["strict", "false"])
def test_inline_secrets_are_refused(apiserver: ApiServer, namespace: str, validate: str) -> None:
    # Even with client/server field validation off the CEL rule refuses it, so a providers file
    # pasted into kubectl never leaks secret values into etcd nor silently loses them.
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec["signature"]["secrets"] = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
    result = create(apiserver, namespace, "inline", spec, f"--validate={validate}")
    assert result.returncode != 0
    assert "signature.secrets (inline secret values) is only for the providers file" in result.stderr
    assert apiserver.kubectl("get", "whp", "-n", namespace, "-o", "name").stdout == ""


def test_unknown_fields_are_rejected_under_strict_validation(apiserver: ApiServer, namespace: str) -> None:
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec["signature"]["secret"] = "typo for secretRef"
    result = create(apiserver, namespace, "typo", spec, "--validate=strict")
    assert result.returncode != 0
    assert 'unknown field "spec.signature.secret"' in result.stderr


def test_explain_shows_field_descriptions(apiserver: ApiServer) -> None:
    out = apiserver.kubectl("explain", "whp.spec.signature").stdout
    assert "How the receiver verifies that a request really comes from the sender" in out
    for field in ("scheme", "secretRef", "toleranceSeconds", "rotationOverlapSeconds", "standard-webhooks"):
        assert field in out
    assert "Python callable" in apiserver.kubectl("explain", "webhookproviders.spec.handler").stdout


def test_get_prints_columns_from_status(apiserver: ApiServer, namespace: str) -> None:
    assert create(apiserver, namespace, "stripe", MINIMAL_SPEC).returncode == 0
    status = {
        "observedGeneration": 1,
        "backlog": 42,
        "oldestPendingSeconds": 7,
        "deadLetters": 3,
        "replicas": 2,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Reconciled",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    patched = patch_status(apiserver, namespace, "stripe", status)
    assert patched.returncode == 0, patched.stderr
    header, row = apiserver.kubectl("get", "whp", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "SCHEME", "READY", "BACKLOG", "DEAD", "REPLICAS", "AGE"]
    assert row.split()[:6] == ["stripe", "stripe", "True", "42", "3", "2"]
    # The category lists it next to anything else Hookline defines.
    listed = apiserver.kubectl("get", "hookline", "-n", namespace, "-o", "name").stdout
    assert listed.split() == ["webhookprovider.hookline.io/stripe"]


def test_status_conditions_must_be_well_formed(apiserver: ApiServer, namespace: str) -> None:
    assert create(apiserver, namespace, "stripe", MINIMAL_SPEC).returncode == 0
    result = patch_status(apiserver, namespace, "stripe", {"conditions": [{"type": "Ready", "status": "Yes"}]})
    assert result.returncode != 0
    assert 'Unsupported value: "Yes"' in result.stderr
    assert "lastTransitionTime: Required value" in result.stderr


def test_rbac_applies_to_service_account_tokens(apiserver: ApiServer, namespace: str) -> None:
    apiserver.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = apiserver.kubectl("create", "token", "reader", "-n", namespace).stdout.strip()

    denied = apiserver.kubectl("get", "whp", "-n", namespace, token=token, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr

    ns = ("-n", namespace)
    apiserver.kubectl("create", "role", "whp-reader", *ns, "--verb=get,list", "--resource=webhookproviders.hookline.io")
    apiserver.kubectl(
        "create", "rolebinding", "whp-reader", *ns, "--role=whp-reader", f"--serviceaccount={namespace}:reader"
    )
    # The RBAC authorizer learns about new bindings through a watch: allow it a moment.
    def read_as_the_reader() -> bool:
        allowed = apiserver.kubectl("get", "whp", "-n", namespace, token=token, check=False)
        assert allowed.returncode == 0, allowed.stderr
        return True

    eventually_sync(read_as_the_reader, timeout=10, interval=0.2, what="the reader's new binding in effect")
    # The static admin token works too (for clients that cannot present a client certificate).
    whoami = apiserver.kubectl(
        "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", token=apiserver.admin_token
    )
    assert whoami.stdout == "hookline-admin"
