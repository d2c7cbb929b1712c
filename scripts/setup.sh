#!/usr/bin/env bash
# Installs whatever is missing on a fresh machine: Debian packages, a virtualenv in .venv and the
# project (editable, with dev extras). Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
need_apt=()
# python3-venv: only when the interpreter cannot create a virtualenv with pip by itself
if [ ! -x .venv/bin/python ] && ! "$PY" -c "import ensurepip, venv" >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
# PostgreSQL server binaries (initdb, pg_ctl, pg_recvlogical): tests and the demo start their own
# throwaway clusters from them.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  need_apt+=(postgresql)
fi
# MariaDB server and client (mariadbd, mariadb-install-db, mariadb-binlog): the MySQL/MariaDB
# connector's tests, benchmarks and the demo start their own throwaway servers from them
if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
  need_apt+=(mariadb-server mariadb-client)
fi
# redis-server: the Redis follower's tests and the demo start their own throwaway server
if ! command -v redis-server >/dev/null; then
  need_apt+=(redis-server)
fi
# promtool (Debian's prometheus package; its daemon is not started here): checks and unit-tests
# the alert rules in deploy/monitoring (tests/test_monitoring.py)
if ! command -v promtool >/dev/null; then
  need_apt+=(prometheus)
fi
# systemd-analyze (Debian's systemd package; nothing is started): verifies the units in
# deploy/systemd (tests/test_monitoring.py)
if ! command -v systemd-analyze >/dev/null; then
  need_apt+=(systemd)
fi
# Java 17+: Spark (pyspark, local mode) runs the apply jobs
if ! command -v java >/dev/null; then
  need_apt+=(openjdk-17-jre-headless)
fi
# Maven: fetches the Kafka broker's and Spark's connector jars once (`cdc setup`, below)
if ! command -v mvn >/dev/null; then
  need_apt+=(maven)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating virtualenv .venv"
  "$PY" -m venv .venv
fi

stamp=.venv/.cdc-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev,spark]'
  touch "$stamp"
fi

# the JVM jars, from Maven into the user's jar cache (~/.cache/cdc/jars, or $CDC_JARS_DIR), once:
# Spark's Kafka source, spark-avro and delta-spark, which `cdc apply` passes with `spark.jars`, and
# Apache Kafka's broker, which the tests, the demo and the benchmarks run throwaway KRaft brokers
# from (cdc/jvm: the poms; never fetched at run time)
.venv/bin/cdc setup
# ... and Kafka Connect with Debezium's JDBC sink and Apicurio Registry, which the
# interoperability tests run
.venv/bin/cdc setup --only connect --only apicurio
