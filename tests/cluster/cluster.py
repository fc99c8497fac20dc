"""A real single-node Kubernetes cluster on this machine, for the end-to-end tests.

Every component runs as a process of this machine in its own temporary folder: etcd and kube-apiserver
(tests/envtest), kube-controller-manager, kube-scheduler, CoreDNS, kube-proxy, containerd (Debian's,
with its own root, state and socket) and a kubelet, with a CNI bridge for the pods. Images come from
containerd's own store (``ctr images import`` of OCI archives), never from a registry. Versions and
every non-default flag, with the reason for each, are in tests/cluster/README.md.

    with Cluster(find_parts()) as cluster:
        cluster.api.kubectl("get", "nodes")

``python tests/cluster/cluster.py up`` starts one for hands-on use (``make cluster-up``); ``down`` stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "envtest"))

from apiserver import K8S_VERSION, SERVICE_CIDR, ApiServer, InTempDir, KubectlError, find_assets  # noqa: E402

# Keep in sync with KUBELET_VERSION in build.sh (without the "v"): with K8S_VERSION it names the cache folder.
KUBELET_VERSION = "1.35.4"
NODE_BINARIES = ("kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler", "coredns", "helm")
HOST_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip")
CNI_PLUGINS = Path("/usr/lib/cni")
NODE_NAME = "hookline-node"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "hookline0"
CLUSTER_DOMAIN = "cluster.local"
# The OCI archives tests/images/build.sh writes, and the names pods refer to them by.
IMAGES = {"pause": "localhost/pause:local", "hookline": "localhost/hookline:dev",
          "hookline-service": "localhost/hookline-service:dev"}
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# What a kubelet and containerd create outside their configured folders, whatever the flags: the device
# plugin socket folder, the /var/log/containers links to pod logs, and containerd's parent cgroup of the
# pods (k8s.io, in every v1 hierarchy). Removed at tear-down when the cluster created them.
HOST_FOLDERS = (Path("/var/lib/kubelet"), Path("/var/log/containers"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet's own iptables chains (kube-proxy --cleanup leaves them): (table, chain, built-in chains
# that jump to it).
KUBELET_CHAINS = (
    ("filter", "KUBE-FIREWALL", ("INPUT", "OUTPUT")),
    ("filter", "KUBE-KUBELET-CANARY", ()),
    ("nat", "KUBE-KUBELET-CANARY", ()),
    ("mangle", "KUBE-KUBELET-CANARY", ()),
    ("mangle", "KUBE-IPTABLES-HINT", ()),
)
# `make cluster-up` records its process here so that `make cluster-down` can stop it.
RUN_STATE = Path.home() / ".cache" / "hookline" / "cluster" / "up.json"

ENABLE_ADVICE = "run `make cluster images` (as root) to build the cluster's binaries and images once"


class ClusterError(RuntimeError):
    """Start-up failed; the message carries the tail of the component logs."""


def binaries_dir() -> Path:
    root = os.environ.get("HOOKLINE_CLUSTER_CACHE") or Path.home() / ".cache" / "hookline" / "cluster"
    return Path(root) / f"{K8S_VERSION}-node{KUBELET_VERSION}"


def images_dir() -> Path:
    return Path(os.environ.get("HOOKLINE_IMAGE_CACHE") or Path.home() / ".cache" / "hookline" / "images")


@dataclass(frozen=True)
class Parts:
    """Where everything a cluster needs was found."""

    envtest: Path
    binaries: Path
    images: dict[str, Path]


def missing_parts() -> list[str]:
    """What this machine lacks for a cluster, each in a few words (empty: everything is there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (a kubelet mounts volumes, containerd makes namespaces and cgroups)")
    if find_assets() is None:
        missing.append("etcd/kube-apiserver/kubectl (make envtest)")
    if not all(os.access(binaries_dir() / name, os.X_OK) for name in NODE_BINARIES):
        missing.append(f"{', '.join(NODE_BINARIES)} in {binaries_dir()} (make cluster)")
    absent = [name for name in HOST_COMMANDS if not _on_path(name)]
    if absent or not (CNI_PLUGINS / "bridge").exists():
        missing.append(f"Debian packages containerd runc containernetworking-plugins ({' '.join(absent)})")
    absent_images = [f"{name}.oci.tar" for name in IMAGES if not (images_dir() / f"{name}.oci.tar").exists()]
    if absent_images:
        missing.append(f"images {', '.join(absent_images)} in {images_dir()} (make images)")
    return missing


def _on_path(name: str) -> bool:
    # The sbin folders too: root's tools (runc, iptables) are there even when PATH lacks them.
    folders = [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"]
    return any(os.access(Path(folder) / name, os.X_OK) for folder in folders)


def find_parts() -> Parts:
    """Everything a cluster needs; raises ClusterError naming what is missing."""
    missing = missing_parts()
    envtest = find_assets()
    if missing or envtest is None:
        raise ClusterError(f"cannot start a cluster, missing: {'; '.join(missing)}. {ENABLE_ADVICE}")
    return Parts(envtest, binaries_dir(), {name: images_dir() / f"{name}.oci.tar" for name in IMAGES})


def node_ip() -> str:
    """The address of the interface that holds the default route: the node's InternalIP, which pods
    reach through their bridge and the API server reaches the kubelet at."""
    out = subprocess.run(["ip", "-4", "route", "get", "192.0.2.255"], capture_output=True, text=True, check=True).stdout
    words = out.split()
    return words[words.index("src") + 1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _insecure_context() -> ssl.SSLContext:
    # Only for health checks of components on loopback that serve a self-signed certificate.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Cluster(InTempDir):
    """A single-node cluster, torn down on exit: processes stopped, pods' mounts, network and rules removed."""

    workdir_prefix = "hookline-cluster-"

    def __init__(self, parts: Parts, *, startup_timeout: float = 180.0) -> None:
        self.parts = parts
        self.startup_timeout = startup_timeout
        self.node_ip = node_ip()
        self.api = ApiServer(
            parts.envtest,
            startup_timeout=startup_timeout,
            advertise_address=self.node_ip,
            extra_args=(
                # The kubelet is reached by its node address, not a host name nobody resolves (logs, exec,
                # port-forward).
                "--kubelet-preferred-address-types=InternalIP",
                "--enable-admission-plugins=NodeRestriction",
            ),
        )
        self.workdir = Path()
        self._ip_forward_before: str | None = None
        self._created_here: list[Path] = []
        self._kubelet_chains_are_ours = False

    # -- paths -------------------------------------------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.workdir.joinpath(*parts)

    @property
    def containerd_socket(self) -> Path:
        return self.path("containerd", "containerd.sock")

    # -- life cycle: start, stop (and ``with``) from InTempDir -------------------------------------------------
    def _start(self) -> None:
        self._created_here = [path for path in (*HOST_FOLDERS, *_pod_cgroups()) if not path.exists()]
        self._kubelet_chains_are_ours = "KUBE-FIREWALL" not in _iptables_save()
        self.api.start()
        # Pod -> Service -> pod on the same bridge is routed back out of the host: forwarding must be on.
        self._ip_forward_before = IP_FORWARD.read_text().strip()
        IP_FORWARD.write_text("1\n")
        self._start_control_plane()
        self._start_containerd()
        self._import_images()
        self._start_dns()
        self._start_proxy()
        self._start_kubelet()
        self._wait_node_ready()

    def _kubeconfig(self) -> str:
        return str(self.api.kubeconfig)

    def _start_control_plane(self) -> None:
        pki = self.api.workdir / "pki" if self.api.workdir else Path()
        ports = free_port(), free_port()
        self.api.spawn(
            "kube-controller-manager",
            f"--kubeconfig={self._kubeconfig()}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports[0]}",
            "--leader-elect=false",
            # Published into every namespace as kube-root-ca.crt, which projected token volumes need.
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--cluster-name=hookline",
            binary=self.parts.binaries / "kube-controller-manager",
        )
        self.api.spawn(
            "kube-scheduler",
            f"--kubeconfig={self._kubeconfig()}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports[1]}",
            "--leader-elect=false",
            binary=self.parts.binaries / "kube-scheduler",
        )
        self.api.wait_ready("kube-controller-manager", f"https://127.0.0.1:{ports[0]}/healthz", _insecure_context())
        self.api.wait_ready("kube-scheduler", f"https://127.0.0.1:{ports[1]}/healthz", _insecure_context())

    def _start_containerd(self) -> None:
        for folder in ("containerd", "cni/net.d", "cni/ipam"):
            self.path(folder).mkdir(parents=True)
        self.path("cni", "net.d", "10-hookline.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        self.path("containerd", "config.toml").write_text(self._containerd_config())
        self.api.spawn("containerd", f"--config={self.path('containerd', 'config.toml')}",
                       binary=Path("/usr/bin/containerd"))
        deadline = time.monotonic() + self.startup_timeout
        while self.ctr("version", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise self.api.failure("containerd did not answer on its socket")
            time.sleep(0.2)

    def _cni_config(self) -> dict[str, object]:
        bridge = {
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            # A pod that reaches itself through its own Service (hairpin) must get its packets back.
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(self.path("cni", "ipam")),
            },
        }
        return {"cniVersion": "1.0.0", "name": "hookline", "plugins": [bridge]}

    def _containerd_config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.path('containerd', 'root')}"
state = "{self.path('containerd', 'state')}"

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.path('containerd', 'opt')}"

[{cri}]
  sandbox_image = "{IMAGES['pause']}"
  # This host refuses negative oom_score_adj; without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.cni]
  bin_dir = "{CNI_PLUGINS}"
  conf_dir = "{self.path('cni', 'net.d')}"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "/usr/sbin/runc"
  Root = "{self.path('containerd', 'runc')}"
  SystemdCgroup = false
"""

    def ctr(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """containerd's own CLI on this cluster's containerd, in the namespace the kubelet uses."""
        argv = ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done

    def _import_images(self) -> None:
        for name, archive in self.parts.images.items():
            self.ctr("images", "import", "--platform=linux/amd64", str(archive))
            listed = self.ctr("images", "ls", "--quiet").stdout.split()
            if IMAGES[name] not in listed:
                raise ClusterError(f"{archive} did not provide {IMAGES[name]}; containerd has {listed}")

    def _start_dns(self) -> None:
        ready, health = free_port(), free_port()
        corefile = f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {self.node_ip}
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {self._kubeconfig()}
        pods insecure
        fallthrough in-addr.arpa
    }}
    cache 5
}}
.:53 {{
    bind {self.node_ip}
    errors
    forward . /etc/resolv.conf
}}
"""
        self.path("Corefile").write_text(corefile)
        self.api.spawn("coredns", f"-conf={self.path('Corefile')}", binary=self.parts.binaries / "coredns")
        self.api.wait_ready("coredns", f"http://127.0.0.1:{ready}/ready", None)

    def _start_proxy(self) -> None:
        self.api.spawn(
            "kube-proxy",
            f"--kubeconfig={self._kubeconfig()}",
            f"--hostname-override={NODE_NAME}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={POD_CIDR}",
            # Leave the host's conntrack sysctls alone and open NodePorts on the node address only
            # (the default, every address, would also turn on route_localnet).
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            f"--nodeport-addresses={self.node_ip}/32",
            f"--healthz-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            binary=self.parts.binaries / "kube-proxy",
        )

    def _kubelet_config(self, healthz_port: int) -> dict[str, object]:
        pki = self.api.workdir / "pki" if self.api.workdir else Path()
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host mounts cgroup v1; Kubernetes 1.35 still runs on it when told to.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            # No per-QoS cgroup tree and no node allocatable enforcement: the host's cgroup hierarchy is shared
            # with other work on this machine and stays untouched.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [self.node_ip],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "/etc/resolv.conf",
            "podLogsDir": str(self.path("pod-logs")),
            # Imported images cannot be pulled again: never garbage-collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        }

    def _start_kubelet(self) -> None:
        healthz = free_port()
        self.path("kubelet").mkdir()
        self.path("kubelet.yaml").write_text(json.dumps(self._kubelet_config(healthz), indent=2))
        self.api.spawn(
            "kubelet",
            f"--config={self.path('kubelet.yaml')}",
            f"--kubeconfig={self._kubeconfig()}",
            f"--root-dir={self.path('kubelet')}",
            f"--cert-dir={self.path('kubelet', 'pki')}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={self.node_ip}",
            binary=self.parts.binaries / "kubelet",
        )
        self.api.wait_ready("kubelet", f"http://127.0.0.1:{healthz}/healthz", None)

    def _wait_node_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            node = self.api.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if node.returncode == 0 and _condition(json.loads(node.stdout), "Ready") == "True":
                return
            if time.monotonic() > deadline:
                raise self.api.failure(f"node {NODE_NAME} not Ready after {self.startup_timeout:.0f}s: {node.stdout}")
            time.sleep(0.5)

    # -- tear-down ---------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every pod through the kubelet (so CNI and volumes are cleaned up by their owners), then every
        process, then remove what outlives them: mounts, containerd shims, the bridge and kube-proxy's rules."""
        if self.api.workdir is not None and self.workdir != Path() and self.path("kubelet").exists():
            with contextlib.suppress(Exception):
                self._drain_pods()
        self.api.stop()
        if self.workdir != Path():
            self._remove_leftovers()
        if self._ip_forward_before is not None:
            IP_FORWARD.write_text(self._ip_forward_before + "\n")
            self._ip_forward_before = None

    def _drain_pods(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Controllers replace deleted pods until their owners are gone too; repeated for pods created meanwhile.
            self.api.kubectl("delete", "deployments,statefulsets,replicasets,daemonsets,jobs,pods", "--all",
                             "--all-namespaces", "--wait=false", "--grace-period=2", check=False)
            pods = self.api.kubectl("get", "pods", "-A", "-o", "name", check=False)
            tasks = self.ctr("tasks", "ls", check=False, timeout=30).stdout.splitlines()[1:]
            if pods.returncode == 0 and not pods.stdout.strip() and not tasks:
                return
            time.sleep(1)

    def _remove_leftovers(self) -> None:
        _kill_shims(str(self.containerd_socket))
        _unmount_below(self.workdir)
        subprocess.run([str(self.parts.binaries / "kube-proxy"), "--cleanup"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        _remove_host_traces(self.workdir, self._created_here)
        if self._kubelet_chains_are_ours:
            _remove_kubelet_chains()
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.workdir)], capture_output=True, check=False)
        self.workdir = Path()

    # -- helpers for tests -------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return self.api.kubectl(*args, input=input, check=check, timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        """The helm command line on this cluster, as admin; its caches stay in the cluster's folder."""
        env = {**self.api.env(), "HELM_CACHE_HOME": str(self.path("helm", "cache")),
               "HELM_CONFIG_HOME": str(self.path("helm", "config")), "HELM_DATA_HOME": str(self.path("helm", "data"))}
        argv = [str(self.parts.binaries / "helm"), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if check and done.returncode != 0:
            raise KubectlError(done.returncode, argv, done.stdout, done.stderr)
        return done

    def diagnostics(self, namespace: str) -> str:
        """What a person would look at when something in `namespace` did not come up: pods, events, logs."""
        sections = []
        for title, args in (
            ("pods", ("get", "pods", "-n", namespace, "-o", "wide")),
            ("describe pods", ("describe", "pods", "-n", namespace)),
            ("events", ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp")),
            ("logs", ("logs", "-n", namespace, "--all-containers", "--prefix", "--tail=40", "-l",
                      "app.kubernetes.io/name")),
        ):
            done = self.kubectl(*args, check=False)
            sections.append(f"--- kubectl {title}:\n{done.stdout}{done.stderr}")
        return "\n".join(sections)


def _condition(obj: dict[str, object], kind: str) -> str | None:
    status = obj.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    return next((c.get("status") for c in conditions if c.get("type") == kind), None)


def _kill_shims(address: str) -> None:
    """containerd-shim-runc-v2 processes outlive containerd by design; end the ones serving this cluster."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address.encode() in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _unmount_below(folder: Path) -> None:
    """Detach every mount under `folder` (volumes, overlay root filesystems), deepest first."""
    prefix = str(folder) + "/"
    for mount_point in sorted(_mount_points(), key=len, reverse=True):
        if mount_point.startswith(prefix):
            subprocess.run(["umount", "--lazy", mount_point], capture_output=True, check=False)


def _mount_points() -> Iterator[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and the like escaped as octal.
        yield line.split()[4].encode().decode("unicode_escape")


def _pod_cgroups() -> list[Path]:
    return [hierarchy / "k8s.io" for hierarchy in CGROUP_ROOT.iterdir() if (hierarchy / "cgroup.procs").exists()]


def _remove_host_traces(workdir: Path, created_here: list[Path]) -> None:
    """Links to this cluster's pod logs, then the host folders and cgroups it created (a cgroup that still
    holds a process stays: rmdir refuses it)."""
    for link in HOST_FOLDERS[1].glob("*.log"):
        if link.is_symlink() and str(link.readlink()).startswith(f"{workdir}/"):
            link.unlink()
    for path in created_here:
        if not path.is_relative_to(CGROUP_ROOT):
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, check=False)
    # The last pods' processes (and the killed shims) take a moment to leave their cgroups.
    deadline = time.monotonic() + 30
    cgroups = [path for path in created_here if path.is_relative_to(CGROUP_ROOT)]
    while cgroups and time.monotonic() < deadline:
        for path in list(cgroups):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:  # still busy
                continue
            cgroups.remove(path)
        time.sleep(0.2)


def _iptables_save() -> str:
    return subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout


def _remove_kubelet_chains() -> None:
    for command in ("iptables", "ip6tables"):
        for table, chain, callers in KUBELET_CHAINS:
            for caller in callers:
                subprocess.run([command, "-t", table, "-D", caller, "-j", chain], capture_output=True, check=False)
            subprocess.run([command, "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run([command, "-t", table, "-X", chain], capture_output=True, check=False)


def main(argv: list[str]) -> int:
    """`up`: start a cluster and keep it until Ctrl-C or `down`; `down`: stop the one `up` started."""
    if argv[1:] == ["down"]:
        if not RUN_STATE.exists():
            print("no cluster started by `make cluster-up` is running")
            return 0
        try:
            os.kill(json.loads(RUN_STATE.read_text())["pid"], signal.SIGTERM)
        except ProcessLookupError:  # killed without tearing down: its folders and rules may be left
            RUN_STATE.unlink()
            print("the `make cluster-up` process is gone without stopping its cluster", file=sys.stderr)
            return 1
        deadline = time.monotonic() + 180
        while RUN_STATE.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        print("cluster stopped" if not RUN_STATE.exists() else "the cluster is still stopping after 3 minutes")
        return 0
    if argv[1:] != ["up"]:
        print(f"usage: {argv[0]} up|down", file=sys.stderr)
        return 2
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with Cluster(find_parts()) as cluster:
            RUN_STATE.write_text(json.dumps({"pid": os.getpid(), "kubeconfig": str(cluster.api.kubeconfig)}))
            print(f"cluster up: node {NODE_NAME} Ready\n  export KUBECONFIG={cluster.api.kubeconfig}\n"
                  f"  helm: {cluster.parts.binaries / 'helm'}\nCtrl-C or `make cluster-down` stops it.", flush=True)
            while not stop:
                time.sleep(0.5)
            print("stopping: pods, processes, mounts, network", flush=True)
    finally:
        # Only once everything is gone: `make cluster-down` waits for this file to disappear.
        RUN_STATE.unlink(missing_ok=True)
    print("cluster down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
