# syntax=docker/dockerfile:1
#
# Two images from one build, both running the one `hookline` program (the chart picks the component
# with the container's arguments, e.g. `args: [receiver, --port=8080]`):
#   operator (the default target)  everything, plus the operator's extra (kopf, kubernetes). It runs
#                                  every component, so one image can serve the whole chart, and the
#                                  operator starts worker Deployments with exactly the code it runs
#                                  (HOOKLINE_WORKER_IMAGE defaults to it).
#   service                        receiver, worker, relay and migrate only: no Kubernetes client in
#                                  the images that face partners and run handlers.
#
# Build:  docker build -t hookline:dev .                      (the operator image)
#         docker build --target service -t hookline-service:dev .
#         make images   (podman, no Docker engine, no registry: a debootstrapped Debian base; tests/images/)
# tests/chart/test_dockerfile.py checks the file's rules and replays the build stages in temporary
# virtualenvs (no container tool needed); tests/images/test_images.py runs the built images.

# An exact version tag, never a floating one. For reproducible builds, pin the digest too
# (python:3.11.14-slim-bookworm@sha256:...) and let a bot such as Renovate bump both.
# Any base with a Python >= 3.11 as `python3` and its venv module works: make images passes
# --build-arg PYTHON_IMAGE=localhost/debian-python:bookworm (Debian's /usr/bin/python3 + python3-venv).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- deps: a virtualenv with the dependencies only -------------------------------------------------
FROM ${PYTHON_IMAGE} AS deps
# The image's virtualenv never holds pip: pip lives in a build-only virtualenv and installs into the
# image's one through PIP_PYTHON (pip's --python). `python3`, not `python`: a Debian base has only
# python3 (/usr/bin/python3); the official image has both.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PIP_PYTHON=/opt/venv/bin/python
RUN python3 -m venv /opt/build-tools \
    && python3 -m venv --without-pip "$VIRTUAL_ENV"
ENV PATH="/opt/venv/bin:/opt/build-tools/bin:$PATH"
WORKDIR /src
# Dependencies get their own layers, before any source: rebuilt only when pyproject.toml changes,
# not on every source edit. Every dependency ships manylinux wheels, so no compiler is needed
# (--only-binary).
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && pip install --only-binary=:all: -r requirements.txt \
    && python -m compileall -q "$VIRTUAL_ENV"

# ---- deps-operator: the same plus the `operator` extra (kopf, kubernetes) ---------------------------
FROM deps AS deps-operator
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['operator']))" > operator-requirements.txt \
    && pip install --only-binary=:all: -r operator-requirements.txt \
    && python -m compileall -q "$VIRTUAL_ENV"

# ---- build / build-operator: the package on each set of dependencies (the same steps twice, so a
# source edit reinstalls only the package, never the Kubernetes client) ------------------------------
FROM deps AS build
COPY README.md ./
COPY services ./services
COPY operator ./operator
# A regular (not editable) install: the final stage copies only the virtualenv, not /src.
RUN pip install --no-deps . \
    && python -m compileall -q "$VIRTUAL_ENV"

FROM deps-operator AS build-operator
COPY README.md ./
COPY services ./services
COPY operator ./operator
RUN pip install --no-deps . \
    && python -m compileall -q "$VIRTUAL_ENV"

# ---- runtime: the slim base and the settings both images share; no pip, no build tree, no compilers
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="hookline" \
      org.opencontainers.image.description="Webhook infrastructure on PostgreSQL: receiver, worker, relay and Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/hookline/hookline"
ENV PATH="/opt/venv/bin:$PATH" \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOOKLINE_LOG_FORMAT=json
# A numeric UID/GID (not a name): Kubernetes' runAsNonRoot can only verify a numeric user. No
# /etc/passwd entry: nothing may ask for the user's name (the operator gives kopf its identity
# itself); HOME points at /tmp, the one writable (emptyDir) path in the chart.
ENV HOME=/tmp
# The official base ships pip in its system site-packages (a Debian base has none): nothing in a
# running container may install code.
RUN rm -rf /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/lib/python3*/site-packages/pip \
    /usr/local/lib/python3*/site-packages/pip-*.dist-info
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 8081 8082
ENTRYPOINT ["hookline"]
CMD ["--help"]

# ---- service: receiver, worker, relay, migrate ------------------------------------------------------
FROM runtime AS service
COPY --from=build /opt/venv /opt/venv

# ---- operator: every component and the operator (the default target: last) -------------------------
FROM runtime AS operator
COPY --from=build-operator /opt/venv /opt/venv
