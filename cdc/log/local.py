"""The local change log: segment files on disk plus one atomically replaced commit file.

Layout of a log directory::

    LOCK                      held (flock) by the one writer; holds its pid
    state.json                the committed state — the single commit point
    schemas.jsonl             the schema store (see cdc/log/schemas.py)
    topics/<topic>/<p>/<base>-<gen>.seg   segment files (format: cdc/log/segment.py)

**Commit protocol.** ``append`` writes each touched partition's records to the end of its active
segment, fdatasyncs those files, then writes the new ``state.json`` (per partition: next offset,
active segment, committed byte length; plus the source offsets) to a temporary file, fsyncs it and
renames it over the old one, and fsyncs the directory. The rename is the commit: records and
source offsets become visible and durable together. A crash before it leaves bytes past the
committed length, which readers never look at and the next writer truncates away; a crash after it
loses nothing.

**Readers** read ``state.json`` (re-reading it when it changes) and never look past a partition's
committed next offset, nor past the committed byte length of an active segment that has not been
rewritten. Compaction rewrites only segments that were already closed, into a new generation
file, so a reader holding an old state still reads consistent bytes. It may work from a newer
state than a reader's, though, and drop every record the reader's state reaches (their keys'
newer records lie past its end): so a read that finds nothing looks again under the state
committed since (``LocalChangeLogReader._read_committed``).
"""

from __future__ import annotations

import bisect
import copy
import fcntl
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cdc.errors import (
    LogCorruptError,
    LogError,
    LogLockedError,
    check_format,
    storage_error,
)
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
from cdc.log.schemas import SchemaStore
from cdc.log.segment import (
    READ_CHUNK,
    frame_records,
    list_segments,
    parse_record,
    scan,
    scan_batches,
    segment_name,
)
from cdc.preflight import Part, Step, Warn, writable_place

STATE_FILE = "state.json"
#: the framing blobs an appender keeps between commits (beyond this they are let go)
BLOB_CACHE_BYTES = 64 * 1024**2
#: a read from an arbitrary offset starts at the nearest of every so many records seen before
MARK_EVERY = 16
#: bytes read at a time by reads of a few records (e.g. one previous image); larger reads use
#: segment.READ_CHUNK
SMALL_READ_CHUNK = 64 * 1024
#: where a record's bytes are: (segment file, first byte, size)
Location = tuple[Path, int, int]
#: segment files kept open for :meth:`LocalChangeLogReader.read_at`
READ_FDS = 16
LOCK_FILE = "LOCK"
TOPICS_DIR = "topics"
FORMAT_VERSION = 1


@dataclass
class PartitionState:
    """Committed state of one partition."""

    next_offset: int = 0
    active_base: int = 0
    active_bytes: int = 0


@dataclass
class TopicState:
    info: TopicInfo
    parts: list[PartitionState]


@dataclass
class LogState:
    """Everything ``state.json`` holds."""

    commit: int
    topics: dict[str, TopicState]
    source_offsets: dict[str, Any]

    @classmethod
    def empty(cls) -> LogState:
        return cls(0, {}, {})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "commit": self.commit,
            "topics": {
                name: {
                    "partitions": topic.info.partitions,
                    "meta": topic.info.meta,
                    "parts": [[p.next_offset, p.active_base, p.active_bytes] for p in topic.parts],
                }
                for name, topic in self.topics.items()
            },
            "source_offsets": self.source_offsets,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> LogState:
        check_format(data.get("format"), FORMAT_VERSION, f"the change log's state {where}",
                     fix="run the cdc version that wrote the log (or a newer one), or "
                     "bootstrap a new log")
        topics = {}
        for name, raw in data["topics"].items():
            info = TopicInfo(name, int(raw["partitions"]), dict(raw.get("meta", {})))
            parts = [PartitionState(int(a), int(b), int(c)) for a, b, c in raw["parts"]]
            topics[name] = TopicState(info, parts)
        return cls(int(data["commit"]), topics, dict(data.get("source_offsets", {})))


def topic_dir(root: Path, topic: str) -> Path:
    return root / TOPICS_DIR / quote(topic, safe="")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalChangeLogReader(ChangeLogReader):
    """Reads a local log directory; safe beside a running writer and a running compaction."""

    backend = "local"

    def __init__(self, path: str | Path, tombstone_retention: float = 24 * 3600.0) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.retention = tombstone_retention
        self._schemas: SchemaStore | None = None
        self._state = LogState.empty()
        self._state_bytes = b""
        # (topic, partition) -> (segment path, next offset, byte position) after the last read,
        # so a reader that continues where it stopped does not rescan the segment.
        self._resume: dict[tuple[str, int], tuple[Path, int, int]] = {}
        # segment path -> (offset, byte position) of every MARK_EVERY-th record seen, so a read
        # from an arbitrary offset starts near it (paths change when compaction rewrites)
        self._marks: dict[Path, list[tuple[int, int]]] = {}
        #: segment files :meth:`read_at` keeps open (at most READ_FDS, oldest closed first)
        self._read_fds: dict[Path, int] = {}
        if not self.path.is_dir():
            raise LogError(f"no change log at {self.path}",
                           "check log.path in the config, or run `cdc capture` to create the log")

    # -- state -------------------------------------------------------------------------------
    def state(self) -> LogState:
        """The latest committed state.

        The file is read on every call and parsed only when its bytes changed. (Comparing
        ``stat`` results is not enough: the rename reuses freed inode numbers and mtimes are as
        coarse as the kernel's clock tick, so two commits can look identical.)
        """
        file = self.path / STATE_FILE
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return self._state
        except OSError as exc:
            raise LogError(f"cannot read {file}: {exc.strerror}",
                           "check the log directory's permissions") from None
        if data != self._state_bytes:
            try:
                parsed = json.loads(data)
            except ValueError as exc:
                raise LogCorruptError(f"cannot parse {file}: {exc}",
                                      "restore the log directory from a copy") from None
            self._state = LogState.from_json(parsed, file)
            self._state_bytes = data
        return self._state

    def topics(self) -> list[TopicInfo]:
        return [self.state().topics[name].info for name in sorted(self.state().topics)]

    def topic(self, name: str) -> TopicInfo:
        state = self.state().topics.get(name)
        if state is None:
            raise LogError(f"the log has no topic {name!r}", "run `cdc log stats` to list topics")
        return state.info

    def end_offsets(self, topic: str) -> dict[int, int]:
        state = self.state().topics.get(topic)
        if state is None:
            return {}
        return {index: part.next_offset for index, part in enumerate(state.parts)}

    def source_offsets(self) -> dict[str, Any]:
        return copy.deepcopy(self.state().source_offsets)

    def committed(self) -> Committed:
        state = self.state()
        return Committed({name: topic.info for name, topic in state.topics.items()},
                         {name: [part.next_offset for part in topic.parts]
                          for name, topic in state.topics.items()},
                         copy.deepcopy(state.source_offsets))

    def schemas(self) -> SchemaStore:
        if self._schemas is None:
            self._schemas = SchemaStore(self.path)
        return self._schemas

    def tombstone_retention(self, topic: str) -> float:
        return self.retention

    # -- records -----------------------------------------------------------------------------
    def read(self, topic: str, partition: int, start: int = 0,
             max_records: int | None = None) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        self._read_committed(out, topic, partition, start, max_records)
        return out

    def read_located(self, topic: str, partition: int, start: int = 0,
                     max_records: int | None = None) -> list[tuple[StoredRecord, Location]]:
        """:meth:`read`, with where each record's bytes are (for :meth:`read_at`)."""
        located: list[Location] = []
        out: list[StoredRecord] = []
        self._read_committed(out, topic, partition, start, max_records, located)
        return list(zip(out, located, strict=True))

    def _read_committed(self, out: list[StoredRecord], topic: str, partition: int, start: int,
                        max_records: int | None, located: list[Location] | None = None) -> None:
        """:meth:`read` into ``out`` (and ``located``).

        Nothing found is an answer only under a state that is still the latest when the scan
        is over. Online compaction works from its own state, which may be newer than the one
        this read began with, and drops a record once a newer one of its key is committed: it
        can empty all of ``[start, next offset)`` of this read's state in favour of records past
        that end. An empty answer then would tell a caller that reads until one (such as
        :meth:`iter_partition`) that the partition ends there, and it would miss those keys
        altogether. So when nothing was found, the read goes on from that end under the state
        committed since, if the partition's end moved.
        """
        while True:
            state = self.state().topics.get(topic)
            if state is None or not 0 <= partition < len(state.parts):
                return
            part = state.parts[partition]
            if start >= part.next_offset or (max_records is not None and max_records <= 0):
                return
            directory = topic_dir(self.path, topic) / str(partition)
            for _attempt in range(5):
                try:
                    self._read_into(out, topic, partition, directory, part, start, max_records,
                                    located)
                    break
                except FileNotFoundError:
                    # compaction replaced or removed a segment between listing and opening:
                    # relist
                    start = out[-1].offset + 1 if out else start
                    self._resume.pop((topic, partition), None)
            else:
                raise LogError(f"segments of {topic}[{partition}] kept vanishing while reading",
                               "retry; if it persists, check that only one compaction runs at "
                               "a time")
            if out:
                return
            start = part.next_offset

    def read_at(self, topic: str, partition: int, where: Location) -> StoredRecord | None:
        """The record whose bytes :meth:`read_located` said are at ``where``, read with one
        ``read``; ``None`` when that file is gone (compaction rewrote the segment: use
        :meth:`read`). The caller checks the offset it expects: a committed record's bytes
        never change while its file exists."""
        path, start, size = where
        fd = self._read_fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            if len(self._read_fds) >= READ_FDS:
                os.close(self._read_fds.pop(next(iter(self._read_fds))))
            self._read_fds[path] = fd
        # an unlinked file (compaction replaced it) still holds the committed bytes
        raw = parse_record(os.pread(fd, size, start), path, start)
        if raw is None:
            return None
        return StoredRecord(topic, partition, raw.offset, raw.timestamp_ms, raw.key, raw.value,
                            raw.position)

    def close(self) -> None:
        self.close_reads()

    def close_reads(self) -> None:
        """Close the files :meth:`read_at` keeps open."""
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    def appended_no_earlier_than(self, topic: str, partition: int, offset: int) -> int | None:
        """The append time of the first record of the segment holding ``offset`` (read at the
        segment's start, not scanned up to ``offset``): offsets grow with append time, so the
        first record held at or after ``offset`` is no older."""
        directory = topic_dir(self.path, topic) / str(partition)
        try:
            bases = [segment.base for segment in list_segments(directory)]
        except FileNotFoundError:
            return None
        holding = [base for base in bases if base <= offset]
        if not holding:
            return None
        first = self.read(topic, partition, holding[-1], 1)
        return first[0].timestamp_ms if first else None

    def _read_into(self, out: list[StoredRecord], topic: str, partition: int, directory: Path,
                   part: PartitionState, start: int, max_records: int | None,
                   located: list[Location] | None = None) -> None:
        segments = list_segments(directory)
        resume = self._resume.get((topic, partition))
        for index, segment in enumerate(segments):
            if segment.base >= part.next_offset:
                break
            following = segments[index + 1].base if index + 1 < len(segments) else None
            if following is not None and following <= start:
                continue
            limit = None
            if segment.base == part.active_base and segment.generation == 0:
                limit = part.active_bytes
            first_byte, from_offset = 0, -1
            marks = self._marks.setdefault(segment.path, [])
            if resume and resume[0] == segment.path and resume[1] <= start:
                first_byte, from_offset = resume[2], resume[1]
            if marks and marks[0][0] <= start:  # a mark may be closer
                mark = marks[bisect.bisect_right(marks, (start, 1 << 62)) - 1]
                if mark[0] > from_offset:
                    first_byte = mark[1]
            chunk = SMALL_READ_CHUNK if max_records is not None and max_records <= 64 \
                else READ_CHUNK
            if self._read_segment(out, topic, partition, segment.path, first_byte, limit,
                                  chunk, part.next_offset, start, max_records, located):
                return
            start = max(start, following or start)

    def _read_segment(self, out: list[StoredRecord], topic: str, partition: int, path: Path,
                      first_byte: int, limit: int | None, chunk: int, next_offset: int,
                      start: int, max_records: int | None, located: list[Location] | None
                      ) -> bool:
        """Append the segment's records from ``start`` (below ``next_offset``) to ``out``,
        marking offsets on the way; True when ``max_records`` is reached or the committed end
        was passed (nothing more to read)."""
        marks = self._marks.setdefault(path, [])
        last_mark = marks[-1][0] if marks else -1
        for records in scan_batches(path, first_byte, limit, chunk=chunk):
            for offset, timestamp, key, value, position, at, size in records:
                if offset >= next_offset:
                    return True
                if offset % MARK_EVERY == 0 and offset > last_mark:
                    marks.append((offset, at))
                    last_mark = offset
                if offset < start:
                    continue
                out.append(StoredRecord(topic, partition, offset, timestamp, key, value,
                                        position))
                if located is not None:
                    located.append((path, at, size))
                if max_records is not None and len(out) >= max_records:
                    self._resume[(topic, partition)] = (path, offset + 1, at + size)
                    return True
        return False

    # -- statistics --------------------------------------------------------------------------
    def topic_bytes(self, topic: str) -> int | None:
        total = 0
        for root, _, files in os.walk(topic_dir(self.path, topic)):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:  # compaction replaced it meanwhile
                    continue
        return total

    def partition_stats(self, topic: str, partition: int) -> PartitionStats:
        state = self.state().topics[topic]
        part = state.parts[partition]
        directory = topic_dir(self.path, topic) / str(partition)
        stats = PartitionStats(topic, partition, part.next_offset, part.next_offset, 0, 0, 0, 0)
        for segment in list_segments(directory):
            if segment.base >= part.next_offset and segment.base > part.active_base:
                continue
            stats.segments += 1
            limit = part.active_bytes if (
                segment.base == part.active_base and segment.generation == 0) else None
            for raw in scan(segment.path, 0, limit, verify=False):
                if raw.offset >= part.next_offset:
                    break
                stats.start_offset = min(stats.start_offset, raw.offset)
                stats.records += 1
                stats.tombstones += raw.value is None
                stats.bytes += raw.size
        return stats


class LocalChangeLog(LocalChangeLogReader, ChangeLogWriter):
    """The writer. Exactly one per log directory (enforced by an flock on ``LOCK``)."""

    def __init__(self, path: str | Path, *, partitions: int = 8,
                 segment_bytes: int = 64 * 1024**2, fsync: bool = True,
                 tombstone_retention: float = 24 * 3600.0) -> None:
        self.path = Path(path)
        try:
            (self.path / TOPICS_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(f"create the log directory {self.path}", exc) from None
        if not os.access(self.path, os.W_OK):
            raise LogError(f"the log directory {self.path} is not writable by this user",
                           "fix its permissions (chown/chmod) or set log.path elsewhere")
        super().__init__(path, tombstone_retention)
        self.partitions = partitions
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock_fd = self._take_lock()
        self._mutex = threading.Lock()
        self._fds: dict[tuple[str, int], tuple[int, int]] = {}  # -> (fd, segment base)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cdc-fsync")
        #: framing buffers per partition, kept between commits (segment.frame_records)
        self._blobs: dict[tuple[str, int], bytearray] = {}
        self._closed = False
        self._recovered = False
        try:
            self._recover()
            self._recovered = True
        except BaseException:
            self.close()
            raise

    def state(self) -> LogState:
        """The writer is the only committer: after recovery its own copy is the truth."""
        return self._state if self._recovered else super().state()

    def schemas(self) -> SchemaStore:
        if self._schemas is None:
            self._schemas = SchemaStore(self.path, writable=True)
        return self._schemas

    # -- locking and recovery ----------------------------------------------------------------
    def _take_lock(self) -> int:
        lock_path = self.path / LOCK_FILE
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LogLockedError(
                f"the change log at {self.path} is already open for writing (pid {holder})",
                "stop the other cdc process first; only one writer may use a log",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _recover(self) -> None:
        """Bring the files back to exactly the committed state."""
        (self.path / (STATE_FILE + ".tmp")).unlink(missing_ok=True)
        self._state_bytes = b""
        state = self.state()
        topics_root = self.path / TOPICS_DIR
        known = {quote(name, safe=""): name for name in state.topics}
        for entry in os.listdir(topics_root):
            name = known.get(entry)
            if name is None:
                # a topic created by a writer that died before committing it
                shutil.rmtree(topics_root / entry)
                continue
            for index, part in enumerate(state.topics[name].parts):
                self._recover_partition(topic_dir(self.path, name) / str(index), part)

    def _recover_partition(self, directory: Path, part: PartitionState) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        # (.tmp files belong to compaction, which may be running now and cleans up after itself)
        current = {segment.base: segment for segment in list_segments(directory)}
        for name in os.listdir(directory):
            if not name.endswith(".seg"):
                continue
            base = int(name[:20])
            if base > part.active_base or current[base].name != name:
                (directory / name).unlink()  # uncommitted roll, or a superseded generation
        active = directory / segment_name(part.active_base)
        if not active.exists():
            if part.active_bytes:
                raise LogCorruptError(
                    f"the active segment {active} is missing",
                    "restore the log directory from a copy")
            active.touch()
        size = active.stat().st_size
        if size < part.active_bytes:
            raise LogCorruptError(
                f"{active} holds {size} bytes but {part.active_bytes} were committed",
                "the disk lost acknowledged data: restore the log directory from a copy")
        if size > part.active_bytes:
            os.truncate(active, part.active_bytes)  # drop what was never committed
        _fsync_dir(directory)

    # -- topics ------------------------------------------------------------------------------
    def ensure_topic(self, topic: str, meta: Mapping[str, Any] | None = None,
                     partitions: int | None = None) -> TopicInfo:
        count = partitions or self.partitions
        with self._mutex:
            state = self.state()
            existing = state.topics.get(topic)
            if existing is not None:
                if partitions is not None and existing.info.partitions != count:
                    raise LogError(
                        f"topic {topic} has {existing.info.partitions} partitions, not {count}",
                        "a topic is never repartitioned: rebuild the log to change it")
                return existing.info
            new = copy.deepcopy(state)
            info = TopicInfo(topic, count, dict(meta or {}))
            new.topics[topic] = TopicState(info, [PartitionState() for _ in range(count)])
            root = topic_dir(self.path, topic)
            try:
                for index in range(count):
                    directory = root / str(index)
                    directory.mkdir(parents=True, exist_ok=True)
                    (directory / segment_name(0)).touch()
                    _fsync_dir(directory)
                _fsync_dir(root)
                _fsync_dir(root.parent)
                self._commit(new)
            except OSError as exc:
                raise storage_error(f"create topic {topic}", exc) from None
            return info

    def drop_topic(self, topic: str) -> None:
        with self._mutex:
            state = self.state()
            if topic not in state.topics:
                return
            new = copy.deepcopy(state)
            del new.topics[topic]
            try:
                self._commit(new)  # readers stop seeing it here; its files go next
                shutil.rmtree(topic_dir(self.path, topic), ignore_errors=True)
            except OSError as exc:
                raise storage_error(f"drop topic {topic}", exc) from None

    # -- appending ---------------------------------------------------------------------------
    def append(self, records: Sequence[Record],
               source_offsets: Mapping[str, Any] | None = None,
               finish: Finisher | None = None) -> list[AppendResult]:
        with self._mutex:
            if self._closed:
                raise LogError("the change log writer is closed")
            return self._append_locked(records, source_offsets, finish)

    def _append_locked(self, records: Sequence[Record],
                       source_offsets: Mapping[str, Any] | None,
                       finish: Finisher | None) -> list[AppendResult]:
        state = self.state()
        new = copy.deepcopy(state)
        now_ms = int(time.time() * 1000)
        used: dict[tuple[str, int], int] = {}  # bytes of framed records per partition's blob
        target = _Target(self, state, new)
        placed = self._place(records, new, now_ms, used, target.base_of)
        if finish is not None:
            more, offsets = finish(placed)
            if offsets is not None:
                source_offsets = offsets
            if more:
                placed += self._place(more, new, now_ms, used, target.base_of)
        try:
            self._write_placed(state, new, used, target, source_offsets)
        finally:
            if sum(map(len, self._blobs.values())) > BLOB_CACHE_BYTES:
                self._blobs.clear()
        return placed

    def _place(self, records: Sequence[Record], new: LogState, now_ms: int,
               used: dict[tuple[str, int], int],
               base_of: Callable[[str, int], tuple[Path, int]]) -> list[AppendResult]:
        """Give each record its partition, offset (in ``new``) and location, and write its
        framed bytes into its partition's blob (``self._blobs``, ``used`` bytes of it so far),
        which is written at ``base_of(topic, partition)``."""
        topics = new.topics
        offsets = {name: [part.next_offset for part in topic.parts]
                   for name, topic in topics.items()}
        try:
            placed: list[AppendResult] = frame_records(
                records if isinstance(records, list) else list(records), offsets, now_ms,
                self._blobs, used, AppendResult, base_of)
        except KeyError as exc:
            raise LogError(f"append to unknown topic {exc.args[0]!r}",
                           "call ensure_topic() first (this is a bug in the caller)") from None
        for name, parts in offsets.items():
            for part, next_offset in zip(topics[name].parts, parts, strict=True):
                part.next_offset = next_offset
        return placed

    def _write_placed(self, state: LogState, new: LogState, used: dict[tuple[str, int], int],
                      target: _Target, source_offsets: Mapping[str, Any] | None) -> None:
        """Write the placed records, sync them and commit ``new`` with ``source_offsets``."""
        written: list[tuple[str, int, int, int]] = []  # topic, partition, fd, committed bytes
        writes: list[tuple[int, memoryview, int]] = []  # fd, bytes, where
        try:
            for (topic_name, partition), length in used.items():
                data = memoryview(self._blobs[(topic_name, partition)])[:length]
                part = new.topics[topic_name].parts[partition]
                fd = target.fds[(topic_name, partition)]
                written.append((topic_name, partition, fd, part.active_bytes))
                writes.append((fd, data, part.active_bytes))
                part.active_bytes += len(data)
            self._write_and_sync(writes, target.new_dirs)
            if source_offsets:
                new.source_offsets.update(copy.deepcopy(dict(source_offsets)))
            self._commit(new)
        except OSError as exc:
            self._undo(state, written)
            raise storage_error("append to the change log", exc) from None

    def _active_fd(self, topic: str, partition: int, old: PartitionState,
                   part: PartitionState) -> tuple[int, bool]:
        """The fd of the partition's active segment, rolling to a new one when it is full.

        ``part`` (the state being built) is updated in place when the segment rolls.
        """
        rolled = False
        if old.active_bytes >= self.segment_bytes:
            part.active_base = old.next_offset
            part.active_bytes = 0
            rolled = True
        cached = self._fds.get((topic, partition))
        if cached is not None and cached[1] == part.active_base:
            return cached[0], rolled
        if cached is not None:
            os.close(cached[0])
            del self._fds[(topic, partition)]
        path = topic_dir(self.path, topic) / str(partition) / segment_name(part.active_base)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._fds[(topic, partition)] = (fd, part.active_base)
        return fd, rolled

    def _write_and_sync(self, writes: list[tuple[int, memoryview, int]],
                        directories: list[Path]) -> None:
        """Write each partition's bytes at their place (and fdatasync them), the partitions in
        parallel: on a VM, the page cache's first touch of fresh memory is a hypervisor fault
        per page, so one thread writing every partition in turn is slow where several are not;
        then fsync the new segments' directories."""
        if len(writes) == 1:
            self._write_one(*writes[0])
        else:
            futures = [self._pool.submit(self._write_one, *write) for write in writes]
            errors = [future.exception() for future in futures]
            for error in errors:
                if error is not None:
                    raise error
        if self.fsync:
            for directory in directories:
                _fsync_dir(directory)

    def _write_one(self, fd: int, data: memoryview, at: int) -> None:
        _write_all(fd, data, at)
        if self.fsync:
            os.fdatasync(fd)

    def _undo(self, state: LogState, written: list[tuple[str, int, int, int]]) -> None:
        """After a failed append: cut the written bytes off again (best effort)."""
        for topic, partition, fd, committed in written:
            old = state.topics[topic].parts[partition]
            try:
                if self._fds.get((topic, partition), (None, -1))[1] == old.active_base:
                    os.ftruncate(fd, committed)
                else:  # the failed append had rolled to a new segment: forget it
                    os.close(fd)
                    del self._fds[(topic, partition)]
                    path = topic_dir(self.path, topic) / str(partition)
                    (path / segment_name(old.next_offset)).unlink(missing_ok=True)
            except OSError:
                pass

    def _commit(self, new: LogState) -> None:
        """Make ``new`` the committed state (atomic rename), then adopt it in memory."""
        new.commit += 1
        data = json.dumps(new.to_json(), separators=(",", ":")).encode()
        tmp = self.path / (STATE_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / STATE_FILE)
        if self.fsync:
            _fsync_dir(self.path)
        self._state = new
        self._state_bytes = data

    def roll_all(self) -> int:
        """Close every non-empty active segment so compaction may rewrite it. Returns how many."""
        with self._mutex:
            new = copy.deepcopy(self.state())
            rolled = 0
            for name, topic in new.topics.items():
                for index, part in enumerate(topic.parts):
                    if part.active_bytes == 0:
                        continue
                    directory = topic_dir(self.path, name) / str(index)
                    (directory / segment_name(part.next_offset)).touch()
                    _fsync_dir(directory)
                    part.active_base, part.active_bytes = part.next_offset, 0
                    rolled += 1
            if rolled:
                self._commit(new)
            return rolled

    def close(self) -> None:
        """Close the files and release the lock; an append running in another thread finishes
        first."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            for fd, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self.close_reads()
            self._pool.shutdown(wait=True)
            os.close(self._lock_fd)

    def __enter__(self) -> LocalChangeLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Target:
    """Where one append writes each partition it touches: the active segment (rolled to a new
    one when full, see :meth:`LocalChangeLog._active_fd`) and the byte its new records start
    at; decided on first touch, while the records are framed."""

    def __init__(self, log: LocalChangeLog, state: LogState, new: LogState) -> None:
        self.log, self.state, self.new = log, state, new
        self.fds: dict[tuple[str, int], int] = {}
        #: partition directories that got a new segment file (their entries must be synced)
        self.new_dirs: list[Path] = []

    def base_of(self, topic: str, partition: int) -> tuple[Path, int]:
        part = self.new.topics[topic].parts[partition]
        old = self.state.topics[topic].parts[partition]
        try:
            fd, rolled = self.log._active_fd(topic, partition, old, part)
        except OSError as exc:
            raise storage_error("append to the change log", exc) from None
        directory = topic_dir(self.log.path, topic) / str(partition)
        if rolled:
            self.new_dirs.append(directory)
        self.fds[(topic, partition)] = fd
        return directory / segment_name(part.active_base), part.active_bytes


def _write_all(fd: int, data: bytes | bytearray | memoryview, at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view = view[written:]
        at += written


#: below this much free space the local log's preflight warns
LOW_DISK = 1024**3


def preflight_part(path: Path) -> Part:
    """The local log's preflight (the contract of :mod:`cdc.preflight`): its directory a log,
    or a place where one can be created; the free space there. Creates nothing."""

    def directory() -> str:
        if (path / STATE_FILE).exists():
            reader = LocalChangeLogReader(path)
            try:
                return f"a log of {len(reader.topics())} topic(s) at {path}"
            finally:
                reader.close()
        if path.is_dir() and any(path.iterdir()):
            raise LogError(f"{path} holds files but no change log (no {STATE_FILE})",
                           "point log.path at an empty or new directory, or at the directory "
                           "`cdc capture` writes")
        return writable_place(path, "log.path", "make it writable by the user cdc runs as, "
                              "or set log.path elsewhere")

    def disk() -> str:
        place = path
        while not place.exists() and place != place.parent:
            place = place.parent
        free = shutil.disk_usage(place).free
        shown = f"{free / 1024**3:.1f} GiB free at {place}"
        return Warn(f"{shown}: the log needs room for every key's newest record") \
            if free < LOW_DISK else shown

    return Part("log (local)", [Step("directory", directory), Step("disk space", disk)])
