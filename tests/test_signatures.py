"""Signature schemes, checked against the senders' own rules.

Incoming requests are signed by an independent reference (the official ``standardwebhooks`` and
``stripe`` libraries, or a direct transcription of the provider's documented algorithm), never by
our own ``sign``; our ``sign`` is then checked the other way round with the official verifiers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import stripe
from multidict import CIMultiDict, CIMultiDictProxy
from standardwebhooks import Webhook

from hookline.core import signatures as sig
from hookline.core.signatures import SignatureConfig, SignatureError

NOW = 1_700_000_000
BODY = b'{"id":"evt_123","object":"event","type":"invoice.paid","event_id":"Ev1","event":{"type":"x"}}'
MSG_ID = "msg_2a8fHq"

WHSEC_A = "whsec_" + base64.b64encode(b"A" * 32).decode()
WHSEC_B = "whsec_" + base64.b64encode(b"B" * 24).decode()
WHSEC_C = "whsec_" + base64.b64encode(b"C" * 32).decode()
RAW_A, RAW_B, RAW_C = "whsec_stripeSecretAaaaaaaaaaaaaaaaaaa", "s3cr3t-b", "s3cr3t-c"

Headers = dict[str, str]


def _mac(secret: str | bytes, data: bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, data, hashlib.sha256).digest()


# --- reference senders (not our code) ---------------------------------------------------------


def ref_standard(secret: str, body: bytes, ts: int) -> Headers:
    signature = Webhook(secret).sign(MSG_ID, datetime.fromtimestamp(ts, tz=UTC), body.decode())
    return {"webhook-id": MSG_ID, "webhook-timestamp": str(ts), "webhook-signature": signature}


def ref_stripe(secret: str, body: bytes, ts: int) -> Headers:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=ts)
    return {"Stripe-Signature": header}


def ref_github(secret: str, body: bytes, ts: int) -> Headers:
    return {"X-Hub-Signature-256": "sha256=" + _mac(secret, body).hex(), "X-GitHub-Delivery": "d-1"}


def ref_shopify(secret: str, body: bytes, ts: int) -> Headers:
    return {"X-Shopify-Hmac-Sha256": base64.b64encode(_mac(secret, body)).decode()}


def ref_slack(secret: str, body: bytes, ts: int) -> Headers:
    digest = _mac(secret, f"v0:{ts}:".encode() + body).hex()
    return {"X-Slack-Signature": "v0=" + digest, "X-Slack-Request-Timestamp": str(ts)}


def ref_generic_hex(secret: str, body: bytes, ts: int) -> Headers:
    return {"X-Signature": _mac(secret, body).hex()}


def ref_generic_b64(secret: str, body: bytes, ts: int) -> Headers:
    return {"X-Acme-Sig": "sha256=" + base64.b64encode(_mac(secret, body)).decode()}


@dataclass(frozen=True)
class Case:
    id: str
    scheme: str
    ref: Callable[[str, bytes, int], Headers]
    secrets: tuple[str, str, str]  # two configured (rotation) + one unknown
    required: tuple[str, ...]  # headers whose absence must be reported by name
    malformed: Mapping[str, tuple[str, ...]]  # header -> bad values
    extra: Mapping[str, str] = field(default_factory=dict)  # header / encoding / prefix

    def config(self, *secrets: str, tolerance: int = 300) -> SignatureConfig:
        secrets = secrets or self.secrets[:2]
        return SignatureConfig(self.scheme, secrets, tolerance_seconds=tolerance, **self.extra)

    @property
    def timestamped(self) -> bool:
        return sig.get_scheme(self.scheme).has_timestamp


HEX64 = "ab" * 32
B64_32 = base64.b64encode(b"x" * 32).decode()
CASES = [
    Case(
        "standard-webhooks",
        "standard-webhooks",
        ref_standard,
        (WHSEC_A, WHSEC_B, WHSEC_C),
        ("webhook-id", "webhook-timestamp", "webhook-signature"),
        {
            "webhook-signature": ("garbage", "v1", f"v2,{B64_32}", "v1,not*base64!", f"v1a,{B64_32}"),
            "webhook-timestamp": ("soon", "1.7e9", "-1700000000", "9" * 40),
        },
    ),
    Case(
        "stripe",
        "stripe",
        ref_stripe,
        (RAW_A, RAW_B, RAW_C),
        ("Stripe-Signature",),
        {
            "Stripe-Signature": (
                "garbage",
                f"v1={HEX64}",
                f"t={NOW}",
                f"t=abc,v1={HEX64}",
                f"t={NOW},v0={HEX64}",
                f"t={NOW},v1=zz",
                f"t={'9' * 40},v1={HEX64}",
            )
        },
    ),
    Case(
        "github",
        "github",
        ref_github,
        (RAW_A, RAW_B, RAW_C),
        ("X-Hub-Signature-256",),
        {"X-Hub-Signature-256": ("garbage", HEX64, f"sha1={HEX64}", "sha256=xyz", f"sha256={HEX64}00")},
    ),
    Case(
        "shopify",
        "shopify",
        ref_shopify,
        (RAW_A, RAW_B, RAW_C),
        ("X-Shopify-Hmac-Sha256",),
        {"X-Shopify-Hmac-Sha256": ("not base64!", "abc*", "a")},
    ),
    Case(
        "slack",
        "slack",
        ref_slack,
        (RAW_A, RAW_B, RAW_C),
        ("X-Slack-Signature", "X-Slack-Request-Timestamp"),
        {
            "X-Slack-Signature": ("garbage", HEX64, f"v1={HEX64}", "v0=nothex"),
            "X-Slack-Request-Timestamp": ("yesterday", "17e8"),
        },
    ),
    Case(
        "hmac-hex",
        "hmac-sha256",
        ref_generic_hex,
        (RAW_A, RAW_B, RAW_C),
        ("X-Signature",),
        {"X-Signature": ("garbage", "sha256=" + HEX64, HEX64[:-2])},
        {"header": "X-Signature"},
    ),
    Case(
        "hmac-b64-prefix",
        "hmac-sha256",
        ref_generic_b64,
        (RAW_A, RAW_B, RAW_C),
        ("X-Acme-Sig",),
        {"X-Acme-Sig": (B64_32, "sha256=not base64!", "SHA256=" + B64_32)},
        {"header": "X-Acme-Sig", "encoding": "base64", "prefix": "sha256="},
    ),
]
TIMESTAMPED = [c for c in CASES if c.timestamped]
MALFORMED = [(c, h, v) for c in CASES for h, values in c.malformed.items() for v in values]


def _fail(case: Case, headers: Mapping[str, str], body: bytes = BODY, now: float = NOW) -> SignatureError:
    with pytest.raises(SignatureError) as info:
        sig.verify(case.config(), headers, body, now)
    _assert_no_secret(case, info.value)
    return info.value


def _assert_no_secret(case: Case, error: SignatureError) -> None:
    """Neither a secret nor any expected signature may leak into what the caller or logs see."""
    texts = (error.message, str(error), repr(error))
    expected = [v for s in case.secrets for v in case.ref(s, BODY, NOW).values() if v not in {MSG_ID, "d-1"}]
    for text in texts:
        for secret in case.secrets:
            assert secret not in text
            assert secret.removeprefix("whsec_") not in text
        for value in expected:
            assert value not in text


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


# --- every scheme -----------------------------------------------------------------------------


def test_accepts_reference_signature(case: Case) -> None:
    sig.verify(case.config(), case.ref(case.secrets[0], BODY, NOW), BODY, NOW)


def test_rejects_wrong_secret(case: Case) -> None:
    error = _fail(case, case.ref(case.secrets[2], BODY, NOW))
    assert error.code == "invalid_signature"
    assert "does not match" in error.message


def test_rejects_one_byte_tampered_body(case: Case) -> None:
    headers = case.ref(case.secrets[0], BODY, NOW)
    for index in (0, len(BODY) // 2, len(BODY) - 1):
        tampered = bytearray(BODY)
        tampered[index] ^= 0x01
        assert _fail(case, headers, bytes(tampered)).code == "invalid_signature"
    assert _fail(case, headers, BODY + b" ").code == "invalid_signature"


def test_missing_header_is_named(case: Case) -> None:
    for name in case.required:
        headers = {k: v for k, v in case.ref(case.secrets[0], BODY, NOW).items() if k.lower() != name.lower()}
        error = _fail(case, headers)
        assert error.code == "invalid_signature"
        assert name in error.message
        error = _fail(case, {**headers, name: "  "})  # empty counts as missing
        assert name in error.message


@pytest.mark.parametrize(
    ("case", "name", "value"), MALFORMED, ids=lambda x: x.id if isinstance(x, Case) else None
)
def test_malformed_header(case: Case, name: str, value: str) -> None:
    headers = case.ref(case.secrets[0], BODY, NOW)
    headers = {k: v for k, v in headers.items() if k.lower() != name.lower()} | {name: value}
    error = _fail(case, headers)
    assert error.code == "invalid_signature"


def test_rotation(case: Case) -> None:
    config = case.config()
    for secret in case.secrets[:2]:
        sig.verify(config, case.ref(secret, BODY, NOW), BODY, NOW)
    assert _fail(case, case.ref(case.secrets[2], BODY, NOW)).code == "invalid_signature"


def test_headers_are_case_insensitive(case: Case) -> None:
    headers = case.ref(case.secrets[1], BODY, NOW)
    config = case.config()
    sig.verify(config, {k.upper(): v for k, v in headers.items()}, BODY, NOW)
    sig.verify(config, {k.lower(): v for k, v in headers.items()}, BODY, NOW)
    sig.verify(
        config, CIMultiDictProxy(CIMultiDict({k.swapcase(): v for k, v in headers.items()})), BODY, NOW
    )


def test_our_sign_round_trips(case: Case) -> None:
    config = case.config()
    headers = sig.get_scheme(case.scheme).sign(config, BODY, msg_id=MSG_ID, timestamp=NOW)
    sig.verify(config, headers, BODY, NOW)
    assert sig.signature_headers_for(config) & {k.lower() for k in headers}


def test_scheme_metadata(case: Case) -> None:
    scheme = sig.get_scheme(case.scheme)
    assert scheme.name == case.scheme
    assert all(h == h.lower() for h in scheme.signature_headers)
    assert scheme.default_event_id[0] in {"header", "json"}
    if scheme.default_event_id[0] == "json":
        assert scheme.default_event_id[1].startswith("/")


def test_raw_bytes_are_hashed_not_decoded(case: Case) -> None:
    if case.scheme in {"standard-webhooks", "stripe"}:  # the reference libraries need text bodies
        body = '{"name":"Zoë 🎉"}'.encode()
    else:
        body = b'\xff\xfe{"not": "utf-8"}\r\n\x00'
    sig.verify(case.config(), case.ref(case.secrets[0], body, NOW), body, NOW)


# --- timestamped schemes ----------------------------------------------------------------------


@pytest.fixture(params=TIMESTAMPED, ids=lambda c: c.id)
def timed(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.mark.parametrize("offset", [-301, 301, -86_400, 86_400])
def test_stale_past_and_future(timed: Case, offset: int) -> None:
    error = _fail(timed, timed.ref(timed.secrets[0], BODY, NOW + offset))
    assert error.code == "stale_timestamp"
    assert ("future" if offset > 0 else "past") in error.message


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_within_tolerance(timed: Case, offset: int) -> None:
    sig.verify(timed.config(), timed.ref(timed.secrets[1], BODY, NOW + offset), BODY, NOW)


def test_tolerance_is_configurable(timed: Case) -> None:
    headers = timed.ref(timed.secrets[0], BODY, NOW - 3_000)
    sig.verify(timed.config(tolerance=3_600), headers, BODY, NOW)
    with pytest.raises(SignatureError, match="stale_timestamp"):
        sig.verify(timed.config(tolerance=60), headers, BODY, NOW)


def test_forged_and_stale_is_invalid_signature(timed: Case) -> None:
    # The signature is checked first: an unauthenticated request never learns about freshness.
    assert _fail(timed, timed.ref(timed.secrets[2], BODY, NOW - 10_000)).code == "invalid_signature"


def test_timestamp_is_part_of_the_signature(timed: Case) -> None:
    headers = timed.ref(timed.secrets[0], BODY, NOW)
    if timed.scheme == "stripe":
        headers = {"Stripe-Signature": headers["Stripe-Signature"].replace(f"t={NOW}", f"t={NOW + 1}")}
    else:
        name = next(k for k in headers if "timestamp" in k.lower())
        headers = {**headers, name: str(NOW + 1)}
    assert _fail(timed, headers).code == "invalid_signature"


@pytest.mark.parametrize(
    "raw_ts", ["1" + "0" * 400, "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660"]
)
def test_correctly_signed_absurd_timestamp_is_malformed(raw_ts: str) -> None:
    # Signed with the right secret, so only the timestamp parsing can reject it: an overflow in
    # the tolerance arithmetic (or int() accepting non-ASCII digits) must not slip through.
    case = next(c for c in CASES if c.scheme == "slack")
    digest = _mac(RAW_A, f"v0:{raw_ts}:".encode() + BODY).hex()
    headers = {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": raw_ts}
    error = _fail(case, headers)
    assert error.code == "invalid_signature" and "X-Slack-Request-Timestamp" in error.message


# --- Standard Webhooks, both directions with the official library -----------------------------


def test_standard_webhooks_our_sign_verified_by_library() -> None:
    now = int(time.time())  # the library checks freshness against the real clock
    headers = sig.sign_standard_webhooks([WHSEC_A, WHSEC_B], MSG_ID, now, BODY)
    assert headers["webhook-id"] == MSG_ID and headers["webhook-timestamp"] == str(now)
    entries = headers["webhook-signature"].split(" ")
    assert len(entries) == 2 and all(e.startswith("v1,") for e in entries)
    for secret in (WHSEC_A, WHSEC_B):
        Webhook(secret).verify(BODY, headers, json_parse=False)
    scheme_headers = sig.get_scheme("standard-webhooks").sign(
        SignatureConfig("standard-webhooks", (WHSEC_A, WHSEC_B)), BODY, msg_id=MSG_ID, timestamp=now
    )
    assert scheme_headers == headers


def test_standard_webhooks_skips_other_versions_and_accepts_any_listed_signature() -> None:
    good = ref_standard(WHSEC_A, BODY, NOW)["webhook-signature"]
    other = ref_standard(WHSEC_C, BODY, NOW)["webhook-signature"]
    base = ref_standard(WHSEC_A, BODY, NOW)
    config = SignatureConfig("standard-webhooks", (WHSEC_A,))
    for value in (f"v1a,{B64_32} {good}", f"{other} {good}", f"junk {good}", f"{good}  v2,xyz"):
        sig.verify(config, {**base, "webhook-signature": value}, BODY, NOW)


def test_standard_webhooks_secret_without_prefix_or_padding() -> None:
    headers = ref_standard(WHSEC_B, BODY, NOW)
    bare = WHSEC_B.removeprefix("whsec_").rstrip("=")
    sig.verify(SignatureConfig("standard-webhooks", (bare,)), headers, BODY, NOW)


def test_standard_webhooks_non_ascii_id_is_hashed_as_received() -> None:
    # aiohttp decodes header bytes with surrogateescape; the HMAC must see the original bytes.
    raw_id = b"msg_\xc3\xa9\xff"
    wire_id = raw_id.decode("utf-8", "surrogateescape")
    content = raw_id + f".{NOW}.".encode() + BODY
    signature = base64.b64encode(_mac(base64.b64decode(WHSEC_A[6:]), content)).decode()
    headers = {"webhook-id": wire_id, "webhook-timestamp": str(NOW), "webhook-signature": f"v1,{signature}"}
    sig.verify(SignatureConfig("standard-webhooks", (WHSEC_A,)), headers, BODY, NOW)


# --- Stripe, both directions with the official library ----------------------------------------


def test_stripe_our_sign_verified_by_library() -> None:
    now = int(time.time())
    config = SignatureConfig("stripe", (RAW_A, RAW_B))
    headers = sig.get_scheme("stripe").sign(config, BODY, msg_id="ignored", timestamp=now)
    assert re.fullmatch(rf"t={now},v1=[0-9a-f]{{64}},v1=[0-9a-f]{{64}}", headers["Stripe-Signature"])
    for secret in (RAW_A, RAW_B):
        event = stripe.Webhook.construct_event(BODY, headers["Stripe-Signature"], secret)
        assert event.id == "evt_123"
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(BODY, headers["Stripe-Signature"], RAW_C)


def test_stripe_multiple_v1_and_v0_entries() -> None:
    real = ref_stripe(RAW_A, BODY, NOW)["Stripe-Signature"]
    v1 = real.split("v1=")[1]
    other = stripe.WebhookSignature._compute_signature(f"{NOW}.{BODY.decode()}", RAW_C)
    config = SignatureConfig("stripe", (RAW_A,))
    for value in (
        f"t={NOW},v1={other},v1={v1}",
        f"t={NOW}, v0={HEX64}, v1={v1}",
        f"v1={v1},t={NOW},x=y",
        f"t={NOW},v1={v1},t={NOW + 1}",  # like stripe-python, the first t= is the signed one
    ):
        sig.verify(config, {"Stripe-Signature": value}, BODY, NOW)


def test_stripe_secret_is_used_raw_not_base64_decoded() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()  # decodable, but Stripe doesn't decode it
    headers = ref_stripe(secret, BODY, NOW)
    sig.verify(SignatureConfig("stripe", (secret,)), headers, BODY, NOW)
    with pytest.raises(SignatureError):
        sig.verify(SignatureConfig("standard-webhooks", (secret,)), {
            "webhook-id": MSG_ID, "webhook-timestamp": str(NOW),
            "webhook-signature": "v1," + base64.b64encode(bytes.fromhex(
                headers["Stripe-Signature"].split("v1=")[1])).decode(),
        }, BODY, NOW)  # fmt: skip


# --- the rest of the public API ---------------------------------------------------------------


def test_sign_headers_per_scheme() -> None:
    def sign(scheme: str, **extra: str) -> dict[str, str]:
        config = SignatureConfig(scheme, (RAW_A, RAW_B), **extra)  # type: ignore[arg-type]
        return sig.get_scheme(scheme).sign(config, BODY, msg_id=MSG_ID, timestamp=NOW)

    assert sign("github") == {**ref_github(RAW_A, BODY, NOW), "X-GitHub-Delivery": MSG_ID}
    assert sign("shopify") == {**ref_shopify(RAW_A, BODY, NOW), "X-Shopify-Webhook-Id": MSG_ID}
    assert sign("slack") == ref_slack(RAW_A, BODY, NOW)
    assert sign("hmac-sha256", header="X-Signature") == ref_generic_hex(RAW_A, BODY, NOW)
    assert sign("hmac-sha256", header="X-Acme-Sig", encoding="base64", prefix="sha256=") == ref_generic_b64(
        RAW_A, BODY, NOW
    )
    assert sign("none") == {}
    with pytest.raises(ValueError, match="at least one secret"):
        sig.sign_standard_webhooks([], MSG_ID, NOW, BODY)
    with pytest.raises(ValueError, match="at least one secret"):
        sig.get_scheme("github").sign(SignatureConfig("github", ()), BODY, msg_id=MSG_ID, timestamp=NOW)


def test_none_scheme_accepts_anything() -> None:
    sig.verify(SignatureConfig("none", ()), {}, b"\x00anything", NOW)
    assert not sig.get_scheme("none").has_timestamp


def test_defaults() -> None:
    expected = {
        "standard-webhooks": (("header", "webhook-id"), ("json", "/type"), True),
        "stripe": (("json", "/id"), ("json", "/type"), True),
        "github": (("header", "x-github-delivery"), ("header", "x-github-event"), False),
        "shopify": (("header", "x-shopify-webhook-id"), ("header", "x-shopify-topic"), False),
        "slack": (("json", "/event_id"), ("json", "/event/type"), True),
        "hmac-sha256": (("json", "/id"), ("json", "/type"), False),
        "none": (("json", "/id"), ("json", "/type"), False),
    }
    actual = {n: (s.default_event_id, s.default_event_type, s.has_timestamp) for n, s in sig.SCHEMES.items()}
    assert actual == expected
    assert "webhook-signature" in sig.SCHEMES["standard-webhooks"].signature_headers
    assert "x-hub-signature" in sig.SCHEMES["github"].signature_headers
    generic = SignatureConfig("hmac-sha256", (RAW_A,), header="X-Acme-Sig")
    assert sig.signature_headers_for(generic) == {"x-acme-sig"}


def test_get_scheme_unknown_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown signature scheme 'svix'") as info:
        sig.get_scheme("svix")
    for name in sig.SCHEMES:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="unknown"):
        sig.verify(SignatureConfig("svix", (RAW_A,)), {}, BODY, NOW)


def test_generate_secret() -> None:
    standard = sig.get_scheme("standard-webhooks").generate_secret()
    assert standard.startswith("whsec_") and len(base64.b64decode(standard[6:], validate=True)) == 32
    Webhook(standard)  # the official library accepts it
    stripe_secret = sig.get_scheme("stripe").generate_secret()
    assert re.fullmatch(r"whsec_[A-Za-z0-9]{32}", stripe_secret)
    for name in ("github", "shopify", "slack", "hmac-sha256"):
        assert re.fullmatch(r"[0-9a-f]{64}", sig.get_scheme(name).generate_secret())
    assert len({sig.get_scheme(n).generate_secret() for n in sig.SCHEMES for _ in range(5)}) == 35
    for name, scheme in sig.SCHEMES.items():
        config = SignatureConfig(name, (scheme.generate_secret(),), header="X-Sig")
        sig.validate_config(config)
        sig.verify(config, scheme.sign(config, BODY, msg_id=MSG_ID, timestamp=NOW), BODY, NOW)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SignatureConfig("svix", (RAW_A,)), "unknown signature scheme"),
        (SignatureConfig("stripe", ()), "at least one secret"),
        (SignatureConfig("github", ("",)), "non-empty"),
        (SignatureConfig("hmac-sha256", (RAW_A,)), "needs 'header'"),
        (SignatureConfig("hmac-sha256", (RAW_A,), header="X-Sig", encoding="base32"), "encoding"),
        (SignatureConfig("standard-webhooks", ("whsec_not*base64!",)), "not valid base64"),
        (SignatureConfig("standard-webhooks", (WHSEC_A, "whsec_")), "secret #2"),
        (SignatureConfig("slack", (RAW_A,), tolerance_seconds=0), "positive"),
    ],
)
def test_validate_config_rejects(config: SignatureConfig, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        sig.validate_config(config)
    for secret in config.secrets:
        if secret not in {"", "whsec_"}:
            assert secret not in str(info.value)


def test_validate_config_accepts() -> None:
    for config in (
        SignatureConfig("none", ()),
        SignatureConfig("standard-webhooks", (WHSEC_A, WHSEC_B)),
        SignatureConfig("stripe", (RAW_A,)),
        SignatureConfig("hmac-sha256", (RAW_A,), header="X-Sig", encoding="base64", prefix="sha256="),
    ):
        sig.validate_config(config)


def test_config_hides_secrets_and_normalises_them() -> None:
    config = SignatureConfig("stripe", [RAW_A, RAW_B])  # type: ignore[arg-type]
    assert config.secrets == (RAW_A, RAW_B)
    assert RAW_A not in repr(config) and RAW_B not in repr(config)
    with pytest.raises(TypeError, match="not a string"):
        SignatureConfig("stripe", RAW_A)  # type: ignore[arg-type]


def test_signature_error_shape() -> None:
    error = SignatureError("stale_timestamp", "too old")
    assert (error.code, error.message) == ("stale_timestamp", "too old")
    assert isinstance(error, Exception)
