#!/usr/bin/env bash
# Copies JVM jars from Maven into .cache/jars, once. Run by scripts/setup.sh; again only when a pom
# changes. Tests, the demo, the benchmarks and `cdc apply` never fetch anything: they only read
# these folders.
#   scripts/jvm/kafka/pom.xml -> .cache/jars/kafka: the jars the throwaway Kafka brokers run from
#     (the broker, kafka-tools, a log4j2 slf4j binding, and everything they depend on), read by
#     cdc_app/servers/kafka.py
#   scripts/jvm/spark/pom.xml -> .cache/jars/spark: Spark's Kafka source, spark-avro and
#     delta-spark with their runtime dependencies, less what pyspark ships in its own jars/
#     folder; spark_apply/session.py passes them with `spark.jars`
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mvn >/dev/null; then
  echo "fetch_jars: mvn is not installed (scripts/setup.sh installs Debian's maven)" >&2
  exit 1
fi

# fetch NAME WHAT [MAVEN ARGS...]: scripts/jvm/NAME/pom.xml's dependencies into .cache/jars/NAME
fetch() {
  local name=$1 what=$2
  shift 2
  local pom=scripts/jvm/$name/pom.xml
  local out=.cache/jars/$name
  local stamp=.cache/jars/$name.stamp
  if [ -d "$out" ] && [ -f "$stamp" ] && [ ! "$pom" -nt "$stamp" ]; then
    return 0
  fi
  echo "setup: fetching $what into $out (Maven)"
  # a fresh folder, so a version bump leaves no old jar behind on the classpath
  local tmp="$out.tmp"
  rm -rf "$tmp"
  mkdir -p .cache/jars
  # its output (only errors with -q, and Debian's Maven 3.8 colour resets) is shown on failure
  local log=.cache/jars/fetch-$name.log
  if ! mvn -q -B dependency:copy-dependencies -DoutputDirectory="$PWD/$tmp" "$@" -f "$pom" \
      >"$log" 2>&1; then
    cat "$log" >&2
    echo "fetch_jars: Maven could not fetch $what (see above; it needs Maven Central)" >&2
    exit 1
  fi
  rm -rf "$out"
  mv "$tmp" "$out"
  touch "$stamp"
}

fetch kafka "the Kafka jars"
# runtime scope: Spark itself (spark-sql, spark-core, ...) is `provided` in these poms and comes
# from pyspark's jars/ folder; the pom excludes the other jars pyspark already ships
fetch spark "the Spark connector jars (Kafka source, Avro, Delta)" -DincludeScope=runtime
