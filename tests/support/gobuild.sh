# Shared by the scripts that compile test binaries from the Go module proxy into a per-machine cache
# (tests/envtest/build.sh, tests/monitoring/build-prometheus.sh, tests/cluster/build.sh). Source it,
# set LOG_PREFIX, then:
#   gobuild_lock DEST        make DEST, take the cache's build lock (two callers never both compile)
#   gobuild_workdir NAME     a temporary folder removed on exit, in $WORK
#   gobuild_install SRC BIN  copy a built binary into $DEST atomically
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
