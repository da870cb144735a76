# dprelease: `make release` runs the default release; `make test` runs the linters (`make lint`) and the test suite.
# Both create (or reuse) the virtualenv in .venv and install the project into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= deploy/releases/acs2018_default.yaml
RUN_ARGS ?=

.PHONY: release test lint install plan clean-release

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

install: $(BIN)/.installed

release: $(BIN)/.installed
	$(BIN)/dprelease run $(CONFIG) $(RUN_ARGS)

plan: $(BIN)/.installed
	$(BIN)/dprelease plan $(CONFIG)

lint: $(BIN)/.installed
	$(BIN)/ruff check engine schemas tasks flows tests benchmarks
	$(BIN)/mypy

test: $(BIN)/.installed lint
	$(BIN)/python -m pytest
