# usmkit: `make demo` sets up and runs the pipeline on the embedded corpus; `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA := data/demo
EXP := exp/demo_ctc

.PHONY: demo test venv clean

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

clean:
	rm -rf $(VENV) data exp outputs
