"""WebhookEndpoint end to end: a real kube-apiserver, the operator as the chart's Role allows it, a
real relay process, real HTTP endpoints verifying with `standardwebhooks` and `svix`, and two teams
that each publish with the credential the operator wrote into their own namespace."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from apiserver import ApiServer

from support.endpoints import Answer, Received, TestEndpoint
from support.kube import kget
from support.operator import condition, event_lines, permission_errors, start_operator
from support.processes import ServiceProcess, relay
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENDPOINT = """
apiVersion: hookline.io/v1alpha1
kind: WebhookEndpoint
metadata: {{name: {name}}}
spec:
  url: "{url}"
  eventTypes: ["order.*"]
  retry: {{maxAttempts: {attempts}, initialDelaySeconds: 0.2, maxDelaySeconds: 0.5}}
  rateLimit: {{perSecond: 100, burst: 20, maxInFlight: 4}}
"""


def new_namespace(apiserver: ApiServer) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    apiserver.kubectl("create", "namespace", name)
    return name


def secret_data(apiserver: ApiServer, namespace: str, name: str) -> dict[str, str]:
    found = kget(apiserver, namespace, "secret", name)
    return {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}


async def ready(apiserver: ApiServer, namespace: str, name: str, reason: str = "Reconciled") -> dict[str, Any]:
    whe: dict[str, Any] = await eventually(
        lambda: (o := kget(apiserver, namespace, "whe", name)) and condition(o, "Ready").get("reason") == reason and o,
        what=f"{namespace}/{name} Ready ({reason})")
    return whe


async def publish(url: str, event_type: str, n: int) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT hookline.publish($1, jsonb_build_object('n', $2::int))", event_type, n))
    finally:
        await conn.close()


class Team:
    """One namespace with a WebhookEndpoint `partner` at its own test server."""

    def __init__(self, apiserver: ApiServer, endpoint: TestEndpoint) -> None:
        self.apiserver, self.endpoint = apiserver, endpoint
        self.namespace = new_namespace(apiserver)

    async def apply(self, attempts: int = 10) -> None:
        self.apiserver.kubectl("apply", "-n", self.namespace, "-f", "-",
                               input=ENDPOINT.format(name="partner", url=self.endpoint.url, attempts=attempts))
        whe = await ready(self.apiserver, self.namespace, "partner")
        self.endpoint.secret = secret_data(self.apiserver, self.namespace, "partner-endpoint-secret")["secret"]
        self.publisher = secret_data(self.apiserver, self.namespace, whe["status"]["publisherSecret"])["url"]


@pytest.fixture
async def two_teams(apiserver: ApiServer, database_url: str, log_dir: Path) -> Any:
    async with TestEndpoint("whsec_placeholder") as ep_a, TestEndpoint("whsec_placeholder") as ep_b:
        a, b = Team(apiserver, ep_a), Team(apiserver, ep_b)
        operator = start_operator(apiserver, [a.namespace, b.namespace], database_url, log_dir)
        relays: list[ServiceProcess] = []
        try:
            await asyncio.gather(a.apply(), b.apply())
            relays.append(await asyncio.to_thread(relay, database_url, log_dir, "--allow-private-networks"))
            yield a, b, operator
        finally:
            for process in relays:
                process.stop()
            operator.stop()
        assert not permission_errors(operator.logs()), "\n".join(permission_errors(operator.logs())[:20])


async def test_each_team_publishes_to_its_own_partner_only_signed_with_its_secret(
        two_teams: Any, apiserver: ApiServer, pool: asyncpg.Pool) -> None:
    a, b, operator = two_teams
    # Both namespaces have an endpoint `partner`; the rows are qualified by namespace.
    rows = {r["name"]: r for r in await pool.fetch("SELECT * FROM hookline.endpoints")}
    assert set(rows) == {f"{a.namespace}/partner", f"{b.namespace}/partner"}
    row = rows[f"{a.namespace}/partner"]
    assert (row["rate_per_second"], row["rate_burst"], row["max_in_flight"], row["max_attempts"]) == (100, 20, 4, 10)
    assert a.endpoint.secret != b.endpoint.secret and a.endpoint.secret.startswith("whsec_")

    ids_a = [await publish(a.publisher, "order.paid", n) for n in range(3)]
    ids_b = [await publish(b.publisher, "order.paid", n) for n in range(2)]
    await publish(a.publisher, "user.created", 9)  # not an event type of the endpoint
    await eventually(lambda: len(a.endpoint.delivered()) == 3 and len(b.endpoint.delivered()) == 2)
    # TestEndpoint verified each with standardwebhooks and svix, with its own team's secret.
    assert [r.webhook_id for r in a.endpoint.delivered()] == ids_a and a.endpoint.invalid == []
    assert [r.webhook_id for r in b.endpoint.delivered()] == ids_b and b.endpoint.invalid == []

    # Neither team's publisher can see, replay, pause or publish to the other's endpoint.
    conn = await asyncpg.connect(a.publisher)
    try:
        own = f"{a.namespace}/partner"
        assert [r["name"] for r in await conn.fetch("SELECT name FROM hookline.endpoints")] == [own]
        assert {r["endpoint"] for r in await conn.fetch("SELECT endpoint FROM hookline.deliveries")} == {own}
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT hookline.publish('order.paid', '{}', NULL, NULL, NULL, $1)", b.namespace)
        for statement in ("UPDATE hookline.endpoints SET paused = true",
                          "UPDATE hookline.deliveries SET status = 'pending' WHERE status = 'dead'",
                          "SELECT secrets FROM hookline.endpoints"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()

    whe = await eventually(lambda: (o := kget(apiserver, a.namespace, "whe", "partner"))
                           and o["status"].get("deliveredLastHour") == 3 and o)
    assert whe["status"]["circuit"] == "closed" and whe["status"]["deadLetters"] == 0
    assert condition(whe, "CircuitClosed")["status"] == "True" and condition(whe, "SecretReady")["status"] == "True"
    # An unchanged endpoint's row is not written again (each write makes every relay re-read): one
    # write at creation (two when the create handler and the first tick raced), none per tick since.
    assert sum("EndpointSynced" in e for e in event_lines(apiserver, a.namespace)) <= 2
    listed = apiserver.kubectl("get", "whe", "-n", a.namespace).stdout.splitlines()
    assert listed[0].split() == ["NAME", "URL", "READY", "CIRCUIT", "PENDING", "DEAD", "AGE"]
    assert listed[1].split()[:6] == ["partner", a.endpoint.url, "True", "closed", "0", "0"]
    # No secret in the resource, its Events or the operator's log.
    for secret in (a.endpoint.secret, a.publisher.split("@")[0].rsplit(":", 1)[1]):
        assert secret not in json.dumps(whe) and all(secret not in e for e in event_lines(apiserver, a.namespace))
        assert secret not in operator.logs()


async def test_pause_rotation_and_replay_go_through_the_resource(two_teams: Any, apiserver: ApiServer,
                                                                 pool: asyncpg.Pool) -> None:
    a, _b, _operator = two_teams
    name, ns = f"{a.namespace}/partner", a.namespace

    # paused: deliveries wait, then go in order once it is unpaused.
    apiserver.kubectl("patch", "whe", "partner", "-n", ns, "--type=merge", "-p", '{"spec": {"paused": true}}')
    await ready(apiserver, ns, "partner", "Paused")
    await eventually(lambda: pool.fetchval("SELECT paused FROM hookline.endpoints WHERE name = $1", name))
    await asyncio.sleep(0.5)  # the relay's next claim sees the pause (docs/outbox.md)
    paused_ids = [await publish(a.publisher, "order.paid", n) for n in range(3)]
    await asyncio.sleep(1.0)
    assert a.endpoint.received == []
    apiserver.kubectl("patch", "whe", "partner", "-n", ns, "--type=merge", "-p", '{"spec": {"paused": false}}')
    await eventually(lambda: len(a.endpoint.delivered()) == 3)
    assert {r.webhook_id for r in a.endpoint.delivered()} == set(paused_ids)

    # rotate-secret: a new key; for the overlap both sign, so a receiver on either key verifies.
    old = a.endpoint.secret
    apiserver.kubectl("annotate", "whe", "partner", "-n", ns, "hookline.io/rotate-secret=r1")
    whe = await eventually(lambda: (o := kget(apiserver, ns, "whe", "partner"))
                           and (o["status"].get("rotation") or {}).get("lastHandledToken") == "r1" and o)
    assert whe["status"]["rotation"]["result"] == "Rotated"
    rotated_secret = secret_data(apiserver, ns, "partner-endpoint-secret")
    new = rotated_secret["secret"]
    assert new != old and json.loads(rotated_secret["previous"])[0]["value"] == old
    await eventually(lambda: pool.fetchval("SELECT jsonb_array_length(secrets) = 2 FROM hookline.endpoints "
                                           "WHERE name = $1", name))
    await asyncio.sleep(0.5)  # the relay re-reads the endpoint on its notification
    for key, n in ((old, 7), (new, 8)):  # the receiver verifies with either key (TestEndpoint.invalid)
        a.endpoint.secret = key
        rotated = await publish(a.publisher, "order.paid", n)
        await eventually(lambda rotated=rotated: rotated in {r.webhook_id for r in a.endpoint.delivered()})
        last = next(r for r in a.endpoint.received if r.webhook_id == rotated)
        assert len(last.headers["webhook-signature"].split()) == 2 and a.endpoint.invalid == []

    # replay-dlq: deliveries that died while the endpoint failed are sent again on request.
    failing = True

    def behaviour(_n: int, _r: Received) -> Answer:
        return Answer(500 if failing else 200)

    a.endpoint.behaviour = behaviour
    apiserver.kubectl("patch", "whe", "partner", "-n", ns, "--type=merge", "-p",
                      '{"spec": {"retry": {"maxAttempts": 1}}}')
    await eventually(lambda: pool.fetchval("SELECT max_attempts = 1 FROM hookline.endpoints WHERE name = $1", name))
    await asyncio.sleep(0.5)
    dead = [await publish(a.publisher, "order.paid", n) for n in range(2)]
    whe = await eventually(lambda: (o := kget(apiserver, ns, "whe", "partner"))
                           and o["status"].get("deadLetters") == 2 and o)
    assert "500" in whe["status"]["lastError"]
    failing = False
    apiserver.kubectl("annotate", "whe", "partner", "-n", ns, "hookline.io/replay-dlq=first")
    await eventually(lambda: set(dead) <= {r.webhook_id for r in a.endpoint.delivered()})
    whe = await eventually(lambda: (o := kget(apiserver, ns, "whe", "partner"))
                           and o["status"].get("deadLetters") == 0 and o)
    assert whe["status"]["replay"]["requeued"] == 2

    # Deleting the resource removes the row (and its deliveries); the other team's stays.
    apiserver.kubectl("delete", "whe", "partner", "-n", ns, "--wait=false")
    await eventually(lambda: pool.fetchval("SELECT count(*) = 0 FROM hookline.endpoints WHERE name = $1", name))
    assert await pool.fetchval("SELECT count(*) FROM hookline.endpoints") == 1


async def test_bad_resources_are_refused_by_the_api_server_with_the_field_named(apiserver: ApiServer,
                                                                                namespace: str) -> None:
    cases = [
        ('url: "ftp://example.com/x"', "url must be an absolute http:// or https:// URL"),
        ('url: "https://user:pw@example.com/x"', "must not carry credentials"),
        ('url: "https://example.com/x"\n  rateLimit: {perSecond: 5}', "perSecond and rateLimit.burst go together"),
        ('url: "https://example.com/x"\n  rateLimit: {}', "needs perSecond and burst, or maxInFlight"),
        ('url: "https://example.com/x"\n  retry: {initialDelaySeconds: 10, maxDelaySeconds: 1}',
         "must not exceed retry.maxDelaySeconds"),
        ('url: "https://example.com/x"\n  eventTypes: ["order paid"]', "eventTypes"),
    ]
    for spec, message in cases:
        refused = apiserver.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=(
            "apiVersion: hookline.io/v1alpha1\nkind: WebhookEndpoint\nmetadata: {name: bad}\nspec:\n  " + spec))
        assert refused.returncode != 0 and message in refused.stderr, (spec, refused.stderr)
    assert apiserver.kubectl("get", "whe", "-n", namespace, "-o", "name").stdout.strip() == ""
    explained = apiserver.kubectl("explain", "whe.spec.rateLimit").stdout
    assert "held by all relays together" in explained and "maxInFlight" in explained


EGRESS_ENDPOINT = """
apiVersion: hookline.io/v1alpha1
kind: WebhookEndpoint
metadata: {{name: secured}}
spec:
  url: "{url}"
  retry: {{maxAttempts: 20, initialDelaySeconds: 0.2, maxDelaySeconds: 0.5}}
  tls:
    clientCertificateSecretRef: {{name: relay-client}}
    caSecretRef: {{name: partner-ca}}
  auth:
    oauth2:
      tokenUrl: "{token_url}"
      clientId: hookline
      clientSecretRef: {{name: partner-oauth}}
      scopes: ["hooks:write"]
  proxy:
    url: "{proxy_url}"
    credentialsSecretRef: {{name: egress-proxy}}
"""


async def test_mtls_and_oauth2_come_from_the_namespaces_secrets(apiserver: ApiServer, database_url: str,
                                                               log_dir: Path, tmp_path: Path) -> None:
    """spec.tls and spec.auth name Secrets of the namespace; the operator stores their values sealed
    (set_egress), the relay presents the client certificate to a server that demands one and sends a
    token from the token endpoint. A missing Secret says so in Ready; nothing secret leaves the Secrets."""
    from support.oauth import token_server
    from support.proxy import ConnectProxy
    from support.tls import issue, make_ca, mtls_server_context, pem
    from support.tls_terminator import TlsTerminator

    client_secret = f"oauth-{uuid.uuid4().hex}"
    ca = make_ca("partner CA")
    ca_pem = pem(ca)[0]
    client_cert, client_key = pem(issue(ca, "hookline-relay", client=True))
    server = mtls_server_context(ca, tmp_path)
    (tmp_path / "client.pem").write_text(client_cert)
    (tmp_path / "client.key").write_text(client_key)
    (tmp_path / "ca.crt").write_text(ca_pem)

    ns = new_namespace(apiserver)
    proxy_password = f"proxy-{uuid.uuid4().hex}"
    async with token_server({"hookline": client_secret}) as tokens, TestEndpoint("whsec_x", tokens.answer) as ep, \
            ConnectProxy(credentials=f"relay:{proxy_password}") as proxy:
        with TlsTerminator(server, ep.port) as front:
            operator = start_operator(apiserver, [ns], database_url, log_dir)
            relays: list[ServiceProcess] = []
            try:
                apiserver.kubectl("apply", "-n", ns, "-f", "-", input=EGRESS_ENDPOINT.format(
                    url=f"https://localhost:{front.port}/hook", token_url=tokens.url, proxy_url=proxy.url))
                missing = await ready(apiserver, ns, "secured", "EgressSecretMissing")
                assert "relay-client" in condition(missing, "Ready")["message"]
                apiserver.kubectl("create", "secret", "tls", "relay-client", "-n", ns,
                                  f"--cert={tmp_path / 'client.pem'}", f"--key={tmp_path / 'client.key'}")
                apiserver.kubectl("create", "secret", "generic", "partner-ca", "-n", ns,
                                  f"--from-file=ca.crt={tmp_path / 'ca.crt'}")
                apiserver.kubectl("create", "secret", "generic", "partner-oauth", "-n", ns,
                                  f"--from-literal=client-secret={client_secret}")
                apiserver.kubectl("create", "secret", "generic", "egress-proxy", "-n", ns,
                                  f"--from-literal=credentials=relay:{proxy_password}")
                whe = await ready(apiserver, ns, "secured")
                ep.secret = secret_data(apiserver, ns, "secured-endpoint-secret")["secret"]
                publisher = secret_data(apiserver, ns, whe["status"]["publisherSecret"])["url"]
                relays.append(await asyncio.to_thread(relay, database_url, log_dir, "--allow-private-networks"))
                ids = [await publish(publisher, "order.paid", n) for n in range(3)]
                await eventually(lambda: len(ep.delivered()) == 3, timeout=30)
                assert {r.webhook_id for r in ep.delivered()} == set(ids) and ep.invalid == []
                assert front.failures == [] and len(tokens.issued) == 1
                # The deliveries and the token request went through the endpoint's own proxy, with its
                # credentials from the Secret, to the checked addresses.
                assert {a.authority for a in proxy.asked} >= {f"127.0.0.1:{front.port}"}
                whe = kget(apiserver, ns, "whe", "secured")
                logs = operator.logs() + "".join(r.logs() for r in relays)
                for secret in (client_key.splitlines()[1], client_secret, tokens.issued[0], proxy_password):
                    assert secret not in json.dumps(whe) and secret not in logs
                    assert all(secret not in e for e in event_lines(apiserver, ns))
            finally:
                for process in relays:
                    process.stop()
                operator.stop()


async def test_a_secret_of_your_own_is_read_and_never_rotated(apiserver: ApiServer, database_url: str,
                                                             log_dir: Path, pool: asyncpg.Pool) -> None:
    ns = new_namespace(apiserver)
    mine = "whsec_" + base64.b64encode(uuid.uuid4().bytes * 2).decode()
    apiserver.kubectl("create", "secret", "generic", "partner-key", "-n", ns, f"--from-literal=signing={mine}")
    operator = start_operator(apiserver, [ns], database_url, log_dir)
    try:
        apiserver.kubectl("apply", "-n", ns, "-f", "-", input=(
            "apiVersion: hookline.io/v1alpha1\nkind: WebhookEndpoint\nmetadata: {name: partner}\nspec:\n"
            "  url: https://partner.example/hooks\n  secretRef: {name: partner-key, key: signing}\n"))
        whe = await ready(apiserver, ns, "partner")
        assert condition(whe, "SecretReady")["reason"] == "SecretFound"
        apiserver.kubectl("annotate", "whe", "partner", "-n", ns, "hookline.io/rotate-secret=r1")
        whe = await eventually(lambda: (o := kget(apiserver, ns, "whe", "partner"))
                               and (o["status"].get("rotation") or {}).get("lastHandledToken") == "r1" and o)
        assert whe["status"]["rotation"]["result"] == "Refused"
        assert secret_data(apiserver, ns, "partner-key") == {"signing": mine}
        assert "partner-endpoint-secret" not in apiserver.kubectl("get", "secrets", "-n", ns, "-o", "name").stdout
        # The row signs with your key (sealed at rest: not readable in the column).
        stored = await pool.fetchval("SELECT secrets::text FROM hookline.endpoints WHERE name = $1", f"{ns}/partner")
        assert mine not in stored
    finally:
        operator.stop()
    assert mine not in operator.logs()
