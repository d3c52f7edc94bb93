# usmkit: `make demo` sets up and runs the pipeline on the embedded corpus; `make test` runs the tests.
# `make lint` checks style (CI runs it too); `make test-slow` runs the slow tests kept out of `make test`
# (long trainings, multi-process runs, the real corpora); `make test-gpu` the tests that need CUDA.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA := data/demo
EXP := exp/demo_ctc

.PHONY: demo test test-slow test-gpu lint venv clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python -m usmkit.cli.prepare synth out=$(DATA) size=demo
	$(BIN)/python -m usmkit.cli.demo data=$(DATA) exp=$(EXP)

test: $(VENV)/.installed
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m 'slow and not gpu'

test-gpu: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m gpu

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) data exp outputs
