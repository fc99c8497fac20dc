"""docs/provider-spec.md is what the CRD and the signature schemes say (tests/support/specdoc.py)."""

from __future__ import annotations

from hookline.core.provider_spec import parse_provider
from hookline.core.signatures import SCHEMES
from support import specdoc


def test_the_provider_spec_reference_is_up_to_date() -> None:
    assert specdoc.SPEC_DOC.read_text() == specdoc.render(), (
        "docs/provider-spec.md and its sources (crds/, core/signatures.py) disagree: run `make docs`")


def test_the_endpoint_spec_reference_is_up_to_date() -> None:
    assert specdoc.ENDPOINT_DOC.read_text() == specdoc.render_endpoint(), (
        "docs/endpoint-spec.md and crds/webhookendpoints.hookline.io.yaml disagree: run `make docs`")
    for path in ("url", "rateLimit.perSecond", "retry.maxAttempts", "secretRef.key"):
        assert f"| `{path}` |" in specdoc.render_endpoint()


def test_every_field_of_the_crd_and_every_scheme_is_in_the_reference() -> None:
    text = specdoc.render()
    for path in ("signature.scheme", "signature.encoding", "ordering.transitions[].on", "workers.tolerations"):
        assert f"| `{path}` |" in text
    for scheme in SCHEMES:
        assert f"| `{scheme}` |" in text


def test_the_reference_example_is_a_valid_provider() -> None:
    parse_provider("example", {"signature": {"scheme": "hmac-sha256", "header": "X-Signature", "encoding": "hex",
                                             "prefix": "sha256="}, "handler": "myhooks:on_event"}, ["s3cret"])
