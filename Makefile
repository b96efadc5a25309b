PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test check lint bench venv lab

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e .

demo: $(BIN)/python
	$(BIN)/pip install -q -e '.[notebook]'
	$(BIN)/python -m istos.demo
	$(BIN)/python -m istos_nb.demo
	@echo "Next: 'make lab' opens the notebooks (notebooks/01-quickstart first) in JupyterLab."

# JupyterLab and the kernel into .venv, then notebooks/01-quickstart. JUPYTER_PATH puts the
# venv's kernelspec first, so a python3 kernelspec elsewhere in ~/.local cannot stand in for it.
# tools/lab.py turns the news pop-up off in the venv's settings and prints the notebook's URL.
lab: $(BIN)/python
	$(BIN)/pip install -q -e '.[lab]'
	JUPYTER_PATH=$(abspath $(VENV))/share/jupyter $(BIN)/python tools/lab.py $(LAB_ARGS)

# The whole suite, in parallel (pytest-xdist): most tests wait on sockets, processes and
# servers, so more workers than cores pays. Tests that need a resource to themselves say so
# (tests/conftest.py); `make test PYTEST_WORKERS=0` runs it serially.
PYTEST_WORKERS ?= 6
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadgroup)

# Bytecode on: the suite starts hundreds of Python processes (nodes, CLIs, kernels) that import
# the engine, and each pytest worker rewrites the test modules' asserts; with
# PYTHONDONTWRITEBYTECODE set (some shells and images set it) every one of them compiles the
# sources again (a third of test_cli.py's CPU). The sources are compiled once, in parallel,
# before the workers start; pytest caches its rewritten test modules beside them.
PYTEST_ENV = PYTHONDONTWRITEBYTECODE=
COMPILE = $(PYTEST_ENV) $(BIN)/python -m compileall -q -j 0 -x '/\.' istos istos_nb tests bench

# The dev extra, installed again only when pyproject.toml changed.
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

test: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(COMPILE)
	$(PYTEST_ENV) $(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The inner loop (< 90 s on 2 cores): the linters and the tests marked `fast` (no process,
# browser, kernel, server or Zenoh session; see docs/contributing.md).
check: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(COMPILE)
	$(PYTEST_ENV) $(BIN)/python -m pytest -q -m fast -n 2

lint: $(BIN)/python
	$(BIN)/ruff check .

bench: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m bench.engine
	$(BIN)/python -m bench.sim
	$(BIN)/python -m bench.durable
	$(BIN)/python bench/attach_perf.py
	$(BIN)/python bench/frames_charts_perf.py

.PHONY: docs
# The docs site into docs/_build/html: offline (nothing is fetched, the notebooks are shown
# as committed, never executed), every warning an error; -E rereads every page, so a page
# added beside docs/index.md joins its section (%optional-pages%) in an incremental build too.
docs: $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
	@echo "Built docs/_build/html/index.html"
