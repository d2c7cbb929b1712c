"""``cdc apply`` from a Kafka log with Spark's own Kafka source (``reader: spark-kafka``: the
JVM fetches the planned offset ranges ``read_committed`` and decodes the Avro with
``from_avro``), against the same log read through the log contract (``reader: log``).

PostgreSQL captured into a throwaway broker; a table of many column types (decimals, times,
JSON, arrays, bytes, NaN...). Both readers, into Redis and Delta (SCD1, repartitioned by owner in
the JVM), give identical followers equal to the table; then ``ALTER TABLE ... ADD COLUMN`` mid
stream registers a new schema id, and the next ``cdc apply`` decodes it (the schema set is
re-read for every micro-batch) — `cdc verify` passes for every follower. The same with the log
in ``format: json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc.sink import open_sink
from tests.kafkakit import kafka_yaml
from tests.pgkit import Capture, Database, cdc, output, wait_caught_up, write_config
from tests.sparkkit import InProcessApply, apply_once

pytestmark = [pytest.mark.timeout(900)]

FOLLOWERS = ("jvm", "python", "jvm_delta")

TABLE = """
CREATE TABLE kinds (
  id int PRIMARY KEY, big bigint, amount numeric(20,5), free numeric, ratio double precision,
  flag boolean, born date, seen timestamptz, at timestamp(3), doc jsonb, tags text[],
  raw bytea, uid uuid, note text);
"""
ROW = ("INSERT INTO kinds SELECT g, g::bigint * 1000000007, g / 7.0, g * 1.5e10, "
       "CASE WHEN g %% 13 = 0 THEN 'NaN'::float8 ELSE g / 3.0 END, g %% 2 = 0, "
       "date '2020-02-29' + g, timestamptz '2024-01-01 00:00:00.123456+02' + g * interval '1 s', "
       "timestamp '1999-12-31 23:59:59' + g * interval '1 ms', "
       "jsonb_build_object('g', g, 'l', jsonb_build_array(g, 'x')), ARRAY['a' || g, NULL], "
       "decode(md5(g::text), 'hex'), md5(g::text)::uuid, 'note ' || g "
       "FROM generate_series(%s::int, %s::int) g")


def followers_yaml(redis_url: str, tmp_path: Path) -> str:
    base = redis_url.rsplit("/", 1)[0]
    return (f"followers:\n"
            f"  jvm:\n    kind: redis\n    url: {base}/3\n    reader: spark-kafka\n"
            f"  python:\n    kind: redis\n    url: {base}/4\n    reader: log\n"
            f"  jvm_delta:\n    kind: delta\n    path: {tmp_path / 'wh'}\n    buckets: 4\n"
            f"    reader: spark-kafka\n")


def held(config: Path, name: str, topic: str) -> dict[str, dict[str, str]]:
    sink = open_sink(load_config(config), name)
    try:
        return sink.read(topic, list(sink.keys(topic)))
    finally:
        sink.close()


def apply_and_verify(config: Path, topic: str, verify: bool = True
                     ) -> dict[str, dict[str, str]]:
    """``cdc apply --once`` of every follower (in this process, on the shared session), the
    followers equal to each other; with ``verify``, ``cdc verify`` of each."""
    apply_once(config, *FOLLOWERS)
    rows = {name: held(config, name, topic) for name in FOLLOWERS}
    assert rows["jvm"] == rows["python"] == rows["jvm_delta"]
    if not verify:
        return rows["jvm"]
    # verify waits for the followers to reach the leader's position: apply continuously
    running = InProcessApply(config, config.parent / "apply.log", *FOLLOWERS)
    try:
        results = {name: cdc("verify", "--config", str(config), "--follower", name,
                             "--timeout", "120s", timeout=300) for name in FOLLOWERS}
    finally:
        running_code = running.terminate()
    for name, checked in results.items():
        assert checked.returncode == 0, f"{name}: {output(checked)}"
    assert running_code == 0, running.log_file.read_text() if running.error else ""
    return rows["jvm"]


@pytest.mark.parametrize("log_format", ["avro", "json"])
def test_spark_kafka_reader_equals_the_log_reader_and_follows_add_column(
        kafka_broker: Any, pg_db: Database, tmp_path: Path, redis_url: str, spark: Any,
        log_format: str) -> None:
    """With ``log.format: json`` (Kafka Connect's form, decimals ``precise``, times
    ``adaptive``) the JVM cannot decode the values: the Spark reader's tasks turn them back into
    the log's own forms (cdc/connect.py; ``decimal_handling: string`` round-trips byte for byte
    as well: tests/test_connect_json.py)."""
    pg_db.execute(TABLE)
    pg_db.execute(ROW, (1, 300))
    options = {**kafka_yaml(kafka_broker), "format": log_format}
    if log_format == "json":  # `at` timestamp(3): Connect's Timestamp in milliseconds
        options["time_precision"] = "adaptive"
    config = write_config(tmp_path, pg_db, ["public.kinds"], log_options=options,
                          extra=followers_yaml(redis_url, tmp_path))
    settings = {**options, "path": str(tmp_path / "log")}
    topic = f"{pg_db.source}.public.kinds"
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        pg_db.execute(ROW, (301, 400))
        pg_db.execute("UPDATE kinds SET note = NULL, amount = -amount WHERE id % 5 = 0")
        pg_db.execute("DELETE FROM kinds WHERE id % 7 = 0")
        wait_caught_up(pg_db, settings, 120)
        first = apply_and_verify(config, topic, verify=False)  # the second round verifies
        assert len(first) == 400 - 400 // 7
        assert first['{"id":13}']["ratio"] == "NaN"
        assert first['{"id":10}']["amount"] == "-1.42857"
        # no DEFAULT: PostgreSQL fills a default into existing rows without a change event
        pg_db.execute("ALTER TABLE kinds ADD COLUMN extra numeric(6,2)")
        pg_db.execute("UPDATE kinds SET extra = id / 4.0 WHERE id <= 40")
        pg_db.execute(ROW.replace("FROM generate_series", ", 9.99 FROM generate_series"),
                      (401, 420))
        wait_caught_up(pg_db, settings, 120)
        second = apply_and_verify(config, topic)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    assert second['{"id":8}']["extra"] == "2.00"
    assert second['{"id":410}']["extra"] == "9.99"
    assert "extra" not in second['{"id":41}']
