"""The operator end to end: a real kube-apiserver, a real Postgres, real processes, the real kubectl."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from apiserver import ApiServer

from hookline.core import migrations
from hookline.core.embedded import EmbeddedPostgres
from hookline.core.providers import stored_secrets
from hookline.core.secrets_at_rest import configured_ring
from support import senders
from support.cluster import metric
from support.inbox import insert_events
from support.kube import kget
from support.operator import permission_errors, timer_ran
from support.operator import start_operator as operator_process
from support.processes import ServiceProcess, receiver, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


def start_operator(apiserver: ApiServer, namespace: str, database_url: str, log_dir: Path) -> ServiceProcess:
    """The operator as the chart's operator Role allows it (support/operator.py), never as the admin."""
    return operator_process(apiserver, [namespace], database_url, log_dir, extra_args=("--log-level", "DEBUG"))


@pytest.fixture
def operator(apiserver: ApiServer, namespace: str, database_url: str, log_dir: Path) -> Iterator[ServiceProcess]:
    proc = start_operator(apiserver, namespace, database_url, log_dir)
    yield proc
    proc.stop()
    # Everything the test made the operator do was allowed by the chart's Role.
    assert not permission_errors(proc.logs()), "\n".join(permission_errors(proc.logs())[:20])


def get(apiserver: ApiServer, namespace: str, *what: str) -> dict[str, Any]:
    return kget(apiserver, namespace, *what)


def apply(apiserver: ApiServer, namespace: str, manifest: str) -> None:
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)


def condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type), {})


def events(apiserver: ApiServer, namespace: str) -> list[str]:
    items = get(apiserver, namespace, "events")["items"]
    return [f"{e['reason']}: {e.get('message', '')}" for e in items]


STATS_QUERIES = "hookline_operator_stats_queries_total"
STABILIZATION_SECONDS = 3

PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks, rotationOverlapSeconds: {overlap}}}
  handler: "support.handlers:record_effect"
  leaseSeconds: 5
  retry: {{maxAttempts: 3, initialDelaySeconds: 1, maxDelaySeconds: 2}}
  workers: {{minReplicas: 0, maxReplicas: 5, targetBacklogPerReplica: 100,
            scaleDownStabilizationSeconds: {stabilization}}}
"""


def provider_yaml(name: str, overlap: int = 3) -> str:
    return PROVIDER.format(name=name, overlap=overlap, stabilization=STABILIZATION_SECONDS)


async def post_signed(url: str, provider: str, secret: str) -> int:
    event_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps({"type": "t", "id": event_id}).encode()
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/webhooks/{provider}", data=body,
            headers=senders.standard_webhooks(body, event_id, secret=secret)) as r:
        return r.status


def secret_value(apiserver: ApiServer, namespace: str, name: str) -> str:
    data = get(apiserver, namespace, "secret", name)["data"]
    return base64.b64decode(data["secret"]).decode()


async def test_provider_gets_a_secret_a_row_workers_and_status(apiserver, namespace, database_url, operator,
                                                               log_dir, pool) -> None:
    apply(apiserver, namespace, provider_yaml("shop"))
    whp = await eventually(lambda: (o := get(apiserver, namespace, "whp", "shop"))
                           and condition(o, "Ready").get("status") == "True" and o, what="Ready")
    assert condition(whp, "SecretReady")["status"] == "True"  # created: see the SecretCreated event below
    assert condition(whp, "Synced")["status"] == "True"
    assert condition(whp, "Ready")["observedGeneration"] == whp["metadata"]["generation"]
    assert "hookline.io/finalizer" in whp["metadata"]["finalizers"]

    secret = get(apiserver, namespace, "secret", "shop-webhook-secret")
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("WebhookProvider", "shop", whp["metadata"]["uid"])
    value = secret_value(apiserver, namespace, "shop-webhook-secret")
    assert value.startswith("whsec_")
    # Secrets never reach status or events.
    assert value not in json.dumps(whp)
    seen = await eventually(lambda: events(apiserver, namespace), what="events")
    assert any(e.startswith("SecretCreated") for e in seen)
    assert all(value not in e for e in seen)

    row = await pool.fetchrow("SELECT spec, secrets FROM hookline.providers WHERE name = 'shop'")
    assert row["spec"]["handler"] == "support.handlers:record_effect"
    assert [s["value"] for s in stored_secrets(configured_ring(), "shop", row["secrets"])] == [value]
    assert value not in json.dumps(row["secrets"])  # encrypted at rest

    recv = receiver(database_url, log_dir)
    try:
        assert await post_signed(recv.url, "shop", value) == 200
        assert await post_signed(recv.url, "shop", "whsec_" + base64.b64encode(b"x" * 32).decode()) == 401
    finally:
        recv.stop()

    # One pending event (nothing runs the worker pods here): the operator scales 0 -> 1.
    deployment = await eventually(lambda: (d := get(apiserver, namespace, "deployment", "shop-worker"))
                                  and d["spec"]["replicas"] == 1 and d, what="one replica for a backlog of one")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["worker", "--provider", "shop"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 5
    assert deployment["metadata"]["ownerReferences"][0]["name"] == "shop"

    table = await eventually(lambda: (out := apiserver.kubectl("get", "whp", "-n", namespace).stdout)
                             and out.splitlines()[1].split()[:6] == ["shop", "standard-webhooks", "True", "1", "0", "1"]
                             and out, what="printer columns with real values")
    assert table.splitlines()[0].split() == ["NAME", "SCHEME", "READY", "BACKLOG", "DEAD", "REPLICAS", "AGE"]

    apiserver.kubectl("delete", "whp", "shop", "-n", namespace, "--wait=true", "--timeout=30s")
    assert await pool.fetchval("SELECT count(*) FROM hookline.providers WHERE name = 'shop'") == 0
    # Events stay, archived under NAME@uid for no later owner of the name to see (migration 0015).
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'shop'") == 0
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider LIKE 'shop@%'") == 1


async def test_workers_follow_the_backlog_up_and_down_and_pause(apiserver, namespace, database_url, operator,
                                                                pool) -> None:
    apply(apiserver, namespace, provider_yaml("scale"))
    await eventually(lambda: get(apiserver, namespace, "deployment", "scale-worker"), what="deployment")
    replicas = lambda: get(apiserver, namespace, "deployment", "scale-worker")["spec"]["replicas"]  # noqa: E731
    await insert_events(pool, "scale", 250)
    await eventually(lambda: replicas() == 3, what="scale up to 3")
    await pool.execute("UPDATE hookline.inbox SET status = 'done'")
    await eventually(lambda: replicas() == 0, timeout=20, what="scale down to 0 after the window")
    seen = events(apiserver, namespace)
    assert any(e.startswith("Scaled: scaled scale-worker from ") and " to 0 " in e for e in seen), seen

    apiserver.kubectl("annotate", "whp", "scale", "-n", namespace, "hookline.io/paused=true", "--overwrite")
    await eventually(lambda: condition(get(apiserver, namespace, "whp", "scale"), "Scaling").get("reason") == "Paused",
                     what="Paused")
    await insert_events(pool, "scale", 450)
    # Statistics that count the new events (a whole refresh after the insert), then scaling decisions
    # made with them: unpaused, these would have scaled up.
    queries = metric(operator.url, STATS_QUERIES)
    await eventually(lambda: metric(operator.url, STATS_QUERIES) >= queries + 2, what="a statistics refresh")
    await timer_ran(operator, "scale")
    assert replicas() == 0
    apiserver.kubectl("annotate", "whp", "scale", "-n", namespace, "hookline.io/paused-")
    await eventually(lambda: replicas() == 5, what="scale up to max after unpausing")


async def test_replicas_stay_when_postgres_is_unreachable(apiserver, namespace, tmp_path, log_dir) -> None:
    server = EmbeddedPostgres(tmp_path / "pg")
    url = server.start()
    conn = await asyncpg.connect(url)
    await migrations.migrate(conn)
    await conn.close()
    proc = start_operator(apiserver, namespace, url, log_dir)
    try:
        apply(apiserver, namespace, provider_yaml("steady"))
        conn = await asyncpg.connect(url)
        await insert_events(conn, "steady", 150)
        await conn.close()
        await eventually(lambda: get(apiserver, namespace, "deployment", "steady-worker")["spec"]["replicas"] == 2,
                         what="scaled to 2")
        await asyncio.to_thread(server.stop, "immediate")
        await eventually(lambda: condition(get(apiserver, namespace, "whp", "steady"), "Scaling").get("reason")
                         == "DatabaseUnavailable", what="DatabaseUnavailable")
        # The stabilization window is the behaviour's own clock: once it is over, scaling decisions
        # would act on any recommendation made without statistics.
        await asyncio.sleep(STABILIZATION_SECONDS)
        await timer_ran(proc, "scale")
        assert get(apiserver, namespace, "deployment", "steady-worker")["spec"]["replicas"] == 2
    finally:
        proc.stop()
        server.stop("immediate")


async def test_expired_leases_are_requeued_with_the_attempt_counted(apiserver, namespace, operator, pool) -> None:
    apply(apiserver, namespace, provider_yaml("leases"))
    await eventually(lambda: get(apiserver, namespace, "deployment", "leases-worker"), what="deployment")
    await insert_events(pool, "leases", 2)
    await pool.execute("UPDATE hookline.inbox SET status = 'processing', attempts = 1, locked_by = 'gone', "
                       "lease_expires_at = now() - interval '1 second'")
    await _wait_pending(pool, 2)
    row = await pool.fetchrow("SELECT attempts, last_error FROM hookline.inbox LIMIT 1")
    assert row["attempts"] == 1 and "lease expired" in row["last_error"]
    await eventually(lambda: any(e.startswith("LeasesRequeued: returned 2") for e in events(apiserver, namespace)),
                     what="LeasesRequeued event")


async def _dead(pool: asyncpg.Pool, provider: str, n: int) -> None:
    await insert_events(pool, provider, n)
    await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 3 WHERE status = 'pending'")


async def _wait_pending(pool: asyncpg.Pool, n: int) -> None:
    await eventually(lambda: pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'pending'"), equals=n,
                     what=f"{n} pending events")


async def test_replay_once_per_token_also_across_restarts(apiserver, namespace, database_url, pool,
                                                          log_dir) -> None:
    op = start_operator(apiserver, namespace, database_url, log_dir)
    try:
        apply(apiserver, namespace, provider_yaml("replay"))
        await eventually(lambda: condition(get(apiserver, namespace, "whp", "replay"), "Ready").get("status") == "True")
        await _dead(pool, "replay", 4)
        apiserver.kubectl("annotate", "whp", "replay", "-n", namespace, "hookline.io/replay-dlq=t1", "--overwrite")
        await _wait_pending(pool, 4)
        status = await eventually(lambda: get(apiserver, namespace, "whp", "replay")["status"].get("replay"))
        assert (status["lastHandledToken"], status["requeued"]) == ("t1", 4)
        assert any("DeadLettersReplayed: requeued 4" in e for e in events(apiserver, namespace))
        # Same token again: nothing happens.
        await pool.execute("UPDATE hookline.inbox SET status = 'dead'")
        apiserver.kubectl("annotate", "whp", "replay", "-n", namespace, "hookline.io/replay-dlq=t1", "--overwrite")
        await timer_ran(op, "annotation_tokens")
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 4
    finally:
        op.stop()
    # A token set while the operator is down is handled when it starts; t1 never again.
    apiserver.kubectl("annotate", "whp", "replay", "-n", namespace, "hookline.io/replay-dlq=t2", "--overwrite")
    op = start_operator(apiserver, namespace, database_url, log_dir)
    try:
        await _wait_pending(pool, 4)
        status = await eventually(lambda: (s := get(apiserver, namespace, "whp", "replay")["status"]["replay"])
                                  and s["lastHandledToken"] == "t2" and s)
        assert status["requeued"] == 4
    finally:
        op.stop()
    # Restart with t2 still on the resource and the status wiped: the token table says it was handled.
    await pool.execute("UPDATE hookline.inbox SET status = 'dead'")
    op = start_operator(apiserver, namespace, database_url, log_dir)
    try:
        # Tokens are looked at once a sync has claimed the name, so: a sync, then token runs after it.
        await timer_ran(op, "sync", runs=1)
        await timer_ran(op, "annotation_tokens")
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 4
    finally:
        op.stop()


async def test_rotation_keeps_the_old_secret_valid_for_the_overlap(apiserver, namespace, database_url, operator,
                                                                    log_dir) -> None:
    apply(apiserver, namespace, provider_yaml("rot", overlap=4))
    await eventually(lambda: condition(get(apiserver, namespace, "whp", "rot"), "Ready").get("status") == "True")
    old = secret_value(apiserver, namespace, "rot-webhook-secret")
    recv = receiver(database_url, log_dir)
    try:
        apiserver.kubectl("annotate", "whp", "rot", "-n", namespace, "hookline.io/rotate-secret=r1", "--overwrite")
        new = await eventually(lambda: (v := secret_value(apiserver, namespace, "rot-webhook-secret")) != old and v)
        await eventually(lambda: get(apiserver, namespace, "whp", "rot")["status"].get("rotation", {})
                         .get("lastHandledToken") == "r1", what="rotation status")
        await eventually(lambda: post_signed(recv.url, "rot", new), equals=200, timeout=5, interval=0.2,
                         what="the new secret accepted")
        assert await post_signed(recv.url, "rot", old) == 200  # both valid during the overlap
        await eventually(lambda: post_signed(recv.url, "rot", old), equals=401, timeout=15, interval=0.3,
                         what="the old secret refused after the overlap")
        assert await post_signed(recv.url, "rot", new) == 200
    finally:
        recv.stop()
    seen = events(apiserver, namespace)
    assert any(e.startswith("SecretRotated") for e in seen)
    assert all(old not in e and new not in e for e in seen)


async def test_a_spec_the_api_server_accepts_but_hookline_cannot_use_is_reported(apiserver, namespace, operator
                                                                                ) -> None:
    apiserver.kubectl("create", "secret", "generic", "bad-secret", "-n", namespace,
                      "--from-literal=secret=whsec_not-base64!!")
    apply(apiserver, namespace, """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: broken}
spec:
  signature: {scheme: standard-webhooks, secretRef: {name: bad-secret, key: secret}}
  handler: "support.handlers:record_effect"
""")
    whp = await eventually(lambda: (o := get(apiserver, namespace, "whp", "broken"))
                           and condition(o, "Synced").get("reason") == "InvalidSpec" and o)
    assert condition(whp, "Ready")["status"] == "False"
    assert "not-base64" not in json.dumps(whp)


# The inbox scope's maintenance leader (core/maintenance.py, take_maintenance_lease): who holds the lease.
INBOX_LEADERS = "SELECT holder FROM hookline.maintenance_leaders WHERE scope = 'inbox' AND expires_at > now()"


async def _inbox_leaders(pool: asyncpg.Pool) -> list[str]:
    return [r["holder"] for r in await pool.fetch(INBOX_LEADERS)]


async def _one_leader_not(pool: asyncpg.Pool, gone: set[str]) -> str | None:
    """The single inbox leader (host:pid:maintainer) once it is not one of ``gone``."""
    leaders = await _inbox_leaders(pool)
    assert len(leaders) <= 1, leaders  # never two sweepers at once
    return leaders[0] if leaders and leaders[0] not in gone else None


async def test_an_operator_and_a_sweeping_worker_elect_one_lease_rescuer(apiserver, namespace, database_url,
                                                                          log_dir, pool) -> None:
    sweeper = worker(database_url, log_dir, "--sweep")
    operator: ServiceProcess | None = None
    try:
        worker_leader = await eventually(lambda: _one_leader_not(pool, set()), timeout=60)
        operator = start_operator(apiserver, namespace, database_url, log_dir)
        # The operator's maintainer runs (its statistics job) but the worker stays the only leader.
        op = operator
        await eventually(lambda: metric(op.url, "hookline_operator_stats_queries_total") >= 2, timeout=60)
        assert await _inbox_leaders(pool) == [worker_leader]
        sweeper.stop()  # the operator, the only other candidate, takes over
        operator_leader = await eventually(lambda: _one_leader_not(pool, {worker_leader}), timeout=60)
        sweeper = worker(database_url, log_dir, "--sweep")
        operator.stop()  # and the new worker takes over from it
        await eventually(lambda: _one_leader_not(pool, {worker_leader, operator_leader}), timeout=60)
    finally:
        sweeper.stop()
        if operator is not None:
            operator.stop()
