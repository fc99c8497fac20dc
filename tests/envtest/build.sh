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

# kube-apiserver reports this version; without it, it claims v0.0.0-master and kubectl warns about skew.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
version_flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # build <module dir> <package> <binary name> [extra ldflags]
    (cd "$1" && nice -n 19 "$GO" build -trimpath -ldflags "-s -w${4:-}" -o "$WORK/out/$3" "$2")
    gobuild_install "$WORK/out/$3" "$3"
}
mkdir -p "$WORK/k8s" "$WORK/etcd"

if [[ ! -x "$DEST/kube-apiserver" || ! -x "$DEST/kubectl" ]]; then
    # k8s.io/kubernetes requires its staging modules (k8s.io/api, client-go, ...) as v0.0.0 and
    # replaces them with ./staging/...; outside its repository each must be mapped to the published
    # v0.X.Y tag, derived here from that go.mod so the list never goes stale.
    gomod="$(cd "$WORK" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^\s*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    staging_version="v0.${K8S_VERSION#v1.}"
    {
        echo "module hookline.local/envtest"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u |
            while read -r mod; do echo "	$mod => $mod $staging_version"; done
        echo ")"
    } >"$WORK/k8s/go.mod"
    build "$WORK/k8s" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$version_flags"
    build "$WORK/k8s" k8s.io/kubernetes/cmd/kubectl kubectl "$version_flags"
fi

if [[ ! -x "$DEST/etcd" ]]; then
    # Not `go install ...@version`: etcd's server module has replace directives, which go install refuses.
    printf 'module hookline.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$ETCD_VERSION" >"$WORK/etcd/go.mod"
    build "$WORK/etcd" go.etcd.io/etcd/server/v3 etcd
fi

echo "$DEST"
