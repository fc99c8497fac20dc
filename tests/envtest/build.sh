#!/usr/bin/env bash
# Provide etcd, kube-apiserver and kubectl for the operator tests (envtest layout):
#   ${HOOKLINE_ENVTEST_CACHE:-$HOME/.cache/hookline/envtest}/<k8s-version>/{etcd,kube-apiserver,kubectl}
# Nothing is downloaded except Go modules: the binaries are compiled from the Go module proxy with
# the machine's Go toolchain, once; later runs find them in the cache and return at once.
# Prints the directory holding the binaries as the last line of stdout.
set -euo pipefail

# One pinned release. k8s.io/kubernetes requires go >= 1.26.0 from v1.36 on; v1.37.2 builds with Go 1.26.
# Keep K8S_VERSION in sync with K8S_VERSION in tests/envtest/apiserver.py.
K8S_VERSION="v1.37.2"
# The etcd that Kubernetes v1.37.2 ships with (its build/dependencies.yaml and go.mod both say 3.7.0).
ETCD_VERSION="v3.7.0"

LOG_PREFIX=envtest
# shellcheck source=../support/gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/gobuild.sh"

has_all() { [[ -x "$1/etcd" && -x "$1/kube-apiserver" && -x "$1/kubectl" ]]; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
    if has_all "$KUBEBUILDER_ASSETS"; then
        log "using KUBEBUILDER_ASSETS"
        echo "$KUBEBUILDER_ASSETS"
        exit 0
    fi
    log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks etcd/kube-apiserver/kubectl; building into the cache"
fi

CACHE="${HOOKLINE_ENVTEST_CACHE:-$HOME/.cache/hookline/envtest}"
DEST="$CACHE/${K8S_VERSION#v}"
if has_all "$DEST"; then
    echo "$DEST"
    exit 0
fi

gobuild_lock "$DEST"
if has_all "$DEST"; then echo "$DEST"; exit 0; fi

gobuild_workdir envtest
log "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION with $("$GO" version) (first time: many minutes)"

mkdir -p "$WORK/etcd"

if [[ ! -x "$DEST/kube-apiserver" || ! -x "$DEST/kubectl" ]]; then
    gobuild_k8s_module "$WORK/k8s" "$K8S_VERSION"
    # kube-apiserver reports this version; without it, it claims v0.0.0-master and kubectl warns about skew.
    version_flags="$(gobuild_k8s_ldflags "$K8S_VERSION")"
    gobuild_go "$WORK/k8s" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$version_flags"
    gobuild_go "$WORK/k8s" k8s.io/kubernetes/cmd/kubectl kubectl "$version_flags"
fi

if [[ ! -x "$DEST/etcd" ]]; then
    # Not `go install ...@version`: etcd's server module has replace directives, which go install refuses.
    printf 'module hookline.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$ETCD_VERSION" >"$WORK/etcd/go.mod"
    gobuild_go "$WORK/etcd" go.etcd.io/etcd/server/v3 etcd
fi

echo "$DEST"
