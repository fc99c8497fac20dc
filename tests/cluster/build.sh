#!/usr/bin/env bash
# Provide what the single-node test cluster (tests/cluster) needs beyond tests/envtest:
#   ${HOOKLINE_CLUSTER_CACHE:-$HOME/.cache/hookline/cluster}/<versions>/
#       kubelet, kube-proxy             the node (v1.35: the last release with cgroup v1 and containerd 1.x)
#       kube-controller-manager,        the control plane beside envtest's kube-apiserver (same version:
#       kube-scheduler                  neither may be newer than the API server nor lag it by two minors)
#       coredns                         cluster DNS, run on the host like the other components
#       helm                            the helm command line, for install / test / uninstall
# compiled from the Go module proxy once, and Debian's containerd, runc and CNI plugins (apt-get).
# Prints the directory holding the binaries as the last line of stdout.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Keep these in sync with tests/cluster/cluster.py (they name the cache folder).
KUBELET_VERSION="v1.35.4"
# The API server's version, read from the envtest script so the two never drift apart.
CONTROL_PLANE_VERSION="$(sed -n 's/^K8S_VERSION="\(v[0-9.]*\)"$/\1/p' "$HERE/../envtest/build.sh")"
COREDNS_VERSION="v1.15.0"
HELM_VERSION="v4.3.2"
DEBIAN_PACKAGES=(containerd runc containernetworking-plugins)

LOG_PREFIX=cluster
# shellcheck source=../support/gobuild.sh
source "$HERE/../support/gobuild.sh"

BINARIES=(kubelet kube-proxy kube-controller-manager kube-scheduler coredns helm)
has_all() { for b in "${BINARIES[@]}"; do [[ -x "$1/$b" ]] || return 1; done; }
has_packages() { command -v containerd >/dev/null && command -v runc >/dev/null && [[ -x /usr/lib/cni/bridge ]]; }

# A kubelet and containerd need root: elsewhere nothing is built and the cluster tests skip themselves,
# unless HOOKLINE_REQUIRE_CLUSTER=1 (CI) makes that an error.
not_here() {
    log "$1; tests/cluster will be skipped (HOOKLINE_REQUIRE_CLUSTER=1 makes that an error)"
    [[ "${HOOKLINE_REQUIRE_CLUSTER:-}" == 1 ]] && exit 1
    exit 0
}

install_packages() {
    has_packages && return 0
    command -v apt-get >/dev/null || not_here "no apt-get to install ${DEBIAN_PACKAGES[*]}"
    log "installing ${DEBIAN_PACKAGES[*]}"
    # Another apt-get (an image build) may hold the lock for a while: wait for it instead of failing.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
        "${DEBIAN_PACKAGES[@]}" >&2
}

CACHE="${HOOKLINE_CLUSTER_CACHE:-$HOME/.cache/hookline/cluster}"
DEST="$CACHE/${CONTROL_PLANE_VERSION#v}-node${KUBELET_VERSION#v}"
[[ "$(id -u)" == 0 ]] || not_here "the local cluster runs as root only (a kubelet mounts volumes, containerd makes namespaces)"
install_packages
if has_all "$DEST"; then
    echo "$DEST"
    exit 0
fi

gobuild_lock "$DEST"
if has_all "$DEST"; then echo "$DEST"; exit 0; fi
gobuild_workdir cluster
log "building kubelet $KUBELET_VERSION, control plane $CONTROL_PLANE_VERSION, CoreDNS $COREDNS_VERSION," \
    "helm $HELM_VERSION with $("$GO" version) (first time: many minutes)"

if [[ ! -x "$DEST/kubelet" || ! -x "$DEST/kube-proxy" ]]; then
    gobuild_k8s_module "$WORK/node" "$KUBELET_VERSION"
    flags="$(gobuild_k8s_ldflags "$KUBELET_VERSION")"
    gobuild_go "$WORK/node" k8s.io/kubernetes/cmd/kubelet kubelet "$flags"
    gobuild_go "$WORK/node" k8s.io/kubernetes/cmd/kube-proxy kube-proxy "$flags"
fi

if [[ ! -x "$DEST/kube-controller-manager" || ! -x "$DEST/kube-scheduler" ]]; then
    gobuild_k8s_module "$WORK/control" "$CONTROL_PLANE_VERSION"
    flags="$(gobuild_k8s_ldflags "$CONTROL_PLANE_VERSION")"
    gobuild_go "$WORK/control" k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager "$flags"
    gobuild_go "$WORK/control" k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler "$flags"
fi

if [[ ! -x "$DEST/coredns" ]]; then
    # A CoreDNS with only the plugins the cluster's Corefile uses (coredns.go): the stock build links
    # every cloud provider's SDK and takes several times longer to compile.
    mkdir -p "$WORK/coredns"
    cp "$HERE/coredns.go" "$WORK/coredns/main.go"
    printf 'module hookline.local/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns %s\n' \
        "$COREDNS_VERSION" >"$WORK/coredns/go.mod"
    gobuild_go "$WORK/coredns" . coredns " -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
fi

if [[ ! -x "$DEST/helm" ]]; then
    mkdir -p "$WORK/helm"
    printf 'module hookline.local/helm\n\ngo 1.26.0\n\nrequire helm.sh/helm/v4 %s\n' "$HELM_VERSION" >"$WORK/helm/go.mod"
    gobuild_go "$WORK/helm" helm.sh/helm/v4/cmd/helm helm " -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
fi

echo "$DEST"
