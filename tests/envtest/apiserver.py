"""A real etcd + kube-apiserver for tests, built by ``tests/envtest/build.sh``.

No controllers and no kubelet: exactly the API server, so CRD schemas, CEL rules, defaulting,
printer columns, RBAC and ``kubectl`` behave as in a cluster, in a few seconds and without Docker.

    with ApiServer() as api:
        api.kubectl("apply", "--server-side", "-f", "crds/")
        kubernetes.config.load_kube_config(config_file=str(api.kubeconfig))
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

# Keep in sync with K8S_VERSION in build.sh (without the leading "v"): it names the cache folder.
K8S_VERSION = "1.37.2"
BINARIES = ("etcd", "kube-apiserver", "kubectl")
ADMIN_USER = "hookline-admin"
# A ClusterIP range is mandatory for kube-apiserver even though nothing here allocates Services.
SERVICE_CIDR = "10.0.0.0/24"
# The first address of SERVICE_CIDR: the `kubernetes` Service, which pods in a cluster dial.
KUBERNETES_SERVICE_IP = "10.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ApiServerError(RuntimeError):
    """Start-up failed; the message carries the tail of the process logs."""


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose str() includes kubectl's own error message."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or self.stdout}".rstrip()


def cache_dir() -> Path:
    """Where build.sh puts the binaries: ``$HOOKLINE_ENVTEST_CACHE/<version>``."""
    root = os.environ.get("HOOKLINE_ENVTEST_CACHE") or Path.home() / ".cache" / "hookline" / "envtest"
    return Path(root) / K8S_VERSION


def _has_binaries(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name in BINARIES)


def find_assets() -> Path | None:
    """The folder holding etcd, kube-apiserver and kubectl, or None when they were never built."""
    configured = os.environ.get("KUBEBUILDER_ASSETS")
    if configured and _has_binaries(Path(configured)):
        return Path(configured)
    cached = cache_dir()
    return cached if _has_binaries(cached) else None


def _free_port() -> int:
    # The port may be taken again between close() and the server's bind; the window is tiny and a
    # clash shows up as a clear start-up failure rather than a flaky test.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ApiServerError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _openssl_cert(pki: Path, name: str, subject: str, extensions: list[str], issuer: str | None) -> None:
    """Write ``<name>.key`` (ECDSA P-256: instant to generate) and ``<name>.crt``, signed by ``issuer``."""
    args = ["req", "-x509", "-days", "2", "-nodes"]
    args += ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    # An empty config: the system openssl.cnf would mark every -x509 certificate CA:TRUE.
    args += ["-config", str(pki / "openssl.cnf"), "-subj", subject]
    args += ["-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.crt")]
    if issuer:
        args += ["-CA", str(pki / f"{issuer}.crt"), "-CAkey", str(pki / f"{issuer}.key")]
    for extension in [*extensions, "subjectKeyIdentifier=hash"]:
        args += ["-addext", extension]
    _openssl(*args)


def _make_pki(pki: Path, advertise_address: str) -> None:
    """A throwaway CA, the API server's serving cert, an admin client cert and the SA signing key.

    The ``openssl`` CLI is used because the ``cryptography`` package is not a project dependency.
    """
    (pki / "openssl.cnf").write_text("[req]\ndistinguished_name = dn\n[dn]\n")
    _openssl_cert(
        pki,
        "ca",
        "/CN=hookline-envtest-ca",
        ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"],
        None,
    )
    leaf = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
        "authorityKeyIdentifier=keyid",
    ]
    sans = "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1"
    # Pods reach the server through the `kubernetes` Service's address, then at the advertised one.
    sans += f",IP:{KUBERNETES_SERVICE_IP},IP:{advertise_address}"
    _openssl_cert(
        pki,
        "serving",
        "/CN=kube-apiserver",
        [*leaf, f"subjectAltName={sans}", "extendedKeyUsage=serverAuth"],
        "ca",
    )
    # Group (O) system:masters is what makes this user a cluster admin, whatever RBAC says.
    _openssl_cert(pki, "admin", f"/O=system:masters/CN={ADMIN_USER}", [*leaf, "extendedKeyUsage=clientAuth"], "ca")
    sa_key = str(pki / "sa.key")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", sa_key)
    _openssl("ec", "-in", sa_key, "-pubout", "-out", str(pki / "sa.pub"))


class InTempDir:
    """Processes that live in a fresh temporary folder (``workdir``): ``with`` starts them and
    stops them whatever happens, and a start that fails stops what it had started. Subclasses
    say what ``_start`` and ``stop`` do."""

    workdir_prefix = "hookline-"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=self.workdir_prefix))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class ApiServer(InTempDir):
    """etcd + kube-apiserver on free loopback ports, torn down on exit (also usable as start()/stop())."""

    workdir_prefix = "hookline-apiserver-"

    def __init__(
        self,
        assets: Path | None = None,
        *,
        startup_timeout: float = 90.0,
        advertise_address: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
    ) -> None:
        """``advertise_address``: loopback for API-only tests; a cluster's node address when pods must reach
        the server (it then listens on every address and publishes the `kubernetes` Service's endpoints).
        ``extra_args`` are appended to kube-apiserver's command line."""
        found = assets or find_assets()
        if found is None:
            raise ApiServerError("etcd/kube-apiserver/kubectl not found: run tests/envtest/build.sh")
        self.assets: Path = found
        self.startup_timeout = startup_timeout
        self.advertise_address = advertise_address
        self.extra_args = tuple(extra_args)
        self.workdir: Path | None = None
        self.port = 0
        self.url = ""
        # A static bearer token for the admin too, for clients that cannot do client certs.
        self.admin_token = secrets.token_hex(16)
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    # -- paths, valid once started -------------------------------------------------------------
    def _path(self, *parts: str) -> Path:
        if self.workdir is None:
            raise ApiServerError("ApiServer is not started")
        return self.workdir.joinpath(*parts)

    @property
    def kubeconfig(self) -> Path:
        """An admin kubeconfig (client certificate in group system:masters)."""
        return self._path("kubeconfig")

    @property
    def ca_file(self) -> Path:
        return self._path("pki", "ca.crt")

    # -- life cycle: start, stop (and ``with``) from InTempDir ---------------------------------
    def _start(self) -> None:
        pki = self._path("pki")
        pki.mkdir()
        _make_pki(pki, self.advertise_address)
        # Format: token,user,uid,"group1,group2".
        self._path("tokens.csv").write_text(f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')

        etcd_port, peer_port, self.port = _free_port(), _free_port(), _free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self.url = f"https://127.0.0.1:{self.port}"
        self.spawn(
            "etcd",
            "--name=hookline",
            f"--data-dir={self._path('etcd')}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=hookline={peer_url}",
            # Test data is disposable; fsync would make every write wait for the disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self.wait_ready("etcd", f"{etcd_url}/health", None)
        loopback = self.advertise_address == "127.0.0.1"
        self.spawn(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            f"--bind-address={'127.0.0.1' if loopback else '0.0.0.0'}",
            f"--advertise-address={self.advertise_address}",
            # Without a cluster there is no Service network to publish the loopback address in as endpoints.
            *(["--endpoint-reconciler-type=none"] if loopback else []),
            f"--secure-port={self.port}",
            f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Its identity towards kubelets (logs, exec, port-forward), where a cluster has them.
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            f"--token-auth-file={self._path('tokens.csv')}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            *self.extra_args,
        )
        self._write_kubeconfig()
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        self.wait_ready("kube-apiserver", f"{self.url}/readyz", context)

    def spawn(self, name: str, *args: str, binary: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a process logging to ``<workdir>/<name>.log``; stop() ends it (last started, first stopped).

        ``binary`` defaults to ``<assets>/<name>``; a cluster adds its other components the same way."""
        log = self._path(f"{name}.log").open("wb")
        proc = subprocess.Popen([str(binary or self.assets / name), *args], stdout=log, stderr=subprocess.STDOUT)
        self._procs.append((name, proc, log))
        return proc

    def wait_ready(self, name: str, url: str, context: ssl.SSLContext | None) -> None:
        """Poll ``url`` until it answers 200; fail with every process's log tail if ``name`` exits first."""
        deadline = time.monotonic() + self.startup_timeout
        proc = next(p for n, p, _ in self._procs if n == name)
        last = "no answer yet"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise self.failure(f"{name} exited with code {proc.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as err:  # /readyz answers 500 while post-start hooks run
                last = f"HTTP {err.code}"
            except OSError as err:
                last = str(err)
            time.sleep(0.2)
        raise self.failure(f"{name} not ready after {self.startup_timeout:.0f}s ({last})")

    def failure(self, what: str) -> ApiServerError:
        """An error carrying ``what`` and the tail of every process's log."""
        logs = "\n".join(
            f"--- last lines of the {name} log:\n{_tail(self._path(name + '.log'))}" for name, _, _ in self._procs
        )
        return ApiServerError(f"{what}\n{logs}")

    def _write_kubeconfig(self) -> None:
        pki = self._path("pki")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {"server": self.url, "certificate-authority": str(pki / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate": str(pki / "admin.crt"),
                        "client-key": str(pki / "admin.key"),
                    },
                }
            ],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": ADMIN_USER}}],
            "current-context": "envtest",
        }
        # JSON is valid YAML, and every kubeconfig reader accepts it.
        self.kubeconfig.write_text(json.dumps(config, indent=2))

    def stop(self) -> None:
        """Stop kube-apiserver before etcd (so it does not spin on a dead backend), then clean up."""
        for _, proc, _ in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for _, _, log in self._procs:
            log.close()
        self._procs.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # -- helpers -------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, for subprocesses such as the operator under test."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        token: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl, as the admin or, given `token`, as that bearer token's identity.

        Raises KubectlError (carrying kubectl's own message) on failure unless check=False.
        """
        if token is None:
            auth = [f"--kubeconfig={self.kubeconfig}"]
        else:  # no kubeconfig at all, or its admin client certificate would win over the token
            auth = ["--kubeconfig=/dev/null", f"--server={self.url}", f"--certificate-authority={self.ca_file}"]
            auth.append(f"--token={token}")
        # Keep the discovery cache with this server instead of in ~/.kube/cache.
        argv = [str(self.assets / "kubectl"), *auth, f"--cache-dir={self._path('kubectl-cache')}", *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result
