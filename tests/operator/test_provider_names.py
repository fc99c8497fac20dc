"""Many teams, one install: two namespaces apply a WebhookProvider of the same name.

Real kube-apiserver, real kubectl, real Postgres, the real operator process watching
both namespaces. The first resource to claim the public name owns it; the other is
told only that the name is taken (NameConflict; the operator's log names the owner), is
never synced, runs no workers, cannot replay, rotate or see the owner's numbers, and
takes the name over once the owner is deleted.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from apiserver import ApiServer

from hookline.core.providers import stored_secrets
from hookline.core.secrets_at_rest import configured_ring
from support.cluster import apply, get, new_namespace
from support.inbox import insert_events
from support.operator import condition, start_operator
from support.operator import event_lines as events
from support.postgres import lock_waiters
from support.processes import ServiceProcess
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

NAME = "shop"


def provider(url: str) -> str:
    return f"""
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {NAME}}}
spec:
  signature: {{scheme: standard-webhooks}}
  destination: {{url: "{url}"}}
  retry: {{maxAttempts: 3, initialDelaySeconds: 1, maxDelaySeconds: 2}}
  workers: {{minReplicas: 0, maxReplicas: 5, scaleDownStabilizationSeconds: 3}}
"""


def url_of(namespace: str) -> str:
    return f"http://payments.{namespace}.svc/webhooks"


@pytest.fixture
def teams(apiserver: ApiServer) -> tuple[str, str]:
    return new_namespace(apiserver), new_namespace(apiserver)


@pytest.fixture
def operator(apiserver: ApiServer, teams: tuple[str, str], database_url: str, log_dir: Path
             ) -> Iterator[ServiceProcess]:
    # DEBUG: kopf's account of the timers it waits for on a deletion.
    proc = start_operator(apiserver, list(teams), database_url, log_dir, extra_args=("--log-level", "DEBUG"))
    yield proc
    proc.stop()


def whp(apiserver: ApiServer, namespace: str) -> dict[str, Any]:
    return get(apiserver, namespace, "whp", NAME)


async def ready(apiserver: ApiServer, namespace: str, reason: str) -> dict[str, Any]:
    return await eventually(lambda: (o := whp(apiserver, namespace)) and condition(o, "Ready").get("reason") == reason
                            and o, what=f"Ready reason {reason} in {namespace}")


async def owner(pool: asyncpg.Pool) -> tuple[str | None, str | None]:
    row = await pool.fetchrow("SELECT owner_namespace, spec FROM hookline.providers WHERE name = $1", NAME)
    return (row["owner_namespace"], row["spec"]["destination"]["url"]) if row else (None, None)


def delete(apiserver: ApiServer, namespace: str) -> None:
    apiserver.kubectl("delete", "whp", NAME, "-n", namespace, "--wait=true", "--timeout=30s")
    # envtest runs no garbage collector: remove what the resource owned, as a cluster would.
    apiserver.kubectl("delete", "secret,deployment", "-n", namespace, "-l", f"hookline.io/provider={NAME}")


def deployments(apiserver: ApiServer, namespace: str) -> list[str]:
    return [d["metadata"]["name"] for d in get(apiserver, namespace, "deployments")["items"]]


@pytest.mark.parametrize("order", ["a-first", "b-first"])
async def test_the_first_namespace_owns_the_name_until_it_is_deleted(apiserver, teams, operator, pool,
                                                                     order) -> None:
    first, second = teams if order == "a-first" else teams[::-1]
    apply(apiserver, first, provider(url_of(first)))
    await ready(apiserver, first, "Reconciled")
    apply(apiserver, second, provider(url_of(second)))
    loser = await ready(apiserver, second, "NameConflict")
    message = condition(loser, "Ready")["message"]
    assert "already taken" in message and f"/webhooks/{NAME}" in message
    assert condition(loser, "Synced")["reason"] == "NameConflict"
    # The claimant learns that the name is taken, never by whom; the operator's log says.
    conflicts = await eventually(lambda: [e for e in events(apiserver, second)
                                          if e.startswith("Warning NameConflict: ")],
                                 what="the claimant's NameConflict Event")
    assert all(first not in text for text in [*conflicts, *(c["message"] for c in loser["status"]["conditions"])])
    await eventually(lambda: f"WebhookProvider {first}/{NAME}" in operator.logs(),
                     what="the owner in the operator's log")
    # Never synced, no workers, none of the owner's numbers.
    assert await owner(pool) == (first, url_of(first))
    await insert_events(pool, NAME, 3)
    await eventually(lambda: whp(apiserver, first)["status"].get("backlog") == 3, what="the owner's backlog")
    assert "backlog" not in whp(apiserver, second)["status"]
    assert f"{NAME}-worker" not in deployments(apiserver, second)

    # Deleting the claimant changes nothing for the owner.
    delete(apiserver, second)
    assert await owner(pool) == (first, url_of(first))
    assert condition(whp(apiserver, first), "Ready")["status"] == "True"

    # Once the owner is deleted, the other namespace takes the name over on its own.
    apply(apiserver, second, provider(url_of(second)))
    await ready(apiserver, second, "NameConflict")
    delete(apiserver, first)
    await ready(apiserver, second, "Reconciled")
    assert await owner(pool) == (second, url_of(second))
    # The previous owner's events are archived under NAME@uid (migration 0015), never the new owner's.
    await eventually(lambda: whp(apiserver, second)["status"].get("backlog") == 0, what="the new owner's empty backlog")
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider LIKE $1", f"{NAME}@%") == 3
    await eventually(lambda: f"{NAME}-worker" in deployments(apiserver, second), what="the new owner's workers")


async def test_replay_and_rotation_in_one_namespace_never_touch_the_other(apiserver, teams, operator,
                                                                          pool) -> None:
    owner_ns, other_ns = teams
    apply(apiserver, owner_ns, provider(url_of(owner_ns)))
    await ready(apiserver, owner_ns, "Reconciled")
    apply(apiserver, other_ns, provider(url_of(other_ns)))
    await ready(apiserver, other_ns, "NameConflict")
    await insert_events(pool, NAME, 4)
    await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 3")
    owner_secret = get(apiserver, owner_ns, "secret", f"{NAME}-webhook-secret")

    apiserver.kubectl("annotate", "whp", NAME, "-n", other_ns, "hookline.io/replay-dlq=t1", "--overwrite")
    apiserver.kubectl("annotate", "whp", NAME, "-n", other_ns, "hookline.io/rotate-secret=r1", "--overwrite")
    status = await eventually(lambda: (s := whp(apiserver, other_ns)["status"]) and "replay" in s and "rotation" in s
                              and s, what="both requests acknowledged")
    assert (status["replay"]["lastHandledToken"], status["replay"]["requeued"]) == ("t1", 0)
    assert (status["rotation"]["lastHandledToken"], status["rotation"]["result"]) == ("r1", "Refused")
    seen = events(apiserver, other_ns)
    assert any(e.startswith("Warning ReplayRefused") for e in seen), seen
    assert any(e.startswith("Warning RotationRefused") for e in seen), seen
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 4
    after = get(apiserver, owner_ns, "secret", f"{NAME}-webhook-secret")
    assert after["data"] == owner_secret["data"]
    assert after["metadata"]["resourceVersion"] == owner_secret["metadata"]["resourceVersion"]

    # The owner's own requests work, in its namespace only.
    apiserver.kubectl("annotate", "whp", NAME, "-n", owner_ns, "hookline.io/replay-dlq=t1", "--overwrite")
    replayed = await eventually(lambda: whp(apiserver, owner_ns)["status"].get("replay"), what="owner's replay")
    assert replayed["requeued"] == 4
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'pending'") == 4
    apiserver.kubectl("annotate", "whp", NAME, "-n", owner_ns, "hookline.io/rotate-secret=r1", "--overwrite")
    await eventually(lambda: get(apiserver, owner_ns, "secret", f"{NAME}-webhook-secret")["data"]["secret"]
                     != owner_secret["data"]["secret"], what="the owner's secret rotated")
    new_value = base64.b64decode(get(apiserver, owner_ns, "secret", f"{NAME}-webhook-secret")["data"]["secret"])
    async def rotated_secret_stored() -> bool:
        sealed = await pool.fetchval("SELECT secrets FROM hookline.providers WHERE name = $1", NAME)
        return new_value.decode() in [s["value"] for s in stored_secrets(configured_ring(), NAME, sealed)]

    await eventually(rotated_secret_stored, what="the rotated secret in the provider row")
    # The other namespace has no Secret of the owner's, and its own is its own.
    other_secret = get(apiserver, other_ns, "secret", f"{NAME}-webhook-secret")
    assert other_secret["data"]["secret"] != owner_secret["data"]["secret"]
    assert other_secret["metadata"]["ownerReferences"][0]["uid"] == whp(apiserver, other_ns)["metadata"]["uid"]


async def test_an_owner_deleted_behind_the_operators_back_hands_the_name_over(apiserver, teams, database_url,
                                                                               log_dir, pool) -> None:
    owner_ns, other_ns = teams
    operator = start_operator(apiserver, list(teams), database_url, log_dir)
    try:
        apply(apiserver, owner_ns, provider(url_of(owner_ns)))
        await ready(apiserver, owner_ns, "Reconciled")
        apply(apiserver, other_ns, provider(url_of(other_ns)))
        await ready(apiserver, other_ns, "NameConflict")
    finally:
        operator.stop()
    # The owner goes away without its finalizer running: the name is never released.
    apiserver.kubectl("patch", "whp", NAME, "-n", owner_ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    apiserver.kubectl("delete", "whp", NAME, "-n", owner_ns, "--wait=true", "--timeout=30s")
    assert await owner(pool) == (owner_ns, url_of(owner_ns))
    operator = start_operator(apiserver, list(teams), database_url, log_dir)
    try:
        # The API server says the owner is gone: the waiting resource takes the name over.
        await ready(apiserver, other_ns, "Reconciled")
        assert await owner(pool) == (other_ns, url_of(other_ns))
    finally:
        operator.stop()


async def test_a_resource_deleted_while_its_timer_runs_is_gone_once_the_timer_ends(apiserver, teams, operator,
                                                                                    pool, database_url) -> None:
    """kopf removes the finalizer only once the resource's timers have ended, and by default looks
    again only 60 s after finding one still running, unless another event comes. The claimant's
    sync timer is held inside its claim statement (by a row lock on the name) while the resource
    is deleted; once let go, it changes nothing, so no event comes: the deletion must finish
    within seconds anyway. Deleting a resource hung for a minute in make test when one of its
    timers happened to be running (kubectl delete --timeout=30s failed)."""
    owner_ns, claimant_ns = teams
    apply(apiserver, owner_ns, provider(url_of(owner_ns)))
    await ready(apiserver, owner_ns, "Reconciled")
    apply(apiserver, claimant_ns, provider(url_of(claimant_ns)))
    await ready(apiserver, claimant_ns, "NameConflict")
    # Settled: its next sync finds what this one did (its first reported the Secret created).
    await eventually(lambda: condition(whp(apiserver, claimant_ns), "SecretReady").get("reason") == "SecretFound",
                     what="the claimant's status settled")
    locker = await asyncpg.connect(database_url)
    try:
        hold = locker.transaction()
        await hold.start()
        await locker.execute("SELECT 1 FROM hookline.providers WHERE name = $1 FOR UPDATE", NAME)
        # Both sync timers run their claim into the lock: the claimant's on its next tick, the
        # owner's when it re-claims its row (every RESYNC_EVERY_TICKS ticks). A resource runs one
        # sync at a time, so two claims waiting are one of each.
        await eventually(lambda: lock_waiters(pool, "%INSERT INTO hookline.providers%"), equals=2,
                         what="the claims of both resources waiting on the lock")
        apiserver.kubectl("delete", "whp", NAME, "-n", claimant_ns, "--wait=false")
        # The delete handler runs meanwhile, and kopf finds the timer still running (kopf's DEBUG line).
        await eventually(lambda: "Timer 'sync' is still exiting." in operator.logs(),
                         what="kopf waiting for the claimant's sync timer to end")
        assert whp(apiserver, claimant_ns)["metadata"]["deletionTimestamp"]
        await hold.rollback()
        started = asyncio.get_running_loop().time()
        result = await asyncio.to_thread(apiserver.kubectl, "wait", "--for=delete", f"whp/{NAME}", "-n",
                                         claimant_ns, "--timeout=20s", check=False)
        waited = asyncio.get_running_loop().time() - started
        assert result.returncode == 0, f"still there after {waited:.0f} s: {result.stderr}"
    finally:
        await locker.close()
    assert await owner(pool) == (owner_ns, url_of(owner_ns))
    assert condition(whp(apiserver, owner_ns), "Ready")["status"] == "True"
