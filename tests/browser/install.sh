#!/usr/bin/env bash
# Debian's chromium, for the console's browser test (tests/test_console_browser.py drives it with
# Playwright pointed at /usr/bin/chromium: `playwright install` downloads browsers, which we never do).
# apt-get once per machine; an installed chromium is left alone. Without root or apt-get nothing is
# installed and the browser test skips itself, unless HOOKLINE_REQUIRE_BROWSER=1 (CI) makes that an error.
set -euo pipefail
PACKAGES=(chromium)
not_here() {
    echo "browser: $1; the console browser test will be skipped (HOOKLINE_REQUIRE_BROWSER=1 makes that an error)" >&2
    [[ "${HOOKLINE_REQUIRE_BROWSER:-}" == 1 ]] && exit 1
    exit 0
}
[[ -x /usr/bin/chromium ]] && exit 0
[[ "$(id -u)" == 0 ]] || not_here "apt-get needs root"
command -v apt-get >/dev/null || not_here "no apt-get to install ${PACKAGES[*]}"
echo "browser: installing ${PACKAGES[*]}" >&2
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" >&2; }
# The package lists may be missing or stale on a fresh machine: update once and try again.
apt_get install -y --no-install-recommends "${PACKAGES[@]}" \
    || { apt_get update && apt_get install -y --no-install-recommends "${PACKAGES[@]}"; }
[[ -x /usr/bin/chromium ]] || not_here "installed ${PACKAGES[*]} but /usr/bin/chromium is missing"
