# `make demo` and `make test` install whatever is missing first (scripts/setup.sh), then run.
.PHONY: setup demo test lint bench clean

VENV := .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/cdc demo

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/log_append.py

clean:
	rm -rf $(VENV) cdc-data .pytest_cache .mypy_cache .ruff_cache
