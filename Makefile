# Hookline — two commands on a fresh machine with Python 3.11+ and make:
#   make run    the whole stack on an embedded Postgres (hookline dev)
#   make test   lint, type-check and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml | $(PYTHON) -c "import sys,hashlib;print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest()[:12])")
ARGS   ?=

.PHONY: run test lint typecheck pytest bench-receiver bench-worker bench-relay envtest clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

run: $(STAMP)  ## start the whole stack on an embedded Postgres (Ctrl-C stops it)
	$(BIN)/hookline dev $(ARGS)

test: lint typecheck pytest  ## ruff, mypy --strict and the whole test suite

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check services operator tests

typecheck: $(STAMP)  ## mypy --strict on the project's packages
	$(BIN)/mypy

pytest: $(STAMP)  ## the test suite (real Postgres, real processes)
	$(BIN)/pytest $(ARGS)

bench-receiver: $(STAMP)  ## receiver throughput vs the pgbench ceiling
	$(BIN)/python -m benchmarks.receiver $(ARGS)

clean:  ## remove the virtualenv and dev data
	rm -rf $(VENV) .hookline .mypy_cache .ruff_cache .pytest_cache
