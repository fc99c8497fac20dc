# Shared by the scripts that compile test binaries from the Go module proxy into a per-machine cache
# (tests/envtest/build.sh, tests/monitoring/build-prometheus.sh, tests/cluster/build.sh). Source it,
# set LOG_PREFIX, then:
#   gobuild_lock DEST        make DEST, take the cache's build lock (two callers never both compile)
#   gobuild_workdir NAME     a temporary folder removed on exit, in $WORK
#   gobuild_install SRC BIN  copy a built binary into $DEST atomically
#   gobuild_go MODDIR PKG BIN [LDFLAGS]  go build PKG in the module MODDIR, then gobuild_install
# and use $GO for the toolchain. Nothing but the Go module proxy is reached.

log() { printf '%s: %s\n' "$LOG_PREFIX" "$*" >&2; }

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
# The local Go must do (no toolchain download), and no go.work or go.mod around the caller takes part.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED="${CGO_ENABLED:-0}" GOFLAGS="${GOFLAGS:-} -mod=mod"

gobuild_lock() {
    [[ -x "$GO" ]] || { log "no Go toolchain found (set GO=/path/to/go)"; exit 1; }
    mkdir -p "$1"
    if command -v flock >/dev/null; then
        exec 9>"$(dirname "$1")/.build.lock"
        flock 9
    fi
}

gobuild_workdir() {
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/hookline-$1.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: WORK is this call's folder
    trap "rm -rf '$WORK'" EXIT
    mkdir -p "$WORK/out"
}

gobuild_install() {
    # rename(2) within one filesystem: a reader never sees a half-written binary.
    cp "$1" "$DEST/.$2.tmp" && mv -f "$DEST/.$2.tmp" "$DEST/$2"
    log "built $DEST/$2"
}

gobuild_go() { # gobuild_go <module dir> <package> <binary name> [extra ldflags]
    (cd "$1" && nice -n 19 "$GO" build -trimpath -ldflags "-s -w${4:-}" -o "$WORK/out/$3" "$2")
    gobuild_install "$WORK/out/$3" "$3"
}

# Kubernetes commands (k8s.io/kubernetes/cmd/...) built outside the Kubernetes repository:
#   gobuild_k8s_module DIR VERSION   write DIR/go.mod requiring k8s.io/kubernetes VERSION
#   gobuild_k8s_ldflags VERSION      -X flags so the binaries report VERSION (not v0.0.0-master,
#                                    which makes kubectl warn about skew and the node report nonsense)
gobuild_k8s_module() {
    # k8s.io/kubernetes requires its staging modules (k8s.io/api, client-go, ...) as v0.0.0 and
    # replaces them with ./staging/...; outside its repository each must be mapped to the published
    # v0.X.Y tag, derived here from that go.mod so the list never goes stale.
    local dir="$1" version="$2" gomod
    mkdir -p "$dir"
    gomod="$(cd "$dir" && "$GO" mod download -json "k8s.io/kubernetes@$version" |
        sed -n 's/^\s*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    {
        echo "module hookline.local/k8s"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes $version"
        echo
        echo "replace ("
        awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u |
            while read -r mod; do echo "	$mod => $mod v0.${version#v1.}"; done
        echo ")"
    } >"$dir/go.mod"
}

gobuild_k8s_ldflags() {
    local version="$1" minor pkg flags=""
    minor="${version#v1.}"; minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$flags"
}
