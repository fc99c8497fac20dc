#!/usr/bin/env bash
# Provide helm-docs, which writes charts/hookline/README.md from values.yaml's `# --` comments
# (`make chart-docs`; tests/chart/test_chart_docs.py checks the README is what it writes):
#   ${HOOKLINE_HELM_DOCS_CACHE:-$HOME/.cache/hookline/helm-docs}/<version>/helm-docs
# Compiled once from the Go module proxy with the machine's Go toolchain; later runs find it in the
# cache and return at once. Not taken from PATH: another version may write another README.
# Prints the directory holding the binary as the last line of stdout.
set -euo pipefail

# Keep in sync with HELM_DOCS_VERSION in tests/support/chartdocs.py: it names the cache folder.
HELM_DOCS_VERSION="1.14.2"

LOG_PREFIX=helm-docs
# shellcheck source=../support/gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/gobuild.sh"

CACHE="${HOOKLINE_HELM_DOCS_CACHE:-$HOME/.cache/hookline/helm-docs}"
DEST="$CACHE/$HELM_DOCS_VERSION"
if [[ -x "$DEST/helm-docs" ]]; then
    echo "$DEST"
    exit 0
fi

gobuild_lock "$DEST"
if [[ -x "$DEST/helm-docs" ]]; then echo "$DEST"; exit 0; fi

gobuild_workdir helm-docs
log "building helm-docs $HELM_DOCS_VERSION with $("$GO" version) (first time: a few minutes)"

# A wrapper module, like tests/envtest/build.sh: it survives a future replace directive upstream.
printf 'module hookline.local/helm-docs\n\ngo 1.26.0\n\nrequire github.com/norwoodj/helm-docs v%s\n' \
    "$HELM_DOCS_VERSION" >"$WORK/go.mod"
gobuild_go "$WORK" github.com/norwoodj/helm-docs/cmd/helm-docs helm-docs " -X main.version=$HELM_DOCS_VERSION"

echo "$DEST"
