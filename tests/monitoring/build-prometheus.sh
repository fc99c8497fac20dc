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

LOG_PREFIX=prometheus
# shellcheck source=../support/gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/gobuild.sh"

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

gobuild_lock "$DEST"
if has_all "$DEST"; then echo "$DEST"; exit 0; fi

gobuild_workdir prometheus
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
for binary in prometheus promtool; do
    (cd "$WORK" && nice -n 19 "$GO" build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
        -o "$WORK/out/$binary" "github.com/prometheus/prometheus/cmd/$binary")
    gobuild_install "$WORK/out/$binary" "$binary"
done

echo "$DEST"
