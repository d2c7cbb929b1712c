"""What the ``cdc apply`` benchmarks share (``bench/apply.py``, ``bench/apply_tables.py``).

* the synthetic workload: rows of ``shop.public.orders`` (6 columns, a ~100-byte note) and
  the change events of a list of keys (:func:`order_row`, :func:`events`);
* :class:`BenchEnv`: one run's world — a temporary directory, the change logs (local, or topics
  of one throwaway Kafka broker: ``--log kafka``), the SparkSession (``local[2,3]`` or a
  throwaway standalone cluster of 2 workers x 1 core: ``--master cluster``), configs written as
  ``cdc apply`` reads them, and ``cdc apply --once`` in-process (:meth:`BenchEnv.apply_once`);
* :class:`PySpy`: ``py-spy record --subprocesses`` of this process (the driver, the JVM and
  every Python worker/executor under it) around a phase, summarized as top functions;
* ``uptime``'s load (:func:`load`, :func:`uptime`) and goal bookkeeping (:func:`goal`).

Logs are written *directly* with the project's codec and log writer (``writer_from``: the
local log, or ``KafkaChangeLog`` as ``bench/kafka_log.py`` does), not through capture.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402

from cdc.avro import EventCodec  # noqa: E402
from cdc.events import ChangeEvent, Op, TableSchema, TransactionInfo  # noqa: E402
from cdc.position import Position  # noqa: E402
from cdc_app.synthetic import ORDERS  # noqa: E402

console = Console(stderr=True)
#: a DSN nobody listens on: the throughput phases never start capture
NO_DSN = "postgresql://postgres@127.0.0.1:1/shop"


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def uptime() -> str:
    """``uptime``'s line (load averages over 1, 5 and 15 minutes)."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def goal(value: float | None, target: float, below: bool = False) -> dict[str, Any]:
    """``{"value", "goal", "met"}`` for a figure with a goal (``below``: must stay under)."""
    met = None if value is None else (value < target if below else value >= target)
    return {"value": value, "goal": f"{'<' if below else '>='} {target:g}", "met": met}


# ------------------------------------------------------------------------------ the workload

def orders(source: str) -> TableSchema:
    """The synthetic ``public.orders`` table of source ``source`` (topic
    ``<source>.public.orders``)."""
    return ORDERS if source == ORDERS.source else dataclasses.replace(ORDERS, source=source)


def order_row(key: int, version: int) -> dict[str, Any]:
    """Row ``key`` of the orders table as of ``version`` (deterministic)."""
    rnd = random.Random(key * 7 + version)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return {"id": key, "customer": f"customer-{rnd.randrange(10_000)}",
            "amount": Decimal(rnd.randrange(1, 10_000_000)).scaleb(-2),
            "status": rnd.choice(("new", "paid", "shipped")),
            "placed_at": base + dt.timedelta(seconds=rnd.randrange(30_000_000)),
            "note": f"order {key} version {version} " + "x" * 80}


def events(table: TableSchema, keys: Iterable[int], op: Op,
           first_position: int) -> Iterator[ChangeEvent]:
    """One ``op`` event per key, positions ``first_position, first_position + 1, ...``, each
    its own one-change transaction committed now."""
    now = int(time.time() * 1000)
    for index, key in enumerate(keys):
        position = first_position + index
        yield ChangeEvent(table, op, Position.test(position), ts_ms=now, before=None,
                          after=order_row(key, position),
                          source_info={"txId": position, "lsn": position * 64},
                          transaction=TransactionInfo(str(position), 1, 1))


# ------------------------------------------------------------------------------ the logs

@dataclasses.dataclass(frozen=True)
class Log:
    """One change log of the run: its ``log:`` settings and the source name its topic has."""

    name: str
    settings: dict[str, Any]
    source: str

    @property
    def topic(self) -> str:
        return orders(self.source).topic


def append_log(log: Log, keys: Iterable[int], op: Op, first_position: int,
               chunk: int = 5000) -> float:
    """Append one ``op`` event per key of ``keys`` to ``log`` (created if new) with the project's
    codec and log writer, ``chunk`` records per append, the source offset with each; seconds."""
    from cdc.log.open import writer_from

    started = time.perf_counter()
    table = orders(log.source)
    writer = writer_from(log.settings)
    try:
        codec = EventCodec(writer.schemas())
        writer.ensure_topic(table.topic, {"source": log.source, "table": str(table.table)})
        out = writer.for_source(log.source)
        batch: list[Any] = []
        position = first_position
        for event in events(table, keys, op, first_position):
            batch.extend(codec.records(event))
            position += 1
            if len(batch) >= chunk:
                out.append(batch, {log.source: {"lsn": position * 64,
                                                "lsn_text": f"0/{position * 64:X}"}})
                batch = []
        out.append(batch, {log.source: {"lsn": position * 64,
                                        "lsn_text": f"0/{position * 64:X}"}})
    finally:
        writer.close()
    return time.perf_counter() - started


# ------------------------------------------------------------------------------ followers

def redis_follower(url: str, batch: int, trigger: float = 1.0) -> dict[str, Any]:
    return {"kind": "redis", "url": url, "max_records_per_batch": batch,
            "trigger_interval": f"{trigger}s"}


def delta_follower(path: Path, batch: int, mode: str = "scd1", buckets: int = 16,
                   trigger: float = 1.0) -> dict[str, Any]:
    return {"kind": "delta", "path": str(path), "mode": mode, "buckets": buckets,
            "max_records_per_batch": batch, "trigger_interval": f"{trigger}s"}


def search_follower(path: Path, batch: int, text_fields: dict[str, list[str]],
                    trigger: float = 1.0) -> dict[str, Any]:
    return {"kind": "search", "path": str(path), "text_fields": text_fields,
            "max_records_per_batch": batch, "trigger_interval": f"{trigger}s"}


# ------------------------------------------------------------------------------ py-spy

class PySpy:
    """``py-spy record --subprocesses --format raw`` of this process tree while in the
    ``with`` block (off when ``path`` is None). :meth:`summary`: the top functions by samples
    (self and total), over every Python process sampled."""

    def __init__(self, path: Path | None, rate: int = 50) -> None:
        self.path = path
        self.rate = rate
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        binary = Path(sys.executable).parent / "py-spy"
        if self.path is not None and binary.exists():
            self.process = subprocess.Popen(
                [str(binary), "record", "--subprocesses", "--nonblocking", "--format", "raw",
                 "--rate", str(self.rate), "--pid", str(os.getpid()), "--output",
                 str(self.path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached before the phase starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(2)  # SIGINT: py-spy writes its output and exits
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def summary(self, top: int = 25) -> str:
        """Top frames by self samples and by total (inclusive) samples, with shares."""
        if self.path is None or not self.path.exists():
            return ""
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        by_process: collections.Counter[str] = collections.Counter()
        total = 0
        for line in self.path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            samples = int(count)
            frames = stack.split(";")
            processes = [f for f in frames if f.startswith("process ")]
            frames = [f for f in frames if not f.startswith("process ")]
            total += samples
            by_process[_process(processes[-1]) if processes else "?"] += samples
            if frames:
                own[_frame(frames[-1])] += samples
            for frame in {_frame(f) for f in frames if "(<frozen " not in f}:
                inclusive[frame] += samples
        if not total:
            return ""
        lines = [f"{total:,} samples at {self.rate}/s over every Python process (busy "
                 "threads only; the JVM's own time is invisible to py-spy)", "",
                 "by process (the innermost Python process of each sample):"]
        lines += [f"  {n / total:6.1%}  {name}" for name, n in by_process.most_common(8)]
        lines += ["", "self (top):"]
        lines += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
        lines += ["", "total, inclusive (top; import machinery left out):"]
        lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
        return "\n".join(lines)


def _process(frame: str) -> str:
    """``process 123:"/path/python -m module ..."`` -> ``python -m module ...`` (80 chars)."""
    command = frame.partition(":")[2].strip('"')
    words = command.split()
    if words:
        words[0] = Path(words[0]).name
    return " ".join(words)[:80]


def _frame(frame: str) -> str:
    """``function (path/to/file.py:line)`` -> ``function (file.py)`` (lines merged)."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(where).parts
    short = "/".join(parts[-2:]) if parts else where
    return f"{name} ({short})"


# ------------------------------------------------------------------------------ the run

@dataclasses.dataclass
class BenchEnv:
    """One run's temporary directory, logs, Spark session (local or a throwaway cluster) and
    Kafka broker (``log == "kafka"``). Use as a context manager; :meth:`start_spark` first."""

    master: str = "local"
    log_backend: str = "local"
    root: Path = dataclasses.field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="cdc-bench-apply-")))
    spark: Any = None
    cluster: Any = None
    kafka: Any = None
    spark_master_url: str = "local[2,3]"
    spark_conf: dict[str, str] = dataclasses.field(default_factory=dict)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    _stack: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    @property
    def default_path(self) -> bool:
        """Spark local mode and a local log: the set-up the goals are for."""
        return self.master == "local" and self.log_backend == "local"

    def __enter__(self) -> BenchEnv:
        self.results.update(master=self.master, log=self.log_backend, uptime_start=uptime())
        if self.log_backend == "kafka":
            from cdc_app.servers.kafka import ThrowawayKafka

            console.print("starting a throwaway Kafka broker ...")
            self.kafka = ThrowawayKafka().start()
            self._stack.callback(self._stop_kafka)
        if self.master == "cluster":
            from cdc_app.servers.spark import EXECUTOR_MEMORY, ThrowawaySparkCluster

            console.print("starting a throwaway Spark cluster (2 workers x 1 core) ...")
            self.cluster = ThrowawaySparkCluster(workers=2, cores=1).start()
            self._stack.callback(self.cluster.stop)
            self.spark_master_url = self.cluster.master_url
            self.spark_conf = {"spark.executor.memory": EXECUTOR_MEMORY,
                               "spark.cores.max": "2", "spark.task.maxFailures": "8",
                               "spark.driver.host": "127.0.0.1",
                               "spark.driver.bindAddress": "127.0.0.1"}
        elif self.master != "local":
            self.spark_master_url = self.master
        return self

    def _stop_kafka(self) -> None:
        self.kafka.stop()
        self.kafka.cleanup()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.spark is not None:
                self.spark.stop()
        finally:
            self._stack.close()
            shutil.rmtree(self.root, ignore_errors=True)
            self.results["uptime_end"] = uptime()

    def start_spark(self, app_name: str) -> Any:
        """The run's SparkSession (``cdc apply``'s own ``spark_session``: later ``run_apply``
        calls get this one); its start-up seconds go into the results."""
        from spark_apply.session import spark_session

        started = time.perf_counter()
        self.spark = spark_session(master=self.spark_master_url, app_name=app_name,
                                   conf=self.spark_conf)
        self.results["spark_start_s"] = round(time.perf_counter() - started, 1)
        return self.spark

    def log(self, name: str) -> Log:
        """A new, empty change log of the run's backend (Kafka: internal topics and a source
        name of its own, so logs on the one broker never share a topic)."""
        path = self.root / name
        settings: dict[str, Any] = {"path": str(path), "partitions": 8, "fsync": False}
        source = "shop"
        if self.kafka is not None:
            tag = f"{name.replace('-', '_')}_{uuid.uuid4().hex[:4]}"
            source = f"shop_{tag}"
            settings.update(backend="kafka", bootstrap_servers=self.kafka.bootstrap_servers,
                            offsets_topic=f"_cdc_offsets_{tag}",
                            schemas_topic=f"_cdc_schemas_{tag}",
                            transactional_id_prefix=f"cdc-{tag}-")
        return Log(name, settings, source)

    def config(self, name: str, log: Log, followers: dict[str, dict[str, Any]],
               dsn: str = NO_DSN, table: str = "public.orders") -> Path:
        """Write a ``cdc.yaml`` of ``log``, one PostgreSQL source (``dsn``: not contacted by
        ``cdc apply``), ``followers`` (checkpoints under the run's directory unless given) and
        the run's ``spark:`` section; its path."""
        followers = {key: {"checkpoint": str(self.root / f"ck-{name}-{key}"), **value}
                     for key, value in followers.items()}
        document = {"log": log.settings,
                    "sources": [{"name": log.source, "kind": "postgres", "dsn": dsn,
                                 "tables": [table], "heartbeat_interval": "1s"}],
                    "followers": followers,
                    "spark": {"master": self.spark_master_url, "conf": self.spark_conf}}
        path = self.root / f"cdc-{name}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def apply_once(self, config_path: Path, names: list[str]) -> tuple[float, Any]:
        """``cdc apply --once`` in-process (``run_apply``: query start, every micro-batch, stop;
        the session already runs): (seconds, the finished job)."""
        from cdc.config import load_config
        from spark_apply.jobs import run_apply

        started = time.perf_counter()
        job = run_apply(load_config(config_path), names, once=True, console=None)
        return time.perf_counter() - started, job

    @staticmethod
    def batch_seconds(job: Any, name: str) -> float | None:
        """The sum of follower ``name``'s micro-batch durations (Spark's ``triggerExecution``):
        the run's wall time minus the query's start and stop."""
        query = job.queries.get(name)
        if query is None:
            return None
        total = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress
                    if p.get("numInputRows"))
        return total / 1000 or None

    def warm_up(self, followers: dict[str, dict[str, Any]], records: int = 1000) -> None:
        """Python workers and the first query's set-up, not measured: ``cdc apply --once`` of a
        ``records``-record log into ``followers`` (retried: under load a worker's start can
        miss Spark's connect-back deadline)."""
        log = self.log("warm")
        append_log(log, range(records), Op.CREATE, 1)
        config = self.config("warm", log, followers)
        for attempt in range(3):
            try:
                self.apply_once(config, list(followers))
                return
            except Exception as exc:  # noqa: BLE001 - retried, then raised
                console.print(f"  warm-up failed ({str(exc).splitlines()[0][:120]}); retrying")
                if attempt == 2:
                    raise


def print_json(results: dict[str, Any]) -> None:
    """The run's results as one JSON line (the last line of stdout)."""
    print(json.dumps(results, default=str))


def whole_log(settings: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
    """``(reader, decoder, ranges)``: everything committed in the log of ``settings``, as the
    ``cdc`` source plans it (``spark_apply.source``: complete transactions, offset ranges), with
    the reader and decoder the executors' tasks use."""
    from spark_apply.source import SourceOptions, _open, complete_end, plan

    text = json.dumps(settings)
    reader, decoder = _open(text)
    state = reader.committed()
    partitions = plan(state, {"topics": {}}, complete_end(state, SourceOptions(text)), 1)
    return reader, decoder, [item for part in partitions for item in part.ranges]
