#!/usr/bin/env bash
# Debian's Postgres engines beside the embedded one, for the tests of production Postgres (issue 27):
#   postgresql-15                  a second supported major (tests/test_versions.py, the PG 15 run)
#   postgresql-15-auto-failover,   pg_auto_failover (the extension and pg_autoctl): a monitor, a primary
#   pg-auto-failover-cli           and a synchronous standby
#   pgbouncer                      a real pooler in transaction and session mode
# apt-get once per machine; what is installed already is left alone. Without root or apt-get nothing
# is installed and those tests skip themselves, unless HOOKLINE_REQUIRE_ENGINES=1 (CI) makes that an error.
set -euo pipefail
PACKAGES=(postgresql-15 postgresql-15-auto-failover pg-auto-failover-cli pgbouncer)
has_packages() {
    [[ -x /usr/lib/postgresql/15/bin/postgres && -x /usr/bin/pg_autoctl && -e /usr/lib/postgresql/15/lib/pgautofailover.so && -x /usr/sbin/pgbouncer ]]
}
not_here() {
    echo "engines: $1; the HA, pooler and Postgres 15 tests will be skipped (HOOKLINE_REQUIRE_ENGINES=1 makes that an error)" >&2
    [[ "${HOOKLINE_REQUIRE_ENGINES:-}" == 1 ]] && exit 1
    exit 0
}
has_packages && exit 0
[[ "$(id -u)" == 0 ]] || not_here "apt-get needs root"
command -v apt-get >/dev/null || not_here "no apt-get to install ${PACKAGES[*]}"
echo "engines: installing ${PACKAGES[*]}" >&2
# Debian's packages start their own servers (the postgresql "main" cluster on 5432, pgbouncer on 6432):
# the tests run theirs on free ports, so ours are told not to start (policy-rc.d), and none is created.
mkdir -p /etc/postgresql-common
grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf \
    || echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf
policy=/usr/sbin/policy-rc.d
restore_policy=false
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy && restore_policy=true
fi
trap '$restore_policy && rm -f $policy' EXIT
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
    "${PACKAGES[@]}" >&2 || { apt-get -o DPkg::Lock::Timeout=600 update >&2 && \
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
    "${PACKAGES[@]}" >&2; }
has_packages || not_here "installed ${PACKAGES[*]} but a binary is missing"
