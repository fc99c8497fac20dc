# syntax=docker/dockerfile:1
#
# One image for every Hookline component: receiver, worker, relay, operator and migrations are
# subcommands of the same `hookline` program and share one dependency set, so one image means one
# build, one scan, one signature and one tag to promote. It also lets the operator start worker
# Deployments with exactly the code the receiver runs (HOOKLINE_WORKER_IMAGE defaults to it).
# The chart picks the component with the container's arguments, e.g. `args: [receiver, --port=8080]`.
#
# Build:  docker build -t hookline:dev .
# tests/chart/test_dockerfile.py replays this file's build stage (COPY/RUN/ENV/WORKDIR) in a temporary
# virtualenv and checks its rules, since the development machines have no Docker engine.

# An exact version tag, never a floating one. For reproducible builds, pin the digest too
# (python:3.11.14-slim-bookworm@sha256:...) and let a bot such as Renovate bump both.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- build: a virtualenv with the dependencies, then the package --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv
RUN python -m venv "$VIRTUAL_ENV"
ENV PATH="/opt/venv/bin:$PATH"
WORKDIR /src
# Dependencies get their own layer: it is rebuilt only when pyproject.toml changes, not on every
# source edit. Every dependency ships manylinux wheels, so no compiler is needed (--only-binary).
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && pip install --only-binary=:all: -r requirements.txt
COPY README.md ./
COPY services ./services
COPY operator ./operator
# A regular (not editable) install: the final stage copies only the virtualenv, not /src.
RUN pip install --no-deps . \
    && python -m compileall -q "$VIRTUAL_ENV"

# ---- runtime: the slim base plus the virtualenv; no pip cache, no build tree, no compilers -------
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
COPY --from=build /opt/venv /opt/venv
# A numeric UID/GID (not a name): Kubernetes' runAsNonRoot can only verify a numeric user. No
# /etc/passwd entry is needed; HOME points at /tmp, the one writable (emptyDir) path in the chart.
ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 8081 8082
ENTRYPOINT ["hookline"]
CMD ["--help"]
