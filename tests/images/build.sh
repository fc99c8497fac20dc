#!/usr/bin/env bash
# Build the images users get from the repository's Dockerfile with podman (no Docker engine, no
# registry), plus the local cluster's pause image, and export each as an OCI archive:
#   ${HOOKLINE_IMAGE_CACHE:-$HOME/.cache/hookline/images}/{hookline,hookline-service,pause}.oci.tar
# The base is localhost/debian-python:bookworm, made once by debootstrap from the machine's apt
# mirror, unless HOOKLINE_PYTHON_IMAGE names another (e.g. python:3.11.14-slim-bookworm from a
# registry). An archive is rebuilt only when the hash of its inputs changes. Prints the folder as
# the last line of stdout; without podman/debootstrap/go it prints how to enable them and exits 0
# (HOOKLINE_REQUIRE_CLUSTER=1: exit 1). See tests/images/README.md.
set -euo pipefail

log() { printf 'images: %s\n' "$*" >&2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${HOOKLINE_IMAGE_CACHE:-$HOME/.cache/hookline/images}"
BASE_IMAGE="${HOOKLINE_PYTHON_IMAGE:-localhost/debian-python:bookworm}"
DEBIAN_SUITE="bookworm"  # its python3 is 3.11, the version the official base pins
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
# This host needs runc, cgroupfs and small ulimits (the file says why); a caller's own file wins.
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"

unavailable() { # unavailable <what is missing> <how to get it>
    if [[ "${HOOKLINE_REQUIRE_CLUSTER:-}" == "1" ]]; then
        log "$1 is missing and HOOKLINE_REQUIRE_CLUSTER=1: $2"
        exit 1
    fi
    log "$1 is missing: no images built ($2; HOOKLINE_REQUIRE_CLUSTER=1 makes this an error)"
    exit 0
}

# As root with apt-get (CI, a fresh machine of this kind), Debian's packages are installed rather than
# reported missing: `make test` must work on a clean machine. Installed with their recommends, as tested.
install_packages() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman buildah)
    command -v runc >/dev/null || missing+=(runc)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [[ ${#missing[@]} -gt 0 && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null || return 0
    log "installing ${missing[*]}"
    # Another apt-get (the cluster's build) may hold the lock for a while: wait for it instead of failing.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y "${missing[@]}" >&2
}

check_tools() {
    install_packages
    command -v podman >/dev/null || unavailable podman "apt-get install -y podman buildah runc"
    command -v runc >/dev/null || unavailable runc "apt-get install -y runc"
    [[ -x "$GO" ]] || unavailable "a Go toolchain (for the pause image)" "install Go or set GO=/path/to/go"
    if [[ "$BASE_IMAGE" == localhost/debian-python:* ]] && ! podman image exists "$BASE_IMAGE"; then
        command -v debootstrap >/dev/null || unavailable debootstrap "apt-get install -y debootstrap"
        [[ "$(id -u)" == 0 ]] || unavailable "root (debootstrap needs it)" "run make images as root once"
    fi
}

# The first apt source serving the suite itself (not -updates/-security): the machine's own mirror.
debian_mirror() {
    if [[ -n "${HOOKLINE_DEBIAN_MIRROR:-}" ]]; then echo "$HOOKLINE_DEBIAN_MIRROR"; return; fi
    local mirror
    mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$DEBIAN_SUITE" '
        /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) { print uri; exit } }
        /^$/ { uri = "" }')"
    [[ -n "$mirror" ]] || mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk -v suite="$DEBIAN_SUITE" '$1 == "deb" { for (i = 2; i < NF; i++) if ($(i + 1) == suite && $i !~ /^\[/) { print $i; exit } }')"
    [[ -n "$mirror" ]] || { log "no apt source for $DEBIAN_SUITE; set HOOKLINE_DEBIAN_MIRROR"; exit 1; }
    echo "$mirror"
}

# A minimal Debian with Python 3.11 and its venv module, as a podman image (about 130 MB).
build_debian_base() {
    local mirror root
    mirror="$(debian_mirror)"
    root="$WORK/rootfs"
    log "debootstrap $DEBIAN_SUITE from $mirror (first time: a few minutes)"
    nice -n 19 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$DEBIAN_SUITE" "$root" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
        { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
    # What the official slim images leave out too: package caches, indexes, docs, translations.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
    tar -C "$root" -c . | podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$root"
    log "built $BASE_IMAGE"
}

ensure_base() {
    if podman image exists "$BASE_IMAGE"; then return; fi
    if [[ "$BASE_IMAGE" == localhost/debian-python:* ]]; then build_debian_base; else podman pull "$BASE_IMAGE" >&2; fi
}

# sha256 of files' contents and names, plus any extra words (a base image id, a Go version).
hash_inputs() { # hash_inputs <extra words> -- <files...>
    local extra="$1"; shift 2
    { echo "$extra"; (cd "$REPO" && sha256sum -- "$@"); } | sha256sum | cut -c1-16
}

# What `COPY services/ operator/` sends to the builder (.dockerignore leaves caches out).
hookline_inputs() {
    (cd "$REPO" && {
        printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md tests/images/containers.conf
        find services operator -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' ! -path '*.egg-info/*' \
            ! -path '*/.pytest_cache/*' ! -path '*/.mypy_cache/*' ! -path '*/.ruff_cache/*' | LC_ALL=C sort
    })
}

up_to_date() { # up_to_date <archive name> <hash> <image>: the archive matches; reload podman's copy if gone
    [[ -f "$CACHE/$1.oci.tar" && "$(cat "$CACHE/$1.oci.tar.inputs" 2>/dev/null)" == "$2" ]] || return 1
    podman image exists "$3" || podman load --quiet -i "$CACHE/$1.oci.tar" >/dev/null
}

export_archive() { # export_archive <archive name> <hash> <image>
    rm -f "$CACHE/.$1.oci.tar.tmp"
    podman save --quiet --format oci-archive -o "$CACHE/.$1.oci.tar.tmp" "$3"
    mv -f "$CACHE/.$1.oci.tar.tmp" "$CACHE/$1.oci.tar"
    echo "$2" >"$CACHE/.$1.oci.tar.inputs.tmp" && mv -f "$CACHE/.$1.oci.tar.inputs.tmp" "$CACHE/$1.oci.tar.inputs"
    log "wrote $CACHE/$1.oci.tar ($(du -h "$CACHE/$1.oci.tar" | cut -f1))"
}

# The pip settings the build needs on this machine, mounted (never copied) into RUN steps: the
# machine's CA bundle (an egress proxy may sign TLS) and its index, if it names one.
pip_mounts() {
    local bundle="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
    {
        echo "[global]"
        echo "cert = /etc/ssl/certs/hookline-build-ca.crt"
        [[ -z "${PIP_INDEX_URL:-}" ]] || echo "index-url = $PIP_INDEX_URL"
        [[ -z "${PIP_EXTRA_INDEX_URL:-}" ]] || echo "extra-index-url = $PIP_EXTRA_INDEX_URL"
    } >"$WORK/pip.conf"
    PIP_MOUNTS=(--volume "$WORK/pip.conf:/etc/pip.conf:ro")
    [[ -f "$bundle" ]] && PIP_MOUNTS+=(--volume "$bundle:/etc/ssl/certs/hookline-build-ca.crt:ro")
}

build_hookline() { # build_hookline <archive name> <Dockerfile target> <image> <hash>
    if up_to_date "$1" "$4" "$3"; then return; fi
    log "building $3 (target $2) on $BASE_IMAGE"
    # --network host: pip in RUN reaches the index the way the host does; --pull=never: the base is local.
    (cd "$REPO" && nice -n 19 podman build --quiet --pull=never --network host "${PIP_MOUNTS[@]}" \
        --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --target "$2" --tag "$3" . >/dev/null)
    export_archive "$1" "$4" "$3"
}

build_pause() {
    local digest
    digest="$(hash_inputs "$("$GO" version)" -- tests/images/pause/main.go tests/images/pause/go.mod \
        tests/images/pause/Containerfile)"
    if up_to_date pause "$digest" localhost/pause:local; then return; fi
    cp "$HERE/pause/main.go" "$HERE/pause/go.mod" "$HERE/pause/Containerfile" "$WORK/"
    (cd "$WORK" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod \
        "$GO" build -trimpath -ldflags '-s -w' -o pause .)
    podman build --quiet --pull=never --file "$WORK/Containerfile" --tag localhost/pause:local "$WORK" >/dev/null
    export_archive pause "$digest" localhost/pause:local
}

main() {
    check_tools
    mkdir -p "$CACHE"
    # Two callers (make images, a test fixture) must not build the same images at once.
    if command -v flock >/dev/null; then
        exec 9>"$CACHE/.build.lock"
        flock 9
    fi
    WORK="$(mktemp -d "$CACHE/.work.XXXXXX")"  # in the cache: same file system for the renames
    trap 'rm -rf "$WORK"' EXIT

    build_pause
    ensure_base
    local base_id digest
    base_id="$(podman image inspect --format '{{.Id}}' "$BASE_IMAGE")"
    mapfile -t inputs < <(hookline_inputs)
    digest="$(hash_inputs "$base_id" -- "${inputs[@]}")"
    pip_mounts
    build_hookline hookline-service service localhost/hookline-service:dev "$digest"
    build_hookline hookline operator localhost/hookline:dev "$digest"
    echo "$CACHE"
}

main "$@"
