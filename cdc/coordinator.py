"""The coordinator: runs a source's *snapshot* (``cdc bootstrap``) and then its *stream*
(``cdc capture``), both emitting through one :class:`~cdc.pipeline.Dispatcher` into the log.

The source offset stored in the log is the whole truth about where a source stands:

* ``{"state": "bootstrapping", ...}`` is committed *before* a snapshot starts. A crash leaves it
  there; capture refuses to stream from it and ``cdc bootstrap`` starts over with a new slot.
* ``{"state": "streaming", "lsn": L, ...}`` is committed with the last snapshot row, then with
  every flush of streamed changes. Streaming resumes *after* ``L``: every transaction whose
  commit LSN is below ``L`` is already in the log.

The server's slot is told an LSN (``confirm``) only after the log committed it, so the slot never
runs ahead of the log: SIGKILL at any instant loses nothing, and whatever is delivered twice
carries the same position as its first copy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
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
from cdc.config import Config, SourceConfig
from cdc.errors import CdcError, ConfigError
from cdc.events import ChangeEvent, TableId
from cdc.log.local import LocalChangeLog
from cdc.log.schemas import SchemaStore
from cdc.pipeline import TABLE_KEY, Dispatcher
from cdc.position import Position, format_lsn
from cdc.status import StatusFile

log = logging.getLogger("cdc.capture")

def open_log(config: Config) -> tuple[LocalChangeLog, EventCodec]:
    """The log writer for ``config`` and a codec registering schemas beside it."""
    writer = LocalChangeLog(config.log_path, partitions=config.log.partitions,
                            segment_bytes=config.log.segment_bytes, fsync=config.log.fsync)
    try:
        codec = EventCodec(SchemaStore(config.log_path, writable=True))
    except BaseException:
        writer.close()
        raise
    return writer, codec


def postgres_sources(config: Config, names: Iterable[str] = ()) -> list[SourceConfig]:
    """The sources to run: those named, or all of them; only kinds that can be captured."""
    chosen = [config.source(name) for name in names] if names else list(config.sources)
    if not chosen:
        raise ConfigError("the config lists no sources", "add one under `sources:`")
    for source in chosen:
        if source.kind != "postgres":
            raise ConfigError(f"source {source.name!r}: capture from {source.kind} is not "
                              "implemented yet", "capture PostgreSQL sources only for now")
    return chosen


# ---------------------------------------------------------------------------------- bootstrap

@dataclass
class BootstrapReport:
    source: str
    consistent_lsn: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    vanished: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed else "", style="cyan")


def live_keys(writer: LocalChangeLog, topic: str) -> set[bytes]:
    """The keys whose latest record in ``topic`` is not a tombstone."""
    live: set[bytes] = set()
    if topic not in {t.name for t in writer.topics()}:
        return live
    for partition in range(writer.topic(topic).partitions):
        for record in writer.iter_partition(topic, partition):
            if record.key == TABLE_KEY:
                continue
            if record.value is None:
                live.discard(record.key)
            else:
                live.add(record.key)
    return live


def bootstrap(config: Config, source_config: SourceConfig, writer: LocalChangeLog,
              codec: EventCodec, console: Console) -> BootstrapReport:
    """Snapshot every table of one source into the log; leave it ready to stream."""
    from connectors.postgres.snapshot import SnapshotSession
    from connectors.postgres.source import PostgresSource

    report = BootstrapReport(source_config.name)
    started = time.monotonic()
    with SnapshotSession(PostgresSource(source_config)) as snap:
        tables = snap.check()  # every refusal happens here, before anything changes
        previous = {table: live_keys(writer, captured.schema.topic)
                    for table, captured in tables.items()}
        writer.append([], {source_config.name: {
            "state": "bootstrapping", "slot": source_config.slot_name,
            "started_ms": int(time.time() * 1000)}})
        snap.open()
        report.consistent_lsn = snap.consistent_lsn
        console.print(f"source [bold]{source_config.name}[/]: slot {source_config.slot_name} "
                      f"created at {format_lsn(snap.consistent_lsn)}; snapshotting "
                      f"{len(tables)} table(s)", highlight=False)
        dispatcher = Dispatcher(writer, codec, source_config.name,
                                max_records=config.log.commit_max_records, interval=1.0,
                                image_cache_bytes=0)  # snapshot rows are never partial
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      _RateColumn(), TimeRemainingColumn(), console=console,
                      transient=False) as progress:
            for table in tables:
                task = progress.add_task(str(table), total=snap.estimate_rows(table))

                def advance(n: int, task: TaskID = task) -> None:
                    progress.update(task, completed=n)

                rows, vanished = _snapshot_table(snap, table, dispatcher, previous[table],
                                                 advance)
                progress.update(task, total=rows, completed=rows)
                report.rows[str(table)], report.vanished[str(table)] = rows, vanished
        dispatcher.checkpoint(snap.resume_offset())
        dispatcher.flush()
    report.seconds = time.monotonic() - started
    return report


def _snapshot_table(snap: Any, table: TableId, dispatcher: Dispatcher, previous: set[bytes],
                    progress: Callable[[int], None]) -> tuple[int, int]:
    """Snapshot one table; tombstone the keys the log had that the table no longer has."""
    rows = 0
    for event in snap.rows(table):
        records = dispatcher.add(event)
        previous.discard(records[0].key)
        rows += 1
        if dispatcher.due():
            dispatcher.flush(wait=False)  # the last flush of the bootstrap waits
        if rows % 2000 == 0:
            progress(rows)
    schema = snap.tables[table].schema
    for key in sorted(previous):
        position = Position.postgres(snap.consistent_lsn, snap.next_row_number(), snapshot=True)
        dispatcher.add_tombstone(schema, key, position)
    progress(rows)
    return rows, len(previous)


# ---------------------------------------------------------------------------------- streaming

def _retryable() -> tuple[type[BaseException], ...]:
    from connectors.postgres.connection import SourceUnavailable
    from connectors.postgres.replication import ReplicationError

    return (SourceUnavailable, ReplicationError, psycopg.OperationalError,
            psycopg.InterfaceError)


class NotBootstrapped(CdcError):
    """Capture cannot start: the source was never bootstrapped, or the bootstrap did not finish."""


class StreamRunner:
    """Streams one source into the log until ``stop`` is set; reconnects on its own."""

    def __init__(self, config: Config, source_config: SourceConfig, writer: LocalChangeLog,
                 codec: EventCodec, stop: threading.Event) -> None:
        self.config = config
        self.source_config = source_config
        self.name = source_config.name
        self.writer = writer
        self.stop = stop
        self.dispatcher = Dispatcher(writer, codec, self.name,
                                     max_records=config.log.commit_max_records,
                                     interval=config.log.commit_interval,
                                     image_cache_bytes=source_config.image_cache)
        self._unavailable_base: int | None = None
        self.status = StatusFile(config.log_path, self.name)
        self.last_lsn = 0
        self.last_error: str | None = None
        self.reconnects = 0

    def stored_offset(self) -> dict[str, Any]:
        offset = self.writer.source_offsets().get(self.name)
        if not offset:
            raise NotBootstrapped(f"source {self.name!r} has not been bootstrapped into the log "
                                  f"at {self.config.log_path}",
                                  f"run `cdc bootstrap --source {self.name}` first")
        if offset.get("state") != "streaming":
            raise NotBootstrapped(f"source {self.name!r}: its bootstrap did not finish (the "
                                  "snapshot was interrupted)",
                                  f"run `cdc bootstrap --source {self.name}` again; it starts "
                                  "over with a new slot")
        return dict(offset)

    def run(self) -> None:
        delay = 0.2
        while not self.stop.is_set():
            try:
                self._session()
                break
            except _retryable() as exc:
                self.dispatcher.discard()  # not durable, never confirmed: the server resends it
                self.reconnects += 1
                self.last_error = _first_line(exc)
                if self._streamed_recently:
                    delay = 0.2
                log.warning("source %s: %s; reconnecting in %.1f s", self.name,
                            self.last_error, delay)
                self._status("reconnecting", force=True)
                self.stop.wait(delay)
                delay = min(delay * 2, 10.0)
        self._status("stopped", force=True)

    _streamed_recently = False

    def _session(self) -> None:
        from connectors.postgres.source import Checkpoint, PostgresSource

        offset = self.stored_offset()
        if self._unavailable_base is None:
            self._unavailable_base = int(offset.get("unavailable_images", 0))
        source = PostgresSource(self.source_config)
        stream = source.stream(int(offset["lsn"]), status_interval=5.0)
        try:
            self._check_slot(stream.catalog_conn, int(offset["lsn"]))
            log.info("source %s: streaming from %s", self.name, format_lsn(int(offset["lsn"])))
            self._streamed_recently = False
            heartbeat_at = time.monotonic()
            for item in stream.events(idle_timeout=min(self.config.log.commit_interval, 0.2)
                                      or 0.05):
                if isinstance(item, ChangeEvent):
                    self.dispatcher.add(item)
                elif isinstance(item, Checkpoint):
                    offset = {**offset, "lsn": item.lsn, "lsn_text": format_lsn(item.lsn),
                              "unavailable_images": self._unavailable_base
                              + self.dispatcher.stats.unavailable}
                    self.dispatcher.checkpoint(offset)
                if item is None:
                    self._flush(stream)
                elif self.dispatcher.due():
                    self._flush(stream, wait=False)  # its fsyncs overlap the next batch
                if self.stop.is_set():
                    break
                heartbeat_at = self._heartbeat(stream, heartbeat_at)
            self._flush(stream)
        finally:
            _close(stream)

    def _flush(self, stream: Any, wait: bool = True) -> None:
        committed = self.dispatcher.flush(wait)
        if committed is not None:
            self.last_lsn = int(committed["lsn"])
            stream.confirm(self.last_lsn)  # only now: the log holds everything up to it
            self._streamed_recently = True
        self._status("streaming")

    def _heartbeat(self, stream: Any, last: float) -> float:
        interval = self.source_config.heartbeat_interval
        if not interval or time.monotonic() - last < interval:
            return last
        from connectors.postgres.source import HEARTBEAT_PREFIX

        stream.catalog_conn.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                                    (HEARTBEAT_PREFIX, str(int(time.time() * 1000))))
        return time.monotonic()

    def _check_slot(self, conn: psycopg.Connection[Any], stored_lsn: int) -> None:
        from connectors.postgres import catalog
        from connectors.postgres.connection import SourceError

        slot = self.source_config.slot_name
        info = catalog.slot_info(conn, slot)
        again = f"run `cdc bootstrap --source {self.name}` again: it re-snapshots the tables " \
                "and tombstones keys deleted meanwhile"
        if info is None:
            raise SourceError(f"source {self.name!r}: replication slot {slot!r} no longer exists "
                              "(dropped while capture was stopped?), so changes made since "
                              "are gone from the WAL", again)
        if info.plugin != "pgoutput":
            raise SourceError(f"source {self.name!r}: slot {slot!r} uses plugin {info.plugin!r}, "
                              "not pgoutput", f"drop it, then {again}")
        if info.wal_status == "lost":
            raise SourceError(f"source {self.name!r}: slot {slot!r} lost WAL it needed "
                              "(max_slot_wal_keep_size exceeded)", again)
        if info.confirmed_flush_lsn is not None and info.confirmed_flush_lsn > stored_lsn:
            raise SourceError(
                f"source {self.name!r}: slot {slot!r} was advanced to "
                f"{format_lsn(info.confirmed_flush_lsn)} past the log's {format_lsn(stored_lsn)} "
                "by another consumer, so changes in between are lost", again)

    def _status(self, state: str, force: bool = False) -> None:
        self.status.update(state, self.dispatcher.stats.events, force=force,
                           last_lsn=format_lsn(self.last_lsn), reconnects=self.reconnects,
                           last_error=self.last_error, records=self.dispatcher.stats.records,
                           unavailable_images=self.dispatcher.stats.unavailable)


def _close(stream: Any, timeout: float = 5.0) -> None:
    """Close the replication connection, wait (up to ``timeout`` s) until the server's walsender
    has let go of the slot, then close the rest.

    The walsender notices the closed socket asynchronously; without the wait, a capture that
    exited 0 could still show its slot ``active`` for a moment, and a capture restarted at once
    would be refused with "replication slot ... is active for PID ...". Before that, the
    stream is ended with ``CopyDone`` so the last confirmation is read, not reset away.
    """
    try:
        walsender = stream.replication_conn.info.backend_pid
        with contextlib.suppress(CdcError, psycopg.Error, OSError):
            if not stream.stream.finish(timeout / 2):
                log.info("the server did not end the stream within %.1f s; closing it", timeout / 2)
        stream.replication_conn.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and stream.catalog_conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE active_pid = %s",
                (walsender,)).fetchone():
            time.sleep(0.02)
    except (psycopg.Error, OSError) as exc:  # a broken connection: nothing to wait for
        log.debug("closing the stream: %s", exc)
    finally:
        stream.close()


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "problem", None) or str(exc) or exc.__class__.__name__
    return str(text).strip().splitlines()[0]


def run_capture(config: Config, sources: list[SourceConfig], writer: LocalChangeLog,
                codec: EventCodec, stop: threading.Event) -> None:
    """Stream every source (one thread each) until ``stop``; re-raise the first fatal error.

    If ``stop`` is already set (a SIGTERM during start-up), nothing is started or checked.
    """
    if stop.is_set():
        log.info("stopped before streaming started")
        return
    runners = [StreamRunner(config, source, writer, codec, stop) for source in sources]
    for runner in runners:
        runner.stored_offset()  # refuse before starting anything
    errors: list[BaseException] = []

    def target(runner: StreamRunner) -> None:
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=target, args=(r,), name=f"capture-{r.name}", daemon=True)
               for r in runners]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        for thread in threads:
            thread.join(timeout=0.2)
    if errors:
        raise errors[0]
