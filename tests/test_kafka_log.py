"""The Kafka backend on a real broker: the log contract, exactly-once appends with fencing, bad
topics refused, and PostgreSQL captured into Kafka end to end."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cdc.config import LogConfig
from cdc.errors import LogError
from cdc.log.base import Record
from cdc.log.kafka import KafkaChangeLog, KafkaChangeLogReader, LogFencedError, kafka_topic
from tests.kafkakit import kafka_yaml, latest
from tests.pgkit import (
    LOAD_SCHEMA,
    PROJECT,
    Capture,
    Database,
    Load,
    assert_follower_equals_log_and_table,
    cdc,
    log_reader,
    output,
    read_topic,
    table_rows,
    wait_caught_up,
    wait_for,
    write_config,
)


def _config(broker: Any, **extra: Any) -> LogConfig:
    prefix = uuid.uuid4().hex[:6]
    return LogConfig(backend="kafka", bootstrap_servers=broker.bootstrap_servers, partitions=3,
                     offsets_topic=f"_cdc_offsets_{prefix}", schemas_topic=f"_cdc_schemas_{prefix}",
                     transactional_id_prefix=f"cdc-{prefix}-", **extra)


def _records(topic: str, n: int, tag: str = "v") -> list[Record]:
    return [Record(topic, json.dumps({"id": i}).encode(), f"{tag}{i}".encode(),
                   i.to_bytes(9, "big")) for i in range(n)]


def test_append_read_and_offsets_commit_together(kafka_broker: Any) -> None:
    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s1")
    try:
        info = log.ensure_topic("s1.public.t", {"source": "s1", "table": "public.t"})
        assert info.partitions == 3
        results = log.append(_records("s1.public.t", 50), {"s1": {"seq": 50}})
        assert len(results) == 50
        reader = KafkaChangeLogReader(config)
        assert [t.name for t in reader.topics()] == ["s1.public.t"]
        assert reader.source_offsets() == {"s1": {"seq": 50}}
        got = {r.key: (r.value, r.position) for p in range(3)
               for r in reader.iter_partition("s1.public.t", p)}
        assert got == {r.key: (r.value, r.position) for r in _records("s1.public.t", 50)}
        # each key in the partition Kafka's Java client would choose, at the offset reported
        for result, record in zip(results, _records("s1.public.t", 50), strict=True):
            [stored] = reader.read("s1.public.t", result.partition, result.offset, 1)
            assert stored.key == record.key
        # the finish step's records and offsets commit in the same transaction
        def finish(placed: Any) -> Any:
            return [Record("s1.public.t", b'{"id":999}', b"late", b"\x00" * 9)], {
                "s1": {"seq": 99, "placed": len(placed)}}
        log.append(_records("s1.public.t", 3, "w"), {"s1": {"seq": 53}}, finish)
        reader2 = KafkaChangeLogReader(config)
        assert reader2.source_offsets() == {"s1": {"seq": 99, "placed": 3}}
        keys = {r.key for p in range(3) for r in reader2.iter_partition("s1.public.t", p)}
        assert b'{"id":999}' in keys
        reader.close()
        reader2.close()
    finally:
        log.close()


def test_a_partition_the_brokers_do_not_know_is_an_outage_not_an_empty_range(
        kafka_broker: Any) -> None:
    """The log describes a topic the brokers do not know (just restarted and still loading
    their logs, or deleted behind cdc's back): a read of it raises LogUnavailable. Taken for
    an empty partition (as once), a follower's batch skipped the range's records and its
    progress moved past them (found by test_apply_outages: a delete missing in Redis)."""
    from cdc.errors import LogUnavailable

    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s1")
    reader = KafkaChangeLogReader(config)
    try:
        log.ensure_topic("s1.public.gone", {"source": "s1", "table": "public.gone"})
        log.append(_records("s1.public.gone", 20), {"s1": {"seq": 20}})
        name = reader.kafka_name("s1.public.gone")
        assert sum(len(reader.read("s1.public.gone", p, 0)) for p in range(3)) == 20
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
        admin.delete_topics([name])[name].result(30)
        wait_for(lambda: name not in admin.list_topics(timeout=10).topics, 30,
                 "the brokers to forget the topic")
        for partition in range(3):
            with pytest.raises(LogUnavailable, match="do not know"):
                reader.read("s1.public.gone", partition, 0)
        with pytest.raises(LogUnavailable, match="do not know"):
            reader.end_offsets("s1.public.gone")
    finally:
        reader.close()
        log.close()


def test_a_consumer_closed_by_another_threads_outage_is_not_fatal(kafka_broker: Any) -> None:
    """One thread's outage closes the shared consumer (``_read_failure``) while another uses
    it: that read retries with a new consumer or is an outage (LogUnavailable), never a fatal
    "Broker handle destroyed" or "Consumer closed" (a broker SIGKILL under load stopped
    capture so, once, in tests/test_kafka_faults.py)."""
    from cdc.errors import LogUnavailable

    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s1")
    reader = KafkaChangeLogReader(config)
    try:
        log.ensure_topic("s1.public.shared", {"source": "s1", "table": "public.shared"})
        log.append(_records("s1.public.shared", 9), {"s1": {"seq": 9}})
        name = reader.kafka_name("s1.public.shared")
        closed = reader._reader()
        closed.close()  # as another thread's outage leaves it: closed, the next one made anew
        reader._consumer = None
        handed = iter([closed])
        fresh = reader._reader

        def racing() -> Any:
            return next(handed, None) or fresh()

        reader._reader = racing  # type: ignore[method-assign]
        highs = [reader._high(name, p) for p in range(3)]  # retried with a new consumer
        assert all(isinstance(high, int) for high in highs) and sum(highs) >= 9, highs  # type: ignore[arg-type]
        handed = iter([closed])
        try:
            found = reader._consume(name, 0, 0, 1)
        except LogUnavailable:
            found = None  # an outage: the caller waits it out
        assert found is None, "a closed consumer must not read"
    finally:
        reader.close()
        log.close()


def test_a_second_writer_fences_the_first(kafka_broker: Any) -> None:
    config = _config(kafka_broker)
    first = KafkaChangeLog(config).for_source("s1")
    first.ensure_topic("s1.public.t", {"source": "s1"})
    first.append(_records("s1.public.t", 5), {"s1": {"seq": 5}})
    second = KafkaChangeLog(config).for_source("s1")  # init_transactions fences `first`
    with pytest.raises(LogFencedError, match="another process took over"):
        first.append(_records("s1.public.t", 5, "x"), {"s1": {"seq": 10}})
    second.append(_records("s1.public.t", 5, "y"), {"s1": {"seq": 10}})
    reader = KafkaChangeLogReader(config)
    values = {r.value for p in range(3) for r in reader.iter_partition("s1.public.t", p)}
    assert not any(v.startswith(b"x") for v in values if v)  # the fenced append never shows
    assert reader.source_offsets()["s1"] == {"seq": 10}
    for log in (first, second):
        log.close()
    reader.close()


def test_bad_topics_are_refused(kafka_broker: Any) -> None:
    config = _config(kafka_broker)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    tag = uuid.uuid4().hex[:4]
    wrong_count, not_compacted = f"s2.public.n{tag}", f"s2.public.d{tag}"
    for name, partitions, settings in ((wrong_count, 5, {"cleanup.policy": "compact"}),
                                       (not_compacted, 3, {"cleanup.policy": "delete"})):
        admin.create_topics([NewTopic(name, partitions, 1, config=settings)])[name].result(30)
    log = KafkaChangeLog(config).for_source("s2")
    try:
        with pytest.raises(LogError, match="has 5 partitions; the log needs 3"):
            log.ensure_topic(wrong_count, {"source": "s2"})
        with pytest.raises(LogError, match="cleanup.policy=delete, not compact"):
            log.ensure_topic(not_compacted, {"source": "s2"})
        log.ensure_topic('s2.public."a b"', {"source": "s2"})
        with pytest.raises(LogError, match="both map to the Kafka topic"):
            log.ensure_topic('s2.public."a/b"', {"source": "s2"})
        assert kafka_topic('s2.public."a b"') == "s2.public._a_b_"
    finally:
        log.close()


@pytest.mark.servers  # starts its own servers or Spark
def test_unreachable_brokers_give_a_clear_error() -> None:
    from cdc_app.servers.postgres import free_port

    config = LogConfig(backend="kafka", bootstrap_servers=f"127.0.0.1:{free_port()}",
                       client={"socket.connection.setup.timeout.ms": 2000})
    with pytest.raises(LogError) as raised:
        KafkaChangeLogReader(config)
    assert "connecting failed" in str(raised.value.problem)
    assert "log.bootstrap_servers" in str(raised.value.fix)


def test_a_record_larger_than_the_broker_allows(kafka_broker: Any) -> None:
    config = _config(kafka_broker, client={"message.max.bytes": 3_000_000})
    log = KafkaChangeLog(config).for_source("s3")
    try:
        log.ensure_topic("s3.public.t", {"source": "s3"})
        big = Record("s3.public.t", b'{"id":1}', b"x" * 2_000_000, b"\x00" * 9)
        with pytest.raises(LogError) as raised:
            log.append([big], {"s3": {"seq": 1}})
        assert "max.message.bytes" in raised.value.fix
        log.append(_records("s3.public.t", 2), {"s3": {"seq": 2}})  # the writer goes on
    finally:
        log.close()


def test_a_failure_inside_an_append_leaves_no_transaction_open(kafka_broker: Any) -> None:
    """An append that fails outside the producer's own calls (here its finisher: in capture,
    e.g. the schemas topic unreadable while a broker restarts) aborts its transaction: nothing
    of it is read, and the next append of the same writer begins anew (it was refused with
    "Operation not valid in state InTransaction", which stopped a capture)."""
    from cdc.errors import LogUnavailable

    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s5")
    try:
        log.ensure_topic("s5.public.t", {"source": "s5"})

        def finish(placed: Any) -> Any:
            raise LogUnavailable("the schemas topic is unreadable", "check the brokers")

        with pytest.raises(LogUnavailable):
            log.append(_records("s5.public.t", 4, "lost"), {"s5": {"seq": 1}}, finish=finish)
        log.append(_records("s5.public.t", 3), {"s5": {"seq": 2}})
        reader = KafkaChangeLogReader(config)
        try:
            values = sorted(r.value for p in range(3) for r in reader.read("s5.public.t", p))
            assert values == [b"v0", b"v1", b"v2"]
            assert reader.source_offsets() == {"s5": {"seq": 2}}
        finally:
            reader.close()
    finally:
        log.close()


# --------------------------------------------------------------- PostgreSQL into Kafka, e2e

def test_postgres_captured_into_kafka(kafka_broker: Any, pg_db: Database, spark: Any,
                                      tmp_path: Path) -> None:
    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, 'seed' "
                  "FROM generate_series(1, 500) g")
    options = kafka_yaml(kafka_broker)
    config = write_config(tmp_path, pg_db, ["public.items"], log_options=options)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=1).start()
    wait_for(lambda: load.committed > 50, 60, "load")
    load.finish()
    pg_db.execute("ALTER TABLE items ADD COLUMN extra text")  # a second schema version
    pg_db.execute("UPDATE items SET extra = 'x' || id WHERE id % 10 = 0")
    settings = {**options, "path": str(tmp_path / "log")}
    wait_caught_up(pg_db, settings, 120)
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()
    topic = f"{pg_db.source}.public.items"
    logged = latest(settings, topic)
    table = table_rows(pg_db, "items")
    assert set(logged) == set(table)
    for key, row in logged.items():
        assert row["v"] == table[key]["v"]
    # the log commands work on Kafka
    stats = cdc("log", "stats", "--config", str(config), "--json")
    assert stats.returncode == 0, output(stats)
    assert topic in {t["topic"] for t in json.loads(stats.stdout)["topics"]}
    dump = cdc("log", "dump", "--config", str(config), "--topic", topic)
    assert dump.returncode == 0 and dump.stdout.count("\n") >= 500
    status = cdc("status", "--config", str(config), "--json")
    assert status.returncode == 0, output(status)
    dumped = [json.loads(line) for line in dump.stdout.splitlines()]
    registry = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "registry", "serve",
                                 "--config", str(config), "--port", "0"],
                                stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    try:
        line = registry.stderr.readline() if registry.stderr else ""
        assert "serving the schemas of the log on http://" in line, line
        url = line.rsplit(" ", 1)[1].strip()
        _check_a_foreign_consumer_decodes(kafka_broker, url, topic, dumped)
        _check_spark_decodes_by_id(spark, kafka_broker, url, topic, dumped)
    finally:
        registry.terminate()
        registry.wait(30)


def _check_spark_decodes_by_id(spark: Any, broker: Any, url: str, topic: str,
                               dumped: list[dict[str, Any]]) -> None:
    """Interop: a plain Spark job — Spark's Kafka source and open-source ``from_avro``, which
    does not read Confluent's framing — strips the 5-byte frame, fetches each schema by its id
    from `cdc registry serve`, and decodes every value of both schema versions as `cdc log dump`
    printed them."""
    import urllib.request

    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
           .option("subscribe", kafka_topic(topic)).option("startingOffsets", "earliest")
           .option("kafka.isolation.level", "read_committed").load())
    framed = raw.where(F.col("value").isNotNull()).select(
        "partition", "offset", F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("long")
        .alias("id"), F.expr("substring(value, 6)").alias("body"))
    ids = sorted(row.id for row in framed.select("id").distinct().collect())
    assert len(ids) == 2, ids
    decoded = {}
    for schema_id in ids:
        with urllib.request.urlopen(f"{url}/schemas/ids/{schema_id}", timeout=10) as answer:
            schema = json.loads(answer.read())["schema"]
        rows = framed.where(F.col("id") == schema_id).select(
            "partition", "offset", from_avro("body", schema, {"mode": "FAILFAST"}).alias("e"))
        for row in rows.select("partition", "offset", "e.op", "e.after.id", "e.after.v").collect():
            decoded[(row.partition, row.offset)] = (row.op, row.id, row.v)
    ours = {(d["partition"], d["offset"]): (d["value"]["op"], (d["value"]["after"] or {}).get("id"),
                                            (d["value"]["after"] or {}).get("v"))
            for d in dumped if d["topic"] == topic and d["value"] is not None}
    assert decoded == ours


def _check_a_foreign_consumer_decodes(broker: Any, url: str, topic: str,
                                      dumped: list[dict[str, Any]]) -> None:
    """Interop: confluent-kafka's own SchemaRegistryClient and AvroDeserializer, pointed at
    `cdc registry serve`, decode every value of ``topic`` — across two schema versions — to
    what `cdc log dump` printed."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    def consume(name: str) -> list[Any]:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                             "group.id": f"foreign-{uuid.uuid4().hex[:6]}",
                             "isolation.level": "read_committed",
                             "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        partitions = consumer.list_topics(name, timeout=10).topics[name].partitions
        consumer.assign([TopicPartition(name, p, 0) for p in partitions])
        out, ended = [], set()
        while len(ended) < len(partitions):
            for message in consumer.consume(500, timeout=1.0):
                if message.error():
                    ended.add(message.partition())
                else:
                    out.append(message)
        consumer.close()
        return out

    client = SchemaRegistryClient({"url": url})
    versions = client.get_versions(f"{topic}-value")
    assert versions == [1, 2], versions
    latest_version = client.get_latest_version(f"{topic}-value")
    assert latest_version.version == 2 and "extra" in latest_version.schema.schema_str
    decode = AvroDeserializer(client)
    by_offset = {(d["partition"], d["offset"]): d["value"] for d in dumped if d["topic"] == topic}
    messages = consume(topic)
    decoded = {(m.partition(), m.offset()): decode(m.value()) for m in messages}
    assert len(decoded) == len(by_offset) > 500
    ids = {int.from_bytes(m.value()[1:5], "big") for m in messages if m.value() is not None}
    assert len(ids) == 2  # both versions decoded
    for at, value in decoded.items():
        ours = by_offset[at]
        if value is None:
            assert ours is None
            continue
        assert value["op"] == ours["op"] and value["source"]["lsn"] == ours["source"]["lsn"]
        for image in ("before", "after"):
            assert json.loads(json.dumps(value[image], default=str)) == ours[image], (at, image)


def test_sigkill_of_capture_into_kafka_loses_nothing(kafka_broker: Any, pg_db: Database,
                                                     tmp_path: Path) -> None:
    """SIGKILL `cdc capture` mid-transaction under load, again and again: afterwards the
    history in Kafka (read_committed) equals the audit trail, every key's latest equals the
    table, and replays carry their first positions."""
    import random
    import time

    from tests.pgkit import capture_watch, check_against_audit, kill_capture

    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, 'seed' "
                  "FROM generate_series(1, 200) g")
    pg_db.execute("INSERT INTO audit (id, v, op) SELECT g, 1, 'c' FROM generate_series(1, 200) g")
    options = kafka_yaml(kafka_broker)
    config = write_config(tmp_path, pg_db, ["public.items"], log_options=options)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    settings = {**options, "path": str(tmp_path / "log")}
    load = Load(pg_db, threads=2, bulk_every=15).start()
    rng = random.Random(7)
    capture = Capture(config, tmp_path / "capture.log")
    try:
        with capture_watch(pg_db, capture, into="Kafka") as watch:
            for _ in range(6):
                capture.start()
                delay = rng.uniform(1.5, 3.0)
                time.sleep(delay)
                assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
                watch.wait_moving()
                kill_capture(watch, capture, "just restarted" if delay < 2.2 else "streaming",
                             settings, pg_db.source)
    finally:
        load.finish()
    capture.start()
    wait_caught_up(pg_db, settings, 180)
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()
    assert load.committed > 50
    figures = check_against_audit(pg_db, read_topic(settings, f"{pg_db.source}.public.items"))
    assert figures


def test_brokers_compact_the_log_and_a_new_follower_from_offset_0_equals_the_leader(
        kafka_broker: Any, pg_db: Database, tmp_path: Path, redis_url: str, spark: Any) -> None:
    """Topics made with segment.ms 1 s and dirty ratio 0.01 (log.topic_config): after updates
    and deletes, `cdc log compact --wait` sees the broker's cleaner drop every superseded record
    (deadline 90 s); then `cdc apply --once` builds a new Redis follower from offset 0 of the
    compacted topics (in this process, on the shared session), and it equals the table —
    deleted keys absent (their tombstones kept)."""
    import time

    from cdc.config import load_config
    from cdc.sink import open_sink
    from tests.sparkkit import apply_once

    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, 'seed' "
                  "FROM generate_series(1, 200) g")
    options = {**kafka_yaml(kafka_broker), "tombstone_retention": "1h",
               "topic_config": {"segment.ms": 1000, "min.cleanable.dirty.ratio": 0.01,
                                "min.compaction.lag.ms": 0}}
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    config = write_config(tmp_path, pg_db, ["public.items"], log_options=options,
                          extra=followers)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    settings = {**options, "path": str(tmp_path / "log")}
    topic = f"{pg_db.source}.public.items"
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        for round_ in range(3):
            pg_db.execute(f"UPDATE items SET v = v + 1, note = 'round {round_}'")
        pg_db.execute("DELETE FROM items WHERE id % 10 = 0")
        wait_caught_up(pg_db, settings, 120)
        time.sleep(1.5)  # past segment.ms: the next records roll every partition's segment
        pg_db.execute("INSERT INTO items (id, v, note) SELECT g, 1, 'new' "
                      "FROM generate_series(1001, 1060) g")
        wait_caught_up(pg_db, settings, 120)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    reader = log_reader(settings)
    assert reader is not None
    appended = sum(reader.end_offsets(topic).values())  # offsets are kept by compaction
    reader.close()
    compacted = cdc("log", "compact", "--config", str(config), "--wait", "--timeout", "90s",
                    timeout=200)
    assert compacted.returncode == 0, output(compacted)
    assert "the brokers dropped all" in compacted.stdout
    events = read_topic(settings, topic)
    keys = [event.key for event in events]
    assert appended >= 900 and len(events) < appended - 500  # 3 rounds of updates dropped
    deleted = {json.dumps({"id": i}, separators=(",", ":")) for i in range(10, 201, 10)}
    # one record per key: a deleted key keeps only its tombstone (until the retention)
    assert len(keys) == len(set(keys)) == 240 + len(deleted)
    assert {e.key for e in events if e.op == "tombstone"} == deleted

    apply_once(config, "cache")  # in this process, on the shared session
    sink = open_sink(load_config(config), "cache")
    assert assert_follower_equals_log_and_table(sink, pg_db, settings, topic) == 240


@pytest.mark.servers  # starts its own servers or Spark
def test_authentication_and_authorization_errors_name_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker with a SASL/PLAIN listener and the standard authorizer (no ACLs: only the
    broker's own PLAINTEXT principal is a super user): a wrong password and a principal without
    ACLs each give a LogError with the fix, and the password never shows."""
    from cdc_app.servers.kafka import ThrowawayKafka
    from cdc_app.servers.postgres import free_port

    port, sasl_port, controller = free_port(), free_port(), free_port()
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="admin" password="admin-pw" user_admin="admin-pw" '
            'user_alice="alice-Secret-42";')
    overrides = {
        "listeners": (f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                      f"CONTROLLER://127.0.0.1:{controller}"),
        "advertised.listeners": (f"PLAINTEXT://127.0.0.1:{port},"
                                 f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}"),
        "listener.security.protocol.map": ("CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                                           "SASL_PLAINTEXT:SASL_PLAINTEXT"),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
    with ThrowawayKafka(overrides=overrides, port=port, controller_port=controller):
        client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                  "sasl.username": "alice", "socket.connection.setup.timeout.ms": 3000}
        monkeypatch.setenv("CDC_TEST_KAFKA_PW", "not-the-password")
        config = LogConfig(backend="kafka", bootstrap_servers=f"127.0.0.1:{sasl_port}",
                           client=client, password_env="CDC_TEST_KAFKA_PW")
        with pytest.raises(LogError) as raised:
            KafkaChangeLog(config)
        assert "sasl.username" in raised.value.fix and "password_env" in raised.value.fix
        assert "not-the-password" not in str(raised.value) + raised.value.fix

        monkeypatch.setenv("CDC_TEST_KAFKA_PW", "alice-Secret-42")
        with pytest.raises(LogError) as raised:
            KafkaChangeLog(config)  # creates its internal topics: alice may not
        assert "grant this principal" in raised.value.fix, raised.value
        assert "alice-Secret-42" not in str(raised.value) + raised.value.fix


def test_a_writer_found_fenced_mid_write_says_so(kafka_broker: Any) -> None:
    """A fenced producer may learn it while it is still producing a large append: `produce`
    then fails with only "Local: Fatal error" (seen when two capture daemons overlapped); the
    error must still say that another process took over."""
    config = _config(kafka_broker)
    first = KafkaChangeLog(config).for_source("s1")
    first.ensure_topic("s1.public.t", {"source": "s1"})
    first.append(_records("s1.public.t", 2), {"s1": {"seq": 2}})
    second = KafkaChangeLog(config).for_source("s1")  # init_transactions fences `first`
    with pytest.raises(LogFencedError, match="another process took over"):
        first.append(_records("s1.public.t", 200_000, "x"), {"s1": {"seq": 4}})
    for log in (first, second):
        log.close()


def _three_records_of_s1(config: LogConfig) -> None:
    log = KafkaChangeLog(config).for_source("s1")
    try:
        log.ensure_topic("s1.public.t", {"source": "s1", "table": "public.t"})
        log.append(_records("s1.public.t", 3), {"s1": {"seq": 3}})
    finally:
        log.close()


def test_the_layout_carries_its_format_and_a_newer_one_is_refused(kafka_broker: Any) -> None:
    """The offsets topic's ``format`` record is written with the first topic; a log marked
    with a newer format is refused by readers and writers, naming the fix."""
    from confluent_kafka import Producer

    from cdc.errors import FormatVersionError
    from cdc.log.kafka import FORMAT_KEY, FORMAT_VERSION

    config = _config(kafka_broker)
    _three_records_of_s1(config)
    reader = KafkaChangeLogReader(config)
    try:
        marks = [json.loads(r.value()) for r in reader._consume(config.offsets_topic, 0, 0,
                                                                reader._high(config.offsets_topic,
                                                                             0) or 0)
                 if r.key() == FORMAT_KEY]
        assert marks == [{"format": 1, "records": "avro"}]  # format 2 is for json records
        assert reader.source_offsets() == {"s1": {"seq": 3}}
    finally:
        reader.close()
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    producer.produce(config.offsets_topic, key=FORMAT_KEY,
                     value=json.dumps({"format": FORMAT_VERSION + 1}).encode(), partition=0)
    producer.flush(30)
    newer = f"has format {FORMAT_VERSION + 1}, written by a newer cdc"
    for opened in (KafkaChangeLogReader, KafkaChangeLog):
        with pytest.raises(FormatVersionError, match=newer) as held:  # the writer reads it
            other = opened(config)                                     # when it opens
            try:
                other.source_offsets()
            finally:
                other.close()
        assert "run the cdc version that wrote the log" in str(held.value)


def test_a_log_keeps_the_records_format_it_was_created_with(kafka_broker: Any) -> None:
    """``log.format`` is fixed when the log is created: a writer configured otherwise is
    refused, naming the fix; a reader needs no setting to read either."""
    from cdc.errors import LogError

    config = _config(kafka_broker)
    _three_records_of_s1(config)
    as_json = config.model_copy(update={"format": "json"})
    with pytest.raises(LogError) as refused:
        KafkaChangeLog(as_json)
    assert "created with format avro" in refused.value.problem
    assert "log.format" in (refused.value.fix or "")


def test_a_writer_reads_what_it_just_committed(kafka_broker: Any) -> None:
    """A Kafka commit returns before its markers reach the partitions, and until they do a
    committed read ends short of the records. The writer's own reads (a TRUNCATE's live-key
    scan, previous images) must see every record it committed, right after the commit."""
    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s1")
    topics = ["s1.public.a", "s1.public.b"]
    short = 0
    try:
        for topic in topics:
            log.ensure_topic(topic, {"source": "s1", "table": topic[3:]})
        for round_ in range(40):
            records = [r for t in topics for r in _records(t, 8, tag=f"r{round_}-")]
            placed = log.append(records, {"s1": {"seq": round_}})
            last = {(p.topic, p.partition): p.offset for p in placed}
            for (topic, partition), offset in sorted(last.items()):
                seen = list(log.iter_partition(topic, partition))
                short += not seen or seen[-1].offset < offset
    finally:
        log.close()
    assert short == 0


def test_offsets_are_right_when_another_producer_writes_into_the_partitions(
        kafka_broker: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An append learns the offsets of each partition's first and last record and places the
    ones between at the offsets between. Another producer writing into the same partitions
    meanwhile breaks that: the append must notice, make itself again with every offset
    reported, and still say where each record really is."""
    from confluent_kafka import Producer

    config = _config(kafka_broker)
    log = KafkaChangeLog(config).for_source("s1")
    intruder = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "linger.ms": 0})
    stop = threading.Event()

    def intrude() -> None:
        while not stop.is_set():
            for partition in range(3):
                intruder.produce(kafka_topic("s1.public.t"), b"intruder", b'{"id":-1}',
                                 partition=partition)
            intruder.poll(0.001)

    try:
        log.ensure_topic("s1.public.t", {"source": "s1", "table": "public.t"})
        records = _records("s1.public.t", 20_000)
        thread = threading.Thread(target=intrude, daemon=True)
        thread.start()
        with caplog.at_level(logging.WARNING, logger="cdc.log.kafka"):
            placed = log.append(records, {"s1": {"seq": 1}})
        stop.set()
        thread.join()
        intruder.flush(10)
        assert "another producer wrote into source s1's partitions" in caplog.text
        _assert_placed(log, placed, records)
        # alone again: the first and last of each partition are enough, and right
        alone = _records("s1.public.t", 3_000, tag="w")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cdc.log.kafka"):
            placed = log.append(alone, {"s1": {"seq": 2}})
        assert "another producer" not in caplog.text
        _assert_placed(log, placed, alone)
    finally:
        stop.set()
        log.close()


def _assert_placed(log: KafkaChangeLog, placed: list[Any], records: list[Record]) -> None:
    """Each record is where its append said it went."""
    stored = {(p, r.offset): (r.key, r.value) for p in range(3)
              for r in log.iter_partition("s1.public.t", p)}
    assert len(placed) == len(records)
    for result, record in zip(placed, records, strict=True):
        assert stored[(result.partition, result.offset)] == (record.key, record.value)
