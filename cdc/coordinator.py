"""The coordinator: runs a source's *snapshot* (``cdc bootstrap``) and then its *stream*
(``cdc capture``), both emitting through one :class:`~cdc.pipeline.Dispatcher` into the log.
It knows sources only through the connector contract (:mod:`cdc.source`).

The source offset stored in the log (:mod:`cdc.offsets`) is the whole truth about where a
source stands:

* state ``bootstrapping`` is committed *before* a snapshot starts. A crash leaves it there;
  capture refuses to stream from it and ``cdc bootstrap`` starts over.
* state ``streaming`` is committed with the last snapshot row, then with every flush of streamed
  changes. Streaming resumes *after* it: every transaction it covers is already in the log.

The server is told an offset (:meth:`~cdc.source.StreamingSource.confirm`) only after the log
committed it, so the server never forgets what the log lacks: SIGKILL at any instant loses
nothing, and whatever is delivered twice carries the same position as its first copy.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from cdc.avro import EventCodec
from cdc.columns import ColumnPolicies, check_key
from cdc.config import Config, SourceConfig
from cdc.errors import CdcError, ConfigError, LogUnavailable
from cdc.events import ChangeEvent, TableId, TableSchema, topic_name
from cdc.heap import long_lived_heap
from cdc.incremental import IncrementalSnapshots, SnapshotQueue, TableProgress
from cdc.log.base import ChangeLogReader, ChangeLogWriter
from cdc.log.open import open_writer
from cdc.observe import NO_OBSERVER, CaptureObserver
from cdc.offsets import SourceOffset
from cdc.pipeline import TABLE_KEY, Dispatcher
from cdc.source import (
    Checkpoint,
    Connector,
    EncodedBatch,
    IncrementalSnapshotSource,
    SnapshotSource,
    StreamingSource,
    Watermark,
    connector_for,
)
from cdc.status import StatusFile

log = logging.getLogger("cdc.capture")
T = TypeVar("T")


def open_log(config: Config) -> tuple[ChangeLogWriter, EventCodec]:
    """The log writer for ``config`` and a codec registering schemas in the log's registry."""
    writer = open_writer(config)
    try:
        codec = EventCodec(writer.schemas())
    except BaseException:
        writer.close()
        raise
    return writer, codec


#: seconds between a daemon's tries to reach an unavailable log: the first, and the most
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 10.0


def when_log_answers(what: str, call: Callable[[], T], stop: threading.Event) -> T | None:
    """``call()``, tried again while it raises :class:`~cdc.errors.LogUnavailable` (brokers
    down or restarting: what a daemon waits out, starting as running), after
    :data:`RETRY_FIRST_S` seconds doubling up to :data:`RETRY_MAX_S`, with one warning per
    try. None if ``stop`` is set first (a SIGTERM ends the wait at once); other errors raise."""
    delay = RETRY_FIRST_S
    while not stop.is_set():
        try:
            return call()
        except LogUnavailable as exc:
            log.warning("%s: %s; retrying the log in %.1f s", what, _first_line(exc), delay)
            stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX_S)
    return None


def capture_sources(config: Config, names: Iterable[str] = ()) -> list[SourceConfig]:
    """The sources to run: those named, or all of them; each must have a connector."""
    chosen: list[SourceConfig] = (
        [config.source(name) for name in names] if names else list(config.sources))
    if not chosen:
        raise ConfigError("the config lists no sources", "add one under `sources:`")
    for source in chosen:
        connector_for(source)  # an unknown kind is refused here, before anything starts
    return chosen


# ---------------------------------------------------------------------------------- bootstrap

@dataclass
class BootstrapReport:
    source: str
    #: where streaming starts (the snapshot's point in the source's log)
    resume: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    vanished: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed else "", style="cyan")


def live_keys(writer: ChangeLogReader, topic: str) -> set[bytes]:
    """The keys whose latest record in ``topic`` is not a tombstone."""
    live: set[bytes] = set()
    info = writer.committed().topics.get(topic)
    if info is None:
        return live
    for partition in range(info.partitions):
        for record in writer.iter_partition(topic, partition):
            if record.key == TABLE_KEY:
                continue
            if record.value is None:
                live.discard(record.key)
            else:
                live.add(record.key)
    return live


def bootstrap(config: Config, source_config: SourceConfig, writer: ChangeLogWriter,
              codec: EventCodec, console: Console,
              connector: Connector | None = None,
              observer: CaptureObserver = NO_OBSERVER) -> BootstrapReport:
    """Snapshot every table of one source into the log; leave it ready to stream."""
    connector = connector or connector_for(source_config)
    writer = writer.for_source(source_config.name)  # fences a capture still writing for it
    report = BootstrapReport(source_config.name)
    observer.state(source_config.name, "snapshotting")
    started = time.monotonic()
    columns = source_config.column_policies()  # a missing hash key is refused first
    with connector.snapshot(codec) as snap:
        stored = writer.source_offsets().get(source_config.name)
        snap.stored = connector.load_offset(stored) if stored else None
        tables = snap.check()  # every refusal happens here, before anything changes
        _check_columns(columns, tables, codec)
        report.warnings = snap.warnings()
        for warning in report.warnings:
            console.print(f"[yellow]warning:[/] source {source_config.name}: {warning}",
                          highlight=False)
        previous = {table: live_keys(writer, schema.topic) for table, schema in tables.items()}
        dispatcher = Dispatcher(writer, codec, source_config.name,
                                max_records=config.log.commit_max_records, interval=1.0,
                                image_cache_bytes=0,  # snapshot rows are never partial
                                columns=columns)
        dispatcher.observer = observer
        if columns is not None:
            snap.use_column_rules(columns)
        for schema in tables.values():  # an empty table too: capture then knows it was
            dispatcher.ensure_topic(schema)  # bootstrapped (not new to the log)
        # committed first: a crash before the end leaves the source marked unfinished; the
        # snapshot's rows stay past the source's cut (unseen by followers) until it ends
        dispatcher.checkpoint(connector.bootstrapping_offset())
        dispatcher.flush()
        where = snap.open()
        console.print(f"source [bold]{source_config.name}[/]: {where}; snapshotting "
                      f"{len(tables)} table(s)", highlight=False)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      _RateColumn(), TimeRemainingColumn(), console=console,
                      transient=False) as progress:
            for table in tables:
                estimate = snap.estimate_rows(table)
                task = progress.add_task(str(table), total=estimate)

                def advance(n: int, task: TaskID = task, name: str = str(table),
                            estimate: int | None = estimate) -> None:
                    progress.update(task, completed=n)
                    observer.snapshot_progress(source_config.name, name, n, estimate)

                rows, vanished = _snapshot_table(snap, table, tables[table], dispatcher,
                                                 previous[table], advance)
                progress.update(task, total=rows, completed=rows)
                observer.snapshot_progress(source_config.name, str(table), rows, rows)
                report.rows[str(table)], report.vanished[str(table)] = rows, vanished
        resume = snap.resume_offset()
        report.resume = resume.describe()
        dispatcher.checkpoint(resume)
        dispatcher.flush()
    report.seconds = time.monotonic() - started
    return report


def _check_columns(columns: ColumnPolicies | None, tables: dict[TableId, TableSchema],
                   codec: EventCodec) -> None:
    """Refuse column rules that do not fit the tables, rules that would hide what the log
    already holds in clear (:mod:`cdc.columns`), and keys that differ from the log's, before
    the snapshot changes anything."""
    for table, schema in tables.items():
        policy = columns.get(table) if columns is not None else None
        logged = policy.schema(schema) if policy is not None else schema
        check_key(logged, [v.schema for v in codec.store.versions(f"{logged.topic}-value")])
    if columns is not None:
        columns.check_log(codec.store)


def _snapshot_table(snap: SnapshotSource, table: TableId, schema: TableSchema,
                    dispatcher: Dispatcher, previous: set[bytes],
                    progress: Callable[[int], None]) -> tuple[int, int]:
    """Snapshot one table; tombstone the keys the log had that the table no longer has."""
    rows = 0
    shown = 0
    for item in snap.rows(table):
        if isinstance(item, EncodedBatch):
            dispatcher.add_batch(item)
            for record in item.records:
                previous.discard(record.key)
            rows += item.events
        else:
            records = dispatcher.add(item)
            previous.discard(records[0].key)
            rows += 1
        if dispatcher.due():
            dispatcher.flush(wait=False)  # the last flush of the bootstrap waits
        if rows - shown >= 2000:
            progress(rows)
            shown = rows
    for key in sorted(previous):
        dispatcher.add_tombstone(schema, key, snap.vanished_position())
    progress(rows)
    return rows, len(previous)


# ---------------------------------------------------------------------------------- streaming

class NotBootstrapped(CdcError):
    """Capture cannot start: the source was never bootstrapped, or the bootstrap did not finish."""


class StreamRunner:
    """Streams one source into the log until ``stop`` is set; reconnects on its own."""

    def __init__(self, config: Config, source_config: SourceConfig, writer: ChangeLogWriter,
                 codec: EventCodec, stop: threading.Event,
                 connector: Connector | None = None,
                 observer: CaptureObserver = NO_OBSERVER) -> None:
        self.config = config
        self.source_config = source_config
        self.connector = connector or connector_for(source_config)
        self.name = source_config.name
        self.writer = writer = writer.for_source(self.name)  # fences an older writer first
        self.stop = stop
        self.dispatcher = Dispatcher(writer, codec, self.name,
                                     max_records=config.log.commit_max_records,
                                     max_bytes=config.log.commit_max_bytes,
                                     interval=config.log.commit_interval,
                                     image_cache_bytes=source_config.image_cache,
                                     columns=source_config.column_policies())
        self.observer = self.dispatcher.observer = observer
        #: incremental snapshots (``cdc snapshot``, tables new to the log), made by the first
        #: session that takes them (:meth:`_resume_snapshots`)
        self.snapshots: IncrementalSnapshots | None = None
        self._unavailable_base: int | None = None
        self.status = StatusFile(config.log_path, self.name)
        self.last_offset: SourceOffset | None = None
        self.last_error: str | None = None
        self.reconnects = 0

    def check_columns(self) -> None:
        """Refuse column rules that would hide what the log holds in clear (cdc/columns.py)."""
        if self.dispatcher.columns is not None:
            self.dispatcher.columns.check_log(self.dispatcher.codec.store)

    def checked(self) -> bool:
        """The refusals before streaming: bootstrapped, column rules that fit the log."""
        self.stored_offset()
        self.check_columns()
        return True

    def stored_offset(self) -> SourceOffset:
        data = self.writer.source_offsets().get(self.name)
        if not data:
            raise NotBootstrapped(f"source {self.name!r} has not been bootstrapped into the log "
                                  f"at {self.config.log_path}",
                                  f"run `cdc bootstrap --source {self.name}` first")
        offset = self.connector.load_offset(data)
        if not offset.streaming:
            raise NotBootstrapped(f"source {self.name!r}: its bootstrap did not finish (the "
                                  "snapshot was interrupted)",
                                  f"run `cdc bootstrap --source {self.name}` again; it starts "
                                  "over")
        return offset

    def run(self) -> None:
        delay = RETRY_FIRST_S
        retryable = self.connector.retryable() + (LogUnavailable,)
        while not self.stop.is_set():
            try:
                self._session()
                break
            except retryable as exc:
                self.dispatcher.discard()  # not durable, never confirmed: the server resends it
                self.reconnects += 1
                self.last_error = _first_line(exc)
                self.observer.error(self.name, exc.__class__.__name__)
                if self._streamed_recently:
                    delay = RETRY_FIRST_S  # it had been streaming: start the backoff over, once
                    self._streamed_recently = False
                log.warning("source %s: %s; %s in %.1f s", self.name, self.last_error,
                            "retrying the log" if isinstance(exc, LogUnavailable)
                            else "reconnecting", delay)
                self._status("reconnecting", force=True)
                self.stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        self._status("stopped", force=True)

    _streamed_recently = False

    def _resume_snapshots(self, stream: StreamingSource, offset: SourceOffset
                          ) -> Callable[[], None] | None:
        """Resume the source's incremental snapshots (cdc/incremental.py) from ``offset`` if
        ``stream`` takes them: the step to take between transactions. None (and no snapshots)
        if it does not."""
        if not isinstance(stream, IncrementalSnapshotSource):
            self.snapshots = None
            return None
        if self.snapshots is None:
            self.snapshots = self._new_snapshots()
        self.snapshots.resume({"snapshots": offset.snapshots})
        self._new_tables()
        return functools.partial(self._snapshot_step, stream, self.snapshots)

    def _new_snapshots(self) -> IncrementalSnapshots:
        """The source's incremental snapshots, made once: they outlive sessions."""
        source = self.source_config
        columns = self.dispatcher.columns
        observer, name = self.observer, self.name

        def hashed(schema: TableSchema) -> bool:  # its log keys cannot be looked up
            policy = columns.get(schema.table) if columns is not None else None
            return policy is not None and policy.transforms_key(schema.key)

        def progressed(table: str, progress: TableProgress) -> None:
            observer.snapshot_progress(name, table, progress.rows, progress.estimated)

        return IncrementalSnapshots(
            name, [TableId.parse(t) for t in source.tables],
            SnapshotQueue(self.config.log_path, name), None, source.snapshot_chunk_size,
            self.dispatcher.logged_key, lambda topic: live_keys(self.writer, topic),
            hashed, progressed, lambda event, table: observer.snapshot_event(name, event, table))

    def _session(self) -> None:
        offset = self.stored_offset()
        self.dispatcher.resync()
        if self._unavailable_base is None:
            self._unavailable_base = offset.unavailable_images
            self.last_offset = offset
        stream = self.connector.stream(offset, self.dispatcher.codec)
        try:
            snapshot_step = self._resume_snapshots(stream, offset)
            stream.use_previous_images(self.dispatcher.images.latest_value)
            if self.dispatcher.columns is not None:
                stream.use_column_rules(self.dispatcher.columns)
            log.info("source %s: streaming from %s", self.name, stream.describe())
            self._streamed_recently = False
            self._pump(stream, snapshot_step)
        finally:
            stream.close()

    def _new_tables(self) -> None:
        """Tables in ``tables`` the log has never seen get an incremental snapshot."""
        assert self.snapshots is not None
        known = {info.name for info in self.writer.topics()}
        new = [t for t in (TableId.parse(text) for text in self.source_config.tables)
               if topic_name(self.name, t) not in known and str(t) not in self.snapshots.running]
        if new:
            log.info("source %s: %s not in the log yet: snapshotting incrementally", self.name,
                     ", ".join(map(str, new)))
            self.snapshots.add(new, "new-tables")

    def _pump(self, stream: StreamingSource, snapshot_step: Callable[[], None] | None) -> None:
        dispatcher = self.dispatcher
        add, checkpoint_type, event_type = dispatcher.add, Checkpoint, ChangeEvent
        heartbeat_at = time.monotonic()
        interval = self.source_config.heartbeat_interval
        snapshots = self.snapshots
        for item in stream.items(idle_timeout=min(self.config.log.commit_interval, 0.2)
                                 or 0.05):
            kind = item.__class__
            if kind is event_type:
                if snapshots is not None and snapshots.watching:
                    snapshots.saw(item)  # type: ignore[arg-type]
                add(item)  # type: ignore[arg-type]
            elif kind is checkpoint_type:
                dispatcher.checkpoint(
                    self._counted(item.offset))  # type: ignore[union-attr,arg-type]
                if snapshot_step is not None:
                    snapshot_step()
            elif kind is EncodedBatch:
                batch: EncodedBatch = item  # type: ignore[assignment]
                if snapshots is not None and snapshots.watching:
                    snapshots.saw(batch)
                if batch.offset is not None:
                    batch.offset = self._counted(batch.offset)
                dispatcher.add_batch(batch)
            elif kind is Watermark and snapshots is not None:
                snapshots.reached(item, add,  # type: ignore[arg-type]
                                  dispatcher.add_tombstone, dispatcher.add_batch)
            if item is None and snapshot_step is not None:
                snapshot_step()
            if item is None:
                self._flush(stream)
                self.observer.idle(self.name)
            elif dispatcher.due():
                self._flush(stream, wait=False)  # its fsyncs overlap the next batch
            if self.stop.is_set():
                break
            if interval and time.monotonic() - heartbeat_at >= interval:
                stream.heartbeat()
                heartbeat_at = time.monotonic()
        self._flush(stream)

    def _snapshot_step(self, stream: IncrementalSnapshotSource,
                       snapshots: IncrementalSnapshots) -> None:
        """Between transactions: take new requests, open the next snapshot window. A refusal
        stops that table's snapshot alone; a lost connection reconnects as usual."""
        snapshots.poll()
        retryable: tuple[type[BaseException], ...] = (*self.connector.retryable(),
                                                       LogUnavailable)
        try:
            snapshots.step(stream)
        except retryable:
            raise
        except CdcError as exc:
            snapshots.fail(exc)

    def _counted(self, offset: SourceOffset) -> SourceOffset:
        """``offset`` with the count of changes whose images could not be completed, and the
        incremental snapshots' progress."""
        if self.snapshots is not None and self.snapshots.tracking:
            offset = offset.replace(snapshots=self.snapshots.progress())
        unavailable = self.dispatcher.stats.unavailable
        if not unavailable:
            return offset  # it carries the stored count already
        return offset.replace(unavailable_images=(self._unavailable_base or 0) + unavailable)

    def _flush(self, stream: StreamingSource, wait: bool = True) -> None:
        committed = self.dispatcher.flush(wait)
        if committed is not None:
            self.last_offset = committed
            stream.confirm(committed)  # only now: the log holds everything up to it
            self._streamed_recently = True
            self.observer.durable(self.name, committed)
            if self.snapshots is not None:
                self.snapshots.durable(committed.snapshots)
        self._status("streaming")

    def _status(self, state: str, force: bool = False) -> None:
        self.observer.state(self.name, state,
                            self.last_error or "" if state == "reconnecting" else "")
        last = self.last_offset
        self.status.update(state, self.dispatcher.stats.events, force=force,
                           last_position=last.describe() if last else None,
                           last_lsn=last.describe() if last else None,
                           reconnects=self.reconnects,
                           last_error=self.last_error, records=self.dispatcher.stats.records,
                           unavailable_images=self.dispatcher.stats.unavailable)


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "problem", None) or str(exc) or exc.__class__.__name__
    return str(text).strip().splitlines()[0]


def stopped_before_streaming() -> None:
    """Say that a SIGTERM came before any source streamed (nothing was started)."""
    log.info("stopped before streaming started")


def run_capture(config: Config, sources: Sequence[SourceConfig], writer: ChangeLogWriter,
                codec: EventCodec, stop: threading.Event,
                observer: CaptureObserver = NO_OBSERVER) -> None:
    """Stream every source (one thread each) until ``stop``; re-raise the first fatal error.

    If ``stop`` is already set (a SIGTERM during start-up), nothing is started or checked.
    """
    if stop.is_set():
        stopped_before_streaming()
        return
    runners = [StreamRunner(config, source, writer, codec, stop, observer=observer)
               for source in sources]
    for runner in runners:  # refuse before starting anything (waiting out a log outage)
        if when_log_answers(f"source {runner.name}", runner.checked, stop) is None:
            stopped_before_streaming()
            return
    errors: list[BaseException] = []

    def target(runner: StreamRunner) -> None:
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            observer.error(runner.name, exc.__class__.__name__)
            errors.append(exc)
            stop.set()

    long_lived_heap()  # capture's per-change garbage: cdc/heap.py
    threads = [threading.Thread(target=target, args=(r,), name=f"capture-{r.name}", daemon=True)
               for r in runners]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        for thread in threads:
            thread.join(timeout=0.2)
    if errors:
        raise errors[0]
