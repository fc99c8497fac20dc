"""The console's Kubernetes authorisation against the real kube-apiserver: real ServiceAccount tokens,
real RBAC, and the authorizer running as the chart's console ServiceAccount (its ClusterRole as
rendered by Helm), so a permission the chart lacks fails here too. The two teams and their accounts
are support/console_kube.py's World (the `world` fixture).
"""

from __future__ import annotations

import json
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hookline.console.kube import Connection, KubernetesAuthorizer, ProviderOwner
from support.console_kube import World
from support.kube import kget
from support.waiting import eventually


@pytest.fixture
def as_console(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process environment of a console outside a cluster: its kubeconfig, no in-cluster variables."""
    monkeypatch.setenv("KUBECONFIG", str(world.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield


@pytest.fixture
async def authorizer(as_console: None) -> AsyncIterator[KubernetesAuthorizer]:
    found = KubernetesAuthorizer()
    yield found
    await found.close()


async def test_a_namespace_reader_reads_its_provider_only_and_replays_nothing(
        world: World, authorizer: KubernetesAuthorizer) -> None:
    access = await authorizer.authorize_for(world.reader, world.providers)
    assert access is not None
    assert access.subject == f"system:serviceaccount:{world.team_a}:reader"
    assert access.read == {world.provider_a}
    assert access.replay == frozenset()
    assert not access.install_wide
    assert not access.may_read(world.provider_b) and not access.may_read(world.unowned)


async def test_patch_on_the_resource_allows_replay(world: World, authorizer: KubernetesAuthorizer) -> None:
    access = await authorizer.authorize_for(world.replayer, world.providers)
    assert access is not None
    assert (access.read, access.replay) == ({world.provider_a}, {world.provider_a})
    assert not access.install_wide


async def test_a_cluster_wide_reader_reads_every_provider_and_the_outbox(
        world: World, authorizer: KubernetesAuthorizer) -> None:
    access = await authorizer.authorize_for(world.cluster_reader, world.providers)
    assert access is not None
    assert access.read == {world.provider_a, world.provider_b, world.unowned}
    assert access.replay == frozenset()  # list and get, no patch
    assert access.install_wide


async def test_a_cluster_wide_patcher_replays_every_provider_the_unowned_one_included(
        world: World, authorizer: KubernetesAuthorizer) -> None:
    access = await authorizer.authorize_for(world.cluster_operator, world.providers)
    assert access is not None
    everything = {world.provider_a, world.provider_b, world.unowned}
    assert (access.read, access.replay, access.install_wide) == (everything, everything, True)


async def test_tokens_the_api_server_does_not_accept_get_nothing(
        world: World, authorizer: KubernetesAuthorizer) -> None:
    header, payload, _ = world.reader.split(".")
    forged = f"{header}.{payload}.c2lnbmF0dXJl"  # a real token's claims, a signature of our own
    for token in ("", "not-a-token", forged):
        assert await authorizer.authorize_for(token, world.providers) is None


def token_for(world: World, audience: str) -> str:
    """team-a's reader's token, issued for ``audience`` only."""
    return world.api.kubectl("create", "token", "reader", "-n", world.team_a, f"--audience={audience}").stdout.strip()


async def test_an_audience_the_token_was_not_issued_for_is_refused(world: World, as_console: None) -> None:
    meant = token_for(world, "hookline-console")
    strict = KubernetesAuthorizer(audiences=["hookline-console"])
    elsewhere = KubernetesAuthorizer(audiences=["another-service"])
    default = KubernetesAuthorizer()  # the API server's own audiences
    try:
        assert await strict.authorize_for(world.reader, world.providers) is None
        access = await strict.authorize_for(meant, world.providers)
        assert access is not None and access.read == {world.provider_a}
        assert await elsewhere.authorize_for(meant, world.providers) is None
        assert await default.authorize_for(meant, world.providers) is None
    finally:
        for authorizer in (strict, elsewhere, default):
            await authorizer.close()


async def test_a_console_with_audience_flags_accepts_only_tokens_issued_for_one_of_them(
        world: World, database_url: str, log_dir: Path) -> None:
    """``hookline console --auth kubernetes --audience X --audience Y``: the flags reach the TokenReview."""
    import aiohttp

    from support.processes import console

    meant, also, other = (token_for(world, a) for a in ("hookline-console", "hookline-ui", "another-service"))
    proc = console(database_url, log_dir, "--auth", "kubernetes", "--audience", "hookline-console",
                   "--audience", "hookline-ui",
                   env={"KUBECONFIG": str(world.kubeconfig), "KUBERNETES_SERVICE_HOST": ""})
    try:
        async with aiohttp.ClientSession(base_url=proc.url) as http:
            for token, status in ((meant, 200), (also, 200), (other, 401), (world.reader, 401)):
                async with http.get("/api/v1/providers", headers={"Authorization": f"Bearer {token}"}) as answer:
                    assert answer.status == status, (status, await answer.text())
        logs = proc.logs()
        assert all(token not in logs for token in (meant, also, other, world.reader))
    finally:
        proc.stop()


async def test_authorize_reads_the_providers_from_the_source(world: World, as_console: None) -> None:
    async def providers() -> list[ProviderOwner]:
        return world.providers

    with_source = KubernetesAuthorizer(provider_source=providers)
    try:
        access = await with_source.authorize(world.replayer)
        assert access is not None and access.replay == {world.provider_a}
    finally:
        await with_source.close()


def revoke(world: World, namespace: str, account: str) -> None:
    """Delete the RoleBindings that name ServiceAccount namespace/account."""
    for binding in kget(world.api, namespace, "rolebindings")["items"]:
        if any(s.get("name") == account for s in binding.get("subjects") or []):
            world.api.kubectl("delete", "rolebinding", binding["metadata"]["name"], "-n", namespace)


async def test_a_revoked_binding_denies_once_the_cache_expires(world: World, as_console: None) -> None:
    account = f"temp-{uuid.uuid4().hex[:6]}"
    token = world.account(world.team_b, account, ["get"])
    uncached = KubernetesAuthorizer(ttl=0)
    try:
        first = await uncached.authorize_for(token, world.providers)
        assert first is not None and first.read == {world.provider_b}
        revoke(world, world.team_b, account)
        second = await uncached.authorize_for(token, world.providers)
        assert second is not None and second.read == frozenset()
    finally:
        await uncached.close()


async def test_decisions_are_kept_for_the_ttl_and_the_cache_is_bounded(world: World, as_console: None) -> None:
    account = f"temp-{uuid.uuid4().hex[:6]}"
    token = world.account(world.team_b, account, ["get"])
    one_token = KubernetesAuthorizer(ttl=600, cache_size=1)
    try:
        first = await one_token.authorize_for(token, world.providers)
        assert first is not None and first.read == {world.provider_b}
        revoke(world, world.team_b, account)
        kept = await one_token.authorize_for(token, world.providers)
        assert kept is not None and kept.read == {world.provider_b}  # from the cache: not asked again
        await one_token.authorize_for(world.reader, world.providers)  # takes the only place
        asked_again = await one_token.authorize_for(token, world.providers)
        assert asked_again is not None and asked_again.read == frozenset()
    finally:
        await one_token.close()


async def test_an_unreachable_api_server_denies_and_logs_no_token(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    closed = Connection("https://127.0.0.1:1", ssl.create_default_context(), lambda: "Bearer console-credential")
    down = KubernetesAuthorizer(closed)
    try:
        with caplog.at_level(logging.WARNING, logger="hookline.console.kube"):
            assert await down.authorize_for(world.reader, world.providers) is None
    finally:
        await down.close()
    assert "TokenReview failed" in caplog.text
    assert world.reader not in caplog.text and "console-credential" not in caplog.text


async def test_a_replay_is_recorded_as_an_event_on_the_resource(world: World, authorizer: KubernetesAuthorizer) -> None:
    subject = f"system:serviceaccount:{world.team_a}:replayer"
    assert await authorizer.record_replay(world.team_a, world.whp_a, world.uid_a, subject, 3)

    def replayed() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = kget(world.api, world.team_a, "events")["items"]
        return [e for e in items if e.get("reason") == "Replayed" and e["involvedObject"]["name"] == world.whp_a]

    events = await eventually(replayed, what="a Replayed event on the WebhookProvider")
    event = events[0]
    assert event["type"] == "Normal"
    assert event["message"] == f"replayed 3 event(s) on behalf of {subject}"
    assert event["involvedObject"]["uid"] == world.uid_a
    assert event["involvedObject"]["kind"] == "WebhookProvider"
    assert event["reportingComponent"] == "hookline-console"
    # `kubectl describe whp` shows it, as operators look for it.
    described = world.api.kubectl("describe", "whp", world.whp_a, "-n", world.team_a).stdout
    assert "Replayed" in described
    text = json.dumps(event)
    for token in (world.reader, world.replayer, world.cluster_reader, world.cluster_operator):
        assert token not in text


async def test_the_console_cannot_read_webhookproviders_itself(world: World) -> None:
    token = world.console_token()
    result = world.api.kubectl("get", "whp", "-A", token=token, check=False)
    assert result.returncode != 0 and "Forbidden" in result.stderr


async def test_in_a_pod_the_mounted_token_and_ca_are_used(world: World, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kubelet mounts in the console's pod, and the `kubernetes` Service's variables."""
    (tmp_path / "ca.crt").write_bytes(world.api.ca_file.read_bytes())
    (tmp_path / "token").write_text(world.console_token() + "\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(world.api.port))
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # must not be what is used
    in_pod = KubernetesAuthorizer(Connection.in_cluster(tmp_path))
    try:
        access = await in_pod.authorize_for(world.reader, world.providers)
        assert access is not None and access.read == {world.provider_a}
    finally:
        await in_pod.close()


async def test_a_team_reads_only_its_own_providers_through_a_real_console(
        world: World, database_url: str, pool: Any, log_dir: Path) -> None:
    """``hookline console --auth kubernetes`` as a process, its kubeconfig the chart's console account:
    team-a's reader lists team-a's provider only, and team-b's event is a 404 (never a 403 that would
    say it exists); team-a's replayer replays its own dead letter, and the resource gets the Event."""
    import aiohttp

    from support.inbox import insert_events

    await world.store_providers(database_url, pool)
    [event_a] = await insert_events(pool, world.provider_a, 1)
    [event_b] = await insert_events(pool, world.provider_b, 1)
    await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 1 WHERE event_id = $1", event_a)
    proc = world.start_console(database_url, log_dir)
    try:
        async with aiohttp.ClientSession(base_url=proc.url) as http:
            def as_(token: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {token}"}

            async with http.get("/api/v1/providers", headers=as_(world.reader)) as answer:
                assert answer.status == 200
                names = {p["name"] for p in (await answer.json())["items"]}
            assert names == {world.provider_a}
            async with http.get("/api/v1/events", headers=as_(world.reader)) as answer:
                assert {e["event_id"] for e in (await answer.json())["items"]} == {event_a}
            async with http.get(f"/api/v1/events/{world.provider_b}/{event_b}", headers=as_(world.reader)) as answer:
                assert answer.status == 404
                assert answer.content_type == "application/problem+json"
            async with http.post("/api/v1/dead-letters/replay", json={"provider": world.provider_a, "filter": {}},
                                 headers=as_(world.reader)) as answer:
                assert answer.status == 403  # reads, may not replay
            async with http.post("/api/v1/dead-letters/replay", json={"provider": world.provider_a, "filter": {}},
                                 headers=as_(world.replayer)) as answer:
                assert answer.status == 200, await answer.text()
                assert (await answer.json())["count"] == 1
            async with http.get("/api/v1/events", headers=as_("not-a-token")) as answer:
                assert answer.status == 401
        assert await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = $1", event_a) == "pending"
        await eventually(lambda: any(
            e.get("reason") == "Replayed" and e["involvedObject"]["name"] == world.whp_a
            for e in json.loads(world.api.kubectl("get", "events", "-n", world.team_a, "-o", "json").stdout)["items"]),
            timeout=30)
        assert world.reader not in proc.logs() and world.replayer not in proc.logs()
    finally:
        proc.stop()


async def test_a_team_sees_and_replays_only_its_own_endpoints_through_a_real_console(
        world: World, database_url: str, pool: Any, log_dir: Path) -> None:
    """Both teams have a WebhookEndpoint `partner` (rows NAMESPACE/partner, as the operator writes
    them): `get` on team-a's resource shows team-a's endpoint, deliveries and events only; `patch`
    replays its dead deliveries and sends it a test event; team-b's are 404s either way."""
    import aiohttp

    reader = world.account(world.team_a, "endpoint-reader", ["get"], resource="webhookendpoints.hookline.io")
    replayer = world.account(world.team_a, "endpoint-replayer", ["get", "patch"],
                             resource="webhookendpoints.hookline.io")
    a, b = f"{world.team_a}/partner", f"{world.team_b}/partner"
    for namespace in (world.team_a, world.team_b):
        await pool.execute("INSERT INTO hookline.endpoints (name, namespace, resource_name, owner_uid, url, secrets) "
                           "VALUES ($1 || '/partner', $1, 'partner', 'uid-' || $1, 'http://127.0.0.1:9/hooks', "
                           "'[]')", namespace)
        await pool.execute("SELECT hookline.publish('order.paid', '{}', NULL, NULL, NULL, $1)", namespace)
    await pool.execute("UPDATE hookline.deliveries SET status = 'dead', attempts = 1")
    dead = {r["endpoint"]: r["id"] for r in await pool.fetch("SELECT endpoint, id FROM hookline.deliveries")}
    proc = world.start_console(database_url, log_dir)
    try:
        async with aiohttp.ClientSession(base_url=proc.url) as http:
            def as_(token: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {token}"}

            for token in (reader, replayer):
                async with http.get("/api/v1/endpoints", headers=as_(token)) as answer:
                    assert [e["name"] for e in (await answer.json())["items"]] == [a]
                async with http.get("/api/v1/deliveries", headers=as_(token)) as answer:
                    assert [d["endpoint"] for d in (await answer.json())["items"]] == [a]
                async with http.get(f"/api/v1/deliveries/{dead[b]}", headers=as_(token)) as answer:
                    assert answer.status == 404
                async with http.get(f"/api/v1/deliveries/{dead[a]}", headers=as_(token)) as answer:
                    assert answer.status == 200 and (await answer.json())["event_type"] == "order.paid"
            async with http.get("/api/v1/endpoints", headers=as_(world.reader)) as answer:
                assert (await answer.json())["items"] == []  # rights on providers are not rights on endpoints
            async with http.post("/api/v1/deliveries/replay", json={"endpoint": a}, headers=as_(reader)) as answer:
                assert answer.status == 403
            async with http.post("/api/v1/deliveries/replay", json={"endpoint": b}, headers=as_(replayer)) as answer:
                assert answer.status == 404
            async with http.post("/api/v1/deliveries/replay", json={"ids": [dead[b]]},
                                 headers=as_(replayer)) as answer:
                assert answer.status == 200 and (await answer.json())["count"] == 0
            async with http.post("/api/v1/deliveries/replay", json={"all": True}, headers=as_(replayer)) as answer:
                assert answer.status == 200 and (await answer.json())["count"] == 1
            async with http.post(f"/api/v1/endpoints/{b}/test", headers=as_(replayer)) as answer:
                assert answer.status == 404
            async with http.post(f"/api/v1/endpoints/{a}/test", headers=as_(reader)) as answer:
                assert answer.status == 403
            async with http.post(f"/api/v1/endpoints/{a}/test", headers=as_(replayer)) as answer:
                assert answer.status == 202, await answer.text()
        statuses = {r["endpoint"]: r["status"] for r in await pool.fetch(
            "SELECT endpoint, status FROM hookline.deliveries WHERE id = ANY ($1)", list(dead.values()))}
        assert statuses == {a: "pending", b: "dead"}
        await eventually(lambda: any(
            e.get("reason") == "Replayed" and e["involvedObject"] == {
                **e["involvedObject"], "kind": "WebhookEndpoint", "name": "partner"}
            and "replayed 1 delivery(ies)" in e["message"]
            for e in json.loads(world.api.kubectl("get", "events", "-n", world.team_a, "-o", "json").stdout)["items"]),
            timeout=30)
        assert await pool.fetchval("SELECT count(*) FROM hookline.deliveries AS d JOIN hookline.outbox AS o "
                                   "ON o.id = d.outbox_id WHERE o.event_type = 'hookline.test' "
                                   "AND d.endpoint = $1 AND o.namespace = $2", a, world.team_a) == 1
    finally:
        proc.stop()
