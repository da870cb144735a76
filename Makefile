# dprelease: `make release` runs the default release; `make test` runs the linters (`make lint`) and the test suite.
# Both create (or reuse) the virtualenv in .venv and install the project into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= deploy/releases/acs2018_default.yaml
RUN_ARGS ?=

.PHONY: release test lint install install-browser plan clean-release scale

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

install: $(BIN)/.installed

# Chromium from the Debian packages, for the test that opens a release's report.html in a real browser
# (tests/test_release_report.py). Idempotent; without apt-get or root it says so and that test is skipped.
install-browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then echo "install-browser: no apt-get here; the browser test of report.html will be skipped"; \
	elif [ "$$(id -u)" != 0 ]; then echo "install-browser: not root, cannot apt-get install chromium; the browser test of report.html will be skipped"; \
	else DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >/dev/null \
	  || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >/dev/null; } \
	  || echo "install-browser: apt-get install chromium failed; the browser test of report.html will be skipped"; fi

release: $(BIN)/.installed
	$(BIN)/dprelease run $(CONFIG) $(RUN_ARGS)

plan: $(BIN)/.installed
	$(BIN)/dprelease plan $(CONFIG)

# the whole pipeline's scale curve at 1x and 4x the shared data (benchmarks/scale.py; each size
# alone on the machine, the table records the commit): what a change to synthesis runs before it is
# called done, beside the peer benchmark. SCALES="1,4,16" SCALE_ARGS="--national" for the full curve.
SCALES ?= 1,4
SCALE_ARGS ?=
scale: $(BIN)/.installed
	$(BIN)/python benchmarks/scale.py --scales $(SCALES) $(SCALE_ARGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check engine schemas tasks flows tests benchmarks
	$(BIN)/mypy

# the suite in parallel worker processes (pytest-xdist; tests/conftest.py gives each its own Prefect
# home, one Prefect server for the session, one Dask cluster per worker).
# TEST_ARGS="-n 0" runs it in one process.
TEST_ARGS ?= -n auto --maxprocesses 4 --dist worksteal

test: $(BIN)/.installed install-browser lint
	$(BIN)/python -m pytest $(TEST_ARGS)
