"""The images `make images` builds (tests/images/build.sh), run under podman exactly as the chart runs
them: its user, a read-only root file system with an emptyDir (here a tmpfs) at /tmp, no
capabilities, no privilege escalation, and the chart's own arguments and environment.

Skipped, with the reason, when podman or the images' other build tools are missing; with
HOOKLINE_REQUIRE_CLUSTER=1 that is a failure instead (CI).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hookline.core import secrets_at_rest
from hookline.core.embedded import free_port
from support import senders
from support.kube import ApiServer, kget, require_assets
from support.operator import condition
from support.postgres import PgServer, database_with_providers
from support.waiting import eventually_sync

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "chart"))  # tests/ is not a package: the chart renderer

from chartkit import render_default  # noqa: E402

BUILD = REPO / "tests" / "images" / "build.sh"
IMAGES = {"service": "localhost/hookline-service:dev", "operator": "localhost/hookline:dev"}
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF",
                                                                str(REPO / "tests" / "images" / "containers.conf"))}
REQUIRED = os.environ.get("HOOKLINE_REQUIRE_CLUSTER") == "1"
# The first test's fixture may build the images (a cold build with debootstrap takes minutes).
pytestmark = pytest.mark.timeout(1800)


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (and HOOKLINE_REQUIRE_CLUSTER=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """The two images, built (or found up to date) by the same script as `make images`."""
    if shutil.which("podman") is None:
        _unavailable("podman is not installed: apt-get install -y podman buildah runc debootstrap, then make images")
    # A no-op when the archives match the sources; a rebuild (minutes) when the code changed.
    built = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=1800, env=PODMAN_ENV, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    if not built.stdout.strip():  # the script says which tool is missing and builds nothing
        _unavailable(built.stderr.strip())
    return IMAGES


# -- running a container the way the chart runs it ------------------------------------------------


@functools.cache  # one Helm render per session
def _receiver_container() -> dict[str, Any]:
    pod = render_default().component("Deployment", "receiver")[0]["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return {"pod": pod, "container": container}


def chart_security_flags() -> list[str]:
    """podman flags for the receiver pod's securityContext and emptyDir mounts (every component uses
    the same helpers)."""
    found = _receiver_container()
    pod, container = found["pod"], found["container"]
    pod_context, context = pod["securityContext"], container["securityContext"]
    flags = ["--user", f"{pod_context['runAsUser']}:{pod_context['runAsGroup']}"]
    if context.get("readOnlyRootFilesystem"):
        # podman --read-only adds its own tmpfs on /tmp, /var/tmp and /run; the chart gives only
        # its emptyDirs, so those are turned off and the emptyDirs added one by one.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in empty_dirs:
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,mode=0777"]  # an emptyDir is world-writable
    for capability in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    return flags


def chart_env() -> list[str]:
    """The receiver container's literal environment (the database URL comes from a Secret there)."""
    env = _receiver_container()["container"].get("env", [])
    return [f"--env={e['name']}={e['value']}" for e in env if "value" in e]


@functools.cache
def keys_volume() -> list[str]:
    """The session's key file (tests/conftest.py) where the chart's environment says the key file is,
    as the chart mounts its key Secret there: readable by the image's user (10001), as a Secret volume is."""
    env = {e["name"]: e.get("value") for e in _receiver_container()["container"].get("env", [])}
    path = env.get(secrets_at_rest.KEYS_FILE_ENV)
    if not path:
        return []
    folder = Path(tempfile.mkdtemp(prefix="hookline-image-keys-"))
    folder.chmod(0o755)
    copy = folder / "keys"
    shutil.copyfile(os.environ[secrets_at_rest.KEYS_FILE_ENV], copy)
    copy.chmod(0o444)
    return [f"{copy}:{path}:ro"]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=PODMAN_ENV,
                          check=False)


def run(image: str, *args: str, entrypoint: str | None = None, env: dict[str, str] | None = None,
        flags: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """One container to completion, with the chart's security settings unless `flags` says otherwise."""
    options = [*(chart_security_flags() if flags is None else flags), "--network", "host"]
    if entrypoint:
        options += ["--entrypoint", entrypoint]
    options += [f"--env={k}={v}" for k, v in (env or {}).items()]
    return podman("run", "--rm", *options, image, *args)


class Container:
    """A detached container, removed on exit; `logs()` explains a failure."""

    def __init__(self, image: str, *args: str, env: dict[str, str], volumes: list[str] | None = None) -> None:
        self.name = f"hookline-test-{uuid.uuid4().hex[:12]}"
        started = podman("run", "--detach", "--name", self.name, *chart_security_flags(), *chart_env(),
                         "--network", "host", *(f"--env={k}={v}" for k, v in env.items()),
                         *(f"--volume={v}" for v in [*keys_volume(), *(volumes or [])]), image, *args)
        if started.returncode != 0:
            self.remove()  # a container can exist although it failed to start
            raise AssertionError(started.stderr)

    def remove(self) -> None:
        podman("rm", "--force", "--time", "10", self.name, timeout=60)

    def logs(self) -> str:
        logs = podman("logs", self.name)
        return logs.stdout + logs.stderr

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip()
        return state == "true"

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def http_get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def http_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def fetchval(url: str, sql: str, *args: object) -> Any:
    async def query() -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(query())


# -- what the image is --------------------------------------------------------------------------


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_as_the_charts_numeric_non_root_user(images: dict[str, str], image: str) -> None:
    configured = podman("image", "inspect", "--format", "{{.Config.User}}", images[image]).stdout.strip()
    pod = _receiver_container()["pod"]
    # The kubelet's runAsNonRoot check needs a numeric user in the image; the chart runs the same one.
    assert configured == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    # No --user here: the image's own default.
    result = run(images[image], "-c", "import os; print(os.getuid(), os.getgid())", entrypoint="python",
                 flags=["--read-only", "--read-only-tmpfs=false"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == configured.split(":")


@pytest.mark.parametrize("image", IMAGES)
def test_root_file_system_stays_read_only_and_tmp_is_writable(images: dict[str, str], image: str) -> None:
    probe = (
        "import pathlib, sys\n"
        "pathlib.Path('/tmp/probe').write_text('ok')\n"
        "try:\n"
        "    pathlib.Path(sys.prefix, 'probe').write_text('no')\n"
        "except OSError as error:\n"
        "    print(error.strerror)\n"
    )
    result = run(images[image], "-c", probe, entrypoint="python")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Read-only file system", result.stdout


@pytest.mark.parametrize("image", IMAGES)
def test_default_command_is_hookline_help(images: dict[str, str], image: str) -> None:
    result = run(images[image])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: hookline"), result.stdout


@pytest.mark.parametrize(("image", "command"), [
    ("service", "receiver"), ("service", "worker"), ("service", "relay"), ("service", "migrate"),
    ("operator", "operator"),
])
def test_each_component_starts_in_its_image(images: dict[str, str], image: str, command: str) -> None:
    result = run(images[image], command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: hookline {command}" in result.stdout, result.stdout


def test_only_the_operator_image_holds_the_kubernetes_client(images: dict[str, str]) -> None:
    script = "import importlib.util as u; print(*(u.find_spec(m) is not None for m in ('kopf', 'kubernetes')))"
    service = run(images["service"], "-c", script, entrypoint="python")
    operator = run(images["operator"], "-c", script, entrypoint="python")
    assert (service.stdout.split(), operator.stdout.split()) == (["False", "False"], ["True", "True"]), (
        service.stderr + operator.stderr)


# Run by the virtualenv's python and by the base interpreter it points at.
INVENTORY = """
import importlib.util, json, os, shutil, sys
print(json.dumps({
    "pip": importlib.util.find_spec("pip") is not None,
    "tools": sorted(t for t in ("pip", "pip3", "gcc", "cc", "c++", "make") if shutil.which(t)),
    "trees": sorted(p for p in ("/src", "/opt/build-tools") if os.path.exists(p)),
    "base": sys._base_executable,
}))
"""


@pytest.mark.parametrize("image", IMAGES)
def test_no_pip_compilers_or_build_tree_in_the_image(images: dict[str, str], image: str) -> None:
    in_venv = run(images[image], "-c", INVENTORY, entrypoint="python")
    assert in_venv.returncode == 0, in_venv.stderr
    found = json.loads(in_venv.stdout)
    assert (found["pip"], found["tools"], found["trees"]) == (False, [], []), found
    # The base interpreter (the official image ships pip in its site-packages; the Dockerfile removes it).
    in_base = run(images[image], "-c", INVENTORY, entrypoint=found["base"])
    assert in_base.returncode == 0, in_base.stderr
    assert json.loads(in_base.stdout)["pip"] is False, in_base.stdout


# -- the image against a real Postgres and over real HTTP ------------------------------------------


@pytest.fixture
async def empty_database(pg_server: PgServer) -> AsyncIterator[str]:
    name = await pg_server.create_database(template=None)
    try:
        yield pg_server.url_for(name)
    finally:
        await pg_server.drop_database(name)


def test_migrate_in_the_service_image(images: dict[str, str], empty_database: str) -> None:
    migrate = run(images["service"], "migrate", env={"HOOKLINE_DATABASE_URL": empty_database})
    assert migrate.returncode == 0, migrate.stderr
    # Every migration the image ships is recorded, and a second run (the hook Job retried) is a no-op.
    shipped = run(images["service"], "-c",
                  "from hookline.core import migrations; print(len(migrations.available()))", entrypoint="python")
    assert shipped.returncode == 0, shipped.stderr
    recorded = fetchval(empty_database, "SELECT count(*) FROM hookline.schema_migrations")
    assert recorded == int(shipped.stdout) > 0
    again = run(images["service"], "migrate", env={"HOOKLINE_DATABASE_URL": empty_database})
    assert again.returncode == 0, again.stderr
    assert fetchval(empty_database, "SELECT count(*) FROM hookline.schema_migrations") == recorded


@pytest.fixture
async def providers_database(pg_server: PgServer) -> AsyncIterator[str]:
    async with database_with_providers(pg_server, senders.PROVIDERS_YAML) as url:
        yield url


@pytest.fixture
def receiver(images: dict[str, str], providers_database: str) -> Iterator[str]:
    """The receiver in the service image, on a free loopback port, with the chart's arguments."""
    port = free_port()
    # The chart's args first; the later --host/--port win (argparse keeps the last).
    args = [*_receiver_container()["container"]["args"], "--host=127.0.0.1", f"--port={port}"]
    with Container(images["service"], *args, env={"HOOKLINE_DATABASE_URL": providers_database}) as container:
        url = f"http://127.0.0.1:{port}"
        try:
            eventually_sync(lambda: http_get(f"{url}/readyz") == 200, what="the receiver's /readyz", timeout=60)
        except AssertionError:
            raise AssertionError(f"receiver not ready:\n{container.logs()[-3000:]}") from None
        yield url


def test_receiver_in_the_image_accepts_a_signed_event_and_a_worker_drains_it(
        images: dict[str, str], receiver: str, providers_database: str) -> None:
    event_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps({"type": "invoice.paid", "data": {"id": "in_1"}}).encode()
    status, answer = http_post(f"{receiver}/webhooks/sw", body, senders.standard_webhooks(body, event_id))
    assert (status, answer) == (200, {"status": "accepted", "event_id": event_id})
    unsigned_status, unsigned = http_post(f"{receiver}/webhooks/sw", body, {})
    assert (unsigned_status, unsigned["error"]) == (401, "invalid_signature")

    status_sql = "SELECT status FROM hookline.inbox WHERE provider = 'sw' AND event_id = $1"
    assert fetchval(providers_database, status_sql, event_id) == "pending"
    worker_args = ["worker", "--provider", "sw", "--host=127.0.0.1", f"--port={free_port()}"]
    with Container(images["service"], *worker_args, env={"HOOKLINE_DATABASE_URL": providers_database}) as worker:
        try:
            eventually_sync(lambda: fetchval(providers_database, status_sql, event_id) == "done", what="the event done",
                            timeout=60)
        except AssertionError:
            raise AssertionError(f"worker did not drain:\n{worker.logs()[-3000:]}") from None
        assert worker.running(), worker.logs()[-3000:]



# -- the operator image against a real kube-apiserver ----------------------------------------------


@pytest.fixture(scope="module")
def api_server() -> Iterator[ApiServer]:
    """etcd + kube-apiserver (tests/envtest) with the CRDs; skipped without them (HOOKLINE_REQUIRE_K8S=1)."""
    with ApiServer(require_assets()) as server:
        server.kubectl("apply", "--server-side", "--field-manager=hookline-tests", "-f", str(REPO / "crds"))
        # Established, then served by discovery: kopf resolves the resource when it starts.
        eventually_sync(lambda: server.kubectl("get", "whp", "-A", check=False).returncode == 0,
                        what="whp in discovery")
        yield server


def portable_kubeconfig(server: ApiServer, folder: Path) -> Path:
    """The admin kubeconfig with the certificates inline, readable by the container's user (the
    envtest's own refers to root-only key files by host path)."""
    pki = server.kubeconfig.parent / "pki"

    def inline(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = json.loads(server.kubeconfig.read_text())
    config["clusters"][0]["cluster"] = {"server": server.url, "certificate-authority-data": inline("ca.crt")}
    config["users"][0]["user"] = {"client-certificate-data": inline("admin.crt"),
                                  "client-key-data": inline("admin.key")}
    path = folder / "kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o644)  # a throwaway test server's credentials
    return path


PROVIDER = """
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {name: shop}
spec:
  signature: {scheme: standard-webhooks}
  handler: "hookline.examples.handlers:log_event"
"""


@pytest.mark.k8s
def test_operator_image_reconciles_a_provider(images: dict[str, str], api_server: ApiServer, database_url: str,
                                              tmp_path: Path) -> None:
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    api_server.kubectl("create", "namespace", namespace)
    kubeconfig = portable_kubeconfig(api_server, tmp_path)
    port = free_port()
    args = ["operator", f"--liveness=http://127.0.0.1:{port}/healthz", f"--namespace={namespace}"]
    env = {"HOOKLINE_DATABASE_URL": database_url, "KUBECONFIG": "/etc/hookline/kubeconfig",
           "HOOKLINE_WORKER_IMAGE": images["service"]}
    with Container(images["operator"], *args, env=env,
                   volumes=[f"{kubeconfig}:/etc/hookline/kubeconfig:ro"]) as operator:
        try:
            eventually_sync(lambda: http_get(f"http://127.0.0.1:{port}/healthz") == 200, what="kopf's liveness",
                            timeout=90)
            api_server.kubectl("apply", "-n", namespace, "-f", "-", input=PROVIDER)
            ready = eventually_sync(lambda: condition(kget(api_server, namespace, "whp", "shop"), "Ready")
                                    .get("status") == "True", what="the provider Ready", timeout=90)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{operator.logs()[-4000:]}") from None
        assert ready
        secret = kget(api_server, namespace, "secret", "shop-webhook-secret")
        assert base64.b64decode(secret["data"]["secret"]).startswith(b"whsec_")
        assert fetchval(database_url, "SELECT count(*) FROM hookline.providers WHERE name = 'shop'") == 1
        assert operator.running(), operator.logs()[-4000:]
