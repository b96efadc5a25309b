PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench venv lab

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

test: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

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
# as committed, never executed), every warning an error.
docs: $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "Built docs/_build/html/index.html"
