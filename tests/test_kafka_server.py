"""The throwaway Kafka brokers (cdc_app/servers/kafka.py) against real clients: compacted topics,
transactions (commit, abort, read_committed, fencing), a restart that keeps committed data, and
a 3-node cluster that survives losing a node."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from cdc.errors import CdcError
from cdc_app.servers.kafka import (
    ThrowawayKafka,
    kafka_classpath,
    kafka_version,
)

COMPACTED = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
             "segment.ms": "500", "min.compaction.lag.ms": "0", "delete.retention.ms": "100"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication: int = -1,
                 config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                                  operation_timeout=30, request_timeout=30)
    futures[name].result(timeout=30)


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed",
             partitions: int = 1, timeout: float = 30.0) -> list[tuple[bytes, bytes | None]]:
    """Every record of ``topic`` from the start up to its end, as (key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[tuple[bytes, bytes | None]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"did not reach the end of {topic}: {records}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise KafkaException(error)
            at_end.discard(message.partition())
            records.append((message.key(), message.value()))
    finally:
        consumer.close()
    return records


def transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 30000})
    producer.init_transactions(30)
    return producer


# -------------------------------------------------------------------------- the jars

def test_classpath_has_the_broker_jars() -> None:
    jars = [Path(jar).name for jar in kafka_classpath().split(":")]
    assert f"kafka_2.13-{kafka_version()}.jar" in jars
    assert kafka_version() == "4.3.1"
    # kafka-tools (ProducerPerformance, for the benchmarks) and the log4j2 slf4j binding
    assert "kafka-tools-4.3.1.jar" in jars
    assert any(jar.startswith("log4j-slf4j-impl-") for jar in jars)


def test_missing_jars_name_make_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_KAFKA_JARS", str(tmp_path / "nowhere"))
    with pytest.raises(CdcError, match="make setup") as caught:
        kafka_classpath()
    assert "nowhere" in str(caught.value)
    with pytest.raises(CdcError, match="make setup"):
        ThrowawayKafka().start()


# ------------------------------------------------------------------- the session broker

def test_broker_is_kraft_and_logs_to_a_file(kafka_broker: ThrowawayKafka) -> None:
    assert kafka_broker.bootstrap_servers == f"127.0.0.1:{kafka_broker.port}"
    metadata = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers}).list_topics(
        timeout=10)
    assert list(metadata.brokers) == [1]
    properties = kafka_broker.server_properties()
    assert properties["process.roles"] == "broker,controller"
    assert "zookeeper.connect" not in properties
    assert "Kafka Server started" in kafka_broker.server_log.read_text()
    tail = kafka_broker.log_tail(500)  # the file only grows: read the tail first
    assert len(tail) == 500 and tail in kafka_broker.server_log.read_text()


def test_compacted_topic(kafka_broker: ThrowawayKafka) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique("compacted")
    create_topic(bootstrap, topic, config=COMPACTED)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"
    assert config["min.compaction.lag.ms"].value == "0"

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for version in range(3):
        for key in (b"a", b"b"):
            producer.produce(topic, key=key, value=b"%s-%d" % (key, version))
    producer.produce(topic, key=b"b", value=None)  # a tombstone
    producer.flush(10)
    # the active segment is never cleaned: a later record rolls it (segment.ms), then the
    # cleaner (log.cleaner.backoff.ms=1000) keeps the last value per key and drops tombstones
    deadline = time.monotonic() + 30
    while True:
        time.sleep(0.6)
        producer.produce(topic, key=b"z", value=b"roll")
        producer.flush(10)
        records = read_all(bootstrap, topic)
        older = [record for record in records if record[0] != b"z"]
        if older == [(b"a", b"a-2")]:
            break
        assert time.monotonic() < deadline, f"not compacted: {older}"


def test_transactions_commit_abort_and_read_committed(kafka_broker: ThrowawayKafka) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique("txn")
    create_topic(bootstrap, topic, partitions=2, config=COMPACTED)
    producer = transactional(bootstrap, unique("txn-producer"))

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"k%d" % i, value=b"committed-%d" % i, partition=i % 2)
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"k%d" % i, value=b"aborted-%d" % i, partition=i % 2)
    producer.flush(10)  # the aborted records really are in the log
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, key=b"k9", value=b"committed-9", partition=1)
    producer.commit_transaction(30)

    committed = read_all(bootstrap, topic, partitions=2)
    assert sorted(value for _, value in committed if value is not None) == [
        b"committed-0", b"committed-1", b"committed-2", b"committed-3", b"committed-4",
        b"committed-9"]
    uncommitted = read_all(bootstrap, topic, isolation="read_uncommitted", partitions=2)
    assert sum(1 for _, value in uncommitted if value and value.startswith(b"aborted")) == 5


def test_second_producer_fences_the_first(kafka_broker: ThrowawayKafka) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique("fenced")
    create_topic(bootstrap, topic)
    transactional_id = unique("writer")
    first = transactional(bootstrap, transactional_id)
    first.begin_transaction()
    first.produce(topic, key=b"k", value=b"from-first-uncommitted")
    first.flush(10)

    second = transactional(bootstrap, transactional_id)  # bumps the epoch: first is fenced
    second.begin_transaction()
    second.produce(topic, key=b"k", value=b"from-second")
    second.commit_transaction(30)

    with pytest.raises(KafkaException) as caught:
        first.produce(topic, key=b"k", value=b"from-first-again")
        first.commit_transaction(30)
    error = caught.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                            KafkaError.INVALID_PRODUCER_EPOCH), error
    first.purge()  # else its destructor reports the record it could not send
    first.flush(0)
    del caught, first
    assert [value for _, value in read_all(bootstrap, topic)] == [b"from-second"]


def test_restart_keeps_committed_data(kafka_broker: ThrowawayKafka) -> None:
    # last of the module's session-broker tests: it restarts the shared broker (same port)
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique("durable")
    create_topic(bootstrap, topic)
    producer = transactional(bootstrap, unique("durable-writer"))
    producer.begin_transaction()
    producer.produce(topic, key=b"k1", value=b"kept")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"k2", value=b"aborted")
    producer.abort_transaction(30)
    del producer

    port = kafka_broker.port
    kafka_broker.restart()
    assert kafka_broker.port == port and kafka_broker.running()
    assert read_all(bootstrap, topic) == [(b"k1", b"kept")]
    # and it takes writes again, transactional ones included
    producer = transactional(bootstrap, unique("durable-writer"))
    producer.begin_transaction()
    producer.produce(topic, key=b"k3", value=b"after-restart")
    producer.commit_transaction(30)
    assert read_all(bootstrap, topic) == [(b"k1", b"kept"), (b"k3", b"after-restart")]


# ----------------------------------------------------------------------- the cluster

def produce_acked(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Produce with acks=all and wait for every delivery; fail on any error."""
    failed: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 60000})
    for value in values:
        producer.produce(topic, value=value,
                         on_delivery=lambda err, msg: failed.append(err) if err else None)
    assert producer.flush(90) == 0
    assert failed == []


@pytest.mark.slow
def test_cluster_survives_a_killed_node(kafka_cluster: Any) -> None:
    """The leader of a replicated partition SIGKILLed while a producer (acks=all, idempotent)
    writes to it: a new leader takes over, every record arrives once and in order, and the
    killed node rejoins the ISR after its restart."""
    import threading

    from tests.kafkakit import broker_watch

    cluster = kafka_cluster
    bootstrap = cluster.bootstrap_servers
    assert len(bootstrap.split(",")) == 3
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
    topic = unique("replicated")
    create_topic(bootstrap, topic, replication=3, config={"min.insync.replicas": "2"})
    produce_acked(bootstrap, topic, [b"before-%d" % i for i in range(10)])

    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    victim = cluster.node(leader - 1)
    assert victim.node_id == leader
    sent, acked, failed = [0], [0], []
    stop = threading.Event()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 60000,
                         "linger.ms": 5})

    def delivered(err: Any, _msg: Any) -> None:
        if err:
            failed.append(err)
        else:
            acked[0] += 1

    def produce() -> None:  # a steady stream across the kill
        while not stop.is_set():
            producer.produce(topic, value=b"during-%d" % sent[0], on_delivery=delivered)
            sent[0] += 1
            producer.poll(0.002)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        with broker_watch(victim, "Kafka broker (one of three)", lambda: sent[0]) as watch:
            watch.wait_moving()
            # in flight: records sent to the leader and not yet acknowledged
            watch.kill("partition leader under a producer", victim.kill, lambda: acked[0],
                       read_before=True)
        assert not victim.running()
        # a new leader among the two left (after the session timeout); 2 >= min.insync.replicas
        at_kill = sent[0]
        deadline = time.monotonic() + 90
        while acked[0] <= at_kill + 20:
            assert time.monotonic() < deadline and not failed, (acked, failed)
            time.sleep(0.05)
    finally:
        stop.set()
        writer.join(10)
    assert producer.flush(90) == 0 and failed == []
    produce_acked(bootstrap, topic, [b"after-%d" % i for i in range(10)])
    values = [value for _, value in read_all(bootstrap, topic)]
    assert values == ([b"before-%d" % i for i in range(10)] + [b"during-%d" % i for i in
                      range(sent[0])] + [b"after-%d" % i for i in range(10)])
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    assert partition.leader != leader and leader not in partition.isrs

    victim.start()
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
    deadline = time.monotonic() + 60  # it catches up and is back in sync
    while leader not in admin.list_topics(topic, timeout=10).topics[topic] \
            .partitions[0].isrs:
        assert time.monotonic() < deadline, victim.log_tail()
        time.sleep(0.2)
