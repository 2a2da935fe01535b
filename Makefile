# Two commands do all the set-up: `make run` starts the lobby, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/lobby serve

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks

schema: $(STAMP)
	$(BIN)/lobby schema --write protocol/schema

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
