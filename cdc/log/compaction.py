"""Compaction of the local log: keep the latest record per key, drop expired tombstones.

Rules, per partition:

* a record survives if it is the latest record of its key among the committed records;
* a tombstone that is the latest of its key survives until ``tombstone_retention`` seconds after
  it was appended, then it is dropped too (so is everything older of that key, already);
* offsets never change; the active segment (the one the writer appends to) is never rewritten.

When no writer holds the log (``LOCK`` is free), compaction first *rolls* every active segment so
that everything committed can be compacted ("offline"). Otherwise it compacts the closed segments
only and leaves the writer alone ("online").

A segment is rewritten into ``<base>-<generation+1>.seg`` (written to a ``.tmp`` name, fsynced,
renamed), and only then is the old generation removed; readers pick the highest generation, and a
reader that already opened the old file keeps reading it consistently.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

from cdc.errors import LogError, LogLockedError
from cdc.log.base import CompactionReport
from cdc.log.local import (
    LocalChangeLog,
    LocalChangeLogReader,
    PartitionState,
    _fsync_dir,
    _write_all,
    topic_dir,
)
from cdc.log.segment import SegmentFile, encode_record, list_segments, scan, segment_name

COMPACT_LOCK = "COMPACT.lock"


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def compact(path: str | Path, tombstone_retention: float, now_ms: int | None = None,
            roll: bool = True) -> CompactionReport:
    """Compact every partition of the log at ``path``. Safe beside a writer and readers."""
    root = Path(path)
    started = time.monotonic()
    report = CompactionReport()
    lock_fd = os.open(root / COMPACT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogLockedError(f"another compaction of {root} is running",
                                 "wait for it to finish") from None
        if roll:
            report.offline = _roll_if_no_writer(root)
        reader = LocalChangeLogReader(root)
        state = reader.state()
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        retention_ms = int(tombstone_retention * 1000)
        for name, topic in state.topics.items():
            for index, part in enumerate(topic.parts):
                directory = topic_dir(root, name) / str(index)
                _compact_partition(directory, part, now - retention_ms, report)
    finally:
        os.close(lock_fd)
    report.seconds = time.monotonic() - started
    return report


def _roll_if_no_writer(root: Path) -> bool:
    try:
        writer = LocalChangeLog(root)
    except LogLockedError:
        return False
    try:
        writer.roll_all()
    finally:
        writer.close()
    return True


def _committed(segment: SegmentFile, part: PartitionState) -> int | None:
    """The byte limit of ``segment`` under ``part``'s state (None: the whole file)."""
    if segment.base == part.active_base and segment.generation == 0:
        return part.active_bytes
    return None


def _remove_leftovers(directory: Path) -> None:
    """Files an interrupted compaction left: ``.tmp`` files and superseded generations.

    Works from one directory listing: a segment the writer creates meanwhile is never touched
    (it has generation 0 and nothing supersedes it).
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    newest: dict[str, str] = {}
    for name in sorted(n for n in names if n.endswith(".seg")):
        newest[name[:20]] = name  # sorted: the highest generation of a base comes last
    for name in names:
        superseded = name.endswith(".seg") and newest.get(name[:20]) != name
        if name.endswith(".tmp") or superseded:
            (directory / name).unlink(missing_ok=True)


def _compact_partition(directory: Path, part: PartitionState, expire_before_ms: int,
                       report: CompactionReport) -> None:
    _remove_leftovers(directory)
    segments = [s for s in list_segments(directory) if s.base <= part.active_base]
    closed = [s for s in segments if s.base < part.active_base]
    if not closed:
        return
    latest: dict[bytes, int] = {}
    for segment in segments:
        for raw in scan(segment.path, 0, _committed(segment, part), verify=False):
            if raw.offset >= part.next_offset:
                break
            latest[_digest(raw.key)] = raw.offset
    for segment in closed:
        _rewrite(segment, latest, expire_before_ms, report)


def _rewrite(segment: SegmentFile, latest: dict[bytes, int], expire_before_ms: int,
             report: CompactionReport) -> None:
    kept: list[bytes] = []
    total = dropped_tombstones = size_before = 0
    for raw in scan(segment.path):
        total += 1
        size_before += raw.size
        if latest.get(_digest(raw.key)) != raw.offset:
            continue
        if raw.value is None and raw.timestamp_ms < expire_before_ms:
            dropped_tombstones += 1
            continue
        kept.extend(encode_record(raw.offset, raw.timestamp_ms, raw.key, raw.value,
                                  raw.position))
    report.records_before += total
    report.bytes_before += size_before
    if len(kept) // 5 == total:  # five pieces per record: nothing to drop
        report.records_after += total
        report.bytes_after += size_before
        return
    data = b"".join(kept)
    report.segments_rewritten += 1
    report.records_after += len(kept) // 5
    report.bytes_after += len(data)
    report.tombstones_dropped += dropped_tombstones
    directory = segment.path.parent
    final = directory / segment_name(segment.base, segment.generation + 1)
    if data:
        tmp = final.with_name(final.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise LogError(f"compaction cannot write {tmp}: {exc.strerror}",
                           "free disk space and run it again; the log is unchanged") from None
        os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(directory)
    segment.path.unlink()
    _fsync_dir(directory)
