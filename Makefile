# Hookline — two commands on a fresh machine with Python 3.11+ and make:
#   make run    the whole stack on an embedded Postgres (hookline dev)
#   make test   lint, type-check and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
HASH    = $(shell cat pyproject.toml | $(PYTHON) -c "import sys,hashlib;print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest()[:12])")
STAMP   = $(VENV)/.installed-$(HASH)
RUN_STAMP = $(VENV)/.installed-run-$(HASH)
ARGS   ?=

.PHONY: run test lint typecheck pytest pytest-pg15 schema docs chart-docs crds helm-docs bench bench-receiver bench-worker bench-relay bench-operator-stats bench-storage envtest prometheus images engines browser screenshots clean help

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

# Extras: dev = embedded Postgres (hookline dev, the tests), operator = kopf and kubernetes.
# `make run` installs only what `hookline dev` needs; `make test` everything (a superset, so a
# venv made by `make test` serves `make run` too).
define make_venv
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
endef

$(RUN_STAMP): pyproject.toml
	$(make_venv)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-run-* && touch $@

$(STAMP): pyproject.toml
	$(make_venv)
	$(BIN)/python -m pip install --quiet -e '.[dev,operator,test,otel]'
	rm -f $(VENV)/.installed-* && touch $@ $(RUN_STAMP)

run: $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))  ## start the whole stack on an embedded Postgres (Ctrl-C stops it)
	$(BIN)/hookline dev $(ARGS)

test: lint typecheck pytest pytest-pg15  ## ruff, mypy --strict, the whole test suite, and its database-facing files on Postgres 15

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check services operator tests

typecheck: $(STAMP)  ## mypy --strict on the project's packages
	$(BIN)/mypy

pytest: $(STAMP) envtest helm-docs prometheus cluster images engines browser  ## the test suite (real Postgres, real processes, a real kube-apiserver, Prometheus and pods on a local cluster, failover, PgBouncer)
	$(BIN)/pytest $(ARGS)

# The database-facing files again on the oldest supported major (docs/postgres.md, "Supported
# versions"): the queue, the schema and its upgrades, the tenant boundary, retention and the services.
PG15_TESTS = tests/test_sql.py tests/test_queue.py tests/test_outbox.py tests/test_worker.py \
	tests/test_receiver.py tests/test_tenant_boundary.py tests/test_tenant_roles.py tests/test_upgrade.py \
	tests/test_retention.py tests/test_attempt_log_partitions.py tests/test_maintenance.py \
	tests/test_history.py tests/test_secrets_at_rest.py tests/test_status.py tests/test_dlq_inbox.py \
	tests/test_end_to_end.py tests/test_worker_crash_isolation.py tests/test_listener.py tests/test_relay.py \
	tests/test_console_role.py tests/test_console_sql.py

pytest-pg15: $(STAMP) engines  ## the database-facing test files on Debian's Postgres 15 (the suite's other run is on the embedded 18)
	HOOKLINE_TEST_POSTGRES=15 $(BIN)/pytest $(PG15_TESTS)

schema: $(STAMP)  ## rewrite services/hookline/core/sql/schema.sql, the current schema as one file, from the migrations
	PYTHONPATH=tests $(BIN)/python -m support.schema

docs: $(STAMP)  ## rewrite docs/provider-spec.md from the CRD (crds/) and the signature schemes; tests/test_specdoc.py checks it
	PYTHONPATH=tests $(BIN)/python -m support.specdoc

chart-docs: $(STAMP) helm-docs  ## rewrite charts/hookline/README.md from its README.md.gotmpl and the `# --` comments in values.yaml (helm-docs)
	PYTHONPATH=tests $(BIN)/python -m support.chartdocs

crds:  ## copy crds/ (the CRD's one source) into the chart's files/crds/ (a copy: Helm logs a line for every symlink in a chart)
	rm -f charts/hookline/files/crds/*.yaml
	cp crds/*.yaml charts/hookline/files/crds/

envtest:  ## build etcd, kube-apiserver and kubectl once per machine (cached in ~/.cache/hookline/envtest)
	@if command -v go >/dev/null 2>&1 || [ -n "$$KUBEBUILDER_ASSETS" ]; then \
		nice -n 19 tests/envtest/build.sh; \
	else \
		echo "envtest: no Go toolchain; Kubernetes tests will be skipped (HOOKLINE_REQUIRE_K8S=1 makes that an error)"; \
	fi

helm-docs:  ## build helm-docs once per machine (cached in ~/.cache/hookline/helm-docs), for `make chart-docs` and its test
	@if command -v go >/dev/null 2>&1; then \
		nice -n 19 tests/chart/build-helm-docs.sh; \
	else \
		echo "helm-docs: no Go toolchain; the chart README test will be skipped (HOOKLINE_REQUIRE_K8S=1 makes that an error)"; \
	fi

prometheus:  ## prometheus and promtool from PATH, or built once per machine (cached in ~/.cache/hookline/prometheus)
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || command -v go >/dev/null 2>&1; then \
		nice -n 19 tests/monitoring/build-prometheus.sh; \
	else \
		echo "prometheus: no binaries and no Go toolchain; monitoring tests will be skipped (HOOKLINE_REQUIRE_PROMETHEUS=1 makes that an error)"; \
	fi

engines:  ## apt-get Debian's Postgres 15, pg_auto_failover and PgBouncer once per machine (the failover, pooler and second-major tests)
	tests/engines/install.sh

browser:  ## apt-get Debian's chromium once per machine (the console's browser test drives it with Playwright)
	tests/browser/install.sh

# Only here does the browser test write docs/images: other runs keep their screenshots in tmp_path.
screenshots: $(STAMP) browser  ## retake the README's console screenshots (docs/images/console-*.png) with the browser test
	HOOKLINE_WRITE_SCREENSHOTS=1 HOOKLINE_REQUIRE_BROWSER=1 $(BIN)/pytest -q tests/test_console_browser.py

images:  ## build the hookline and hookline-service images with podman from a debootstrapped base, no Docker or registry (OCI archives in ~/.cache/hookline/images)
	nice -n 19 tests/images/build.sh

bench: $(STAMP)  ## the four benchmarks in a short mode (a few minutes) and one table of every ratio and its target
	$(BIN)/python -m benchmarks.summary

bench-receiver: $(STAMP)  ## receiver throughput vs the pgbench ceiling (load from wrk when installed)
	$(BIN)/python -m benchmarks.receiver $(ARGS)

bench-worker: $(STAMP)  ## worker drain vs the pgbench ceiling, PgQueuer and procrastinate; e2e latency
	$(BIN)/python -m benchmarks.worker $(ARGS)

bench-relay: $(STAMP)  ## outbox relay: 50,000 events to a local endpoint at concurrency 64
	$(BIN)/python -m benchmarks.relay $(ARGS)

bench-operator-stats: $(STAMP)  ## the operator's one statistics query per tick, at 1 million inbox events
	$(BIN)/python -m benchmarks.operator_stats $(ARGS)

bench-storage: $(STAMP)  ## real workers and a relay draining: five drains without a vacuum, 2 million done rows in today's partition (and a held snapshot), history in an old one; statistics, partition drops under ingest, sizes under steady load
	$(BIN)/python -m benchmarks.storage $(ARGS)

clean:  ## remove the virtualenv and dev data
	rm -rf $(VENV) .hookline .mypy_cache .ruff_cache .pytest_cache

# --- Kubernetes dev loop (optional: needs Docker, kind, kubectl, helm and skaffold) -----------------
KIND_CLUSTER ?= hookline
.PHONY: kind-up dev-k8s kind-down

kind-up:  ## create a local kind cluster named $(KIND_CLUSTER) (idempotent)
	@command -v kind >/dev/null || { echo "kind is not installed: https://kind.sigs.k8s.io/docs/user/quick-start/"; exit 1; }
	kind get clusters | grep -qx '$(KIND_CLUSTER)' || kind create cluster --name '$(KIND_CLUSTER)' --wait 120s
	kubectl config use-context 'kind-$(KIND_CLUSTER)'

dev-k8s:  ## build, deploy the chart with dev values and sync code on every save (skaffold dev)
	@command -v skaffold >/dev/null || { echo "skaffold is not installed: https://skaffold.dev/docs/install/"; exit 1; }
	skaffold dev --profile kind --kube-context 'kind-$(KIND_CLUSTER)' $(ARGS)

kind-down:  ## delete the kind cluster
	kind delete cluster --name '$(KIND_CLUSTER)'

# --- A real single-node cluster on this machine (no Docker: containerd + a kubelet; needs root) ---------
.PHONY: cluster cluster-up cluster-down

cluster: envtest  ## build the local cluster's kubelet, control plane, CoreDNS and helm once (cached in ~/.cache/hookline/cluster) and apt-get containerd, runc, CNI plugins
	@if command -v go >/dev/null 2>&1; then \
		nice -n 19 tests/cluster/build.sh; \
	else \
		echo "cluster: no Go toolchain; the cluster tests will be skipped (HOOKLINE_REQUIRE_CLUSTER=1 makes that an error)"; \
	fi

cluster-up: $(STAMP) cluster images  ## start the local single-node cluster with the images (prints KUBECONFIG; Ctrl-C or make cluster-down stops it)
	$(BIN)/python tests/cluster/cluster.py up

cluster-down:  ## stop the cluster make cluster-up started
	$(BIN)/python tests/cluster/cluster.py down
