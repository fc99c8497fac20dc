"""The chart end to end on a real single-node cluster: what a platform team does on its first day.

helm install (dev values, with the database in an existing Secret) -> the migrate hook Job completes ->
receiver, relay and operator pods Ready through their probes -> a WebhookProvider -> signed events through
`kubectl port-forward` accepted -> the operator scales the provider's worker Deployment up -> worker pods
deliver every event (effects counted at a real HTTP destination) -> the Deployment scales back down ->
`hookline.io/replay-dlq` replays dead events -> `helm test` passes -> `helm uninstall` keeps CRD and data.

The database is the test session's embedded Postgres on this machine, reached from pods at the node's
address (a TCP relay): the dev values' Postgres StatefulSet needs an image from a registry and a volume
provisioner, neither of which this machine has (tests/cluster/README.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from tcprelay import TcpRelay

from cluster import IMAGES, Cluster
from support.kube import kget as kube_get
from support.postgres import PgServer
from support.senders import standard_webhooks
from support.waiting import eventually_sync

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hookline"
NAMESPACE = "hookline"
RELEASE = "hookline"
PROVIDER = "orders"
EVENTS = 40
FAILING = 5  # events the destination refuses until it is healed: they go dead, then get replayed
WAIT = 180.0  # seconds any one thing may take on a loaded two-core machine


# --- a destination the workers deliver to ----------------------------------------------------------------------
class Destination:
    """A real HTTP endpoint on the node's address; counts each event's effect once (by its id)."""

    def __init__(self, host: str) -> None:
        self.effects: set[str] = set()
        self.refusing = True
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                refuse = owner.refusing and body.get("fail", False)
                if not refuse:
                    with owner._lock:
                        owner.effects.add(body["id"])
                self.send_response(500 if refuse else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self._lock:
            return len(self.effects)


# --- fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def database(pg_server: PgServer, cluster: Cluster) -> Iterator[tuple[str, str]]:
    """(URL for pods, URL for this test) of an empty database: the chart's migrate Job creates the schema."""
    name = asyncio.run(pg_server.create_database(template=None))
    local = pg_server.url_for(name)
    with TcpRelay(cluster.node_ip, local) as relay:
        yield relay.rewrite(local), local
    asyncio.run(pg_server.drop_database(name))


@pytest.fixture(scope="module")
def destination(cluster: Cluster) -> Iterator[Destination]:
    endpoint = Destination(cluster.node_ip)
    yield endpoint
    endpoint.server.shutdown()


@contextmanager
def step(cluster: Cluster, what: str) -> Iterator[None]:
    """One step of the story; on failure the message says which, with the namespace's pods, events and logs.
    Each step's duration is printed (shown with -s, and with a failure's captured output)."""
    started = time.monotonic()
    try:
        yield
    except (AssertionError, subprocess.SubprocessError, TimeoutError) as exc:
        raise AssertionError(f"step failed: {what}: {exc}\n{cluster.diagnostics(NAMESPACE)}") from exc
    print(f"{time.monotonic() - started:6.1f}s  {what}")


def kget(cluster: Cluster, *what: str) -> dict[str, Any]:
    return kube_get(cluster.api, NAMESPACE, *what)


def rows(local_url: str, query: str) -> int:
    async def fetch() -> int:
        conn = await asyncpg.connect(local_url)
        try:
            value: int = await conn.fetchval(query)
            return value
        finally:
            await conn.close()

    return asyncio.run(fetch())


@contextmanager
def port_forward(cluster: Cluster, target: str, port: int) -> Iterator[int]:
    """`kubectl port-forward` on loopback; yields the local port."""
    argv = [str(cluster.api.assets / "kubectl"), f"--kubeconfig={cluster.api.kubeconfig}", "port-forward",
            "-n", NAMESPACE, "--address=127.0.0.1", target, f"0:{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+) ->", line)
        assert match, f"kubectl port-forward did not start: {line}{proc.stdout.read() if proc.poll() else ''}"
        yield int(match.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def send(port: int, secret: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **standard_webhooks(raw, body["id"], secret)}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/webhooks/{PROVIDER}", raw, headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def provider_manifest(destination_url: str) -> str:
    return json.dumps({
        "apiVersion": "hookline.io/v1alpha1",
        "kind": "WebhookProvider",
        "metadata": {"name": PROVIDER, "namespace": NAMESPACE},
        "spec": {
            "signature": {"scheme": "standard-webhooks", "secretRef": {"name": f"{PROVIDER}-webhook", "key": "secret"}},
            "destination": {"url": destination_url, "timeoutSeconds": 10},
            # One attempt: a refused event is dead at once, for the replay step.
            "retry": {"maxAttempts": 1, "initialDelaySeconds": 1, "maxDelaySeconds": 1},
            "workers": {"minReplicas": 0, "maxReplicas": 2, "targetBacklogPerReplica": 10,
                        "scaleDownStabilizationSeconds": 5},
        },
    })


def helm_values(database_secret: str) -> list[str]:
    """The dev values, with the database in an existing Secret and the images from containerd's store."""
    repository, tag = IMAGES["hookline"].rsplit(":", 1)
    sets = {
        "devPostgres.enabled": "false",
        "database.existingSecret": database_secret,
        # The production path for migrations: a pre-install hook that must complete before anything starts.
        "migrate.hook": "true",
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "Never",
        "worker.image": IMAGES["hookline-service"],
        # Decide scaling every 2 s instead of 10 s: the story is the same, the test is shorter.
        "operator.extraArgs[0]": "--interval=2",
    }
    return ["-f", str(CHART / "values-dev.yaml"), *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]


# --- the story -------------------------------------------------------------------------------------------------
def test_helm_install_to_uninstall(cluster: Cluster, database: tuple[str, str], destination: Destination) -> None:
    pod_url, local_url = database
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "secret", "generic", "hookline-database", "-n", NAMESPACE,
                    f"--from-literal=url={pod_url}")

    with step(cluster, "helm install with the migrate hook"):
        cluster.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, *helm_values("hookline-database"),
                     "--wait", "--timeout=10m")
        assert rows(local_url, "SELECT count(*) FROM hookline.schema_migrations") > 0, "migrate Job ran no migration"

    with step(cluster, "receiver, relay and operator pods Ready through their probes"):
        for component in ("receiver", "relay", "operator"):
            cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "pod", "--timeout=300s",
                            "-l", f"app.kubernetes.io/component={component}")

    with step(cluster, "a WebhookProvider gets its generated signing Secret"):
        cluster.kubectl("apply", "-f", "-", input=provider_manifest(destination.url))
        secret = eventually_sync(lambda: kget(cluster, "secret", f"{PROVIDER}-webhook")["data"]["secret"],
                                 what="the operator to generate the signing Secret", timeout=WAIT)
        signing_secret = base64.b64decode(secret).decode()

    ids = [f"evt-{uuid.uuid4().hex[:12]}" for _ in range(EVENTS)]
    with step(cluster, "signed events through kubectl port-forward are accepted"), \
            port_forward(cluster, f"svc/{RELEASE}-receiver", 80) as port:
        bodies = [{"id": event_id, "fail": n < FAILING} for n, event_id in enumerate(ids)]
        # The receiver learns of a new provider from the database a moment after the operator stores it.
        answers = [eventually_sync(lambda: send(port, signing_secret, bodies[0]),
                                   what="the receiver to know the provider", timeout=WAIT)]
        answers += [send(port, signing_secret, body) for body in bodies[1:]]
        assert [(status, answer["status"]) for status, answer in answers] == [(200, "accepted")] * EVENTS, answers

    with step(cluster, "the operator scales the worker Deployment up with the backlog"):
        eventually_sync(lambda: kget(cluster, "deployment", f"{PROVIDER}-worker")["spec"]["replicas"] >= 1,
                        what="worker replicas >= 1", timeout=WAIT)

    with step(cluster, "worker pods deliver every event that is not refused"):
        eventually_sync(lambda: destination.count() == EVENTS - FAILING, what=f"{EVENTS - FAILING} effects",
                        timeout=300)
        eventually_sync(lambda: rows(local_url, "SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == FAILING,
                        what=f"{FAILING} dead events", timeout=WAIT)

    with step(cluster, "the worker Deployment scales back down"):
        eventually_sync(lambda: kget(cluster, "deployment", f"{PROVIDER}-worker")["spec"]["replicas"] == 0,
                        what="worker replicas == 0", timeout=240)

    with step(cluster, "kubectl annotate hookline.io/replay-dlq replays the dead events"):
        destination.refusing = False
        cluster.kubectl("annotate", "-n", NAMESPACE, "whp", PROVIDER, "hookline.io/replay-dlq=first", "--overwrite")
        replay = eventually_sync(lambda: kget(cluster, "whp", PROVIDER)["status"]["replay"], what="status.replay",
                                 timeout=WAIT)
        eventually_sync(lambda: kget(cluster, "whp", PROVIDER)["status"]["replay"]["lastHandledToken"] == "first",
                        what="the replay token acknowledged", timeout=WAIT)
        assert kget(cluster, "whp", PROVIDER)["status"]["replay"]["requeued"] == FAILING, replay
        eventually_sync(lambda: destination.count() == EVENTS, what=f"all {EVENTS} effects after the replay",
                        timeout=300)

    with step(cluster, "helm test"):
        cluster.helm("test", RELEASE, "-n", NAMESPACE, "--timeout=5m")

    with step(cluster, "helm uninstall keeps the CRD and the data"):
        cluster.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=5m")
        cluster.kubectl("get", "crd", "webhookproviders.hookline.io")
        assert rows(local_url, "SELECT count(*) FROM hookline.inbox") == EVENTS
