"""The Kafka backend: the change log as compacted Kafka topics (``log: {backend: kafka}``).

Layout
------
* One compacted topic per captured table, named like Debezium's (``<source>.<schema>.<table>``)
  with characters Kafka does not allow replaced by ``_`` (:func:`kafka_topic`); two tables whose
  names meet there are refused. ``log.partitions`` partitions; a topic that exists with another
  count, or without ``cleanup.policy=compact``, is refused (never repartitioned or altered).
* Partitions are chosen here with Kafka's murmur2 (:mod:`cdc.log.partitioner`) and passed
  explicitly (librdkafka's default partitioner is not Java's).
* Keys are the JSON key bytes, values Confluent's wire format (magic byte, schema id, Avro), the
  position travels in the record header ``cdc.position``. With ``log.format: json`` keys and
  values are in Kafka Connect's JSON form instead (:mod:`cdc.connect`): written so by the
  writer, given back in the forms above by the reader; partitions are still chosen from the
  canonical key bytes.
* ``log.offsets_topic`` (compacted, one partition) holds each source's offset (key
  ``source:<name>``, with its cut) and each topic's description (key ``topic:<name>``: Kafka name,
  partitions, meta). ``log.schemas_topic`` holds the schemas (:mod:`cdc.log.kafka_schemas`).
* The offsets topic's record ``format`` (``{"format": N, "records": "avro"|"json", ...}``,
  written with the first topic description) is the version of this layout (2 for ``json``
  records, else 1; :data:`FORMAT_VERSION` the newest), the records' format and the decimal
  handling, all fixed when the log is created: a writer whose config says otherwise is refused.
  A log without it was written before formats were marked (format 1). Readers and writers refuse
  a newer one.

Exactly once
------------
Each source has its own transactional producer (``transactional.id`` =
``log.transactional_id_prefix + source``). One append is one Kafka transaction: the records, the
transaction events computed from where they landed (the ``finish`` step) and the source offset
are committed together or not at all; readers use ``read_committed``. Taking a source's writer
(:meth:`KafkaChangeLog.for_source`) calls ``init_transactions``, which fences any older producer
with that id (its next append fails with :class:`LogFencedError`) and aborts its open
transaction, before the stored offset is read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from cdc.config import LogConfig
from cdc.connect import KEY_PREFIX, VALUE_PREFIX, ConnectJson, canonical_key
from cdc.errors import LogError, LogUnavailable, check_format
from cdc.log.base import (
    AppendResult,
    ChangeLogReader,
    ChangeLogWriter,
    Committed,
    Finisher,
    PartitionStats,
    Record,
    StoredRecord,
    TopicInfo,
)
from cdc.log.kafka_errors import AUTHENTICATION, TRANSIENT, kafka_error
from cdc.log.kafka_schemas import assigned, committed_reader, idempotent_producer
from cdc.log.partitioner import partition_for
from cdc.preflight import Part, Step, environment_set

POSITION_HEADER = "cdc.position"
#: the version of the layout above, in the offsets topic's ``format`` record: 1, or 2 for a log
#: whose records are in Kafka Connect's JSON form (``log.format: json``)
FORMAT_VERSION = 2
#: the key of that record
FORMAT_KEY = b"format"
#: librdkafka's own log lines go here (not to stderr)
_CLIENT_LOG = logging.getLogger("cdc.kafka.client")
_LOG = logging.getLogger(__name__)


#: answers to a watermark read that a moment later are different: every outage's error (a
#: broker's handle torn down as it leaves, too) and leader elections
_TRANSIENT_READS = frozenset(TRANSIENT | {
    KafkaError.OFFSET_NOT_AVAILABLE,
    # the shared consumer closed by another thread's outage (``_read_failure``): a new one
    KafkaError._DESTROY})


class _QuietClient(logging.Filter):
    """librdkafka repeats itself while brokers are down (a line per connection attempt per
    client): one line per kind of message per :attr:`every` seconds, the rest dropped; its
    notes that a setting belongs to the other kind of client are dropped (``log.client`` goes
    to every client)."""

    every = 30.0

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "will be ignored by this" in text:
            return False
        kind = re.sub(r"\d+", "#", text)
        now = time.monotonic()
        if now - self._seen.get(kind, -self.every) < self.every:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[kind] = now
        return True


_CLIENT_LOG.addFilter(_QuietClient())
#: a process that set up no logging (Spark's Python workers, the local applier) drops them:
#: the failures they explain reach the user as errors with their fix
_CLIENT_LOG.addHandler(logging.NullHandler())
_LEGAL = re.compile(r"[^A-Za-z0-9._-]")
#: how long a metadata request may take before the brokers count as unreachable
TIMEOUT = 15.0
#: how long topic creation and description are retried while the controller is busy
ADMIN_DEADLINE = 90.0


class LogFencedError(LogError):
    """Another process took over this source's writer (a second capture, or a bootstrap)."""


def kafka_topic(topic: str) -> str:
    """``topic`` as a legal Kafka topic name (``[A-Za-z0-9._-]``, at most 249 characters)."""
    name = _LEGAL.sub("_", topic)
    if len(name) > 249:
        name = f"{name[:240]}_{zlib.crc32(topic.encode()):08x}"
    return name


def _rest_registry(config: LogConfig) -> Any:
    """The user's Schema Registry (``log.schema_registry``) as the log's schema store."""
    from cdc.log.rest_schemas import RestSchemaRegistry

    assert config.schema_registry is not None
    return RestSchemaRegistry(config.schema_registry.url, config.schema_registry.basic_auth_env)


def client_settings(config: LogConfig) -> dict[str, Any]:
    """librdkafka settings shared by every client (the password read from its variable)."""
    settings: dict[str, Any] = {"bootstrap.servers": config.bootstrap_servers,
                                "logger": _CLIENT_LOG,
                                **{k: v for k, v in config.client.items()}}
    if config.password_env:
        password = os.environ.get(config.password_env)
        if password is None:
            raise LogError(f"the environment variable {config.password_env} (log.password_env) "
                           "is not set", f"export {config.password_env} with the SASL password")
        settings["sasl.password"] = password
    return settings


#: librdkafka settings whose Java client name differs
_JAVA_NAMES = {"sasl.mechanisms": "sasl.mechanism", "ssl.ca.location": "ssl.truststore.location"}
#: librdkafka-only settings with no Java client equivalent (left out for Spark)
_NOT_JAVA = {"logger", "sasl.username", "sasl.password", "enable.ssl.certificate.verification",
             "socket.keepalive.enable", "topic.metadata.refresh.interval.ms"}


def java_client_settings(config: LogConfig) -> dict[str, str]:
    """The log's client settings for a Java Kafka client (Spark's Kafka source: each prefixed
    with ``kafka.`` there): ``sasl.username``/``sasl.password`` become ``sasl.jaas.config``
    (PLAIN or SCRAM), a PEM ``ssl.ca.location`` a PEM truststore. The password is read from its
    variable; the result holds it, so it is never logged."""
    rd = client_settings(config)
    out = {_JAVA_NAMES.get(key, key): str(value) for key, value in rd.items()
           if key not in _NOT_JAVA}
    if "ssl.truststore.location" in out:
        out.setdefault("ssl.truststore.type", "PEM")
    username = rd.get("sasl.username") or config.client.get("sasl.username")
    if username is not None:
        mechanism = str(out.get("sasl.mechanism", "PLAIN")).upper()
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
                  if mechanism.startswith("SCRAM") else
                  "org.apache.kafka.common.security.plain.PlainLoginModule")
        password = str(rd.get("sasl.password", "")).replace("\\", "\\\\").replace('"', '\\"')
        user = str(username).replace("\\", "\\\\").replace('"', '\\"')
        out["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    return out


def _failed_into(failures: list[Any], offsets: dict[str, int] | None = None,
                 name: str = "") -> Any:
    """A delivery callback that keeps the errors of messages that failed delivery (and, with
    ``offsets``, the offset a delivered message got, as ``offsets[name]``)."""
    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(error)
        elif offsets is not None and message is not None and message.offset() is not None:
            offsets[name] = int(message.offset())
    return delivered


def _format_text(setting: tuple[str, str, str]) -> str:
    """``format json (decimal_handling string, time_precision adaptive)``, for messages."""
    records, decimals, times = setting
    if records != "json":
        return f"format {records}"
    return f"format json (decimal_handling {decimals}, time_precision {times})"


class _Snapshot:
    """What the offsets topic says, read to its end: source offsets and topic descriptions.

    ``source_at`` keeps, per source, the offsets-topic offset of the record its value came from:
    a value is only ever replaced by a record further along. A writer records its own commits
    here as they succeed, so a refresh that stops short of them — the last stable offset held
    back after a broker restart until the coordinator has written the markers of a transaction
    whose commit already succeeded — cannot take the source back to an older offset."""

    def __init__(self) -> None:
        self.sources: dict[str, Any] = {}
        self.source_at: dict[str, int] = {}
        self.topics: dict[str, dict[str, Any]] = {}
        #: the offsets topic holds the ``format`` record
        self.marked = False
        #: how the log's records are written (``log.format``; ``avro`` for a log that does not
        #: say) and its decimal handling, from that record
        self.records = "avro"
        self.decimal_handling = "precise"
        self.time_precision = "micro"
        #: where the schemas are: ``log`` (the schemas topic) or ``registry`` (the user's)
        self.schemas = "log"
        self.next_offset = 0


class _Sent:
    """The records of one append as produced: each one's ``(topic, partition)`` and the offsets
    that the first and last of each partition were delivered at.

    One transactional producer writes all of a source's topics and a transaction's records of a
    partition are appended in the order produced, so the records between the first and last of
    a partition sit at the offsets between them. :meth:`place` checks that (last - first ==
    count - 1) instead of assuming it: another producer writing into the partition meanwhile
    breaks it, and the append is then made again with every record reporting."""

    def __init__(self) -> None:
        #: each record's (topic, partition), in order
        self.groups: list[tuple[str, int]] = []
        #: the index of the last record of each group
        self.last: dict[tuple[str, int], int] = {}
        #: the offsets reported, by record index
        self.offsets: dict[int, int] = {}

    def report(self, index: int, failures: list[Any]) -> Any:
        """A delivery callback keeping record ``index``'s offset (or its error)."""
        offsets = self.offsets

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(error)
            else:
                offsets[index] = message.offset()
        return delivered

    def place(self) -> list[AppendResult] | None:
        """Where each record landed, in order; None when a partition's records do not sit at
        consecutive offsets (or a report is missing: its record's delivery failed)."""
        offsets, groups = self.offsets, self.groups
        if any(index not in offsets for index in self.last.values()):
            return None
        if len(offsets) == len(groups):  # every record reported
            return [AppendResult(topic, partition, offsets[index])
                    for index, (topic, partition) in enumerate(groups)]
        nexts: dict[tuple[str, int], int] = {}
        placed: list[AppendResult] = []
        for index, group in enumerate(groups):
            at = nexts.get(group)
            if at is None:
                at = offsets.get(index)
                if at is None:
                    return None
            elif index in offsets and offsets[index] != at:
                return None
            nexts[group] = at + 1
            placed.append(AppendResult(group[0], group[1], at))
        return placed


class KafkaChangeLogReader(ChangeLogReader):
    """Reads the Kafka log (``read_committed``). Any number beside the writers."""

    backend = "kafka"

    def __init__(self, config: LogConfig) -> None:
        self.config = config
        self.where = str(config.bootstrap_servers)
        #: an authentication failure is only reported to error_cb (the call sees a transport
        #: failure): kept to name the real problem
        self._auth_error: KafkaError | None = None
        self.settings = {**client_settings(config), "error_cb": self._on_client_error}
        self._admin = AdminClient(dict(self.settings))
        self._consumer: Consumer | None = None
        self._snapshot = _Snapshot()
        self._lock = threading.RLock()
        self._schemas: Any = None
        self._connect: ConnectJson | None = None
        self._check_reachable()

    # -- clients -----------------------------------------------------------------------------
    def _on_client_error(self, error: KafkaError) -> None:
        if error.code() in AUTHENTICATION:
            self._auth_error = error
        _CLIENT_LOG.debug("client error: %s", error.str())

    def _check_reachable(self) -> None:
        try:
            self._admin.list_topics(timeout=TIMEOUT)
        except KafkaException as exc:
            self._admin.poll(0)  # serves error_cb
            raise kafka_error("connecting", self._auth_error or exc, self.where) from None

    def _check_records_format(self, snap: _Snapshot) -> None:
        """Refuse a config whose ``log.format`` (or decimal handling) is not the log's own."""
        wanted = (self.config.format, self.config.decimal_handling, self.config.time_precision)
        stored = (snap.records, snap.decimal_handling, snap.time_precision)
        wanted_schemas = "registry" if self.config.schema_registry is not None else "log"
        if snap.marked and snap.schemas != wanted_schemas:
            places = {"registry": "a schema registry (log.schema_registry)",
                      "log": "its schemas topic (no log.schema_registry)"}
            raise LogError(f"the Kafka log on {self.where} keeps its schemas in "
                           f"{places[snap.schemas]}; the config says {places[wanted_schemas]}",
                           "where a log keeps its schemas is fixed when it is created: set "
                           "log.schema_registry as the log has it, or bootstrap a new log")
        if snap.marked and wanted != stored:
            raise LogError(f"the Kafka log on {self.where} was created with "
                           f"{_format_text(stored)}; the config says {_format_text(wanted)}",
                           "a log's format is fixed when it is created: set log.format, "
                           "log.decimal_handling and log.time_precision as the log has them, "
                           "or bootstrap a new log (its own offsets_topic, schemas_topic and "
                           "source names)")

    def _check_existing(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + ADMIN_DEADLINE
        while True:  # a topic just created may take a moment to be known everywhere
            try:
                meta = self._admin.list_topics(name, timeout=TIMEOUT).topics[name]
                if meta.error is not None:
                    raise KafkaException(meta.error)
                resource = ConfigResource(ConfigResource.Type.TOPIC, name)
                configs = self._admin.describe_configs([resource])[resource].result(
                    timeout=TIMEOUT)
                break
            except (KafkaException, FutureTimeout) as exc:
                error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
                unknown = isinstance(exc, FutureTimeout) or isinstance(error, KafkaError) and \
                    error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                     KafkaError.LEADER_NOT_AVAILABLE)
                problem = kafka_error(f"describing topic {name}", error or "no answer within "
                                      f"{TIMEOUT:.0f} s", self.where)
                # a broker just killed (transport failure) is asked again too, as creating is
                if time.monotonic() > deadline or not (
                        unknown or isinstance(problem, LogUnavailable)):
                    raise problem from None
                time.sleep(0.1)
        if len(meta.partitions) != partitions:
            raise LogError(f"Kafka topic {name} has {len(meta.partitions)} partitions; the log "
                           f"needs {partitions} (log.partitions)",
                           "cdc never repartitions a topic (keys would move): set "
                           f"log.partitions to {len(meta.partitions)}, or delete the topic and "
                           "rebuild it from the sources")
        policy = configs.get("cleanup.policy")
        if policy is None or "compact" not in str(policy.value):
            raise LogError(f"Kafka topic {name} exists with cleanup.policy="
                           f"{policy.value if policy else '?'}, not compact",
                           f"set it: kafka-configs --alter --topic {name} --add-config "
                           "cleanup.policy=compact (or delete the topic so cdc creates it)")

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = committed_reader(self.settings, "cdc-reader")
        return self._consumer

    # -- the offsets topic -------------------------------------------------------------------
    def _refresh(self) -> _Snapshot:
        """Read the offsets topic from where the last refresh stopped to its end."""
        with self._lock:
            snap = self._snapshot
            topic = self.config.offsets_topic
            end = self._high(topic, 0)
            if end is None or end <= snap.next_offset:
                return snap
            for record in self._consume(topic, 0, snap.next_offset, end):
                key = record.key().decode()
                value = record.value()
                if value is None:  # a dropped topic's description (cdc source drop --topics)
                    if key.startswith("topic:"):
                        snap.topics.pop(key[6:], None)
                    continue
                data = json.loads(value)
                if key == FORMAT_KEY.decode():
                    check_format(data.get("format") if isinstance(data, dict) else data,
                                 FORMAT_VERSION, f"the Kafka log's {topic} topic",
                                 fix="run the cdc version that wrote the log (or a newer one)")
                    snap.marked = True
                    if isinstance(data, dict):
                        snap.records = str(data.get("records", "avro"))
                        snap.decimal_handling = str(data.get("decimal_handling", "precise"))
                        snap.time_precision = str(data.get("time_precision", "micro"))
                        snap.schemas = str(data.get("schemas", "log"))
                elif key.startswith("source:"):
                    at = int(record.offset() or 0)
                    if at > snap.source_at.get(key[7:], -1):
                        snap.sources[key[7:]] = data
                        snap.source_at[key[7:]] = at
                elif key.startswith("topic:"):
                    snap.topics[key[6:]] = data
            snap.next_offset = end
            return snap

    def _committed_end(self, topic: str, kafka_name: str, partition: int) -> int:
        """The partition's end for ``read_committed`` reads — and, in a writer, never short of
        what this writer committed: a transaction's commit returns before its markers reach
        the partitions, and until they do the last stable offset stays behind the records
        (a TRUNCATE's live-key scan right after an append would miss them). Asked again for up
        to :data:`ADMIN_DEADLINE` s."""
        written = self._written_end(topic, partition)
        deadline = time.monotonic() + ADMIN_DEADLINE
        while True:
            end = self._known_high(kafka_name, partition)
            if end >= written:
                return end
            if time.monotonic() > deadline:
                raise LogUnavailable(f"Kafka partition {kafka_name}[{partition}] still ends at "
                                     f"{end} for committed reads, {ADMIN_DEADLINE:.0f} s after "
                                     f"this writer committed records up to {written - 1}",
                                     f"check the brokers on {self.where} (the transaction "
                                     "coordinator writes the commit markers)")
            time.sleep(0.01)

    def _written_end(self, topic: str, partition: int) -> int:
        """One past the last offset this process committed to the partition (a reader: 0)."""
        return 0

    def _known_high(self, kafka_name: str, partition: int) -> int:
        """:meth:`_high` of a partition the log describes: the brokers must know it. Not
        knowing it is an outage (brokers down or still loading their logs after a restart),
        never an empty partition -- a read that took it for one would skip the range's records
        and a follower would move past them."""
        high = self._high(kafka_name, partition)
        if high is None:
            raise LogUnavailable(
                f"Kafka log at {self.where}: the brokers do not know {kafka_name} partition "
                f"{partition}, which the log describes (brokers down or still starting)",
                "check that the brokers are up and that the topic was not deleted outside "
                "cdc; cdc retries by itself")
        return high

    def _high(self, kafka_name: str, partition: int) -> int | None:
        """The partition's last stable offset (read_committed end); None if no such topic.
        Asked again for up to :data:`ADMIN_DEADLINE` s while the answer is transient (a new
        partition leader whose high watermark has not caught up after an election,
        ``OFFSET_NOT_AVAILABLE``; no leader yet; a timeout)."""
        deadline = time.monotonic() + ADMIN_DEADLINE
        while True:
            try:
                _, high = self._reader().get_watermark_offsets(
                    TopicPartition(kafka_name, partition), timeout=TIMEOUT, cached=False)
                break
            except RuntimeError:  # closed by another thread's outage: ask a new consumer
                if time.monotonic() > deadline:
                    raise LogUnavailable(f"Kafka log at {self.where}: reading the end of "
                                         f"{kafka_name} failed", "check that the brokers are "
                                         "up and reachable (log.bootstrap_servers)") from None
                time.sleep(0.25)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if error is not None else None
                if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                            KafkaError._UNKNOWN_TOPIC):
                    return None
                transient = code in _TRANSIENT_READS or bool(error and error.retriable())
                if not transient or time.monotonic() > deadline:
                    raise self._read_failure(f"reading the end of {kafka_name}", exc) from None
                time.sleep(0.25)
        return int(high)

    def _read_failure(self, action: str, error: Any) -> LogError:
        """The error for a failed read; after an outage the consumer is made anew."""
        failure = kafka_error(action, error, self.where)
        if isinstance(failure, LogUnavailable):
            with self._lock:
                consumer, self._consumer = self._consumer, None
            if consumer is not None:
                with contextlib.suppress(KafkaException, RuntimeError):
                    consumer.close()
        return failure

    def _consume(self, kafka_name: str, partition: int, start: int, end: int,
                 limit: int | None = None) -> list[Any]:
        """Committed messages of one partition with ``start <= offset < end``."""
        consumer = self._reader()
        try:
            with assigned(consumer, TopicPartition(kafka_name, partition, start)):
                return self._consume_assigned(consumer, kafka_name, partition, start, end,
                                              limit)
        except RuntimeError:  # the consumer closed by another thread's outage
            raise LogUnavailable(f"Kafka log at {self.where}: reading {kafka_name} was cut "
                                 "short by an outage", "check that the brokers are up and "
                                 "reachable (log.bootstrap_servers)") from None

    def _consume_assigned(self, consumer: Consumer, kafka_name: str, partition: int,
                          start: int, end: int, limit: int | None) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while True:
            batch = consumer.consume(num_messages=min(10_000, limit or 10_000), timeout=0.02)
            done = False
            for message in batch:
                if message.topic() != kafka_name or message.partition() != partition:
                    continue  # left in the queue by an earlier assignment of the consumer
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # an end reached before ``end`` is an earlier read's (stale): go on
                        done = done or (message.offset() or 0) >= end
                        continue
                    raise self._read_failure(f"reading {kafka_name}", error)
                if (message.offset() or 0) >= end:
                    done = True
                    break
                out.append(message)
                if limit is not None and len(out) >= limit:
                    done = True
                    break
            if done:
                break
            position = consumer.position([TopicPartition(kafka_name, partition)])[0].offset
            if position >= end:
                break
            if time.monotonic() > deadline:
                raise LogUnavailable(f"Kafka log at {self.where}: reading {kafka_name} partition "
                               f"{partition} from offset {start} made no progress for 60 s",
                               "check that the brokers are up")
        return out

    # -- the contract ------------------------------------------------------------------------
    def _info(self, name: str, data: Mapping[str, Any]) -> TopicInfo:
        return TopicInfo(name, int(data["partitions"]), dict(data.get("meta", {})))

    def topics(self) -> list[TopicInfo]:
        snap = self._refresh()
        return [self._info(name, snap.topics[name]) for name in sorted(snap.topics)]

    def kafka_name(self, topic: str) -> str:
        data = self._refresh().topics.get(topic)
        return str(data["kafka"]) if data else kafka_topic(topic)

    def end_offsets(self, topic: str) -> dict[int, int]:
        data = self._refresh().topics.get(topic)
        if data is None:
            return {}
        name = str(data["kafka"])
        return {partition: self._known_high(name, partition)
                for partition in range(int(data["partitions"]))}

    def source_offsets(self) -> dict[str, Any]:
        copied: dict[str, Any] = json.loads(json.dumps(self._refresh().sources))
        return copied

    def committed(self) -> Committed:
        with self._lock:
            snap = self._refresh()
            topics = {name: self._info(name, data) for name, data in snap.topics.items()}
            sources = json.loads(json.dumps(snap.sources))
            ends: dict[str, list[int]] = {}
            for name, info in topics.items():
                source = info.meta.get("source")
                cut = (sources.get(source) or {}).get("cut") if source else None
                if isinstance(cut, dict) and info.meta.get("kind") != "transactions":
                    parts = cut.get(name, {})
                    ends[name] = [int(parts.get(str(p), 0)) for p in range(info.partitions)]
                else:
                    found = self.end_offsets(name)
                    ends[name] = [found.get(p, 0) for p in range(info.partitions)]
            return Committed(topics, ends, sources)

    def read(self, topic: str, partition: int, start: int = 0,
             max_records: int | None = None) -> list[StoredRecord]:
        data = self._refresh().topics.get(topic)
        if data is None:
            return []
        name = str(data["kafka"])
        with self._lock:
            end = self._committed_end(topic, name, partition)
            if start >= end:
                return []
            messages = self._consume(name, partition, start, end, max_records)
        return [self._stored(topic, partition, m) for m in messages]

    def _stored(self, topic: str, partition: int, message: Any) -> StoredRecord:
        position = b""
        for header, value in message.headers() or ():
            if header == POSITION_HEADER:
                position = bytes(value)
        key, value = message.key() or b"", message.value()
        if key.startswith(KEY_PREFIX):  # log.format json: back to the log's own forms
            key = canonical_key(key)
        if value is not None and value.startswith(VALUE_PREFIX):
            value = self._connect_json().to_avro(value)
        return StoredRecord(topic, partition, message.offset(), message.timestamp()[1],
                            key, value, position)

    def _connect_json(self) -> ConnectJson:
        """The converter of Kafka Connect's JSON form (:mod:`cdc.connect`), made once."""
        if self._connect is None:
            self._connect = ConnectJson(self.schemas(), self.config.decimal_handling,
                                        self.config.time_precision)
        return self._connect

    def partition_stats(self, topic: str, partition: int) -> PartitionStats:
        data = self._refresh().topics.get(topic)
        if data is None:
            raise LogError(f"the log has no topic {topic!r}", "run `cdc log stats` to list topics")
        name = str(data["kafka"])
        low, _ = self._reader().get_watermark_offsets(TopicPartition(name, partition),
                                                      timeout=TIMEOUT, cached=False)
        end = self._high(name, partition) or 0
        records = tombstones = size = 0
        for record in self.iter_partition(topic, partition):
            records += 1
            tombstones += record.value is None
            size += len(record.key) + len(record.value or b"") + len(record.position)
        return PartitionStats(topic, partition, int(low), end, records, tombstones, size, 0)

    def tombstone_retention(self, topic: str) -> float:
        name = self.kafka_name(topic)
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            configs = self._admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
        except (KafkaException, FutureTimeout):
            return float(self.config.tombstone_retention)
        entry = configs.get("delete.retention.ms")
        return float(entry.value) / 1000 if entry is not None else \
            float(self.config.tombstone_retention)

    def schemas(self) -> Any:
        if self._schemas is None and self.config.schema_registry is not None:
            self._schemas = _rest_registry(self.config)
        if self._schemas is None and self._refresh().schemas == "registry":
            raise LogError(f"the Kafka log on {self.where} keeps its schemas in a schema "
                           "registry, and the config names none",
                           "set log.schema_registry.url to the registry the log was written "
                           "with")
        if self._schemas is None:
            from cdc.log.kafka_schemas import KafkaSchemaRegistry

            self._schemas = KafkaSchemaRegistry(self.settings, self.config.schemas_topic,
                                                self.where, writable=False)
        return self._schemas

    def close(self) -> None:
        """Close the consumers (made again if the reader is used after)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._schemas is not None:
            self._schemas.close()


class KafkaChangeLog(KafkaChangeLogReader, ChangeLogWriter):
    """The writer: internal topics are created on open; appends run on the producer of the
    source they are for (:meth:`for_source`; the log's own writer uses ``<prefix>default``)."""

    def __init__(self, config: LogConfig, source: str | None = None,
                 parent: KafkaChangeLog | None = None) -> None:
        super().__init__(config)
        self.source = source
        self._mutex = threading.Lock()
        self._producer: Producer | None = None
        self._sources: dict[str, KafkaChangeLog] = {}
        self._closed = False
        self._parent = parent
        #: a commit failed on an outage: its outcome is unknown until the producer is renewed
        self._unresolved = False
        #: (topic, partition) -> one past the last offset committed there by this writer or
        #: its sources' (kept by the root): reads wait for the markers of these commits
        self._own_ends: dict[tuple[str, int], int] = {}
        if parent is None:
            self._create_internal_topics()
            self._check_records_format(self._refresh())

    def _written_end(self, topic: str, partition: int) -> int:
        return (self._parent or self)._own_ends.get((topic, partition), 0)

    def source_offsets(self) -> dict[str, Any]:
        """As committed — after this writer's own unfinished transaction, if an outage left
        one, was resolved (renewing the producer makes the coordinator finish or abort it)."""
        if self._unresolved:
            with self._mutex:
                self._open_producer()
        return super().source_offsets()

    # -- topics ------------------------------------------------------------------------------
    def _topic_config(self, compact_only: bool = False) -> dict[str, str]:
        config = {"cleanup.policy": "compact"}
        if not compact_only:
            config.update({k: str(v) for k, v in self.config.topic_config.items()})
            config["delete.retention.ms"] = str(int(self.config.tombstone_retention * 1000))
        if self.config.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.config.min_insync_replicas)
        return config

    def _create(self, name: str, partitions: int, config: dict[str, str]) -> None:
        """Create ``name``; if it exists, check its partition count and cleanup policy."""
        new = NewTopic(name, num_partitions=partitions,
                       replication_factor=self.config.replication_factor, config=config)
        deadline = time.monotonic() + ADMIN_DEADLINE
        while True:  # a busy controller (a broker just restarted) may answer late: ask again
            try:
                self._admin.create_topics([new], operation_timeout=TIMEOUT)[name].result(
                    timeout=TIMEOUT)
                break
            except (KafkaException, FutureTimeout) as exc:
                error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
                if isinstance(error, KafkaError) and \
                        error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    break
                problem = kafka_error(f"creating topic {name}", error or "no answer within "
                                      f"{TIMEOUT:.0f} s", self.where)
                if time.monotonic() > deadline or not (
                        isinstance(exc, FutureTimeout) or isinstance(problem, LogUnavailable)):
                    raise problem from None
                time.sleep(1.0)
        self._check_existing(name, partitions)

    def schemas(self) -> Any:
        root = self._parent or self
        if self.config.schema_registry is not None:
            if root._schemas is None:
                root._schemas = _rest_registry(self.config)
            return root._schemas
        if root._schemas is None or not root._schemas.writable:
            from cdc.log.kafka_schemas import KafkaSchemaRegistry

            root._schemas = KafkaSchemaRegistry(self.settings, self.config.schemas_topic,
                                                self.where, writable=True)
        return root._schemas

    def _create_internal_topics(self) -> None:
        self._create(self.config.offsets_topic, 1, self._topic_config(compact_only=True))
        self._create(self.config.schemas_topic, 1, self._topic_config(compact_only=True))

    def ensure_topic(self, topic: str, meta: Mapping[str, Any] | None = None,
                     partitions: int | None = None) -> TopicInfo:
        count = partitions or self.config.partitions
        snap = self._refresh()
        found = snap.topics.get(topic)
        if found is not None:
            info = self._info(topic, found)
            if partitions is not None and info.partitions != count:
                raise LogError(f"topic {topic} has {info.partitions} partitions, not {count}",
                               "a topic is never repartitioned: rebuild the log to change it")
            return info
        name = kafka_topic(topic)
        clash = [other for other, data in snap.topics.items() if data.get("kafka") == name]
        if clash:
            raise LogError(f"tables {clash[0]!r} and {topic!r} both map to the Kafka topic "
                           f"{name!r} (characters Kafka does not allow become '_')",
                           "rename one of the tables, or capture them from different sources")
        self._create(name, count, self._topic_config())
        description = {"kafka": name, "partitions": count, "meta": dict(meta or {})}
        messages = [(self.config.offsets_topic, f"topic:{topic}".encode(),
                     json.dumps(description).encode())]
        if not snap.marked:
            choice: dict[str, Any] = {"format": 1, "records": "avro"}
            if self.config.schema_registry is not None:
                choice = {"format": 2, "records": "avro", "schemas": "registry"}
            if self.config.format == "json":  # format 2: older readers refuse it (cleanly)
                choice = {"format": 2, "records": "json",
                          "decimal_handling": self.config.decimal_handling}
                if self.config.time_precision != "micro":
                    choice["time_precision"] = self.config.time_precision
            messages.insert(0, (self.config.offsets_topic, FORMAT_KEY,
                                json.dumps(choice).encode()))
        self._transaction(messages)
        snap.topics[topic] = description
        if not snap.marked:
            snap.records, snap.decimal_handling = self.config.format, self.config.decimal_handling
            snap.time_precision = self.config.time_precision
            snap.schemas = "registry" if self.config.schema_registry is not None else "log"
        snap.marked = True
        return self._info(topic, description)

    # -- writing -----------------------------------------------------------------------------
    def for_source(self, source: str) -> KafkaChangeLog:
        if self.source == source:
            return self
        root = self._parent or self
        with root._mutex:
            writer = root._sources.get(source)
            if writer is None:
                writer = KafkaChangeLog(self.config, source, root)
                writer._open_producer()
                root._sources[source] = writer
            return writer

    def _open_producer(self) -> Producer:
        if self._producer is None:
            txn_id = self.config.transactional_id_prefix + (self.source or "default")
            producer = idempotent_producer(self.settings, **{
                "transactional.id": txn_id, "linger.ms": 5, "batch.size": 1_000_000,
                "transaction.timeout.ms": int(self.config.transaction_timeout * 1000),
                "message.max.bytes": int(self.config.client.get("message.max.bytes",
                                                                4_000_000))})
            try:
                producer.init_transactions(TIMEOUT * 4)
            except KafkaException as exc:
                raise kafka_error(f"starting the transactional producer {txn_id}", exc,
                                  self.where) from None
            self._producer = producer
            self._unresolved = False
        return self._producer

    def drop_topic(self, topic: str) -> None:
        data = self._refresh().topics.get(topic)
        if data is None:
            return
        name = str(data["kafka"])
        # the description first: readers stop seeing the topic before it goes
        self._transaction([(self.config.offsets_topic, f"topic:{topic}".encode(), None)])
        try:
            self._admin.delete_topics([name], operation_timeout=TIMEOUT)[name].result(
                timeout=TIMEOUT)
        except (KafkaException, FutureTimeout) as exc:
            error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            if not (isinstance(error, KafkaError)
                    and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise kafka_error(f"deleting topic {name}", error or "no answer within "
                                  f"{TIMEOUT:.0f} s", self.where) from None
        self._refresh()

    def _transaction(self, messages: Sequence[tuple[str, bytes, bytes | None]]) -> None:
        """Commit a few messages to internal topics in one transaction."""
        with self._mutex:
            producer = self._open_producer()
            self._begin(producer)
            failures: list[Any] = []
            for topic, key, value in messages:
                self._produce(producer, topic, key, value, 0, None, _failed_into(failures))
            self._commit(producer, failures)

    def _begin(self, producer: Producer) -> None:
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            raise self._refused(producer, "beginning a transaction", exc) from None

    def _produce(self, producer: Producer, topic: str, key: bytes, value: bytes | None,
                 partition: int, position: bytes | None, on_delivery: Any) -> None:
        headers: list[tuple[str, str | bytes | None]] | None = (
            None if position is None else [(POSITION_HEADER, position)])
        while True:
            try:
                producer.produce(topic, value, key, partition=partition, headers=headers,
                                 on_delivery=on_delivery)
                return
            except BufferError:
                self._call(producer, f"writing to {topic}", producer.poll, 0.05)
            except KafkaException as exc:
                raise self._refused(producer, f"writing to {topic}", exc) from None

    def _commit(self, producer: Producer, failures: list[Any]) -> None:
        """Commit the open transaction. When it fails because a message produced since the
        last flush failed delivery (librdkafka then reports only "N message(s) failed
        delivery"), the error is that message's own (a delivery timed out while the brokers
        were away: retryable), as ``failures`` — filled by :func:`_failed_into` — holds it."""
        try:
            self._call(producer, "committing a transaction", producer.commit_transaction,
                       TIMEOUT * 4)
        except LogFencedError:
            raise
        except LogError:
            if not failures:
                with contextlib.suppress(KafkaException, SystemError):
                    producer.poll(0)  # serve delivery reports still queued
            if not failures:
                raise
            raise self._failure("committing a transaction", KafkaException(failures[0])
                                ) from None

    def _call(self, producer: Producer, action: str, method: Any, *args: Any) -> Any:
        """``method(*args)`` (one that serves delivery callbacks); a Kafka failure aborts the
        transaction and becomes a :class:`LogError`."""
        try:
            return method(*args)
        except (KafkaException, SystemError) as exc:
            # confluent-kafka 2.16: a fatal error (fencing) raised while delivery callbacks
            # still run surfaces as SystemError caused by the KafkaException
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__
            if not isinstance(cause, KafkaException):
                raise
            raise self._refused(producer, action, cause) from None

    def _refused(self, producer: Producer, action: str, exc: KafkaException) -> LogError:
        """Abort the open transaction after ``action`` failed with ``exc``; the error to raise.
        The abort says what really happened when ``exc`` does not: a broker may answer a fenced
        commit with UNKNOWN before librdkafka turns fatal, and ``produce`` on a fenced producer
        says only "Local: Fatal error" (a plain error, not flagged fatal)."""
        fatal = self._abort(producer)
        return self._failure(action, fatal or exc)

    def _abort(self, producer: Producer) -> KafkaException | None:
        """Abort the open transaction; the fatal error (e.g. fencing) that refused it, if any."""
        try:
            producer.abort_transaction(TIMEOUT)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.fatal():
                return exc
        return None

    def _failure(self, action: str, exc: KafkaException) -> LogError:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and (error.fatal() or error.code() in (
                KafkaError._FENCED, KafkaError._FATAL, KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH)):
            self._producer = None
            return LogFencedError(
                f"Kafka log at {self.where}: another process took over the writer of source "
                f"{self.source or 'default'} (transactional id "
                f"{self.config.transactional_id_prefix}{self.source or 'default'}): {action} "
                "was refused",
                "run one `cdc capture` per source; a `cdc bootstrap` of a source stops its "
                "capture on purpose")
        failure = kafka_error(action, exc, self.where)
        if isinstance(failure, LogUnavailable) and self._producer is not None:
            with contextlib.suppress(KafkaException):  # start over with a new epoch
                self._producer.purge(in_queue=True, in_flight=True)
            self._producer = None
            self._unresolved = True
        return failure

    def append(self, records: Sequence[Record], source_offsets: Mapping[str, Any] | None = None,
               finish: Finisher | None = None) -> list[AppendResult]:
        with self._mutex:
            if self._closed:
                raise LogError("the change log writer is closed")
            producer = self._open_producer()
            snap = self._snapshot  # this writer's own view: _send refreshes it for a new topic
            failures: list[Any] = []
            self._begin(producer)
            try:
                placed = self._send_placed(producer, snap, records, failures)
                if finish is not None:
                    more, offsets = finish(placed)
                    if offsets is not None:
                        source_offsets = offsets
                    if more:
                        sent = self._send(producer, snap, more, failures, exact=True)
                        self._flush(producer, failures)
                        placed.extend(self._placed(sent))
                delivered_at: dict[str, int] = {}
                for name, offset in (source_offsets or {}).items():
                    self._produce(producer, self.config.offsets_topic, f"source:{name}".encode(),
                                  json.dumps(offset).encode(), 0, None,
                                  _failed_into(failures, delivered_at, name))
                self._commit(producer, failures)
                ends = (self._parent or self)._own_ends
                # a partition's offsets grow along the list: its last one is its end
                for at, offset in {(r.topic, r.partition): r.offset for r in placed}.items():
                    ends[at] = max(ends.get(at, 0), offset + 1)
                for name, offset in (source_offsets or {}).items():
                    snap.sources[name] = json.loads(json.dumps(offset))
                    if name in delivered_at:  # where the committed value sits (see _Snapshot)
                        snap.source_at[name] = max(delivered_at[name],
                                                   snap.source_at.get(name, -1))
                return placed
            except BaseException:
                # a failure outside the producer's own calls (e.g. the schemas topic unreadable
                # mid-append) must not leave the transaction open: the next append's begin
                # would be refused ("Operation not valid in state InTransaction")
                if self._producer is producer:
                    self._abort(producer)
                raise

    def _send(self, producer: Producer, snap: _Snapshot, records: Sequence[Record],
              failures: list[Any], exact: bool = False) -> _Sent:
        """Produce ``records`` into the open transaction; what :meth:`_Sent.place` needs, once
        flushed, to say where each landed. Only the first and last record of each partition
        report their offsets (``exact``: every record does): a delivery callback per record
        was a third of an append's time."""
        names: dict[str, tuple[str, int]] = {}
        connect = self._connect_json() if self.config.format == "json" else None
        sent = _Sent()
        groups = sent.groups
        for record in records:
            found = names.get(record.topic)
            if found is None:
                data = snap.topics.get(record.topic) or self._refresh().topics.get(record.topic)
                if data is None:
                    raise LogError(f"append to unknown topic {record.topic!r}",
                                   "call ensure_topic() first (this is a bug in the caller)")
                found = names[record.topic] = (str(data["kafka"]), int(data["partitions"]))
            group = (record.topic, partition_for(record.key, found[1]))
            groups.append(group)
            sent.last[group] = len(groups) - 1
        report = sent.report
        produce = producer.produce
        last = sent.last
        first: set[tuple[str, int]] = set()
        for index, record in enumerate(records):
            group = groups[index]
            name = names[record.topic][0]
            key, value = record.key, record.value
            if connect is not None:  # Kafka Connect's JSON form; partitioned by the key's own
                key, value = connect.record(name, key, value)
            callback = None
            if exact or last[group] == index or group not in first:
                first.add(group)
                callback = report(index, failures)
            headers: list[tuple[str, str | bytes | None]] | None = (
                None if record.position is None else [(POSITION_HEADER, record.position)])
            try:
                produce(name, value, key, partition=group[1], headers=headers,
                        on_delivery=callback)
            except (BufferError, KafkaException):  # the queue is full, or a refusal: the slow way
                self._produce(producer, name, key, value, group[1], record.position, callback)
        return sent

    def _send_placed(self, producer: Producer, snap: _Snapshot, records: Sequence[Record],
                     failures: list[Any]) -> list[AppendResult]:
        """Produce ``records`` into the open transaction and flush: where each landed. When a
        partition's records did not land at consecutive offsets (see :class:`_Sent`), the
        transaction is aborted and begun again, and the records produced once more, each
        reporting its own offset."""
        sent = self._send(producer, snap, records, failures)
        self._flush(producer, failures)
        placed = sent.place()
        if placed is None:
            _LOG.warning("Kafka log at %s: another producer wrote into source %s's partitions "
                         "during an append; it is made again with every offset reported",
                         self.where, self.source or "default")
            self._abort(producer)
            self._begin(producer)
            sent = self._send(producer, snap, records, failures, exact=True)
            self._flush(producer, failures)
            placed = self._placed(sent)
        return placed

    def _placed(self, sent: _Sent) -> list[AppendResult]:
        """Where the records of ``sent`` (produced ``exact``, then flushed) landed."""
        placed = sent.place()
        if placed is None:  # every record reported its offset, unless its delivery failed
            raise self._failure("writing records", KafkaException(
                KafkaError(KafkaError._MSG_TIMED_OUT)))
        return placed

    def _flush(self, producer: Producer, failures: list[Any]) -> None:
        remaining = self._call(producer, "writing records", producer.flush, TIMEOUT * 8)
        if remaining or failures:
            self._abort(producer)
            error = failures[0] if failures else KafkaError(KafkaError._MSG_TIMED_OUT)
            raise self._failure("writing records", KafkaException(error))

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        for writer in list(self._sources.values()):
            writer.close()
        if self._producer is not None:
            # nothing left in it was acknowledged (appends are, once their transaction commits);
            # a fenced or failed producer raises here, which must not hide why it stopped
            with contextlib.suppress(KafkaException):
                self._producer.flush(5)
            self._producer = None
        super().close()


def preflight_part(config: LogConfig) -> Part:
    """The log's preflight (the contract of :mod:`cdc.preflight`): the brokers reached, the
    log's recorded format against the config's, and every topic the log has already made
    compacted with its partition count. Reads only: no topic is created."""
    opened: list[KafkaChangeLogReader] = []

    def reach() -> str:
        environment_set(config.password_env, "log.password_env")
        opened.append(KafkaChangeLogReader(config))  # refuses, with the fix, when unreachable
        brokers = opened[0]._admin.list_topics(timeout=TIMEOUT).brokers
        return f"{len(brokers)} broker(s) answer at {config.bootstrap_servers}"

    def recorded_format() -> str:
        reader = opened[0]
        snap = reader._refresh()
        wanted = _format_text((config.format, config.decimal_handling, config.time_precision))
        if not snap.marked:
            return f"a new log: `cdc bootstrap` creates its topics ({wanted})"
        reader._check_records_format(snap)
        return f"{wanted}, as the log was created"

    def topics() -> str:
        reader = opened[0]
        expected = [(config.offsets_topic, 1), (config.schemas_topic, 1)] + [
            (reader.kafka_name(t.name), t.partitions) for t in reader.topics()]
        existing = set(reader._admin.list_topics(timeout=TIMEOUT).topics)
        checked = [(name, count) for name, count in expected if name in existing]
        for name, count in checked:
            reader._check_existing(name, count)
        if not checked:
            return "none yet"
        return f"{len(checked)} topic(s): compacted, partitions as the log made them"

    steps = [Step("brokers", reach, TIMEOUT + 5), Step("format", recorded_format, TIMEOUT + 5),
             Step("topics", topics, 30.0)]
    if config.schema_registry is not None:
        registry = config.schema_registry

        def subjects() -> str:
            environment_set(registry.basic_auth_env, "log.schema_registry.basic_auth_env")
            found = _rest_registry(config).subjects()
            return f"{registry.url} answers ({len(found)} subjects)"
        steps.append(Step("schema registry", subjects))
    return Part("log (kafka)", steps, lambda: opened[0].close() if opened else None)
