"""Schemas for the Kafka backend, kept in a compacted one-partition topic (``log.schemas_topic``).

Each registration is one message, key ``<subject>/<id>``, value ``{"subject", "id", "schema"}``.
Ids are unique even when several daemons register at once, without a coordinator:

* a schema's candidate id is derived from its canonical text (31 bits of its SHA-256), so two
  daemons registering the same schema pick the same id, and different schemas almost never meet;
* the topic's order decides: the *first* message for an id fixes that id's schema. A registrant
  writes its message (acks=all), reads the topic to its end, and if an earlier message gave the id
  to another schema, it tries the next id. Every reader applies the same rule, so all agree.

A subject's versions are its distinct schemas in the order of their first message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc.errors import LogError, LogUnavailable, SchemaError
from cdc.log.base import SchemaRegistry
from cdc.log.kafka_errors import kafka_error
from cdc.log.schemas import RegisteredSchema, canonical

TIMEOUT = 15.0


@contextlib.contextmanager
def assigned(consumer: Consumer, partition: TopicPartition) -> Iterator[Consumer]:
    """``consumer`` assigned ``partition`` (with its start offset) for the block only: an
    assigned partition is fetched from in the background, read or not, so a reader left
    assigned costs its broker a fetch request every ``fetch.wait.max.ms`` (10 ms) for ever."""
    consumer.assign([partition])
    try:
        yield consumer
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.unassign()


def committed_reader(settings: dict[str, Any], group: str) -> Consumer:
    """A consumer of committed records only, for partitions the caller assigns: it commits
    nothing, says when it reached a partition's end, and waits at most 10 ms for data."""
    return Consumer({**settings, "group.id": group, "enable.auto.commit": False,
                     "isolation.level": "read_committed", "enable.partition.eof": True,
                     "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})


def idempotent_producer(settings: dict[str, Any], **extra: Any) -> Producer:
    """An idempotent ``acks=all`` producer (``extra``: more settings, e.g. a transactional id)
    already connected to a broker. librdkafka asks for its producer id as soon as it is made;
    asked before any broker connection is up, it waits a fixed 500 ms to ask again (seen on
    every second start or so): a metadata request first (~0.06 s) makes the first ask succeed.
    Brokers that do not answer within 2 s are left to the caller's next call to report."""
    producer = Producer({**settings, "acks": "all", "enable.idempotence": True, **extra})
    with contextlib.suppress(KafkaException):
        producer.list_topics(timeout=2.0)
    return producer


def candidate_id(text: str) -> int:
    """The first id tried for a schema: 31 bits of its canonical text's SHA-256 (never 0)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF or 1


class KafkaSchemaRegistry(SchemaRegistry):
    """The schema topic, read (and, with ``writable``, written) through Kafka."""

    def __init__(self, settings: dict[str, Any], topic: str, where: str,
                 writable: bool = False) -> None:
        self.settings = settings
        self.topic = topic
        self.where = where
        self.writable = writable
        self._lock = threading.RLock()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._next = 0
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_subject: dict[str, list[RegisteredSchema]] = {}
        self._texts: dict[int, str] = {}

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = committed_reader(self.settings, "cdc-schemas")
        return self._consumer

    def close(self) -> None:
        """Close the consumer (made again if the registry is read after); what was read stays."""
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()

    def _refresh(self) -> None:
        """Read the topic from where the last refresh stopped to its end."""
        with self._lock:
            consumer = self._reader()
            partition = TopicPartition(self.topic, 0)
            try:
                _, end = consumer.get_watermark_offsets(partition, timeout=TIMEOUT, cached=False)
            except KafkaException as exc:  # brokers away: LogUnavailable, waited out
                raise kafka_error(f"reading the schemas topic {self.topic}", exc,
                                  self.where) from None
            if end <= self._next:
                return
            with assigned(consumer, TopicPartition(self.topic, 0, self._next)):
                self._read_to(consumer, partition, end)

    def _read_to(self, consumer: Consumer, partition: TopicPartition, end: int) -> None:
        """Read the assigned schemas topic until offset ``end`` (the lock held)."""
        deadline = time.monotonic() + 60
        while self._next < end:
            for message in consumer.consume(num_messages=1000, timeout=0.02):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        self._next = max(self._next, end)
                        continue
                    raise kafka_error(f"reading the schemas topic {self.topic}", error,
                                      self.where)
                self._next = (message.offset() or 0) + 1
                value = message.value()
                if value is not None:
                    self._add(json.loads(value))
            position = consumer.position([partition])[0].offset
            if position >= end:
                self._next = max(self._next, end)
            if time.monotonic() > deadline:
                raise LogUnavailable(f"Kafka log at {self.where}: reading {self.topic} "
                                     "made no progress for 60 s",
                                     "check that the brokers are up")

    def _add(self, entry: dict[str, Any]) -> None:
        schema_id, subject = int(entry["id"]), str(entry["subject"])
        text = canonical(entry["schema"])
        owner = self._texts.get(schema_id)
        if owner is not None and owner != text:
            return  # the id was taken first by another schema: this message lost
        self._texts[schema_id] = text
        versions = self._by_subject.setdefault(subject, [])
        if any(v.id == schema_id for v in versions):
            return
        registered = RegisteredSchema(schema_id, subject, len(versions) + 1, entry["schema"])
        versions.append(registered)
        self._by_id.setdefault(schema_id, registered)

    def _find(self, subject: str, text: str) -> RegisteredSchema | None:
        for registered in self._by_subject.get(subject, []):
            if self._texts.get(registered.id) == text:
                return registered
        return None

    def register(self, subject: str, schema: Any) -> RegisteredSchema:
        text = canonical(schema)
        with self._lock:
            self._refresh()
            found = self._find(subject, text)
            if found is not None:
                return found
            if not self.writable:
                raise SchemaError(f"schema registry {self.topic} is read-only here",
                                  "register schemas from the capture daemon")
            same = [i for i, t in self._texts.items() if t == text]
            schema_id = same[0] if same else candidate_id(text)
            for _ in range(64):
                while self._texts.get(schema_id, text) != text:
                    schema_id = schema_id % 0x7FFFFFFF + 1  # taken by another schema
                self._write(subject, schema_id, schema)
                self._refresh()
                found = self._find(subject, text)
                if found is not None:
                    return found
            raise SchemaError(f"could not register a schema for {subject} in {self.topic}",
                              "check the brokers' logs")

    def _write(self, subject: str, schema_id: int, schema: Any) -> None:
        if self._producer is None:
            self._producer = idempotent_producer(self.settings)
        errors: list[Any] = []
        self._producer.produce(self.topic, json.dumps(
            {"subject": subject, "id": schema_id, "schema": schema}).encode(),
            f"{subject}/{schema_id}".encode(), partition=0,
            on_delivery=lambda error, _msg: errors.append(error) if error else None)
        if self._producer.flush(TIMEOUT * 4) or errors:
            raise LogError(f"Kafka log at {self.where}: registering a schema for {subject} "
                           f"failed: {errors[0] if errors else 'timed out'}",
                           "check the brokers, and this principal's Write on "
                           f"{self.topic}")

    def get(self, schema_id: int) -> RegisteredSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            self._refresh()
            found = self._by_id.get(schema_id)
        if found is None:
            raise SchemaError(f"the log refers to schema id {schema_id}, which {self.topic} "
                              "does not hold", "the schemas topic was deleted or truncated: "
                              "rebuild the log")
        return found

    def versions(self, subject: str) -> list[RegisteredSchema]:
        self._refresh()
        return list(self._by_subject.get(subject, []))

    def subjects(self) -> list[str]:
        self._refresh()
        return sorted(self._by_subject)
