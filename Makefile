PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e .

demo: $(BIN)/python
	$(BIN)/pip install -q -e '.[notebook]'
	$(BIN)/python -m istos.demo
	$(BIN)/python -m istos_nb.demo

test: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check .
	$(BIN)/mypy
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
