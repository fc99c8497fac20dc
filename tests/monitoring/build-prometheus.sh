#!/usr/bin/env bash
# Provide prometheus and promtool for the monitoring tests:
#   ${HOOKLINE_PROMETHEUS_CACHE:-$HOME/.cache/hookline/prometheus}/<version>/{prometheus,promtool}
# Binaries already on PATH (Debian's `prometheus` package has both) are used as they are. Otherwise
# they are compiled once from the Go module proxy with the machine's Go toolchain; later runs find
# them in the cache and return at once. Prints the directory holding the binaries as the last line.
set -euo pipefail

# Prometheus v3.X.Y is published to the Go module proxy as github.com/prometheus/prometheus v0.3XX.Y.
# Keep PROMETHEUS_VERSION in sync with PROMETHEUS_VERSION in tests/monitoring/prom.py.
PROMETHEUS_VERSION="3.16.0"
MODULE_VERSION="v0.316.0"   # needs go >= 1.26.7

log() { printf 'prometheus: %s\n' "$*" >&2; }

has_all() { [[ -x "$1/prometheus" && -x "$1/promtool" ]]; }

on_path="$(command -v prometheus || true)"
if [[ -n "$on_path" ]] && command -v promtool >/dev/null; then
    log "using prometheus and promtool from PATH"
    dirname "$on_path"
    exit 0
fi

CACHE="${HOOKLINE_PROMETHEUS_CACHE:-$HOME/.cache/hookline/prometheus}"
DEST="$CACHE/$PROMETHEUS_VERSION"
if has_all "$DEST"; then
    echo "$DEST"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { log "no Go toolchain found (set GO=/path/to/go)"; exit 1; }
# The local Go must do (no toolchain download); no go.work or go.mod around the caller takes part.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"

mkdir -p "$DEST"
# Two concurrent callers (make + pytest) must not both spend minutes compiling.
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.build.lock"
    flock 9
fi
if has_all "$DEST"; then echo "$DEST"; exit 0; fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/hookline-prometheus.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building Prometheus $PROMETHEUS_VERSION with $("$GO" version) (first time: several minutes)"

# Tags: no builtinassets, so no web UI assets are needed (the HTTP API is all the tests use);
# remove_all_sd drops every cloud service discovery (tests scrape static targets), which cuts the
# dependencies to compile by most of them.
TAGS="netgo remove_all_sd"
LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
LDFLAGS+=" -X github.com/prometheus/common/version.Branch=HEAD"

# A wrapper module: `go install pkg@version` would work today, but a wrapper also survives a future
# replace directive in Prometheus's go.mod, like tests/envtest/build.sh does for Kubernetes.
printf 'module hookline.local/prometheus\n\ngo 1.26.7\n\nrequire github.com/prometheus/prometheus %s\n' \
    "$MODULE_VERSION" >"$WORK/go.mod"
mkdir -p "$WORK/out"
for binary in prometheus promtool; do
    (cd "$WORK" && nice -n 19 "$GO" build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
        -o "$WORK/out/$binary" "github.com/prometheus/prometheus/cmd/$binary")
    # rename(2) within one filesystem: a reader never sees a half-written binary.
    cp "$WORK/out/$binary" "$DEST/.$binary.tmp" && mv -f "$DEST/.$binary.tmp" "$DEST/$binary"
    log "built $DEST/$binary"
done

echo "$DEST"
