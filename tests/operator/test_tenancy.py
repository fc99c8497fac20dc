"""What a namespace can reach, with the real operator: every credential in a tenant namespace reads and
changes only that namespace's rows, a real worker runs on it, the destination signing secret is an owned
Secret, and handler modules outside the namespace's prefixes are refused."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from apiserver import ApiServer

from hookline.core.providers import stored_destination_secret, stored_secrets
from hookline.core.secrets_at_rest import configured_ring
from support.inbox import create_effect_tables, insert_events
from support.kube import kget
from support.operator import condition, event_lines, start_operator
from support.processes import worker
from support.waiting import eventually

HANDLER_PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks}}
  handler: "{handler}"
  leaseSeconds: 5
"""

DESTINATION_PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: {name}}}
spec:
  signature: {{scheme: standard-webhooks}}
  destination: {{url: "http://orders.example.svc/webhooks"}}
"""


def new_namespace(apiserver: ApiServer) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    apiserver.kubectl("create", "namespace", name)
    return name


async def ready(apiserver: ApiServer, namespace: str, name: str) -> dict[str, Any]:
    whp: dict[str, Any] = await eventually(lambda: (o := kget(apiserver, namespace, "whp", name))
                                           and condition(o, "Ready").get("status") == "True" and o,
                                           what=f"{namespace}/{name} Ready")
    return whp


def secrets_in(apiserver: ApiServer, namespace: str) -> dict[str, dict[str, str]]:
    """Every Secret of the namespace, decoded: what anyone who may read Secrets there gets."""
    return {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
            for s in kget(apiserver, namespace, "secrets")["items"]}


def owner_uid(apiserver: ApiServer, namespace: str, secret: str) -> str:
    refs = kget(apiserver, namespace, "secret", secret)["metadata"]["ownerReferences"]
    assert [r["kind"] for r in refs] == ["WebhookProvider"]
    return str(refs[0]["uid"])


async def test_a_namespace_holds_no_credential_for_another_namespace(apiserver: ApiServer, database_url: str,
                                                                     log_dir: Path, pool: asyncpg.Pool) -> None:
    team_a, team_b = new_namespace(apiserver), new_namespace(apiserver)
    pa, pb = f"pa-{uuid.uuid4().hex[:6]}", f"pb-{uuid.uuid4().hex[:6]}"
    await create_effect_tables(pool)
    operator = start_operator(apiserver, [team_a, team_b], database_url, log_dir)
    try:
        apiserver.kubectl("apply", "-n", team_a, "-f", "-",
                          input=HANDLER_PROVIDER.format(name=pa, handler="support.handlers:record_effect"))
        apiserver.kubectl("apply", "-n", team_b, "-f", "-", input=DESTINATION_PROVIDER.format(name=pb))
        whp_a, whp_b = await ready(apiserver, team_a, pa), await ready(apiserver, team_b, pb)

        # The workers' credential: an owned Secret their Deployment reads, a role of its own.
        credential = (await eventually(lambda: secrets_in(apiserver, team_a).get(f"{pa}-hookline-database"),
                                       what="the workers' database Secret"))["url"]
        assert owner_uid(apiserver, team_a, f"{pa}-hookline-database") == whp_a["metadata"]["uid"]
        assert urlsplit(credential).username != urlsplit(database_url).username
        deployment = kget(apiserver, team_a, "deployment", f"{pa}-worker")
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["HOOKLINE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == f"{pa}-hookline-database"

        # The destination signing secret: an owned Secret holding what the workers sign with.
        destination = (await eventually(lambda: secrets_in(apiserver, team_b).get(f"{pb}-destination-secret"),
                                        what="the destination Secret"))["secret"]
        assert owner_uid(apiserver, team_b, f"{pb}-destination-secret") == whp_b["metadata"]["uid"]
        assert destination == stored_destination_secret(configured_ring(), pb, await pool.fetchval(
            "SELECT destination_secret FROM hookline.providers WHERE name = $1", pb))
        assert destination not in json.dumps(kget(apiserver, team_b, "whp", pb))
        assert all(destination not in e for e in event_lines(apiserver, team_b))
        assert f"{pa}-destination-secret" not in secrets_in(apiserver, team_a)  # a handler signs nothing
        # Its workers read it from that Secret, mounted; they never get the key to the stored secrets.
        pod_b = (await eventually(lambda: kget(apiserver, team_b, "deployment", f"{pb}-worker"),
                                  what="the destination provider's workers"))["spec"]["template"]["spec"]
        env_b = {e["name"]: e.get("value") for e in pod_b["containers"][0]["env"]}
        assert env_b["HOOKLINE_DESTINATION_SECRET_FILE"] == "/etc/hookline/destination/secret"
        assert "HOOKLINE_SECRET_KEYS_FILE" not in env_b and "HOOKLINE_SECRET_KEYS_FILE" not in env
        mounted = next(v["secret"] for v in pod_b["volumes"] if v["name"] == "destination-secret")
        assert (mounted["secretName"], mounted["items"]) == (f"{pb}-destination-secret",
                                                              [{"key": "secret", "path": "secret"}])

        await insert_events(pool, pa, 3)
        await insert_events(pool, pb, 4)
        signing_b = stored_secrets(configured_ring(), pb, await pool.fetchval(
            "SELECT secrets FROM hookline.providers WHERE name = $1", pb))[0]["value"]

        # Every database URL anyone can read in team-a's namespace reaches team-a's rows only.
        urls = [v for data in secrets_in(apiserver, team_a).values() for v in data.values()
                if v.startswith(("postgresql://", "postgres://"))]
        assert urls == [credential]
        for url in urls:
            conn = await asyncpg.connect(url)
            try:
                assert {r["provider"] for r in await conn.fetch("SELECT provider FROM hookline.inbox")} == {pa}
                assert [r["name"] for r in await conn.fetch("SELECT name FROM hookline.providers")] == [pa]
                # No secret column is readable (migrations 0025, 0026), and what is readable holds none.
                for column in ("secrets", "destination_secret"):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.fetch(f"SELECT {column} FROM hookline.providers")
                visible = str(await conn.fetch("SELECT name, spec, owner_namespace FROM hookline.providers"))
                assert signing_b not in visible and destination not in visible
                assert await conn.execute("UPDATE hookline.inbox SET status = 'dead' WHERE provider = $1", pb) \
                    == "UPDATE 0"
                for statement in ("UPDATE hookline.providers SET spec = '{}'", "DELETE FROM hookline.inbox",
                                  "SELECT * FROM hookline.operator_tokens"):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.execute(statement)
            finally:
                await conn.close()
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND status = 'pending'",
                                   pb) == 4

        # And it is enough for a real worker: it drains team-a's events, team-b's stay untouched. (The
        # handler's own tables are the team's business: granted to its role like any table of theirs.)
        role = urlsplit(credential).username
        await pool.execute(f'GRANT INSERT ON test_effects, test_calls TO "{role}"')
        proc = worker(credential, log_dir, "--provider", pa)
        try:
            await eventually(lambda: pool.fetchval("SELECT count(*) FROM test_effects WHERE provider = $1", pa),
                             equals=3)
        finally:
            proc.stop()
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND status = 'done'",
                                   pa) == 3
        assert await pool.fetchval("SELECT count(*) FROM test_effects WHERE provider = $1", pb) == 0

        # The resource gone, its role goes too.
        await pool.execute(f'REVOKE ALL ON test_effects, test_calls FROM "{role}"')
        apiserver.kubectl("delete", "whp", pa, "-n", team_a, "--wait=true", "--timeout=30s")
        assert await pool.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", role) == 0
    finally:
        operator.stop()


async def test_a_foreign_secret_on_the_credential_name_is_never_adopted(apiserver: ApiServer, namespace: str,
                                                                       database_url: str, log_dir: Path) -> None:
    apiserver.kubectl("create", "secret", "generic", "taken-hookline-database", "-n", namespace,
                      "--from-literal=url=postgresql://someone:else@db/x")
    operator = start_operator(apiserver, [namespace], database_url, log_dir)
    try:
        apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=DESTINATION_PROVIDER.format(name="taken"))
        whp = await eventually(lambda: (o := kget(apiserver, namespace, "whp", "taken"))
                               and condition(o, "Ready").get("reason") == "ResourceConflict" and o,
                               what="ResourceConflict")
        assert "taken-hookline-database" in condition(whp, "Ready")["message"]
        assert secrets_in(apiserver, namespace)["taken-hookline-database"] == {"url": "postgresql://someone:else@db/x"}
    finally:
        operator.stop()


async def test_handler_modules_outside_the_namespace_prefixes_are_refused(apiserver: ApiServer, namespace: str,
                                                                          database_url: str, log_dir: Path,
                                                                          pool: asyncpg.Pool) -> None:
    policy = {namespace: ["support.handlers"], "*": []}
    operator = start_operator(apiserver, [namespace], database_url, log_dir,
                              env={"HOOKLINE_HANDLER_MODULES": json.dumps(policy)})
    try:
        apiserver.kubectl("apply", "-n", namespace, "-f", "-",
                          input=HANDLER_PROVIDER.format(name="sneaky", handler="support.handlersx:record_effect"))
        apiserver.kubectl("apply", "-n", namespace, "-f", "-",
                          input=HANDLER_PROVIDER.format(name="allowed", handler="support.handlers:record_effect"))
        whp = await eventually(lambda: (o := kget(apiserver, namespace, "whp", "sneaky"))
                               and condition(o, "Ready").get("reason") == "HandlerNotAllowed" and o,
                               what="HandlerNotAllowed")
        ready_condition = condition(whp, "Ready")
        assert ready_condition["status"] == "False"
        assert "'support.handlersx'" in ready_condition["message"]
        assert "'support.handlers'" in ready_condition["message"]  # what is allowed
        assert condition(whp, "Synced")["reason"] == "HandlerNotAllowed"
        await ready(apiserver, namespace, "allowed")
        assert await pool.fetchval("SELECT count(*) FROM hookline.providers WHERE name = 'sneaky'") == 0
        assert apiserver.kubectl("get", "deployment", "sneaky-worker", "-n", namespace, check=False).returncode != 0
        await eventually(lambda: any(e.startswith("Warning HandlerNotAllowed")
                                     for e in event_lines(apiserver, namespace)),
                         what="a Warning Event")

        # Fixed to a granted module, it is synced.
        apiserver.kubectl("apply", "-n", namespace, "-f", "-",
                          input=HANDLER_PROVIDER.format(name="sneaky", handler="support.handlers:record_effect"))
        await ready(apiserver, namespace, "sneaky")
    finally:
        operator.stop()
