"""The WebhookProvider spec: its typed form and the parser that validates it.

One parser for every source of a spec (a providers file, the operator's resource, a stored
row), so each error message reads the same everywhere: it names the field by its path in
the resource (``spec.retry.maxAttempts``) and says what a valid value looks like.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hookline.core.queue import RetryPolicy
from hookline.core.signatures import Scheme, SignatureConfig, get_scheme, validate_config

# A DNS label. Never allow "@": NAME@OWNER_UID is where a previous owner's events are
# archived when the name changes hands (migration 0015); no provider may be called that.
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DEFAULT_MAX_BODY = 1024 * 1024


class SpecError(ValueError):
    """A provider spec that cannot be used; the message names the field."""


@dataclass(frozen=True)
class FieldRule:
    """Where a value comes from: a JSON pointer into the body, or a header."""

    source: str  # "json" | "header"
    path: str

    def describe(self) -> str:
        return f"JSON pointer {self.path}" if self.source == "json" else f"header {self.path}"


@dataclass(frozen=True)
class Transition:
    on: str
    from_states: tuple[str | None, ...]
    to: str


@dataclass(frozen=True)
class Ordering:
    entity_key: FieldRule
    max_deferral_seconds: float
    transitions: tuple[Transition, ...]


@dataclass(frozen=True)
class Destination:
    url: str
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class Retention:
    """spec.retention: how long this provider's events are kept; None = the install's default
    (chart retention.*). Applied by the partition manager (core/partitions.py), which reads
    them from the stored spec."""

    done_hours: float | None = None
    dead_days: float | None = None
    dedup_days: float | None = None


# Upper limits of spec.retention: ten years (the lower limit of each is 0.001, as in the CRD).
_RETENTION_LIMITS = {"doneHours": 87600.0, "deadDays": 3650.0, "dedupDays": 3650.0}


@dataclass(frozen=True)
class Provider:
    name: str
    signature: SignatureConfig
    event_id: FieldRule
    event_type: FieldRule | None
    max_body_bytes: int = DEFAULT_MAX_BODY
    destination: Destination | None = None
    handler: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_seconds: int = 60
    ordering: Ordering | None = None
    # spec.replayProtection.bodyHashWindowSeconds: a body seen again within this many seconds is
    # a duplicate whatever its event id (for schemes that sign neither the id nor a timestamp).
    replay_window_seconds: float | None = None
    retention: Retention = field(default_factory=Retention)
    # Signs the worker's calls to `destination` (Standard Webhooks), so the internal
    # service can tell them from anyone else's.
    destination_secret: str | None = field(default=None, repr=False)
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def parse_provider(name: str, spec: Mapping[str, Any], secrets: Iterable[str] | None = (),
                   destination_secret: str | None = None) -> Provider:
    """Validate a WebhookProvider ``spec`` and return the typed provider.

    ``secrets`` are the currently valid signing secrets; the spec itself never holds them
    (a providers file's ``signature.secrets`` is split off by ``split_file_secrets``). None:
    not loaded, by a process that never verifies signatures (a worker).
    The parts are checked in the order of the resource's fields, so the first error reported
    is the first faulty field.
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(f"provider name {name!r} must be a DNS label: lower-case letters, digits and '-'")
    if not isinstance(spec, Mapping):
        raise SpecError("spec must be an object")
    signature, scheme = _signature(spec, secrets)
    event_id, event_type = _event_rules(spec, scheme)
    destination, handler = _destination_or_handler(spec)
    retry = _retry(spec)
    ordering = _ordering(spec)
    replay_window = _replay_window(spec)
    retention = _retention(spec)
    return Provider(
        name=name,
        signature=signature,
        event_id=event_id,
        event_type=event_type,
        max_body_bytes=int(_number(spec, "maxBodyBytes", "spec", DEFAULT_MAX_BODY, 1, 64 * 1024 * 1024)),
        destination=destination,
        handler=handler,
        retry=retry,
        lease_seconds=int(_number(spec, "leaseSeconds", "spec", 60, 1, 3600)),
        ordering=ordering,
        replay_window_seconds=replay_window,
        retention=retention,
        destination_secret=destination_secret,
        spec=spec,
    )


# --- the parts of a spec, in the resource's order -----------------------------------------------


def _signature(spec: Mapping[str, Any], secrets: Iterable[str] | None) -> tuple[SignatureConfig, Scheme]:
    sig = spec.get("signature")
    if not isinstance(sig, Mapping):
        raise SpecError("spec.signature is required (at least {scheme: ...})")
    scheme_name = _get(sig, "scheme", str, "spec.signature")
    if scheme_name is None:
        raise SpecError("spec.signature.scheme is required")
    try:
        scheme = get_scheme(scheme_name)
    except ValueError as exc:
        raise SpecError(f"spec.signature.scheme: {exc}") from None
    signature = SignatureConfig(
        scheme=scheme_name,
        secrets=tuple(secrets or ()),
        tolerance_seconds=int(_number(sig, "toleranceSeconds", "spec.signature", 300, 1, 86400)),
        header=_get(sig, "header", str, "spec.signature"),
        encoding=_get(sig, "encoding", str, "spec.signature", "hex"),
        prefix=_get(sig, "prefix", str, "spec.signature", ""),
    )
    try:
        validate_config(signature, secrets_loaded=secrets is not None)
    except ValueError as exc:
        raise SpecError(f"spec.signature: {exc}") from None
    return signature, scheme


def _event_rules(spec: Mapping[str, Any], scheme: Scheme) -> tuple[FieldRule, FieldRule | None]:
    """Where the event id and type come from: the spec's rules, else the scheme's defaults."""
    event_id = _rule(spec["eventId"], "spec.eventId") if spec.get("eventId") else FieldRule(*scheme.default_event_id)
    if spec.get("eventType"):
        return event_id, _rule(spec["eventType"], "spec.eventType")
    return event_id, FieldRule(*scheme.default_event_type) if scheme.default_event_type else None


def _destination_or_handler(spec: Mapping[str, Any]) -> tuple[Destination | None, str | None]:
    """Where events go: exactly one of an internal URL or a Python handler."""
    destination = None
    if (dest := spec.get("destination")) is not None:
        if not isinstance(dest, Mapping) or not isinstance(dest.get("url"), str):
            raise SpecError("spec.destination needs a url")
        if not dest["url"].startswith(("http://", "https://")):
            raise SpecError(f"spec.destination.url must be an http(s) URL, not {dest['url']!r}")
        destination = Destination(dest["url"], _number(dest, "timeoutSeconds", "spec.destination", 10, 0.1, 300))
    handler = _get(spec, "handler", str, "spec")
    if handler is not None and not HANDLER_RE.match(handler):
        raise SpecError(f"spec.handler must look like 'package.module:function', not {handler!r}")
    if destination and handler:
        raise SpecError("spec.destination and spec.handler are mutually exclusive: choose one")
    if not destination and not handler:
        raise SpecError("spec needs a destination (an internal URL to POST events to) or a handler "
                        "('package.module:function')")
    return destination, handler


def _retry(spec: Mapping[str, Any]) -> RetryPolicy:
    retry_spec = _get(spec, "retry", Mapping, "spec", {})
    retry = RetryPolicy(
        max_attempts=int(_number(retry_spec, "maxAttempts", "spec.retry", 12, 1, 1000)),
        initial_delay=_number(retry_spec, "initialDelaySeconds", "spec.retry", 5, 0, 86400),
        max_delay=_number(retry_spec, "maxDelaySeconds", "spec.retry", 3600, 0, 7 * 86400),
    )
    if retry.initial_delay > retry.max_delay:
        raise SpecError("spec.retry.initialDelaySeconds must not exceed maxDelaySeconds")
    return retry


def _ordering(spec: Mapping[str, Any]) -> Ordering | None:
    if (ord_spec := spec.get("ordering")) is None:
        return None
    if not isinstance(ord_spec, Mapping):
        raise SpecError("spec.ordering must be an object")
    if "entityKey" not in ord_spec:
        raise SpecError("spec.ordering.entityKey is required")
    raw_transitions = ord_spec.get("transitions")
    if not isinstance(raw_transitions, list) or not raw_transitions:
        raise SpecError("spec.ordering.transitions must be a non-empty list")
    transitions = tuple(_transition(t, f"spec.ordering.transitions[{i}]") for i, t in enumerate(raw_transitions))
    return Ordering(
        entity_key=_rule(ord_spec["entityKey"], "spec.ordering.entityKey"),
        max_deferral_seconds=_number(ord_spec, "maxDeferralSeconds", "spec.ordering", 3600, 0, 30 * 86400),
        transitions=transitions,
    )


def _transition(raw: Any, where: str) -> Transition:
    if isinstance(raw, Mapping):
        # YAML 1.1 reads an unquoted `on:` key as the boolean true (kubectl's parser
        # turns it into "true"); accept both so the contract's examples work as written.
        raw = {("on" if k in (True, "true") else k): v for k, v in raw.items()}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("on"), str) or not isinstance(raw.get("to"), str):
        raise SpecError(f"{where} needs 'on' (an event type) and 'to' (a state)")
    from_states = raw.get("from", [None])
    if not isinstance(from_states, list) or not all(s is None or isinstance(s, str) for s in from_states):
        raise SpecError(f"{where}.from must be a list of states (null for 'no state yet')")
    return Transition(raw["on"], tuple(from_states), raw["to"])


def _replay_window(spec: Mapping[str, Any]) -> float | None:
    if (replay_spec := _get(spec, "replayProtection", Mapping, "spec")) is None:
        return None
    return _number(replay_spec, "bodyHashWindowSeconds", "spec.replayProtection", 0, 1, 30 * 86400)


def _retention(spec: Mapping[str, Any]) -> Retention:
    if (retention_spec := _get(spec, "retention", Mapping, "spec")) is None:
        return Retention()
    unknown = sorted(set(retention_spec) - set(_RETENTION_LIMITS))
    if unknown:
        raise SpecError(f"spec.retention.{unknown[0]} is not a retention setting "
                        f"(doneHours, deadDays, dedupDays)")
    values = {key: _optional_number(retention_spec, key, "spec.retention", 0.001, hi)
              for key, hi in _RETENTION_LIMITS.items()}
    return Retention(values["doneHours"], values["deadDays"], values["dedupDays"])


# --- field readers -------------------------------------------------------------------------------


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"{where}.{key} must be a number, not {value!r}")
    if not isinstance(value, kind):
        raise SpecError(f"{where}.{key} must be {_KIND_NAMES.get(kind, kind)}, not {_kind_of(value)}")
    return value


# What a spec's author wrote, in YAML's words rather than Python's.
_KIND_NAMES: dict[type | tuple[type, ...], str] = {
    str: "a string", Mapping: "an object", (int, float): "a number", list: "a list",
}


def _kind_of(value: Any) -> str:
    for kind, name in _KIND_NAMES.items():
        if isinstance(value, kind) and not isinstance(value, bool):
            return name
    return "a boolean" if isinstance(value, bool) else "null" if value is None else type(value).__name__


def _number(obj: Mapping[str, Any], key: str, where: str, default: float, lo: float, hi: float) -> float:
    value = float(_get(obj, key, (int, float), where, default))
    if not lo <= value <= hi:
        raise SpecError(f"{where}.{key} must be between {_plain(lo)} and {_plain(hi)}, not {_plain(value)}")
    return value


def _optional_number(obj: Mapping[str, Any], key: str, where: str, lo: float, hi: float) -> float | None:
    """An optional number between ``lo`` and ``hi`` (fractions allowed: 0.5 hours)."""
    if _get(obj, key, (int, float), where) is None:
        return None
    return _number(obj, key, where, 0, lo, hi)


def _plain(number: float) -> str:
    """2592001, not 2.592e+06 (which reads like the limit itself); 0.05 stays 0.05."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _rule(obj: Any, where: str) -> FieldRule:
    if not isinstance(obj, Mapping):
        raise SpecError(f"{where} must be an object with jsonPointer or header")
    pointer, header = obj.get("jsonPointer"), obj.get("header")
    if (pointer is None) == (header is None):
        raise SpecError(f"{where} needs exactly one of jsonPointer or header")
    if pointer is not None:
        if not isinstance(pointer, str) or not (pointer == "" or pointer.startswith("/")):
            raise SpecError(f"{where}.jsonPointer must be a JSON pointer like /id, not {pointer!r}")
        return FieldRule("json", pointer)
    if not isinstance(header, str) or not header:
        raise SpecError(f"{where}.header must be a header name")
    return FieldRule("header", header)


# --- providers files -----------------------------------------------------------------------------


def split_file_secrets(spec: Mapping[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """Split a providers-file spec into (spec without secrets, secrets or None when absent)."""
    copy: dict[str, Any] = json.loads(json.dumps(spec))  # deep copy, and proves it is plain JSON
    sig = copy.get("signature")
    if not isinstance(sig, dict) or "secrets" not in sig:
        return copy, None
    secrets = sig.pop("secrets")
    if not isinstance(secrets, list) or not all(isinstance(s, str) and s for s in secrets):
        raise SpecError("spec.signature.secrets must be a list of non-empty strings")
    return copy, secrets


def load_documents(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) of every WebhookProvider document in a YAML providers file."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}") from None
    out = []
    for i, doc in enumerate(docs):
        where = f"document {i + 1}"
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: expected a WebhookProvider object")
        if doc.get("kind", "WebhookProvider") != "WebhookProvider":
            raise SpecError(f"{where}: kind must be WebhookProvider, not {doc.get('kind')!r}")
        name = (doc.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise SpecError(f"{where}: metadata.name is required")
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            raise SpecError(f"{where} ({name}): spec is required")
        problems = file_spec_problems(spec)
        if problems:
            raise SpecError(f"{where} ({name}): " + "; ".join(problems))
        out.append((name, spec))
    return out


# The keys of a WebhookProvider spec, as the CRD declares them (tests/test_providers.py checks the two
# agree): a nested dict for an object, FREE for a map of anything, a one-item list for an array of
# objects. The API server drops unknown fields of a resource; a providers file is checked here.
FREE: dict[str, Any] = {}
SPEC_KEYS: dict[str, Any] = {
    "signature": {"scheme": None, "secretRef": {"name": None, "key": None}, "secrets": None,
                  "toleranceSeconds": None, "header": None, "encoding": None, "prefix": None,
                  "rotationOverlapSeconds": None},
    "eventId": {"jsonPointer": None, "header": None},
    "eventType": {"jsonPointer": None, "header": None},
    "maxBodyBytes": None,
    "replayProtection": {"bodyHashWindowSeconds": None},
    "retention": {"doneHours": None, "deadDays": None, "dedupDays": None},
    "destination": {"url": None, "timeoutSeconds": None},
    "handler": None,
    "retry": {"maxAttempts": None, "initialDelaySeconds": None, "maxDelaySeconds": None},
    "leaseSeconds": None,
    "ordering": {"entityKey": {"jsonPointer": None, "header": None}, "maxDeferralSeconds": None,
                 "transitions": [{"on": None, "from": None, "to": None}]},
    "workers": {"minReplicas": None, "maxReplicas": None, "targetBacklogPerReplica": None,
                "scaleDownStabilizationSeconds": None, "resources": {"requests": FREE, "limits": FREE},
                "nodeSelector": FREE,
                "tolerations": [{"key": None, "operator": None, "value": None, "effect": None,
                                 "tolerationSeconds": None}],
                "affinity": FREE, "priorityClassName": None},
}


def unknown_keys(value: Any, keys: dict[str, Any] = SPEC_KEYS, where: str = "spec") -> list[str]:
    """Messages for keys of ``value`` that a WebhookProvider spec does not have (a misspelling is
    otherwise silently ignored: ``retyr:`` would leave the default retry policy)."""
    if keys is FREE or not isinstance(value, Mapping):
        return []
    found = []
    for key, child in value.items():
        if key not in keys:
            close = difflib.get_close_matches(str(key), list(keys), n=1)
            found.append(f"{where}.{key} is not a field" + (f" (did you mean {where}.{close[0]}?)" if close else ""))
        elif isinstance(keys[key], list) and isinstance(child, list):
            for i, item in enumerate(child):
                found += unknown_keys(item, keys[key][0], f"{where}.{key}[{i}]")
        elif isinstance(keys[key], dict):
            found += unknown_keys(child, keys[key], f"{where}.{key}")
    return found


def file_spec_problems(spec: Mapping[str, Any]) -> list[str]:
    """What makes a providers-file spec one that can never work, though it parses: unknown keys, a
    Kubernetes secretRef (only the operator reads Secrets), a secret left as a placeholder, an
    ordering transition from a state no transition reaches."""
    problems = unknown_keys(spec)
    sig = spec.get("signature")
    if isinstance(sig, Mapping):
        if "secretRef" in sig:
            problems.append("spec.signature.secretRef names a Kubernetes Secret, which only the operator reads: "
                            "in a providers file give spec.signature.secrets, or leave it out to have one generated")
        for i, secret in enumerate(sig.get("secrets") or []):
            if isinstance(secret, str) and ("..." in secret or secret.strip() in ("", "whsec_", "changeme")):
                problems.append(f"spec.signature.secrets[{i}] is a placeholder: put the sender's real secret "
                                "there, or leave secrets out to have one generated")
    ordering = spec.get("ordering")
    transitions = ordering.get("transitions") if isinstance(ordering, Mapping) else None
    if isinstance(transitions, list):
        reached = {t.get("to") for t in transitions if isinstance(t, Mapping)}
        for t in transitions:
            if not isinstance(t, Mapping):
                continue
            from_states = t.get("from", [None])
            for state in from_states if isinstance(from_states, list) else []:
                if state is not None and state not in reached:
                    problems.append(f"spec.ordering.transitions: {t.get('on')!r} starts from {state!r}, which no "
                                    "transition leads to, so it could never apply (its events would wait, then "
                                    "die)")
    return problems
