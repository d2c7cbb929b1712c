#!/usr/bin/env bash
# Copies the jars the throwaway Kafka brokers run from (scripts/jvm/kafka/pom.xml: the broker,
# kafka-tools, a log4j2 slf4j binding, and everything they depend on) into .cache/jars/kafka, with
# Maven, once. Run by scripts/setup.sh; again only when the pom changes. Tests, the demo and the
# benchmarks never fetch anything: cdc/servers/kafka.py only reads that folder.
set -euo pipefail
cd "$(dirname "$0")/.."

pom=scripts/jvm/kafka/pom.xml
out=.cache/jars/kafka
stamp=.cache/jars/kafka.stamp

if [ -d "$out" ] && [ -f "$stamp" ] && [ ! "$pom" -nt "$stamp" ]; then
  exit 0
fi
if ! command -v mvn >/dev/null; then
  echo "fetch_jars: mvn is not installed (scripts/setup.sh installs Debian's maven)" >&2
  exit 1
fi
echo "setup: fetching the Kafka jars into $out (Maven)"
# a fresh folder, so a version bump leaves no old jar behind on the classpath
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p .cache/jars
# its output (only errors with -q, and Debian's Maven 3.8 colour resets) is shown on failure
log=.cache/jars/fetch.log
if ! mvn -q -B dependency:copy-dependencies -DoutputDirectory="$PWD/$tmp" -f "$pom" >"$log" 2>&1
then
  cat "$log" >&2
  echo "fetch_jars: Maven could not fetch the Kafka jars (see above; it needs Maven Central)" >&2
  exit 1
fi
rm -rf "$out"
mv "$tmp" "$out"
touch "$stamp"
