"""Benchmark: the Kafka change log against Kafka's own producer, and PostgreSQL capture into Kafka
against capture into the local log.

Run with ``make bench-kafka`` or ``.venv/bin/python bench/kafka_log.py [--records N]
[--capture-rows N] [--transaction-ms D] [--format avro|json] [--no-capture] [--profile]``.
``--format json`` writes the Kafka logs in Kafka Connect's form (``log.format: json``); sizes
are then those of the records as Kafka gets them.

One run, one throwaway single-node KRaft broker (``cdc_app.servers.kafka.ThrowawayKafka``: combined
broker and controller, replication factor 1, 1 GB heap), everything on the same broker:

1. **ours**: ``KafkaChangeLog.for_source(source).append(batch, {source: offset})`` of ``--records``
   pre-built records of the synthetic ``shop`` workload (``bench/log_append.py``'s
   ``build_records``: Avro values in Confluent's framing, JSON keys, the position in a header),
   1,000 and then 10,000 records per append. One append is one Kafka transaction (transactional
   producer, ``acks=all``, idempotence); the producer's settings are recorded as
   ``KafkaChangeLog`` passes them to librdkafka and printed. Building the records, and taking the
   source's writer (``init_transactions``), are not timed.
2. **Kafka's ProducerPerformance** (``org.apache.kafka.tools.ProducerPerformance`` from the
   ``kafka-tools`` jar, the Java client): the same number of records, ``--record-size`` = our
   average value size, a topic with the same partition count, the same ``acks``,
   ``enable.idempotence``, ``linger.ms`` and ``batch.size``, transactional, with
   ``--transaction-duration-ms`` chosen so that a transaction holds about 10,000 records (a
   calibration run measures its rate first, and the measured run is made again, once, if its
   transactions held more than 25 % more or fewer; ``--transaction-ms`` fixes it instead).
3. **kafka_ratio** = ours at 10,000 records per append / ProducerPerformance (records/s).
4. **capture**: a throwaway PostgreSQL server, ``bench/pg_capture.py``'s table ``public.bench``
   (12 columns, a 2 kB TOASTed text), one source bootstrapped into a local log and one into the
   Kafka log before ``--capture-rows`` rows are inserted (``pg_capture.load``, 1,000 rows a
   transaction); then ``cdc capture`` drains them into the local log and into Kafka, each timed
   from process start until the row inserted last is committed in the log. **kafka_vs_local** =
   rows/s into Kafka / rows/s into the local log (which fsyncs every commit; the broker does not).

The last line of stdout is one JSON object with the numbers and every setting.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `bench` is not an installed package

import psycopg  # noqa: E402
from confluent_kafka import (  # noqa: E402
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # noqa: E402
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import pg_capture as pgc  # noqa: E402
from bench.common import (  # noqa: E402
    COMMIT_INTERVAL_MS,
    Result,
    capture_command,
    cpu_seconds,
    figures_table,
    load_averages,
    machine_summary,
    peak_rss_mb,
    print_profile,
    print_summary,
    progress_bar,
    reap,
    run_cdc,
    stop,
    tail,
    work_directory,
    write_config,
)
from bench.log_append import build_records, filesystem  # noqa: E402
from cdc.config import LogConfig  # noqa: E402
from cdc.connect import canonical_key  # noqa: E402
from cdc.log.base import ChangeLogReader, Record  # noqa: E402
from cdc.log.kafka import KafkaChangeLog, KafkaChangeLogReader  # noqa: E402
from cdc.log.local import LocalChangeLogReader  # noqa: E402
from cdc.log.partitioner import partition_for  # noqa: E402
from cdc.position import format_lsn  # noqa: E402
from cdc_app.console import make_console  # noqa: E402
from cdc_app.servers.kafka import ThrowawayKafka, find_java, kafka_classpath, kafka_version  # noqa: E402
from cdc_app.servers.postgres import ThrowawayPostgres  # noqa: E402
from cdc_app.synthetic import ORDERS  # noqa: E402

PARTITIONS = 8  # log.partitions' default, and bench/log_append.py's
#: the Kafka logs' ``log.format`` (``--format``; set once by main)
FORMAT = ["avro"]
BATCHES = (1_000, 10_000)
RATIO_BATCH = 10_000  # kafka_ratio compares ours at this many records per append
BROKER_HEAP = ("-Xmx1g", "-Xms1g")  # kafka-server-start.sh's default heap
PP_HEAP = "-Xmx512m"  # kafka-producer-perf-test.sh's
PP_CLASS = "org.apache.kafka.tools.ProducerPerformance"
PP_SETTINGS = ("acks", "enable.idempotence", "linger.ms", "batch.size")  # copied from ours
MIB = 1024 * 1024  # ProducerPerformance's "MB/sec" is MiB/s; ours is reported the same way
POLL_S = 0.1  # how often a drain checks the log
#: what the broker is asked about (its flush policy first)
BROKER_KEYS = ("log.flush.interval.messages", "log.flush.interval.ms",
               "log.flush.scheduler.interval.ms", "default.replication.factor",
               "min.insync.replicas", "transaction.state.log.replication.factor",
               "num.network.threads", "num.io.threads", "log.segment.bytes", "compression.type",
               "message.max.bytes")
LOCAL_SOURCE = "benchlocal"
KAFKA_SOURCE = "benchkafka"
PROFILE_SOURCE = "benchkprof"  # the cProfiled capture into Kafka, from its own slot
OURS = "ours: KafkaChangeLog.append"
PP = "Kafka ProducerPerformance"
PP_CALIBRATION = "ProducerPerformance, calibration run"
PP_TOLERANCE = 0.25  # a measured run's records per transaction may be 10,000 +- 25 %
PP_LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="err" target="SYSTEM_ERR"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="err"/></Root></Loggers>
</Configuration>
"""
#: ProducerPerformance's final line: "N records sent, X records/sec (Y MB/sec), A ms avg latency,
#: M ms max latency, P50 ms 50th, P95 ms 95th, P99 ms 99th, P999 ms 99.9th."
PP_SUMMARY = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th")


@dataclass
class Measured:
    name: str
    records: int
    seconds: float
    per_transaction: float  # records per Kafka transaction
    value_bytes: float  # per record
    payload_bytes: float  # per record: key + value + position header value
    client_cpu_s: float | None = None
    broker_cpu_s: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def value_mib_s(self) -> float:
        return self.rate * self.value_bytes / MIB

    @property
    def payload_mib_s(self) -> float:
        return self.rate * self.payload_bytes / MIB


@dataclass
class Drained:
    name: str
    rows: int
    seconds: float | None = None
    first_to_last_s: float | None = None
    capture_cpu_s: float | None = None
    broker_cpu_s: float | None = None
    rss_mb: float | None = None
    note: str = ""
    error: str | None = None

    @property
    def rate(self) -> float | None:
        return self.rows / self.seconds if self.seconds and not self.error else None


# ------------------------------------------------------------------------------ helpers


def broker_cpu(kafka: ThrowawayKafka) -> float | None:
    """User + system CPU seconds of the broker's JVM so far."""
    return cpu_seconds(kafka.process.pid) if kafka.process is not None else None


def delta(after: float | None, before: float | None) -> float | None:
    return round(after - before, 2) if after is not None and before is not None else None


def own_cpu() -> float:
    """User + system CPU seconds of this process (librdkafka's threads included)."""
    times = os.times()
    return times.user + times.system


def admin(kafka: ThrowawayKafka) -> Any:
    return AdminClient({"bootstrap.servers": kafka.bootstrap_servers})


def broker_settings(kafka: ThrowawayKafka) -> dict[str, str | None]:
    """The broker's values (as it reports them) of :data:`BROKER_KEYS`."""
    resource = ConfigResource(ConfigResource.Type.BROKER, str(kafka.node_id))
    client = admin(kafka)  # held until the result is in (a dropped client cancels it)
    configs = client.describe_configs([resource])[resource].result(timeout=30)
    return {key: (configs[key].value if key in configs else None) for key in BROKER_KEYS}


def flush_policy(broker: dict[str, str | None]) -> str:
    """What the broker's flush settings mean, in words."""
    never = str(2**63 - 1)
    messages = broker.get("log.flush.interval.messages")
    interval = broker.get("log.flush.interval.ms")
    scheduler = broker.get("log.flush.scheduler.interval.ms")
    if messages == never and interval in (None, never) and scheduler in (None, never):
        return ("the broker does not fsync per message or on a timer (log.flush.interval.messages "
                "= Long.MAX, log.flush.interval.ms unset): an acknowledged write is in the page "
                "cache of the one replica; the OS writes it back later")
    return (f"log.flush.interval.messages={messages}, log.flush.interval.ms={interval}, "
            f"log.flush.scheduler.interval.ms={scheduler}")


@contextlib.contextmanager
def recording_producers(seen: list[dict[str, Any]]) -> Iterator[None]:
    """Record the settings every producer ``KafkaChangeLog`` makes is given (so the output
    states what ran, not what this script believes ``_open_producer`` says)."""
    import cdc.log.kafka_schemas as producers  # where KafkaChangeLog's producers are made

    original = producers.Producer

    def make(config: dict[str, Any]) -> Any:
        seen.append({k: v for k, v in config.items()
                     if k != "bootstrap.servers" and not callable(v) and k != "logger"})
        return original(config)

    producers.Producer = make  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        producers.Producer = original  # type: ignore[misc]


# ------------------------------------------------------------------------------ ours


def append_all(writer: KafkaChangeLog, source: str, records: Sequence[Record], batch: int,
               advance: Callable[[int], None]) -> int:
    """Append ``records`` ``batch`` at a time, each with the source's offset; records placed."""
    placed = 0
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        placed += len(writer.append(chunk, {source: {"seq": start + len(chunk)}}))
        advance(len(chunk))
    return placed


def measure_ours(log: KafkaChangeLog, kafka: ThrowawayKafka, records: Sequence[Record],
                 batch: int, sizes: tuple[float, float], bar: Progress) -> Measured:
    source = f"shop-{batch}"
    writer = log.for_source(source)  # init_transactions: not timed
    task = bar.add_task(f"{OURS}, {batch:,}/append", total=len(records), info="")
    cpu, broker = own_cpu(), broker_cpu(kafka)
    started = time.perf_counter()
    placed = append_all(writer, source, records, batch, lambda n: bar.advance(task, n))
    seconds = time.perf_counter() - started
    result = Measured(f"{OURS}, {batch:,}/append", len(records), seconds, batch, *sizes,
                      client_cpu_s=round(own_cpu() - cpu, 2),
                      broker_cpu_s=delta(broker_cpu(kafka), broker))
    reader = KafkaChangeLogReader(log.config)
    try:
        stored = reader.source_offsets().get(source)
    finally:
        reader.close()
    result.note = "one transaction per append, offsets committed with the records"
    if placed != len(records) or stored != {"seq": len(records)}:
        result.note = f"[red]placed {placed:,}, stored offset {stored}[/]"
    return result


def profile_ours(log: KafkaChangeLog, records: Sequence[Record], batch: int,
                 work: Path) -> tuple[Path, Result]:
    """cProfile of our append loop (this thread; librdkafka's threads show up as waiting)."""
    source = f"shop-profile-{batch}"
    writer = log.for_source(source)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(append_all, writer, source, records, batch, lambda n: None)
    seconds = time.perf_counter() - started
    path = work / "append.prof"
    profiler.dump_stats(path)
    return path, Result(f"{OURS} under cProfile", "append", len(records), seconds)


# ------------------------------------------------------------------------------ ProducerPerformance


def create_topic(kafka: ThrowawayKafka, name: str) -> None:
    """A plain (``cleanup.policy=delete``) topic: ProducerPerformance's records have no key,
    which a compacted topic refuses."""
    new = NewTopic(name, num_partitions=PARTITIONS, replication_factor=1,
                   config={"cleanup.policy": "delete"})
    client = admin(kafka)
    client.create_topics([new], operation_timeout=30)[name].result(timeout=30)


def producer_performance(kafka: ThrowawayKafka, work: Path, name: str, records: int, size: int,
                         props: dict[str, str], transaction_ms: int, timeout: float,
                         bar: Progress) -> tuple[Measured, list[str]]:
    """One ProducerPerformance run into a fresh topic; the result and its command line."""
    topic = f"perf-{name}"
    create_topic(kafka, topic)
    log4j = work / "pp-log4j2.xml"
    log4j.write_text(PP_LOG4J2)
    command = [find_java(), PP_HEAP, f"-Dlog4j2.configurationFile={log4j}", "-cp",
               kafka_classpath(), PP_CLASS, "--bootstrap-server", kafka.bootstrap_servers,
               "--topic", topic, "--num-records", str(records), "--record-size", str(size),
               "--throughput", "-1", "--command-property",
               *[f"{key}={value}" for key, value in props.items()],
               "--transactional-id", f"perf-{name}", "--transaction-duration-ms",
               str(transaction_ms), "--reporting-interval", "1000"]
    out, err = work / f"pp-{name}.out", work / f"pp-{name}.err"
    label = PP if name.startswith("measured") else PP_CALIBRATION
    task = bar.add_task(f"{label} ({transaction_ms} ms/txn)", total=records, info="JVM start")
    broker = broker_cpu(kafka)

    def poll() -> None:
        with contextlib.suppress(OSError, IndexError):
            sent = re.findall(r"^(\d+) records sent", out.read_text(), re.MULTILINE)
            if sent:
                bar.update(task, completed=sum(int(n) for n in sent), info="")

    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                cwd=work)
        try:
            exited = reap(proc, poll, timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out.read_text(errors="replace")
    found = PP_SUMMARY.findall(text)
    if exited.code != 0 or not found:
        raise RuntimeError(f"ProducerPerformance exited {exited.code}:\n{tail(out)}\n"
                           f"{tail(err)}")
    sent, rate, mib, avg, peak, p50, p95, p99, p999 = found[-1]
    seconds = int(sent) / float(rate)
    per_txn = min(float(rate) * transaction_ms / 1000, int(sent))
    bar.update(task, completed=records)
    result = Measured(label, int(sent), seconds, per_txn, size, size,
                      client_cpu_s=round(exited.cpu_s, 2),
                      broker_cpu_s=delta(broker_cpu(kafka), broker),
                      note=f"Java client; a commit every {transaction_ms} ms; "
                           f"latency avg {avg} ms, p99 {p99} ms",
                      extra={"reported_mib_per_s": float(mib), "latency_ms": {
                          "avg": float(avg), "max": float(peak), "p50": int(p50),
                          "p95": int(p95), "p99": int(p99), "p999": int(p999)},
                          "transaction_ms": transaction_ms, "summary": text.strip()
                          .splitlines()[-1], "jvm_rss_mb": exited.rss_mb})
    return result, command


# ------------------------------------------------------------------------------ capture


def wire_sizes(log: KafkaChangeLog, records: Sequence[Record], log_format: str
               ) -> tuple[float, float]:
    """Average bytes per record as Kafka gets it: the value, and key + value + position (with
    ``json``, of the records in Kafka Connect's form, measured on a sample of 5,000)."""
    if log_format == "json":
        from cdc.connect import ConnectJson

        connect = ConnectJson(log.schemas())
        sample = records[:5000]
        pairs = [connect.record(r.topic, r.key, r.value) for r in sample]
        values = [len(v or b"") for _, v in pairs]
        whole = [len(k) + len(v or b"") + len(r.position) for (k, v), r in zip(pairs, sample,
                                                                               strict=True)]
        return sum(values) / len(sample), sum(whole) / len(sample)
    n = len(records)
    return (sum(len(r.value or b"") for r in records) / n,
            sum(len(r.key) + len(r.value or b"") + len(r.position) for r in records) / n)


def capture_config(bench: pgc.Bench, kafka: ThrowawayKafka, source: str) -> Path:
    """``pg_capture``'s config of ``source``; with the log on Kafka unless ``source`` is the
    local one."""
    if source == LOCAL_SOURCE:
        return bench.source_config(source)
    kafka_log = {"backend": "kafka", "bootstrap_servers": json.dumps(kafka.bootstrap_servers),
                 "partitions": PARTITIONS, "format": FORMAT[0]}
    return write_config(bench.work / f"{source}.yaml", bench.work / f"log-{source}", source,
                        "postgres", bench.dsn(), [pgc.TABLE], kafka_log)


def capture_setup(bench: pgc.Bench, kafka: ThrowawayKafka, sources: Sequence[str]) -> None:
    """The database and table, and each source bootstrapped on the empty table (its slot and
    publication exist before the rows are written)."""
    with psycopg.connect(bench.server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {pgc.DATABASE}")
    with bench.connect() as conn:
        conn.execute(pgc.DDL)
        version = conn.execute("SHOW server_version").fetchone()
    bench.console.print(f"PostgreSQL {version[0] if version else '?'} on port {bench.server.port}; "
                        f"sources {', '.join(sources)} bootstrapped on the empty table",
                        highlight=False)
    for source in sources:
        config = capture_config(bench, kafka, source)
        run_cdc(bench.work, ["bootstrap", "--config", str(config)], f"bootstrap-{source}-empty")


def log_reader(bench: pgc.Bench, kafka: ThrowawayKafka, source: str) -> ChangeLogReader:
    if source == LOCAL_SOURCE:
        return LocalChangeLogReader(bench.work / f"log-{source}")
    return KafkaChangeLogReader(LogConfig(backend="kafka",
                                          bootstrap_servers=kafka.bootstrap_servers,
                                          partitions=PARTITIONS))


class LogProbe:
    """How far a drain is: the committed end offsets of the table's topic, and whether the row
    inserted last is committed (the last few records of its partition hold its key)."""

    def __init__(self, reader: ChangeLogReader, topic: str) -> None:
        self.reader, self.topic = reader, topic

    def ends(self) -> dict[int, int]:
        return self.reader.end_offsets(self.topic)

    def holds(self, key: bytes, ends: dict[int, int]) -> bool:
        partition = partition_for(key, PARTITIONS)
        start = max(0, ends.get(partition, 0) - 8)
        return any(r.key == key for r in self.reader.read(self.topic, partition, start))

    def close(self) -> None:
        pass


class KafkaProbe(LogProbe):
    """The same against Kafka with one ``ListOffsets`` request (read_committed) for all
    partitions and a consumer of our own for the tail: ``KafkaChangeLogReader`` asks each
    partition's end with its own ``get_watermark_offsets`` (0.1-0.5 s for 8 partitions here),
    which would make the drain's end be noticed that much late."""

    def __init__(self, reader: KafkaChangeLogReader, topic: str, bootstrap: str) -> None:
        super().__init__(reader, topic)
        self.name = reader.kafka_name(topic)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-probe",
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "enable.partition.eof": True,
                                  "fetch.wait.max.ms": 5})
        # connected before the drain is timed: a consumer's first read (connections, leader
        # lookup) took ~0.9 s here, which would be counted as the capture's
        self.holds(b"", self.ends())

    def ends(self) -> dict[int, int]:
        """Committed ends; none until the capture created the topic (at its first row)."""
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        wanted = {TopicPartition(self.name, p): latest for p in range(PARTITIONS)}
        try:
            found = self.admin.list_offsets(
                wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
            return {tp.partition: int(future.result(timeout=30).offset)
                    for tp, future in found.items()}
        except KafkaException:  # no such topic yet ("no leaders found")
            return {}

    def holds(self, key: bytes, ends: dict[int, int]) -> bool:
        partition = partition_for(key, PARTITIONS)
        start = max(0, ends.get(partition, 0) - 8)
        self.consumer.assign([TopicPartition(self.name, partition, start)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for message in self.consumer.consume(num_messages=16, timeout=0.005):
                error = message.error()
                if error is None and canonical_key(message.key() or b"") == key:
                    return True  # the key as the log holds it (log.format json: Connect's)
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    return False
        return False

    def close(self) -> None:
        self.consumer.close()


def drain(bench: pgc.Bench, kafka: ThrowawayKafka, source: str,
          profile_to: Path | None = None) -> Drained:
    """``cdc capture`` of ``source`` from process start until the row inserted last is committed
    in the log (the rows are inserted in key order, so every earlier one is committed too)."""
    rows = bench.expected
    topic = f"{source}.{pgc.TABLE}"
    last_key = json.dumps({"id": bench.args.rows}, separators=(",", ":")).encode()
    config = bench.work / f"{source}.yaml"
    backend = "local log" if source == LOCAL_SOURCE else "Kafka"
    label = f"cdc capture into {backend}" + (" under cProfile" if profile_to else "")
    result = Drained(label, rows)
    reader = log_reader(bench, kafka, source)
    probe = LogProbe(reader, topic) if source == LOCAL_SOURCE else \
        KafkaProbe(reader, topic, kafka.bootstrap_servers)  # type: ignore[arg-type]
    # with profile_to: the stream thread and the commit thread under cProfile
    command = capture_command(config, __file__, profile_to)
    out = bench.work / f"capture-{source}.out"
    try:
        before = sum(probe.ends().values())
        with progress_bar(bench.progress_console, 48) as bar, open(out, "wb") as sink:
            task = bar.add_task(label, total=rows, info="")
            broker = broker_cpu(kafka)
            started = time.perf_counter()
            first_at: float | None = None
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                deadline = started + bench.args.timeout
                while True:
                    offsets = probe.ends()
                    ends = sum(offsets.values()) - before
                    now = time.perf_counter()
                    if ends and first_at is None:
                        first_at = now
                    bar.update(task, completed=min(ends, rows))
                    # Kafka's end offsets count a commit marker per partition and transaction
                    # too: they only say when to look for the last row
                    if ends >= rows and probe.holds(last_key, offsets):
                        break
                    if proc.poll() is not None:
                        result.error = f"capture exited {proc.returncode}: {tail(out)}"
                        return result
                    if now > deadline:
                        result.error = f"timed out at {ends:,} of {rows:,} offsets"
                        return result
                    time.sleep(POLL_S)
                result.seconds = time.perf_counter() - started
                if first_at is not None:
                    result.first_to_last_s = round(result.seconds - (first_at - started), 3)
                result.rss_mb = peak_rss_mb(proc.pid)
                cpu = cpu_seconds(proc.pid)
                result.capture_cpu_s = round(cpu, 2) if cpu is not None else None
                result.broker_cpu_s = delta(broker_cpu(kafka), broker)
            finally:
                code = stop(proc)
            if code != 0:
                result.note = f"exit {code} after SIGTERM; "
            bar.update(task, description=f"{label}: counting the log (not timed)")
            held = sum(1 for p in range(PARTITIONS) for _ in reader.iter_partition(topic, p))
            bar.update(task, completed=rows)
        lsn = int((reader.source_offsets().get(source) or {}).get("lsn", 0))
        result.note += (f"log holds {held:,} records; stored LSN {format_lsn(lsn)} "
                        f"{'>=' if lsn >= bench.endpos else '<'} endpos")
        if held != rows:
            result.note = f"[red]{result.note} (expected {rows:,})[/]"
    finally:
        probe.close()
        reader.close()
    return result


def profile_child(config: str, out: str) -> int:
    """``cdc capture`` with its stream thread under cProfile (``<out>.stream``, as
    ``pg_capture.profile_child`` does), every append its commit thread makes under another
    (``<out>.append``: cProfile sees one thread, and the Kafka appends run in ``cdc-commit``),
    and its main thread (start-up, then waiting) under a third (``<out>.main``)."""
    import threading

    import cdc.coordinator as coordinator
    from cdc_app.cli import main as cli_main

    stream, appends = cProfile.Profile(), cProfile.Profile()
    original_run, original_append = coordinator.StreamRunner.run, KafkaChangeLog.append

    def run(self: coordinator.StreamRunner) -> None:
        try:
            stream.runcall(original_run, self)
        finally:
            stream.dump_stats(f"{out}.stream")
            appends.dump_stats(f"{out}.append")

    def append(self: KafkaChangeLog, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("cdc-commit"):
            return appends.runcall(original_append, self, *args, **kwargs)
        return original_append(self, *args, **kwargs)  # the stream thread's profiler has it

    coordinator.StreamRunner.run = run  # type: ignore[method-assign]
    KafkaChangeLog.append = append  # type: ignore[method-assign]
    main_thread = cProfile.Profile()  # start-up: config, opening the log, taking the writer
    try:
        main_thread.runcall(cli_main, ["capture", "--config", config])
    finally:
        main_thread.dump_stats(f"{out}.main")
    return 0


def capture(args: argparse.Namespace, console: Console, progress_console: Console, work: Path,
            kafka: ThrowawayKafka) -> tuple[pgc.Bench, list[Drained], Path | None]:
    pg = ThrowawayPostgres()
    try:
        pg.start()
        bench_args = argparse.Namespace(rows=args.capture_rows, batch=args.capture_batch,
                                        updates=0.0, timeout=args.timeout)
        bench = pgc.Bench(bench_args, console, progress_console, work, pg)
        sources = [LOCAL_SOURCE, KAFKA_SOURCE] + ([PROFILE_SOURCE] if args.profile else [])
        capture_setup(bench, kafka, sources)
        pgc.load(bench)
        results = [drain(bench, kafka, LOCAL_SOURCE), drain(bench, kafka, KAFKA_SOURCE)]
        profile = None
        if args.profile:
            profile = work / "capture.prof"
            results.append(drain(bench, kafka, PROFILE_SOURCE, profile))
        for result in results:
            shown = f"{result.rate:,.0f} rows/s" if result.rate else f"[red]{result.error}[/]"
            console.print(f"  {result.name}: {shown}", highlight=False)
        return bench, results, profile
    finally:
        pg.cleanup()


# ------------------------------------------------------------------------------ report


def append_table(results: Sequence[Measured], reference: Measured | None) -> Table:
    table = figures_table("Kafka: transactional appends (acks=all, idempotence, one broker, "
                          "replication factor 1)", "producer", "records/txn", "records/s",
                          "value MB/s", "payload MB/s", f"x {PP}", "client CPU s",
                          "broker CPU s", "note")
    for r in results:
        ratio = f"{r.rate / reference.rate:.2f}" if reference else "-"
        table.add_row(r.name, f"{r.per_transaction:,.0f}", f"{r.rate:,.0f}",
                      f"{r.value_mib_s:,.1f}", f"{r.payload_mib_s:,.1f}", ratio,
                      f"{r.client_cpu_s:.1f}" if r.client_cpu_s is not None else "-",
                      f"{r.broker_cpu_s:.1f}" if r.broker_cpu_s is not None else "-", r.note)
    return table


def capture_table(bench: pgc.Bench, results: Sequence[Drained]) -> Table:
    table = figures_table(f"PostgreSQL capture of {bench.expected:,} inserted rows "
                          f"({bench.transactions:,} transactions): local log vs Kafka", "run",
                          "seconds", "rows/s", "x local", "start->first s", "first->last s",
                          "capture CPU s", "broker CPU s", "peak RSS MB", "note")
    local = results[0].rate
    for r in results:
        table.add_row(r.name, f"{r.seconds:.2f}" if r.seconds else "-",
                      f"{r.rate:,.0f}" if r.rate else "-",
                      f"{r.rate / local:.2f}" if r.rate and local else "-",
                      f"{r.seconds - r.first_to_last_s:.2f}" if r.seconds and r.first_to_last_s
                      else "-",
                      f"{r.first_to_last_s:.2f}" if r.first_to_last_s else "-",
                      f"{r.capture_cpu_s:.1f}" if r.capture_cpu_s is not None else "-",
                      f"{r.broker_cpu_s:.1f}" if r.broker_cpu_s is not None else "-",
                      f"{r.rss_mb:,.0f}" if r.rss_mb else "-",
                      f"[red]{r.error}[/]" if r.error else r.note)
    return table


def git_commit() -> str:
    """The checkout's commit, ``+dirty`` if the code measured differs from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "cdc", "connectors") else "")


def goal_line(console: Console, name: str, value: float | None, goal: float) -> None:
    if value is None:
        console.print(f"{name}: not measured (goal >= {goal})")
        return
    verdict = "[green]met[/]" if value >= goal else "[red]missed[/]"
    console.print(f"{name} = {value:.3f} (goal >= {goal}): {verdict}", highlight=False)


def measured_json(r: Measured) -> dict[str, Any]:
    return {"records_per_s": round(r.rate), "value_mib_per_s": round(r.value_mib_s, 2),
            "payload_mib_per_s": round(r.payload_mib_s, 2), "seconds": round(r.seconds, 3),
            "records_per_transaction": round(r.per_transaction), "client_cpu_s": r.client_cpu_s,
            "broker_cpu_s": r.broker_cpu_s}


# ------------------------------------------------------------------------------ main


def run(args: argparse.Namespace, console: Console, work: Path) -> int:
    progress_console = make_console(stderr=True)
    loadavg_start = load_averages()
    n = args.records
    kafka = ThrowawayKafka(jvm_options=BROKER_HEAP)
    seen: list[dict[str, Any]] = []
    appended: list[Measured] = []
    pp_results: list[Measured] = []
    pp_command: list[str] = []
    profiled: tuple[Path, Result] | None = None
    drained: list[Drained] = []
    bench: pgc.Bench | None = None
    capture_profile: Path | None = None
    try:
        kafka.start()
        broker = broker_settings(kafka)
        console.print(f"Kafka {kafka_version()} (KRaft, one broker+controller node, heap "
                      f"{' '.join(BROKER_HEAP)}) on {kafka.bootstrap_servers}, data in "
                      f"{kafka.directory} ({filesystem(kafka.data_dir)}), started in "
                      f"{kafka.start_seconds:.1f} s; nproc {os.cpu_count()}, load "
                      f"{loadavg_start}; code {git_commit()}", highlight=False)
        console.print(f"broker: {flush_policy(broker)}; {broker}", highlight=False)

        # 1. ours
        config = LogConfig(backend="kafka", bootstrap_servers=kafka.bootstrap_servers,
                           partitions=PARTITIONS, format=args.format)
        with progress_bar(progress_console, 48) as bar, recording_producers(seen):
            log = KafkaChangeLog(config)
            build = bar.add_task("building records (not timed)", total=n, info="")
            records = build_records(n, work, lambda done: bar.advance(build, done),
                                    store=log.schemas())
            value_bytes, payload_bytes = wire_sizes(log, records, args.format)
            tombstones = sum(r.value is None for r in records)
            try:
                log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
                for batch in BATCHES:
                    appended.append(measure_ours(log, kafka, records, batch,
                                                 (value_bytes, payload_bytes), bar))
                profiled = profile_ours(log, records, RATIO_BATCH, work) if args.profile \
                    else None
            finally:
                log.close()
        producer = next((s for s in seen if str(s.get("transactional.id", "")).startswith(
            config.transactional_id_prefix + "shop-")), {})
        for r in appended:
            console.print(f"  {r.name}: {r.rate:,.0f} records/s", highlight=False)

        # 2. ProducerPerformance: same settings, value size and partitions
        props = {key: str(producer[key]).lower() for key in PP_SETTINGS if key in producer}
        size = round(value_bytes)
        ours = appended[BATCHES.index(RATIO_BATCH)]
        with progress_bar(progress_console, 48) as bar:
            transaction_ms = args.transaction_ms
            if transaction_ms is None:  # calibrate: ~RATIO_BATCH records per transaction
                guess = max(1, round(RATIO_BATCH / ours.rate * 1000))
                calibration, _ = producer_performance(kafka, work, "calibration", n, size,
                                                      props, guess, args.timeout, bar)
                pp_results.append(calibration)
                transaction_ms = max(1, round(RATIO_BATCH / calibration.rate * 1000))
            for attempt in range(1 if args.transaction_ms else 2):
                measured, pp_command = producer_performance(
                    kafka, work, f"measured-{attempt + 1}", n, size, props, transaction_ms,
                    args.timeout, bar)
                if abs(measured.per_transaction / RATIO_BATCH - 1) <= PP_TOLERANCE or attempt:
                    break
                # faster (or slower) than calibrated: a transaction held too many (or too few)
                # records; run again with the duration that would have held ~RATIO_BATCH
                measured.name = PP_CALIBRATION
                pp_results.append(measured)
                transaction_ms = max(1, round(RATIO_BATCH / measured.rate * 1000))
        pp_results.insert(0, measured)
        console.print(f"  {PP}: {measured.rate:,.0f} records/s", highlight=False)
        kafka_ratio = round(ours.rate / measured.rate, 3)

        # 4. capture into the local log and into Kafka
        if not args.no_capture:
            bench, drained, capture_profile = capture(args, console, progress_console, work,
                                                      kafka)
        broker_log_mb = sum(p.stat().st_size for p in kafka.data_dir.rglob("*.log")) / 1e6
    finally:
        kafka.stop(timeout=30)
        kafka.cleanup()

    # report
    console.print(append_table([*appended, *pp_results], measured))
    console.print(f"records: {n:,} of the synthetic shop workload ({tombstones:,} tombstones); "
                  f"average value {value_bytes:,.1f} bytes (ProducerPerformance --record-size "
                  f"{size}), key + value + position header {payload_bytes:,.1f} bytes; MB/s are "
                  "MiB/s like ProducerPerformance's", highlight=False)
    safe_producer = {k: v for k, v in producer.items() if "password" not in k}
    console.print(f"our producer (librdkafka, as KafkaChangeLog configures it): {safe_producer}",
                  highlight=False, markup=False)
    console.print(f"ProducerPerformance (Java client {kafka_version()}): "
                  f"{' '.join(pp_command[pp_command.index(PP_CLASS):])}", highlight=False,
                  markup=False, soft_wrap=True)
    console.print(f"topics: {PARTITIONS} partitions, replication factor 1 (one broker), no "
                  "compression; ours is compacted (cdc's topics always are), "
                  "ProducerPerformance's is not (its records have no key); ours are partitioned "
                  "by key (murmur2), ProducerPerformance's by the sticky partitioner; broker "
                  f"total on disk afterwards {broker_log_mb:,.0f} MB", highlight=False)
    kafka_vs_local: float | None = None
    if bench is not None:
        console.print(capture_table(bench, drained))
        local, into_kafka = drained[0].rate, drained[1].rate
        kafka_vs_local = round(into_kafka / local, 3) if local and into_kafka else None
    goal_line(console, "kafka_ratio (ours at 10,000/append / ProducerPerformance)", kafka_ratio,
              0.5)
    goal_line(console, "kafka_vs_local (cdc capture into Kafka / into the local log)",
              kafka_vs_local, 0.8)

    profiles: dict[str, list[dict[str, Any]]] = {}
    if profiled is not None:
        path, result = profiled
        profiles["append"] = print_profile(console, path, f"{OURS}, {RATIO_BATCH:,}/append",
                                           result)
    if capture_profile is not None:
        result_p = Result("capture", "stream", drained[-1].rows, drained[-1].seconds,
                          error=drained[-1].error)
        for part, what in (("main", "main thread (start-up, then waiting)"),
                           ("stream", "stream thread"),
                           ("append", "commit thread: KafkaChangeLog.append")):
            path = capture_profile.with_name(f"{capture_profile.name}.{part}")
            if path.exists():
                profiles[f"capture_kafka_{part}"] = print_profile(
                    console, path, f"cdc capture into Kafka, {what}", result_p)

    summary: dict[str, Any] = {
        "kafka_ratio": kafka_ratio,
        "kafka_vs_local": kafka_vs_local,
        "ours_records_per_s": {str(b): round(r.rate) for b, r in zip(BATCHES, appended,
                                                                     strict=True)},
        "ours_value_mib_per_s": {str(b): round(r.value_mib_s, 2)
                                 for b, r in zip(BATCHES, appended, strict=True)},
        "ours": {str(b): measured_json(r) for b, r in zip(BATCHES, appended, strict=True)},
        "producer_performance_records_per_s": round(measured.rate),
        "producer_performance": {**measured_json(measured), **{
            k: v for k, v in measured.extra.items() if k != "summary"},
            "summary": measured.extra["summary"],
            "calibration_runs": [{"records_per_s": round(r.rate),
                                  "transaction_ms": r.extra["transaction_ms"],
                                  "records_per_transaction": round(r.per_transaction)}
                                 for r in pp_results[1:]]},
        "capture": None if bench is None else {
            "rows": bench.expected, "transactions": bench.transactions,
            "rows_per_transaction": bench.args.batch,
            "local_rows_per_s": round(drained[0].rate) if drained[0].rate else None,
            "kafka_rows_per_s": round(drained[1].rate) if drained[1].rate else None,
            "local": {k: v for k, v in vars(drained[0]).items() if k != "name"},
            "kafka": {k: v for k, v in vars(drained[1]).items() if k != "name"},
            "commit_interval_ms": COMMIT_INTERVAL_MS,
            "local_fsync": True,
            "errors": {r.name: r.error for r in drained if r.error},
        },
        "settings": {
            "our_producer": {k: v for k, v in safe_producer.items()},
            "producer_performance_props": props,
            "producer_performance_transaction_ms": measured.extra["transaction_ms"],
            "partitions": PARTITIONS,
            "replication_factor": 1,
            "compression": "none",
            "broker": broker,
            "broker_flush": flush_policy(broker),
            "broker_heap": " ".join(BROKER_HEAP),
            "kafka_version": kafka_version(),
        },
        "records": n,
        "value_bytes_avg": round(value_bytes, 1),
        "format": args.format,
        "payload_bytes_avg": round(payload_bytes, 1),
        "record_size": size,
        "tombstones": tombstones,
        **machine_summary(loadavg_start),
        "python": sys.version.split()[0],
        "git": git_commit(),
    }
    if profiles:
        summary["profile_top_tottime"] = {k: v[:5] for k, v in profiles.items()}
    print_summary(summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000,
                        help="records per append run and per ProducerPerformance run (200,000)")
    parser.add_argument("--capture-rows", type=int, default=100_000,
                        help="rows inserted into PostgreSQL and captured (100,000)")
    parser.add_argument("--capture-batch", type=int, default=1_000,
                        help="rows per PostgreSQL transaction (1,000)")
    parser.add_argument("--transaction-ms", type=int, default=None,
                        help="ProducerPerformance's --transaction-duration-ms (default: "
                             "calibrated to ~10,000 records per transaction)")
    parser.add_argument("--format", default="avro", choices=["avro", "json"],
                        help="the Kafka log's format (json: Kafka Connect's form)")
    parser.add_argument("--no-capture", action="store_true",
                        help="skip the PostgreSQL capture comparison")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile our append (10,000/append) and, from its own slot, "
                             "cdc capture into Kafka, and print the top functions")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to create the work directory (default <project>/.bench-tmp)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (configs, cdc's output, profiles)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds any one measurement may take (1800)")
    parser.add_argument("--profile-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    FORMAT[0] = args.format
    if args.profile_child:
        return profile_child(*args.profile_child)
    # SIGTERM unwinds like Ctrl-C, so that the finally blocks stop the broker, PostgreSQL and
    # any running `cdc capture` or ProducerPerformance
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.records < max(BATCHES) or args.capture_rows < 1 or args.capture_batch < 1:
        parser.error(f"--records must be at least {max(BATCHES):,}; --capture-rows and "
                     "--capture-batch positive")
    console = make_console()
    with work_directory(args.dir, "kafka-log-", args.keep) as work:
        return run(args, console, work)


if __name__ == "__main__":
    sys.exit(main())
