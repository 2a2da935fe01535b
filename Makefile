# Two commands do all the set-up: `make run` starts the lobby, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint bench schema clean

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

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks

schema: $(STAMP)
	$(BIN)/lobby schema --write protocol/schema

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
