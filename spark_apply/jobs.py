"""``cdc apply``: one Spark application, one streaming query per follower.

Each query reads the change log with the ``cdc`` source (``spark_apply/source.py``,
``emit=ranges``) — the follower's sources, at most ``max_records_per_batch`` records per
micro-batch, planned as offset ranges — and hands every micro-batch to :class:`BatchHandler`
through ``foreachBatch``:

1. collect the ranges and watermark rows to the driver (a few rows per partition, never a
   record) and split the ranges into tasks (``spark_apply/tasks.py``'s ``plan_tasks``);
2. run the tasks on the executors: each reads its records (through the log contract, or Spark's
   Kafka source for a Kafka log: ``spark_apply/kafka_read.py``), folds them and
   :meth:`Sink.apply` s them behind the version gate (a driver-only sink runs them here);
3. only when every task succeeded, :meth:`Sink.set_watermark` with the batch's watermark rows
   (per source, the newest), so a watermark never claims more than the follower holds.

Spark commits the batch's offsets to the follower's checkpoint after the handler returns. A
crash before that replays the same batch with the same rows (at-least-once); the version gate
makes the replay change nothing. ``once`` runs ``availableNow`` (everything committed when the
query starts, in as many batches as admission control needs) and returns; otherwise the queries
run every ``trigger_interval`` until :meth:`ApplyJob.request_stop` (SIGTERM), which lets a
running batch finish before stopping.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from cdc.config import Config
from cdc.errors import CdcError, LogError
from cdc.log.base import stale_partitions
from cdc.log.open import log_settings, must_read
from cdc.offsets import offset_text
from cdc.sink import Placement, Sink
from cdc.transactions import is_transaction_topic
from spark_apply.checkpoint import remove_torn_writes, resume_offsets
from spark_apply.latency import LatencyHistogram, format_seconds
from spark_apply.outages import OUTAGES, Waiting, outage_of, probe
from spark_apply.outages import ride_out as wait_out_outages
from spark_apply.tasks import FollowerHandle, add_phases, open_target

log = logging.getLogger(__name__)


class ApplyError(CdcError):
    """A follower's streaming query failed."""


#: failures of Spark's own plumbing, not of the data or the sink: Spark starts a Python process
#: per streaming source (and per task) that must connect back within a fixed 10 s, which a
#: loaded machine can miss. Such a query is restarted from its checkpoint (exactly where it
#: was: the version gate absorbs a replayed batch) up to :data:`TRANSIENT_RESTARTS` times.
TRANSIENT_FAILURES = ("Python worker failed to connect back", "CANNOT_OPEN_SOCKET",
                      "Timed out while waiting for the Python worker")
TRANSIENT_RESTARTS = 5
#: how soon :meth:`ApplyJob.wait` sees a stop request (SIGTERM, Ctrl-C) while it waits
STOP_POLL_S = 0.1


@dataclass
class FollowerProgress:
    """What one follower's query has done so far (updated by its batch handler)."""

    name: str
    batches: int = 0
    records: int = 0
    changes: int = 0
    written: int = 0
    deleted: int = 0
    skipped: int = 0
    #: rows the sink's storage engine read (a view's state: :attr:`ApplyStats.scanned`)
    scanned: int = 0
    #: seconds from the newest applied record's commit at the source to its apply
    lag_s: float | None = None
    #: per change event (c/u/d) applied: commit at the source -> batch applied
    #: (``spark_apply/latency.py``), over all topics and per topic
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    latency_by_topic: dict[str, LatencyHistogram] = field(default_factory=dict)
    #: per topic, log records read (truncates and tombstones included)
    records_by_topic: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: time inside the batch handler; of it, reading + folding (Spark, up to the collect) and
    #: the sink's writes (apply + watermarks)
    seconds: float = 0.0
    fold_seconds: float = 0.0
    sink_seconds: float = 0.0
    #: of the sink's seconds, per phase where it measures them (:attr:`ApplyStats.phases`)
    phases: dict[str, float] = field(default_factory=dict)
    #: a CdcError raised inside the handler (re-raised by the job with its fix)
    error: CdcError | None = None
    #: told of each applied batch, failure and restart (``cdc apply --metrics-port``:
    #: :class:`cdc_app.metrics.ApplyMetrics`)
    observer: Any = None


def reads_with_spark_kafka(config: Config, name: str, sink: Sink) -> bool:
    """Whether follower ``name``'s tasks read with Spark's Kafka source (its ``reader``; a sink
    written on the driver (``Sink.placement``) always reads through the log contract)."""
    if not sink.placement.splits:
        return False
    follower = config.follower(name)
    return follower.reader == "spark-kafka" or (follower.reader == "auto"
                                                and config.log.backend == "kafka")


def checkpointed_offsets(checkpoint: Path, batch_id: int
                         ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The ``(start, end)`` source offsets of micro-batch ``batch_id``, from the query's offset
    log. Spark writes ``offsets/N`` (a version line, the batch's metadata, then one line per
    source: ours is the only one) *before* it runs batch N, and batch N starts where batch N-1
    ended (the source's initial offset, no topics, for batch 0). None when the files cannot be
    read as that; the caller then reads the batch's rows instead."""

    def read(number: int) -> dict[str, Any] | None:
        try:
            lines = (checkpoint / "offsets" / str(number)).read_text().splitlines()
            value = json.loads(lines[2]) if len(lines) == 3 and lines[0] == "v1" else None
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) and "topics" in value else None

    end = read(batch_id)
    start = {"topics": {}} if batch_id == 0 else read(batch_id - 1)
    return None if end is None or start is None else (start, end)


class BatchHandler:
    """The ``foreachBatch`` function of one follower (runs in the driver's Python).

    The micro-batch is planned from its offsets in the query's checkpoint (ranges of the log's
    partitions and the watermarks: :func:`spark_apply.source.batch_plan`), split into tasks
    (:func:`~spark_apply.tasks.plan_tasks`, one per core of the application) and run on the
    executors with :func:`~spark_apply.tasks.run_task` — or, for a sink placed on the driver
    (``Sink.placement``), here. Once every task succeeded, the watermarks are written."""

    def __init__(self, sink: Sink, handle: FollowerHandle, progress: FollowerProgress,
                 topics: Sequence[str] | None, spark: Any, checkpoint: Path | None = None
                 ) -> None:
        self.sink = sink
        self.handle = handle
        self.progress = progress
        self.topics = set(topics) if topics is not None else None
        self.spark = spark
        self.checkpoint = checkpoint
        self._store: Any = None
        self._state: Any = None
        self._local_mode: bool | None = None
        self._local_applier: Any = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        from spark_apply.tasks import ApplyTask, TaskReport, plan_tasks, run_task

        started = time.monotonic()
        ranges, watermarks = self._planned(batch_id)
        if self.topics is not None:
            ranges = [item for item in ranges if item.topic in self.topics]
        context = self.spark.sparkContext
        placement = self.sink.placement
        tasks = plan_tasks(ranges, max(1, context.defaultParallelism) if placement.splits
                           else 1, placement is Placement.BY_OWNER)  # a view: one call
        total = TaskReport()
        try:
            if placement.splits and self._small_in_local_mode(ranges):
                reports = [self.local_applier.run(ApplyTask(tuple(ranges)))]
            elif self.kafka_reader and ranges and placement.on_executors:
                reports = self._run_on_kafka(ranges, batch_id)
            elif placement.on_executors and tasks:
                context.setJobDescription(f"cdc apply {self.handle.name}: batch {batch_id}, "
                                          f"{len(tasks)} tasks")
                handle = self.handle
                reports = (context.parallelize(tasks, len(tasks))
                           .map(lambda task: run_task(handle, task)).collect())
            else:
                reports = [run_task(self.handle, task, self.sink) for task in tasks]
            for report in reports:
                total.merge(report)
            for source, offset in sorted(watermarks.items()):
                self.sink.set_watermark(source, offset)
        except CdcError as exc:
            self.progress.error = exc
            self._observe_error(exc)
            raise
        except Exception as exc:
            known = _task_error(exc)
            self._observe_error(known or exc)
            if known is not None:
                self.progress.error = known
                raise known from None
            raise
        self._record(total, watermarks, time.monotonic() - started)

    def _small_in_local_mode(self, ranges: list[Any]) -> bool:
        """The follower's ``driver_batch_records`` holds this batch and Spark runs in local
        mode (never on a cluster master: there the executors write)."""
        settings = self.handle.config.followers.get(self.handle.name)
        limit = int(settings.driver_batch_records) if settings is not None else 0
        if not ranges or limit <= 0 or not self.local_mode:
            return False
        records: int = sum(item.end - item.start for item in ranges)
        return records <= limit

    @property
    def local_applier(self) -> Any:
        """The follower's :class:`~spark_apply.local_apply.LocalApplier` (started by its first
        small batch)."""
        if self._local_applier is None:
            from spark_apply.local_apply import LocalApplier

            self._local_applier = LocalApplier(self.handle)
        return self._local_applier

    def close(self) -> None:
        if self._local_applier is not None:
            self._local_applier.close()

    @property
    def local_mode(self) -> bool:
        if self._local_mode is None:
            self._local_mode = str(self.spark.sparkContext.master).startswith("local")
        return self._local_mode

    def _observe_error(self, exc: BaseException) -> None:
        if self.progress.observer is not None:
            self.progress.observer.error(self.progress.name, exc.__class__.__name__)

    def _planned(self, batch_id: int) -> tuple[list[Any], dict[str, Any]]:
        """The batch's ranges and watermarks, planned from the checkpoint's offset log
        (:func:`spark_apply.source.batch_plan`, the one way a batch is planned): no Spark job,
        no record read back."""
        from cdc.reading import open_log
        from spark_apply.source import batch_plan

        offsets = None if self.checkpoint is None else \
            checkpointed_offsets(self.checkpoint, batch_id)
        if offsets is None:
            raise ApplyError(f"follower {self.handle.name}: cannot read micro-batch {batch_id}'s "
                             f"offsets in the checkpoint {self.checkpoint}",
                             "the checkpoint folder was changed or damaged: restore it, or "
                             "delete it to rebuild the follower from the log")
        start, end = offsets
        if self._state is None or not set(end.get("topics", {})) <= set(self._state.topics):
            self._state = open_log(self.handle.log)[0].committed()  # topics' meta never changes
        return batch_plan(self._state, start, end)

    @property
    def kafka_reader(self) -> bool:
        return reads_with_spark_kafka(self.handle.config, self.handle.name, self.sink)

    def _run_on_kafka(self, ranges: list[Any], batch_id: int) -> list[Any]:
        """The batch read by Spark's Kafka source, decoded in the JVM, folded and written by
        ``mapInArrow`` tasks (``spark_apply/kafka_read.py``); their reports."""
        import pickle

        from cdc.log.open import kafka_topic_name
        from spark_apply.kafka_read import (
            REPORT_SCHEMA,
            kafka_frame,
            kafka_task,
            topic_schema_ids,
        )

        settings = json.loads(self.handle.log)
        store = self._schemas()
        topics = sorted({item.topic for item in ranges})
        frame = kafka_frame(self.spark, settings, ranges, topic_schema_ids(store, topics),
                               store)
        names = {kafka_topic_name(settings, item.topic): item for item in ranges}
        if self.sink.placement is Placement.BY_OWNER:
            frame = frame.repartition(max(1, self.spark.sparkContext.defaultParallelism),
                                      self._owner_column(names))
        self.spark.sparkContext.setJobDescription(
            f"cdc apply {self.handle.name}: batch {batch_id} from Kafka")
        rows = frame.mapInArrow(kafka_task(self.handle, names), REPORT_SCHEMA).collect()
        return [pickle.loads(row["report"]) for row in rows]  # noqa: S301 - our own tasks'

    def _owner_column(self, names: dict[str, Any]) -> Any:
        """``Sink.owner``'s grouping in the JVM: :func:`cdc.sink.key_group` with
        ``owner_groups(topic)`` (``pmod(crc32(key), groups)``)."""
        from pyspark.sql import functions as F

        crc = F.crc32(F.col("key").cast("binary"))
        owner = crc
        for name, item in names.items():
            groups = self.sink.owner_groups(item.topic)
            if groups:
                owner = F.when(F.col("topic") == name, F.pmod(crc, F.lit(groups))).otherwise(owner)
        return owner

    def _schemas(self) -> Any:
        """The log's schema store (kept: it re-reads itself when asked for a new id)."""
        if self._store is None:
            from cdc.reading import open_log

            self._store = open_log(self.handle.log)[0].schemas()
        return self._store

    def _record(self, total: Any, watermarks: dict[str, dict[str, Any]], seconds: float) -> None:
        progress = self.progress
        progress.batches += 1
        progress.records += total.records
        progress.changes += total.changes
        progress.written += total.written
        progress.deleted += total.deleted
        progress.skipped += total.skipped
        progress.scanned += total.scanned
        progress.watermarks.update(watermarks)
        for topic, count in total.records_by_topic.items():
            progress.records_by_topic[topic] = progress.records_by_topic.get(topic, 0) + count
        progress.seconds += seconds
        progress.fold_seconds += total.read_seconds
        progress.sink_seconds += total.sink_seconds
        add_phases(progress.phases, total.phases)
        for topic, histogram in total.latency_by_topic.items():
            progress.latency.merge(histogram)
            progress.latency_by_topic.setdefault(topic, LatencyHistogram()).merge(histogram)
        if total.newest_ts_ms is not None:
            progress.lag_s = max(0.0, time.time() - total.newest_ts_ms / 1000)
        elif watermarks:
            progress.lag_s = 0.0
        if progress.observer is not None:
            progress.observer.batch(progress, total, seconds)


#: how a CdcError raised in a task reaches the driver: ``module.Kind: problem`` and
#: ``  fix: ...`` (``CdcError.__str__``) inside the Python traceback Spark wraps it in
_TASK_ERROR = re.compile(r"^(?:[\w]+\.)*(?P<kind>\w+): (?P<problem>.*)\n(?:  fix: (?P<fix>.*))?",
                         re.M)


def _error_classes() -> dict[str, type[CdcError]]:
    """Every CdcError class loaded in this process, by name."""
    found: dict[str, type[CdcError]] = {}
    pending: list[type[CdcError]] = [CdcError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


def _task_error(exc: Exception) -> CdcError | None:
    """The CdcError a task raised, rebuilt from Spark's wrapped failure (the last one in its
    text), or ``None`` when the failure is not one of ours."""
    text = str(exc)
    if "Traceback (most recent call last)" not in text:
        return None
    classes = _error_classes()
    for match in reversed(list(_TASK_ERROR.finditer(text))):
        cls = classes.get(match.group("kind"))
        if cls is not None:
            problem = match.group("problem").strip()
            fix = (match.group("fix") or "").strip() or "see the message above"
            try:
                return cls(problem, fix)
            except TypeError:  # a subclass with its own constructor
                return CdcError(problem, fix)
    return None


_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$", re.M)


def failure_summary(text: str) -> str:
    """The line of a query's failure that says what went wrong: the last Python exception
    line of an embedded traceback (``RuntimeError: ...``), else the first line."""
    found = _PYTHON_ERROR.findall(text)
    if "Traceback (most recent call last)" in text and found:
        return str(found[-1]).strip()
    lines = text.strip().splitlines()
    return lines[0] if lines else "?"


def _wait_initialized(query: Any, timeout: float = 30.0) -> None:
    """Until ``query`` has initialized its source (Spark's own Python process for it is up),
    at most ``timeout`` s: queries started together would spawn their Python processes at
    once, and on a loaded machine one can miss Spark's fixed connect-back deadline."""
    deadline = time.monotonic() + timeout
    while (time.monotonic() < deadline and query.isActive
           and query.status.get("message") == "Initializing sources"):
        time.sleep(0.2)  # each look is two calls into the JVM


def check_log(config: Config) -> None:
    """:class:`LogError` with the fix unless the configured log exists."""
    from cdc.log.open import open_reader

    reader = open_reader(config, missing_ok=True)
    if reader is None:
        where = (config.log_path if config.log.backend == "local"
                 else config.log.bootstrap_servers)
        raise LogError(f"there is no change log at {where}",
                       "run `cdc bootstrap` (then `cdc capture`) first, or correct the log "
                       "settings")
    reader.close()


@dataclass
class ApplyJob:
    """The queries of ``names`` on one SparkSession. Build with :meth:`prepare` (checks
    everything that can be checked before Spark starts), then :meth:`run`."""

    config: Config
    names: list[str]
    sinks: dict[str, Sink]
    progress: dict[str, FollowerProgress]
    stop: threading.Event = field(default_factory=threading.Event)
    queries: dict[str, Any] = field(default_factory=dict)
    #: per follower, the restarts after a transient failure (:data:`TRANSIENT_FAILURES`)
    restarts: dict[str, int] = field(default_factory=dict)
    #: views that stopped on their own error while the others went on
    failed_views: dict[str, CdcError] = field(default_factory=dict)
    #: followers waiting out an unreachable log or follower (spark_apply/outages.py)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    #: per follower, its status file for ``cdc status`` (cdc/status.py)
    _status_files: dict[str, Any] = field(default_factory=dict)
    _spark: Any = None
    _once: bool = False
    #: per follower, its query's batch handler
    _handlers: dict[str, BatchHandler] = field(default_factory=dict)
    #: unique to this run (executors keep one sink per run and follower)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def prepare(cls, config: Config, names: Sequence[str], stop: threading.Event | None = None,
                observer: Any = None, wait_out: bool = False) -> ApplyJob:
        """Validate the followers, the log and every sink's connection; no Spark yet. With
        ``wait_out`` (a continuous run), an unreachable log or follower is waited for
        (:mod:`spark_apply.outages`) until ``stop`` is set; otherwise it is the error."""
        stop = stop or threading.Event()

        def check(attempt: Callable[[], Any], followers: list[str]) -> None:
            if wait_out:
                wait_out_outages(attempt, stop, followers, observer)
            else:
                attempt()
        if not names:
            raise CdcError("no follower given",
                           "pass --follower NAME (one of the names under `followers:`)")
        chosen = list(dict.fromkeys(names))
        for name in chosen:
            config.follower(name)
            if not config.follower_sources(name):
                raise CdcError(f"follower {name} follows no source: the config has no "
                               "`sources:`", "add the databases to capture under `sources:`")
        check(lambda: check_log(config), chosen)
        sinks: dict[str, Sink] = {}
        try:
            for name in chosen:
                sink = open_target(config, name)
                sinks[name] = sink
                check(sink.check, [name])
            if any(reads_with_spark_kafka(config, name, sinks[name]) for name in chosen):
                from spark_apply.session import require_spark_jars

                require_spark_jars("kafka", "avro")
        except BaseException:
            for sink in sinks.values():
                sink.close()
            raise
        return cls(config, chosen, sinks, {name: FollowerProgress(name) for name in chosen},
                   stop=stop)

    def checkpoint(self, name: str) -> Path:
        return self.config.follower_checkpoint(name)

    def handle(self, name: str) -> FollowerHandle:
        """What the executors need to write follower ``name`` (pickled into its tasks)."""
        follower = self.config.follower(name)
        secrets = tuple((variable, os.environ[variable])
                        for variable in (getattr(follower, "password_env", None),
                                         self.config.log.password_env)
                        if variable and variable in os.environ)
        return FollowerHandle(self.config, name, json.dumps(log_settings(self.config)),
                              self.token, secrets)

    def start(self, spark: Any, once: bool) -> None:
        """Start one streaming query per follower."""
        self._spark, self._once = spark, once
        for name in self.names:
            query = self._start_or_wait(name)
            if query is not None and len(self.names) > 1:
                _wait_initialized(query)

    def _start_or_wait(self, name: str) -> Any:
        """Start follower ``name``'s query; on an outage, put it among the waiting instead
        (None). Spark's own wrapped failures become the CdcError inside, or an ApplyError
        with its summary — never a traceback."""
        try:
            self.queries[name] = query = self._start_query(self._spark, name, self._once)
            return query
        except Exception as exc:  # noqa: BLE001 - sorted below: ours, an outage, Spark's
            rebuilt = _task_error(exc) if not isinstance(exc, CdcError) else None
            outage = outage_of(exc, rebuilt)
            if outage is None or self._once:  # a batch run reports an outage: its scheduler
                if outage is not None:      # retries
                    raise outage from None
                if isinstance(exc, CdcError):
                    raise
                raise rebuilt or ApplyError(
                    f"follower {name}: its streaming query did not start: "
                    f"{failure_summary(str(exc))[:500]}",
                    "fix the cause and run `cdc apply` again") from None
            self._wait(name, outage)
            return None

    def _wait(self, name: str, outage: CdcError) -> None:
        """Follower ``name`` waits out ``outage`` (a first one, or its query failed again)."""
        self.queries.pop(name, None)
        known = self.waiting.get(name)
        if known is not None:
            known.failed_again(outage)
        else:
            self.waiting[name] = Waiting(name, outage, time.monotonic())
        self.progress[name].error = None  # not the follower's own failure: it resumes
        observer = self.progress[name].observer
        if observer is not None:
            observer.error(name, type(outage).__name__)
            observer.state(name, "waiting", outage.problem)

    def _retry_waiting(self) -> None:
        """Each waiting follower whose time has come: reach what was away, then start its
        query again from its checkpoint."""
        for name, waiting in list(self.waiting.items()):
            if not waiting.due or self.stop.is_set():
                continue
            try:
                probe(self.config, self.sinks[name], waiting.problem)
            except OUTAGES as exc:
                waiting.failed_again(exc)
                continue
            if self._start_or_wait(name) is not None:
                self.waiting.pop(name).ended()
                if self.progress[name].observer is not None:
                    self.progress[name].observer.state(name, "starting")

    def _start_query(self, spark: Any, name: str, once: bool) -> Any:
        follower = self.config.follower(name)
        stream = (spark.readStream.format("cdc")
                  .option("log", json.dumps(log_settings(self.config)))
                  .option("sources", ",".join(self.config.follower_sources(name)))
                  .option("maxRecordsPerTrigger", str(follower.max_records_per_batch))
                  .option("emit", "ranges")
                  .load())
        topics = self.sinks[name].read_topics  # a view: its tables only
        if topics is None and follower.tables:
            topics = list(self.config.follower_topics(name))
        checkpoint = self.checkpoint(name)
        handler = BatchHandler(self.sinks[name], self.handle(name), self.progress[name], topics,
                               spark, checkpoint)
        old = self._handlers.pop(name, None)
        if old is not None:  # a restarted query: its predecessor's process ends
            old.close()
        self._handlers[name] = handler
        refuse_if_stale(self.config, name, checkpoint)  # again: a restart may come much later
        try:
            checkpoint.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CdcError(f"follower {name}: cannot create the checkpoint directory "
                           f"{checkpoint} ({exc.strerror})",
                           f"make it writable, or set followers.{name}.checkpoint") from None
        torn = remove_torn_writes(checkpoint)
        if torn:
            log.warning("follower %s: removed %s left in its checkpoint by a killed run",
                        name, ", ".join(torn))
        writer = (stream.writeStream.foreachBatch(handler)
                  .option("checkpointLocation", str(checkpoint))
                  .queryName(f"cdc-apply-{name}"))
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(follower.trigger_interval * 1000)} "
                                                   "milliseconds")
        return writer.start()

    def request_stop(self) -> None:
        """Ask :meth:`wait` to stop the queries (safe from a signal handler)."""
        self.stop.set()

    def wait(self, console: Console | None = None, refresh: float = 0.5) -> None:
        """Until every query has ended (``availableNow``) or a stop was requested; shows the
        progress table meanwhile. Raises :class:`ApplyError` (or the sink's own CdcError) if
        a query failed."""
        live = Live(self.table(), console=console, refresh_per_second=2, transient=False) \
            if console is not None else None
        try:
            if live is not None:
                live.start()
            while not self.stop.is_set():
                self._raise_failures(restart=True)
                self._retry_waiting()
                if not any(q.isActive for q in self.queries.values()) and not self.waiting:
                    break
                self._report_states()
                if self.queries:
                    self._await_any(refresh)
                else:
                    self.stop.wait(refresh)
                self.write_status()
                if live is not None:
                    live.update(self.table())
            self.stop_queries()
            self._raise_failures()
            for error in self.failed_views.values():
                raise error
        finally:
            if live is not None and console is not None:
                live.update(self.table())
                live.stop()
                if not console.is_terminal:
                    console.line()  # rich leaves the last line of a non-terminal Live open

    def _report_states(self) -> None:
        """Tell each follower's observer whether its query is still starting (Spark
        initialising its sources) or applying (waiting for data, or processing it)."""
        for name, query in list(self.queries.items()):
            observer = self.progress[name].observer
            if observer is None or not query.isActive:
                continue
            message = str(query.status.get("message", ""))
            observer.state(name, "starting" if message.startswith("Initializing")
                           else "applying")

    def _await_any(self, timeout: float) -> None:
        """Up to ``timeout`` seconds, or until a query ends (waited for in the JVM, so ``--once``
        returns as its last batch ends, not at the next poll) or a stop is requested (seen
        within :data:`STOP_POLL_S`)."""
        streams = self._spark.streams  # started: wait() only waits for started queries
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                if streams.awaitAnyTermination(min(left, STOP_POLL_S)):
                    return
            except Exception:  # noqa: BLE001 - a failed query: _raise_failures reports it
                return
            finally:
                streams.resetTerminated()

    def write_status(self, state: str = "running", force: bool = False) -> None:
        """Each follower's progress for ``cdc status`` (at most once a second each)."""
        import contextlib

        from cdc.status import follower_status_file

        for name in self.names:
            p = self.progress[name]
            with contextlib.suppress(OSError):  # advisory: never stop apply for it
                if name not in self._status_files:
                    self._status_files[name] = follower_status_file(self.config.log_path, name)
                failed = self.failed_views.get(name) or p.error
                self._status_files[name].update(
                    state, p.changes, force=force, batches=p.batches, records=p.records,
                    written=p.written, deleted=p.deleted, skipped=p.skipped, lag_s=p.lag_s,
                    watermarks=dict(p.watermarks),
                    last_error=failed.problem if failed else None)

    def stop_queries(self, grace: float = 60.0) -> None:
        """Stop every query, letting a running micro-batch finish (up to ``grace`` s)."""
        deadline = time.monotonic() + grace
        for query in self.queries.values():
            while (query.isActive and query.status.get("isTriggerActive")
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            if query.isActive:
                query.stop()

    def _raise_failures(self, restart: bool = False) -> None:
        """Raise the first failure of a query; with ``restart``, restart instead a query whose
        failure is transient (:meth:`_restart_if_transient`)."""
        for name, query in list(self.queries.items()):
            if query.isActive:
                continue
            failure = query.exception()
            if failure is None:
                continue
            known = self.progress[name].error
            outage = outage_of(known, _task_error(Exception(str(failure))))
            if outage is not None and restart and not self._once:
                self._wait(name, outage)  # the log or the follower is away: wait, resume
                continue
            if known is not None and name in self.config.views and restart:
                self._stop_view(name, known)  # a broken view stops alone
                continue
            if known is not None:
                raise known
            if restart and self._restart_if_transient(name, str(failure)):
                continue
            raise ApplyError(f"follower {name}: the streaming query failed: "
                             f"{failure_summary(str(failure))[:500]}",
                             "fix the cause and run `cdc apply` again; it resumes from the "
                             f"checkpoint at {self.checkpoint(name)}")

    def _stop_view(self, name: str, error: CdcError) -> None:
        """View ``name`` failed with ``error`` (e.g. its SQL broken by a schema change): it
        stops, said loudly; the other followers and views go on. ``cdc apply`` then exits
        with the error once the others are done."""
        self.queries.pop(name)
        self.failed_views[name] = error
        if self.progress[name].observer is not None:
            self.progress[name].observer.state(name, "failed", error.problem)
        log.error("view %s stopped: %s (fix: %s); the other followers and views go on",
                  name, error.problem, error.fix)

    def _restart_if_transient(self, name: str, failure: str) -> bool:
        """Restart follower ``name``'s query if ``failure`` is Spark plumbing (see
        :data:`TRANSIENT_FAILURES`) and it has restarts left; whether it did."""
        done = self.restarts.get(name, 0)
        if (self._spark is None or self.stop.is_set() or done >= TRANSIENT_RESTARTS
                or not any(marker in failure for marker in TRANSIENT_FAILURES)):
            return False
        self.restarts[name] = done + 1
        if self.progress[name].observer is not None:
            self.progress[name].observer.restarted(name)
        first = failure.strip().splitlines()[0][:200]
        log.warning("follower %s: the streaming query failed in Spark's plumbing (%s); "
                    "restarting it from its checkpoint (%d of %d)", name, first, done + 1,
                    TRANSIENT_RESTARTS)
        self.queries[name] = self._start_query(self._spark, name, self._once)
        return True

    def table(self, since: dict[str, LatencyHistogram] | None = None,
              latency: bool = True) -> Table:
        """Per follower: batches, records read, changes, written/deleted/skipped, lag, and
        the per-change latency p50/p99 (commit at the source -> applied) — of the changes
        applied after ``since`` (per follower, a copy of its histogram then), or none shown
        (``latency`` False: while a backlog drains it measures the wait, not the pipeline)."""
        table = Table(title="cdc apply", title_justify="left")
        for column in ("follower", "batches", "records", "changes", "written", "deleted",
                       "skipped (gate)", "lag", "latency p50", "p99", "watermark"):
            table.add_column(column, justify="left" if column in ("follower", "watermark")
                             else "right")
        for name in self.names:
            p = self.progress[name]
            marks = ", ".join(f"{s}@{offset_text(o)}"
                              for s, o in sorted(p.watermarks.items())) or "-"
            hist = p.latency.since(since[name]) if since and name in since else p.latency
            table.add_row(name, f"{p.batches:,}", f"{p.records:,}", f"{p.changes:,}",
                          f"{p.written:,}", f"{p.deleted:,}", f"{p.skipped:,}",
                          "-" if p.lag_s is None else f"{p.lag_s:.2f} s",
                          format_seconds(hist.quantile(0.5)) if latency else "…",
                          format_seconds(hist.quantile(0.99)) if latency else "…", marks)
        return table

    def close(self) -> None:
        for handler in self._handlers.values():
            handler.close()
        for sink in self.sinks.values():
            sink.close()


def start_spark(master: str | None = None, conf: dict[str, str] | None = None,
                jars: Path | None = None, ship: bool = False, scratch: Path | None = None
                ) -> Any:
    """The SparkSession (``spark_apply/session.py``) on ``master`` (default: the embedded
    ``local[2,3]``) with the extra settings ``conf``, the connector jars in ``jars``
    (default: the jar cache's) and the driver's scratch space under ``scratch``, or a
    :class:`CdcError` with the fix."""
    try:
        from spark_apply.session import spark_session

        return spark_session(master=master or "local[2,3]", app_name="cdc-apply", conf=conf,
                             jars_folder=jars, ship=ship, scratch=scratch)
    except ImportError as exc:
        raise CdcError(f"PySpark is not installed ({exc})",
                       "run `make setup`, or pip install -e '.[spark]'") from None
    except Exception as exc:  # noqa: BLE001 - Java missing, no memory, ...: one clear message
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise CdcError(f"cannot start Spark: {first[:300]}",
                       "check that Java 17+ is installed (`java -version`; `make setup` "
                       "installs it) and that the machine has ~1.5 GB of free memory") from None


class FollowerStaleError(CdcError):
    """A follower stopped for longer than the log keeps tombstones: it must be rebuilt."""


def refuse_if_stale(config: Config, name: str, checkpoint: Path) -> None:
    """Raise :class:`FollowerStaleError` if follower ``name`` would resume behind what the log
    still guarantees (:func:`cdc.log.base.stale_partitions`)."""
    resume = resume_offsets(checkpoint)
    if resume is None:
        return
    reader = must_read(config)
    try:
        topics = reader.committed().topics
        rows = {topic: parts for topic, parts in resume.get("topics", {}).items()
                if topic in topics and not is_transaction_topic(topics[topic].meta)}
        stale = stale_partitions(reader, rows, int(time.time() * 1000))
    finally:
        reader.close()
    if not stale:
        return
    first = stale[0]
    age = (time.time() * 1000 - first.appended_ms) / 1000
    raise FollowerStaleError(
        f"follower {name} stopped too long ago: it would resume {first.topic} partition "
        f"{first.partition} at offset {first.resume}, and the next record there was appended "
        f"{age / 3600:.1f} h ago, longer than the log keeps tombstones "
        f"({first.retention / 3600:g} h); deletes it never saw may be compacted away "
        f"({len(stale)} partition(s) so)",
        f"rebuild this follower: stop `cdc apply`, empty the follower and delete its checkpoint "
        f"{checkpoint}, then run `cdc apply` (it reads the log from offset 0); raise "
        "log.tombstone_retention if followers may stop this long")


def run_apply(config: Config, names: Sequence[str], once: bool, console: Console | None,
              stop: threading.Event | None = None, master: str | None = None,
              observer: Any = None) -> ApplyJob:
    """Prepare, start the SparkSession and the queries, wait, stop. ``stop`` (set by a
    SIGTERM handler) ends a continuous run; a stop requested before the queries start means
    none is started. ``master`` overrides the config's ``spark.master``. Returns the finished
    job (its ``progress``)."""
    job = ApplyJob.prepare(config, names, stop, observer, wait_out=not once)
    for progress in job.progress.values():
        progress.observer = observer  # metrics: cdc_app.metrics.ApplyMetrics
    try:
        if job.stop.is_set():
            return job
        for name in job.names:  # before Spark starts: a stale follower is refused at once
            stale = functools.partial(refuse_if_stale, config, name, job.checkpoint(name))
            if once:
                stale()
            else:
                wait_out_outages(stale, job.stop, [name], observer)
        jars = config.resolve(config.spark.jars_dir) if config.spark.jars_dir else None
        chosen = master or config.spark.master
        ship = config.spark.ship == "always" or (
            config.spark.ship == "auto" and not chosen.startswith("local"))
        spark = start_spark(chosen, config.spark.conf, jars, ship,
                            scratch=config.log_path.parent / "state" / "spark")
        if job.stop.is_set():
            return job
        job.start(spark, once)
        job.wait(console)
        return job
    finally:
        job.stop_queries()
        job.write_status("stopped", force=True)
        job.close()
