"""The operator's decisions as pure functions: no Kubernetes, no Postgres.

Ownership (who may write a provider row, a Secret, a Deployment), conditions from what
was observed, status numbers from statistics, and which annotation requests to act on.
"""

from __future__ import annotations

import getpass
import math
import os
import pwd
import socket

import pytest

from hookline.core.inbox_stats import NO_EVENTS, ProviderStats
from hookline_operator.conditions import compose, new_conflicts, ready_reason, set_condition
from hookline_operator.kube import ObservedSecret
from hookline_operator.main import own_identity
from hookline_operator.memo import ScalingOutcome
from hookline_operator.ownership import (
    CLI_OWNER,
    LEGACY_OWNER,
    Claim,
    ClaimState,
    Resource,
    SecretSource,
    claim_outcome,
    owner_is_gone,
    secret_source,
)
from hookline_operator.reconcile import Observation, SyncState, WorkersState, describe_secret
from hookline_operator.stats import INT64_MAX, status_fields
from hookline_operator.tokens import pending_token, rotation_refusal

RES = Resource("team-a", "stripe", "uid-a", 3)
SPEC = {"signature": {"scheme": "stripe"}, "destination": {"url": "http://x/"}}
WITH_REF = {**SPEC, "signature": {"scheme": "stripe", "secretRef": {"name": "db-url", "key": "url"}}}


def row(managed_by: str | None, namespace: str | None = None, name: str | None = None, uid: str | None = None
        ) -> dict[str, object]:
    return {"managed_by": managed_by, "owner_namespace": namespace, "owner_name": name, "owner_uid": uid}


# --- the provider name ---------------------------------------------------------------------------


def test_a_row_with_our_uid_is_ours() -> None:
    assert claim_outcome(row("operator", "team-a", "stripe", "uid-a"), "uid-a").owned


def test_another_resources_row_is_a_conflict_that_does_not_name_it() -> None:
    claim = claim_outcome(row("operator", "team-b", "stripe", "uid-b"), "uid-a")
    assert claim.state is ClaimState.CONFLICT
    # Known to the operator (the takeover check, its log)...
    assert (claim.owner_namespace, claim.owner_name, claim.owner_uid) == ("team-b", "stripe", "uid-b")
    assert claim.owner == "WebhookProvider team-b/stripe"
    # ...but the claimant is told only that the name is taken.
    message = claim.message("stripe")
    assert "already taken" in message and "/webhooks/stripe" in message
    assert "team-b" not in message and "uid-b" not in message and "WebhookProvider" not in message


def test_cli_and_pre_ownership_rows_are_conflicts_with_a_way_out_for_the_platform_team() -> None:
    assert claim_outcome(row("cli"), "uid-a").owner == CLI_OWNER
    assert claim_outcome(row(None), "uid-a").owner == LEGACY_OWNER
    assert "hookline providers delete" in CLI_OWNER


def test_a_claimant_cannot_tell_who_holds_a_name() -> None:
    # The same words whoever holds it: no probing which namespace, the CLI or an old row has a name.
    holders = [row("operator", "team-b", "stripe", "uid-b"), row("operator", "team-c", "other", "uid-c"),
               row("cli"), row(None)]
    assert len({claim_outcome(holder, "uid-a").message("stripe") for holder in holders}) == 1


def test_no_row_back_means_try_again_not_conflict() -> None:
    assert claim_outcome(None, "uid-a").state is ClaimState.RETRY


def test_an_owner_is_gone_only_when_the_api_server_shows_something_else() -> None:
    claim = Claim(ClaimState.CONFLICT, "x", "team-b", "stripe", "uid-b")
    assert owner_is_gone(claim, None)  # deleted
    assert owner_is_gone(claim, "uid-new")  # deleted and created again: a new resource
    assert not owner_is_gone(claim, "uid-b")
    assert not owner_is_gone(Claim(ClaimState.CONFLICT, CLI_OWNER), None)  # the CLI is never "gone"


# --- Kubernetes objects --------------------------------------------------------------------------


def test_secret_sources() -> None:
    ours, theirs = frozenset({"uid-a"}), frozenset({"uid-other"})
    assert secret_source(False, "none", None, "uid-a") is SecretSource.NONE_NEEDED
    assert secret_source(False, "stripe", None, "uid-a") is SecretSource.MISSING
    assert secret_source(True, "stripe", None, "uid-a") is SecretSource.MISSING
    assert secret_source(False, "stripe", ours, "uid-a") is SecretSource.MANAGED
    assert secret_source(True, "stripe", ours, "uid-a") is SecretSource.MANAGED
    assert secret_source(True, "stripe", frozenset(), "uid-a") is SecretSource.USER
    assert secret_source(True, "stripe", theirs, "uid-a") is SecretSource.USER  # another resource's: read only
    assert secret_source(False, "stripe", frozenset(), "uid-a") is SecretSource.CONFLICT


def test_a_foreign_secret_on_the_generated_name_is_a_conflict_and_is_not_read() -> None:
    observed = ObservedSecret("stripe-webhook-secret", {"secret": "s3cret"}, frozenset(), {})
    state = describe_secret(RES, SPEC, observed)
    assert (state.ready, state.reason) == (False, "ResourceConflict")
    assert "stripe-webhook-secret" in state.message and state.data == {}
    assert "s3cret" not in state.message


def test_a_user_secret_is_read_and_said_to_be_never_rotated() -> None:
    observed = ObservedSecret("db-url", {"url": "postgresql://x"}, frozenset(), {})
    state = describe_secret(RES, WITH_REF, observed)
    assert (state.ready, state.source, state.rotatable) == (True, SecretSource.USER, False)
    assert "never rotates" in state.message
    refusal = rotation_refusal(state, owns_name=True)
    assert refusal is not None and "db-url" in refusal and "secretRef" in refusal


def test_rotation_needs_the_name_and_our_own_secret() -> None:
    ours = describe_secret(RES, SPEC, ObservedSecret("stripe-webhook-secret", {"secret": "v"}, frozenset({"uid-a"}),
                                                     {}))
    assert rotation_refusal(ours, owns_name=True) is None
    refusal = rotation_refusal(ours, owns_name=False)
    assert refusal is not None and "does not own" in refusal


# --- conditions ----------------------------------------------------------------------------------


def observation(sync: SyncState, workers: WorkersState | None = None) -> Observation:
    secret = describe_secret(RES, SPEC, ObservedSecret("stripe-webhook-secret", {"secret": "v"}, frozenset({"uid-a"}),
                                                       {}))
    return Observation(secret, sync, workers or WorkersState(True, "WorkersReady", "ok"))


def condition(conditions: list[dict[str, object]], type: str) -> dict[str, object]:
    return next(c for c in conditions if c["type"] == type)


def test_ready_when_everything_is_ours_and_synced() -> None:
    conditions = compose([], observation(SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED))), None, 3)
    assert condition(conditions, "Ready")["status"] == "True"
    assert {c["observedGeneration"] for c in conditions} == {3}


def test_name_conflict_is_the_ready_reason_and_never_names_the_owner() -> None:
    claim = Claim(ClaimState.CONFLICT, "WebhookProvider team-b/stripe", "team-b", "stripe", "uid-b")
    obs = observation(SyncState(False, "NameConflict", claim.message("stripe"), claim),
                      WorkersState(False, "WaitingForName", "no workers"))
    ready = condition(compose([], obs, None, 1), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    assert "already taken" in str(ready["message"]) and "team-b" not in str(ready["message"])


def test_a_foreign_deployment_is_a_resource_conflict() -> None:
    obs = observation(SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED)),
                      WorkersState(False, "ResourceConflict", "Deployment payments-worker exists and is not owned"))
    assert ready_reason(obs) == (False, "ResourceConflict", "Deployment payments-worker exists and is not owned")


def test_the_scaling_outcome_is_carried_into_the_conditions() -> None:
    obs = observation(SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED)))
    conditions = compose([], obs, ScalingOutcome(False, "Paused", "paused"), 1)
    assert condition(conditions, "Scaling")["reason"] == "Paused"


def test_a_conflict_is_announced_once_not_every_tick() -> None:
    claim = Claim(ClaimState.CONFLICT, "WebhookProvider team-b/stripe", "team-b", "stripe", "uid-b")
    obs = observation(SyncState(False, "NameConflict", claim.message("stripe"), claim))
    first = compose([], obs, None, 1)
    assert new_conflicts([], first) == [("NameConflict", claim.message("stripe"))]
    assert new_conflicts(first, compose(first, obs, None, 1)) == []


# --- status numbers ------------------------------------------------------------------------------


def test_status_numbers_are_whole_non_negative_and_within_int64() -> None:
    assert status_fields(NO_EVENTS) == {"backlog": 0, "oldestPendingSeconds": 0, "retrying": 0, "deferred": 0,
                                        "inFlight": 0, "deadLetters": 0}
    odd = ProviderStats(due=-1, oldest_due_seconds=-5.0, retrying=-2, deferred=-3, in_flight=0, dead=-4)
    assert all(v == 0 for v in status_fields(odd).values())
    huge = ProviderStats(due=10**30, oldest_due_seconds=1e30, retrying=10**20, in_flight=1, dead=10**19)
    assert all(isinstance(v, int) and 0 <= v <= INT64_MAX for v in status_fields(huge).values())
    assert status_fields(ProviderStats(due=1, oldest_due_seconds=math.nan))["oldestPendingSeconds"] == 0
    # The age is reported only for due events: nothing due, nothing waiting.
    assert status_fields(ProviderStats(retrying=1, oldest_due_seconds=50.0))["oldestPendingSeconds"] == 0
    assert status_fields(ProviderStats(due=1, oldest_due_seconds=7.9))["oldestPendingSeconds"] == 7


def test_backlog_is_due_plus_in_flight_only() -> None:
    assert ProviderStats(due=2, in_flight=3, retrying=100, deferred=50, dead=9).backlog == 5


# --- annotation tokens ---------------------------------------------------------------------------


def test_a_token_is_pending_until_acknowledged() -> None:
    annotations = {"hookline.io/replay-dlq": "t2"}
    assert pending_token(annotations, {}, "hookline.io/replay-dlq", "replay") == "t2"
    assert pending_token(annotations, {"replay": {"lastHandledToken": "t1"}}, "hookline.io/replay-dlq",
                         "replay") == "t2"
    assert pending_token(annotations, {"replay": {"lastHandledToken": "t2"}}, "hookline.io/replay-dlq",
                         "replay") is None
    assert pending_token({}, {}, "hookline.io/replay-dlq", "replay") is None


def test_writers_setting_different_conditions_keep_one_order() -> None:
    obs = observation(SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED)))
    first = compose([], obs, ScalingOutcome(True, "Active", "due 1"), 1)
    first = set_condition(first, "SecretRotated", True, "Rotated", "r1", 1)
    by_scale = set_condition(first, "Scaling", True, "Active", "due 2", 1)
    by_sync = compose(by_scale, obs, ScalingOutcome(True, "Active", "due 2"), 1)
    assert [c["type"] for c in by_scale] == [c["type"] for c in first] == [c["type"] for c in by_sync]
    assert by_sync == by_scale  # nothing for sync to write after scale wrote the same outcome


@pytest.mark.skipif(os.getuid() != 0, reason="switching to a user with no passwd entry needs root")
def test_the_operator_names_itself_as_a_user_with_no_passwd_entry() -> None:
    """The image runs as uid 10001 with no /etc/passwd entry, where kopf's default identity
    (getpass.getuser()) raises; the operator gives kopf one itself when POD_ID is unset."""
    uid = 54321
    assert all(entry.pw_uid != uid for entry in pwd.getpwall())
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a forked child: the code is loaded already, only the user changes
        try:
            os.close(read_end)
            for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
                os.environ.pop(name, None)
            os.setuid(uid)
            try:
                getpass.getuser()
                answer = "getuser() worked"
            except (KeyError, OSError):
                answer = own_identity()
            os.write(write_end, answer.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer_pipe:
        answer = answer_pipe.read().decode()
    os.waitpid(child, 0)
    assert answer == f"{uid}@{socket.gethostname()}"


SYNCED = SyncState(True, "Synced", "ok", Claim(ClaimState.OWNED))


def test_a_handler_that_does_not_import_is_the_ready_reason_after_the_conflicts() -> None:
    problem = "handler team.hooks:on cannot be imported (ModuleNotFoundError: No module named 'team')"
    ready, reason, message = ready_reason(observation(SYNCED), problem)
    assert (ready, reason) == (False, "HandlerNotImportable") and message.startswith(problem)
    assert ready_reason(observation(SYNCED), None)[:2] == (True, "Reconciled")
    conflicted = observation(SyncState(False, "NameConflict", "provider name stripe is taken", None))
    assert ready_reason(conflicted, problem)[1] == "NameConflict"  # what the user must fix first
    before = compose([], observation(SYNCED), None, 1)
    after = compose(before, observation(SYNCED), None, 1, problem)
    assert new_conflicts(before, after) == [("HandlerNotImportable", next(
        c["message"] for c in after if c["type"] == "Ready"))]
    assert new_conflicts(after, compose(after, observation(SYNCED), None, 1, problem)) == []  # one Event, not per tick
