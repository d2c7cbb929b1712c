"""Incremental snapshots: snapshot tables while capture keeps streaming (``cdc snapshot``, or a
table newly added to a source's ``tables``), without a lock and without a new slot — the
watermark algorithm of Netflix's DBLog, which Debezium and Flink CDC also use.

**Requests.** ``cdc snapshot`` writes a request file under ``<log path>/snapshots/<source>/``
(:class:`SnapshotQueue`; the log path holds the daemons' status files on every backend). The
capture daemon, which owns the log, picks it up within a second and records the table in the
source offset's ``snapshots`` (:class:`TableProgress`); the request file is removed once a
durable offset holds the request's tables. A finished table stays there (phase ``done``) until
it is snapshotted again. With no daemon running, the request waits in the queue.

**Chunks.** Table by table, in primary-key order, ``chunk_size`` rows at a time, in the capture
thread (:meth:`IncrementalSnapshots.step`):

1. a *low* watermark is written into the source's own log (PostgreSQL:
   ``pg_logical_emit_message``), committed on its own;
2. the chunk is read: the rows whose key is above the previous chunk's last key, committed now;
3. a *high* watermark is written the same way.

The stream yields both watermarks back in commit order (:class:`~cdc.source.Watermark`). Between
them, every streamed change of the table drops its key(s) from the chunk — the stream's copy is
as new as the chunk's or newer — and a TRUNCATE drops the whole chunk. At the high watermark the
remaining rows are logged as op ``r`` at the high watermark's positions: after every change
committed before the chunk was read, before every change committed after it. Changes streamed
*before* the low watermark never drop keys: the chunk, read later, already holds them.

**Resume.** The chunk's last key and the row count are stored in the source offset with the
checkpoint that follows the high watermark, in the same commit as the chunk's rows. After a
SIGKILL capture resumes from the stored offset: the replayed watermarks of a window whose chunk
is not in memory are ignored, and that chunk is read again.

**Sweep.** After the last chunk, the keys the log holds live for the table but the table no
longer has — deletes the log never saw (a lost slot, a table dropped from the publication for a
while) — get tombstones, found in windows of the same kind: ``chunk_size`` of the log's live keys
at a time (in key-bytes order) are looked up in the table between two watermarks; those absent
and not changed inside the window are tombstoned at the high watermark's positions. A table
whose key the source's column rules transform (a hashed key) cannot be looked up by its log
keys and skips the sweep.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.events import ChangeEvent, Op, TableId, TableSchema, topic_name
from cdc.log.base import Record
from cdc.source import EncodedBatch, IncrementalSnapshotSource, Watermark

log = logging.getLogger("cdc.snapshot")

#: the prefix of the watermark messages in the source's log
PREFIX = "cdc.snapshot"
#: how often the daemon looks for new requests (seconds)
POLL_INTERVAL = 1.0


class SnapshotRequestError(CdcError):
    """A snapshot request that cannot be taken (a table not captured, one already running)."""


# ------------------------------------------------------------------------------- requests

class SnapshotQueue:
    """Snapshot requests of one source waiting for its capture daemon: one JSON file each."""

    def __init__(self, log_path: Path, source: str) -> None:
        self.directory = Path(log_path) / "snapshots" / source

    def submit(self, tables: Sequence[str]) -> str:
        """Queue a request for ``tables``; its id."""
        request = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".{request}.tmp"
        temporary.write_text(json.dumps({"id": request, "tables": list(tables),
                                         "requested_ms": int(time.time() * 1000)}))
        os.replace(temporary, self.directory / f"{request}.json")
        return request

    def pending(self) -> list[dict[str, Any]]:
        """Every queued request, oldest first (unreadable files are skipped and logged)."""
        if not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("snapshot request %s is unreadable (%s): skipped", path.name, exc)
        return out

    def remove(self, request: str) -> None:
        (self.directory / f"{request}.json").unlink(missing_ok=True)


# ------------------------------------------------------------------------------- progress

@dataclass
class TableProgress:
    """One table's incremental snapshot, as the source offset stores it."""

    request: str
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: ``chunks``, then ``sweep``, then ``done`` (or ``failed``, with ``error``)
    phase: str = "chunks"
    #: the key texts of the last logged chunk's last row (None: none yet)
    after: list[str] | None = None
    #: the last log key (as text) the sweep has decided
    swept: str | None = None
    rows: int = 0
    tombstones: int = 0
    chunks: int = 0
    estimated: int | None = None
    finished_ms: int | None = None
    error: str | None = None

    @property
    def active(self) -> bool:
        return self.phase not in ("done", "failed")

    def dump(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if value is not None}

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> TableProgress:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def progress_of(stored: Mapping[str, Any] | None) -> dict[str, TableProgress]:
    """The per-table progress held by a stored source offset's ``snapshots``."""
    return {table: TableProgress.load(data)
            for table, data in ((stored or {}).get("snapshots") or {}).items()}


# ------------------------------------------------------------------------------- the engine

@dataclass
class _Window:
    """A chunk (or sweep batch) between its watermarks, held until the high one is seen."""

    id: str
    table: TableId
    kind: str  # "chunk" or "sweep"
    schema: TableSchema | None
    #: chunk: logged key bytes -> the row's event or record; sweep: the absent keys (values
    #: unused)
    held: dict[bytes, ChangeEvent | Record | None]
    #: chunk: the last row's key texts (None: the table is done); sweep: the last key decided
    last: Any
    low_seen: bool = False
    #: the sweep's key range end was reached (this is its last window)
    final: bool = False


class IncrementalSnapshots:
    """The incremental snapshots of one source, run by its capture thread (module doc).

    The runner calls :meth:`poll` and :meth:`step` between transactions and when idle, shows
    every streamed item to :meth:`saw` while a window is open, hands each
    :class:`~cdc.source.Watermark` to :meth:`reached`, stores :meth:`progress` with every
    checkpoint (:attr:`tracking`) and calls :meth:`durable` after each commit."""

    def __init__(self, source: str, tables: Sequence[TableId], queue: SnapshotQueue,
                 stored: Mapping[str, Any] | None, chunk_size: int,
                 key_bytes: Callable[[ChangeEvent], bytes],
                 live_keys: Callable[[str], set[bytes]],
                 hashed_key: Callable[[TableSchema], bool] = lambda schema: False,
                 on_progress: Callable[[str, TableProgress], None] | None = None,
                 on_event: Callable[[str, str], None] | None = None) -> None:
        self.source = source
        self.tables = set(tables)
        self.queue = queue
        self.chunk_size = chunk_size
        self.key_bytes = key_bytes
        self.live_keys = live_keys
        self.hashed_key = hashed_key
        self.on_progress = on_progress
        #: told ``(event, table)`` as Debezium notifies: ``started``, ``table_done``,
        #: ``failed`` (a table), ``completed`` (no table left running; table ``""``)
        self.on_event = on_event or (lambda event, table: None)
        self._windows = 0
        self.resume(stored)

    def resume(self, stored: Mapping[str, Any] | None) -> None:
        """Start over from a stored offset's progress (a new stream session: whatever was not
        durable is done again)."""
        #: per table (running or done), its progress
        self.running: dict[str, TableProgress] = progress_of(stored)
        #: whether checkpoints must carry :meth:`progress`
        self.tracking = bool(self.running)
        self.window: _Window | None = None
        self._polled = 0.0
        #: accepted requests -> the tables they started (files go once those are durable)
        self._accepted: dict[str, list[str]] = {}
        #: the sweep's candidate keys per table (read from the log when the sweep starts)
        self._candidates: dict[str, list[bytes]] = {}
        #: per table, how many of its candidates the sweep's windows took so far
        self._cursor: dict[str, int] = {}
        #: keys the stream changed since the sweep read its candidates
        self._touched: dict[str, set[bytes]] = {}

    @property
    def active(self) -> bool:
        return any(p.active for p in self.running.values())

    # -- requests ----------------------------------------------------------------------------
    def add(self, tables: Iterable[TableId], request: str) -> list[str]:
        """Start snapshots of ``tables`` (those already running are left as they are); the
        names started."""
        started = []
        for table in tables:
            name = str(table)
            if name in self.running and self.running[name].active:
                continue
            if table not in self.tables:
                log.warning("source %s: snapshot request %s names %s, which this source does "
                            "not capture: skipped", self.source, request, name)
                continue
            self.running[name] = TableProgress(request)
            self.tracking = True
            started.append(name)
            log.info("source %s: incremental snapshot of %s started (request %s)",
                     self.source, name, request)
            self.on_event("started", name)
        return started

    def poll(self, force: bool = False) -> None:
        """Take the queued requests (at most once per :data:`POLL_INTERVAL`)."""
        now = time.monotonic()
        if not force and now - self._polled < POLL_INTERVAL:
            return
        self._polled = now
        for request in self.queue.pending():
            identifier = str(request.get("id"))
            if identifier in self._accepted:
                continue
            tables = []
            for text in request.get("tables", []):
                try:
                    tables.append(TableId.parse(str(text)))
                except CdcError:
                    log.warning("snapshot request %s: %r is not a table name", identifier, text)
            self._accepted[identifier] = self.add(tables, identifier)

    def progress(self) -> dict[str, Any]:
        """The ``snapshots`` of the next checkpoint's offset."""
        return {name: p.dump() for name, p in self.running.items()}

    def durable(self, snapshots: Mapping[str, Any]) -> None:
        """``snapshots`` (of an offset now durable) holds what it holds: the files of requests
        whose tables it records under their id can go."""
        for identifier, tables in list(self._accepted.items()):
            if all((snapshots.get(t) or {}).get("request") == identifier for t in tables):
                self.queue.remove(identifier)
                del self._accepted[identifier]

    # -- windows -----------------------------------------------------------------------------
    def step(self, stream: IncrementalSnapshotSource) -> None:
        """Open the next window if none is open and work is left (module doc, steps 1-3)."""
        if self.window is not None:
            return
        name, progress = next(((n, p) for n, p in self.running.items() if p.active),
                              ("", None))
        if progress is None:
            return
        table = TableId.parse(name)
        if table not in self.tables:
            self.fail(CdcError(f"{name} is no longer in the source's tables",
                               "add it back and run `cdc snapshot` again, or leave it out"))
            return
        self._windows += 1
        identifier = f"{progress.request}:{self._windows}:{uuid.uuid4().hex[:6]}"
        stream.watermark(json.dumps({"window": identifier, "mark": "low"}))
        if progress.phase == "chunks":
            if progress.estimated is None:
                progress.estimated = stream.estimate_rows(table)
            schema, rows, last = stream.chunk(table, progress.after, self.chunk_size)
            held: dict[bytes, ChangeEvent | Record | None] = {
                row.key if isinstance(row, Record) else self.key_bytes(row): row
                for row in rows}
            window = _Window(identifier, table, "chunk", schema, held, last)
        else:
            window = self._sweep_window(stream, identifier, table, progress)
        stream.watermark(json.dumps({"window": identifier, "mark": "high"}))
        self.window = window

    def fail(self, error: CdcError) -> None:
        """The table being worked on cannot be snapshotted (a refusal, not a lost
        connection): it stops with the error; capture and the other tables go on."""
        self.window = None
        name, progress = next(((n, p) for n, p in self.running.items() if p.active),
                              ("", None))
        if progress is None:
            return
        progress.phase, progress.finished_ms = "failed", int(time.time() * 1000)
        progress.error = error.problem + (f" (fix: {error.fix})" if error.fix else "")
        self._candidates.pop(name, None)
        self._cursor.pop(name, None)
        log.error("source %s: incremental snapshot of %s failed: %s", self.source, name,
                  progress.error)
        self.on_event("failed", name)
        self._completed()

    def _sweep_window(self, stream: IncrementalSnapshotSource, identifier: str, table: TableId,
                      progress: TableProgress) -> _Window:
        name = str(table)
        schema = stream.schema_of(table)
        candidates = self._candidates.get(name)
        if candidates is None:
            if self.hashed_key(schema):
                candidates = []
            else:
                topic = topic_name(self.source, table)
                candidates = sorted(k for k in self.live_keys(topic)
                                    if progress.swept is None or k.decode() > progress.swept)
            self._candidates[name] = candidates
        start = self._cursor.get(name, 0)  # the candidates before it were decided
        keys = candidates[start:start + self.chunk_size]
        self._cursor[name] = start + len(keys)
        final = start + len(keys) >= len(candidates)
        touched = self._touched.pop(name, set()) if final else self._touched.get(name, set())
        batch = [k for k in keys if k not in touched]
        absent = set(stream.absent(table, batch)) if batch else set()
        return _Window(identifier, table, "sweep", schema, dict.fromkeys(absent),
                       keys[-1].decode() if keys else progress.swept, final=final)

    @property
    def watching(self) -> bool:
        """Whether streamed items must be shown to :meth:`saw` (a window is open, or a sweep
        runs: a key the stream changes during a sweep is the stream's to decide)."""
        return self.window is not None or bool(self._candidates)

    def saw(self, item: ChangeEvent | EncodedBatch) -> None:
        """A streamed item passed: inside an open window its keys leave the window; during a
        sweep they also leave the sweep's candidates."""
        if isinstance(item, EncodedBatch):
            tables = {s.table for s in item.schemas}
            for table in tables:
                topic = topic_name(self.source, table)
                self._drop(table, [r.key for r in item.records if r.topic == topic],
                           truncate=False)
            return
        table = item.schema.table
        if item.op is Op.TRUNCATE:
            self._drop(table, [], truncate=True)
            return
        keys = [self.key_bytes(item)]
        if item.replaces is not None:
            keys.append(self.key_bytes(item.replaces))
        self._drop(table, keys, truncate=False)

    def _drop(self, table: TableId, keys: Sequence[bytes], truncate: bool) -> None:
        window = self.window
        if window is not None and window.low_seen and window.table == table:
            if truncate:
                window.held.clear()
            for key in keys:
                window.held.pop(key, None)
        candidates = self._candidates.get(str(table))
        if candidates:
            if truncate:
                candidates.clear()  # the TRUNCATE tombstoned every key already
            else:
                self._touched.setdefault(str(table), set()).update(keys)

    def reached(self, mark: Watermark, add: Callable[[ChangeEvent], Any],
                tombstone: Callable[[TableSchema, bytes, Any], None],
                add_batch: Callable[[EncodedBatch], None]) -> None:
        """The stream passed a watermark: open the window (low) or log what it holds and
        advance the table's progress (high). Watermarks of other windows are ignored. The
        rows a chunk holds as events go to ``add``, those it holds as records to
        ``add_batch`` (as snapshot rows, no transaction), in the order of their positions."""
        window = self.window
        try:
            data = json.loads(mark.payload)
        except ValueError:
            return
        if window is None or data.get("window") != window.id:
            return  # a replayed window whose chunk is gone, or another daemon's
        if data.get("mark") == "low":
            window.low_seen = True
            return
        if not window.low_seen:
            return
        self.window = None
        progress = self.running.get(str(window.table))
        if progress is None:
            return
        ordinal = 0
        if window.kind == "chunk":
            assert window.schema is not None
            schemas, records = (window.schema,), []
            for row in window.held.values():
                assert row is not None
                ordinal += 1
                if isinstance(row, Record):
                    records.append(Record(row.topic, row.key, row.value,
                                          mark.position(ordinal).to_bytes()))
                    continue
                if records:
                    add_batch(EncodedBatch(records, schemas, len(records)))
                    records = []
                row.position = mark.position(ordinal)
                add(row)
            if records:
                add_batch(EncodedBatch(records, schemas, len(records)))
            progress.rows += len(window.held)
            progress.chunks += 1
            if window.last is None:
                progress.phase = "sweep"
            else:
                progress.after = list(window.last)
        else:
            for key in sorted(window.held):
                ordinal += 1
                assert window.schema is not None
                tombstone(window.schema, key, mark.position(ordinal))
            progress.tombstones += len(window.held)
            progress.swept = window.last
            if window.final:
                self._finish(str(window.table), progress)
        if self.on_progress is not None:
            self.on_progress(str(window.table), progress)

    def _finish(self, name: str, progress: TableProgress) -> None:
        progress.phase, progress.finished_ms = "done", int(time.time() * 1000)
        self._candidates.pop(name, None)
        self._cursor.pop(name, None)
        seconds = max(time.time() - progress.started_ms / 1000, 1e-9)
        log.info("source %s: incremental snapshot of %s done: %d rows in %d chunks, %d keys "
                 "tombstoned, %.1f s (%.0f rows/s)", self.source, name, progress.rows,
                 progress.chunks, progress.tombstones, seconds, progress.rows / seconds)
        self.on_event("table_done", name)
        self._completed()

    def _completed(self) -> None:
        if not self.active:
            failed = sorted(n for n, p in self.running.items() if p.phase == "failed")
            log.info("source %s: incremental snapshots completed%s", self.source,
                     f" ({', '.join(failed)} failed)" if failed else "")
            self.on_event("completed", "")


def describe_progress(progress: TableProgress) -> dict[str, Any]:
    """One table's snapshot for ``cdc status``: rows, rate and ETA."""
    now_ms = (progress.finished_ms or int(time.time() * 1000))
    seconds = max((now_ms - progress.started_ms) / 1000, 1e-3)
    rate = progress.rows / seconds
    left = None
    if progress.active and progress.estimated and rate > 0:
        left = max(progress.estimated - progress.rows, 0) / rate
    return {"request": progress.request, "phase": progress.phase, "rows": progress.rows,
            "estimated": progress.estimated, "chunks": progress.chunks,
            "tombstones": progress.tombstones, "rows_per_s": round(rate, 1),
            "eta_s": None if left is None else round(left, 1), "error": progress.error}
