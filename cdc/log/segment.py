"""Segment files: the on-disk record format of the local log.

A partition is a directory of segment files named ``<base offset:020d>-<generation:04d>.seg``.
``base`` is the offset the segment started at when it was created; ``generation`` counts
rewrites by compaction (the writer only ever appends to generation 0 of the newest segment).
Records never move between segments, so the records of segment ``i`` have offsets in
``[base_i, base_{i+1})``.

A record is a 35-byte little-endian header followed by three byte strings::

    u32 length      bytes after this field (crc .. end of value)
    u32 crc         zlib.crc32 of every byte after this field
    i64 offset
    i64 timestamp   ms since the epoch, when the log appended it
    u8  attributes  bit 0: tombstone (the value is null)
    u16 position length
    u32 key length
    u32 value length (0 for a tombstone)
    position bytes, key bytes, value bytes

A record whose length runs past the readable end or whose CRC does not match is torn: a reader
never returns it (see ``cdc/log/local.py`` for which bytes are readable).
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.errors import LogCorruptError
from cdc.log.partitioner import partition_for
from cdc.speedups import pure_python

HEADER = struct.Struct("<IIqqBHII")
PREFIX = struct.Struct("<II")
BODY_HEADER = struct.Struct("<qqBHII")
ATTR_TOMBSTONE = 1
_NAME = re.compile(r"^(\d{20})-(\d{4})\.seg$")
READ_CHUNK = 1 << 20


@dataclass(frozen=True, order=True)
class SegmentFile:
    base: int
    generation: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


def segment_name(base: int, generation: int = 0) -> str:
    return f"{base:020d}-{generation:04d}.seg"


def list_segments(directory: Path) -> list[SegmentFile]:
    """The current segment files of a partition, oldest first: the highest generation per base."""
    best: dict[int, SegmentFile] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        match = _NAME.match(name)
        if not match:
            continue
        segment = SegmentFile(int(match.group(1)), int(match.group(2)), directory / name)
        current = best.get(segment.base)
        if current is None or segment.generation > current.generation:
            best[segment.base] = segment
    return [best[base] for base in sorted(best)]


def encode_record(offset: int, timestamp_ms: int, key: bytes, value: bytes | None,
                  position: bytes) -> list[bytes]:
    """The pieces of one framed record (join them, or several records' pieces, to write)."""
    attributes = 0
    if value is None:
        attributes = ATTR_TOMBSTONE
        value = b""
    body_header = BODY_HEADER.pack(offset, timestamp_ms, attributes, len(position), len(key),
                                   len(value))
    crc = zlib.crc32(value, zlib.crc32(key, zlib.crc32(position, zlib.crc32(body_header))))
    length = BODY_HEADER.size + 4 + len(position) + len(key) + len(value)
    return [PREFIX.pack(length, crc), body_header, position, key, value]


def encode_record_bytes(offset: int, timestamp_ms: int, key: bytes, value: bytes | None,
                        position: bytes) -> bytes:
    """:func:`encode_record` joined into one bytes object (compiled when built: see
    ``cdc/log/_fast.pyx``; ``CDC_PURE_PYTHON=1`` selects this pure-Python one)."""
    return b"".join(encode_record(offset, timestamp_ms, key, value, position))


def frame_records(records: Sequence[Any], offsets: dict[str, list[int]], now_ms: int,
                  blobs: dict[tuple[str, int], bytearray], used: dict[tuple[str, int], int],
                  result: Callable[..., Any],
                  base_of: Callable[[str, int], tuple[Any, int]]) -> list[Any]:
    """Place and frame a commit's records, in order: a record of topic ``t`` goes to partition
    :func:`~cdc.log.partitioner.partition_for` ``(key, len(offsets[t]))`` at offset
    ``offsets[t][partition]`` (advanced in place), and its framed bytes
    (:func:`encode_record_bytes`, timestamp ``now_ms``) are written into
    ``blobs[(t, partition)]`` (made when missing) at ``used[(t, partition)]`` (0 when missing;
    advanced). A blob may be longer than what is used: kept from one commit to the next, it is
    grown only when too small, so its memory is not faulted in again for every commit.
    ``base_of(t, partition)`` says where that blob's first byte will be written:
    ``(file, byte)``; it is asked once per partition a call touches.
    Returns ``result(topic, partition, offset, (file, byte + start in the blob, size))`` per
    record; a topic missing from ``offsets`` raises KeyError."""
    out = []
    bases: dict[tuple[str, int], tuple[Any, int]] = {}
    for topic, key, value, position in records:
        parts = offsets[topic]
        partition = partition_for(key, len(parts))
        offset = parts[partition]
        parts[partition] = offset + 1
        where = (topic, partition)
        base = bases.get(where)
        if base is None:
            base = bases[where] = base_of(topic, partition)
        blob = blobs.get(where)
        if blob is None:
            blob = blobs[where] = bytearray()
        framed = encode_record_bytes(offset, now_ms, key, value, position)
        at = used.get(where, 0)
        if at + len(framed) > len(blob):  # grow geometrically; past ``used`` is scratch
            grown = bytes(max(at + len(framed), 2 * len(blob), 65536) - len(blob))
            try:
                blob.extend(grown)
            except BufferError:  # a view of it is still alive somewhere: use a new one
                blob = blobs[where] = bytearray(blob) + grown
        blob[at:at + len(framed)] = framed
        used[where] = at + len(framed)
        out.append(result(topic, partition, offset, (base[0], base[1] + at, len(framed))))
    return out


#: one parsed record: (offset, timestamp_ms, key, value or None, position, start byte in the
#: segment, size in bytes)
RecordTuple = tuple[int, int, bytes, "bytes | None", bytes, int, int]


def parse_records(buffer: bytes, cursor: int, buffer_start: int, verify: bool
                  ) -> tuple[list[RecordTuple], int, int]:
    """The complete records of ``buffer`` from ``cursor`` (``buffer[0]`` is byte
    ``buffer_start`` of the segment): ``(records, cursor after the last, bad)``; ``bad`` is the
    cursor of a record that cannot be right (its CRC fails when ``verify``, or its lengths do not
    fit), else -1 — the records before it are returned. A record cut short ends the list."""
    out: list[RecordTuple] = []
    total = len(buffer)
    while total - cursor >= HEADER.size:
        length, crc, offset, timestamp, attributes, pos_len, key_len, value_len = (
            HEADER.unpack_from(buffer, cursor))
        size = 4 + length
        if size < HEADER.size:
            return out, cursor, cursor
        if total - cursor < size:
            break
        if verify and zlib.crc32(memoryview(buffer)[cursor + 8 : cursor + size]) != crc:
            return out, cursor, cursor
        if HEADER.size + pos_len + key_len + value_len > size:
            return out, cursor, cursor
        data = cursor + HEADER.size
        position = buffer[data : data + pos_len]
        data += pos_len
        key = buffer[data : data + key_len]
        data += key_len
        value = None if attributes & ATTR_TOMBSTONE else buffer[data : data + value_len]
        out.append((offset, timestamp, key, value, position, buffer_start + cursor, size))
        cursor += size
    return out, cursor, -1


if not pure_python():
    with contextlib.suppress(ImportError):
        from cdc.log._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore] # noqa: F401
            crc32,  # new with this frame_records: an older build is not taken at all
            encode_record_bytes,
            frame_records,
            parse_records,
        )


@dataclass(slots=True)
class RawRecord:
    """A record parsed from a segment, with where its bytes are."""

    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes | None
    position: bytes
    #: byte position of the record's first byte in its segment, and its total size
    start: int
    size: int


def scan(path: Path, start_byte: int = 0, limit_bytes: int | None = None,
         verify: bool = True, chunk: int = READ_CHUNK) -> Iterator[RawRecord]:
    """Records of a segment from ``start_byte``, stopping at ``limit_bytes`` (or end of file),
    reading ``chunk`` bytes at a time (more when one record is larger).

    A record cut short by the limit or the end of the file ends the scan silently: the caller
    decides (from the committed state) whether such bytes may exist. A complete record whose CRC
    fails raises :class:`LogCorruptError`.
    """
    for records in scan_batches(path, start_byte, limit_bytes, verify, chunk):
        for offset, timestamp, key, value, position, start, size in records:
            yield RawRecord(offset, timestamp, key, value, position, start, size)


def scan_batches(path: Path, start_byte: int = 0, limit_bytes: int | None = None,
                 verify: bool = True, chunk: int = READ_CHUNK) -> Iterator[list[RecordTuple]]:
    """:func:`scan` a read at a time: lists of :data:`RecordTuple` (no object per record;
    compiled in ``cdc/log/_fast.pyx``). The same records, the same errors."""
    with open(path, "rb") as handle:
        handle.seek(start_byte)
        end = limit_bytes if limit_bytes is not None else os.fstat(handle.fileno()).st_size
        buffer = b""
        buffer_start = start_byte  # file position of buffer[0]
        cursor = 0
        while True:
            records, cursor, bad = parse_records(buffer, cursor, buffer_start, verify)
            if records:
                yield records
            if bad >= 0:
                offset = HEADER.unpack_from(buffer, bad)[2]
                raise LogCorruptError(
                    f"checksum mismatch in {path} at byte {buffer_start + bad} "
                    f"(offset {offset})",
                    "the disk lost acknowledged data: restore the log from a copy, or rebuild it "
                    "with a new bootstrap",
                )
            remaining = end - (buffer_start + len(buffer))
            if remaining <= 0:
                return
            fresh = handle.read(min(max(chunk, _wanted(buffer, cursor)), remaining))
            if not fresh:
                return
            buffer = buffer[cursor:] + fresh
            buffer_start += cursor
            cursor = 0


def parse_record(data: bytes, path: Path, start: int) -> RawRecord | None:
    """The one record ``data`` holds (read from ``path`` at byte ``start``); None when it is
    cut short. Raises :class:`LogCorruptError` when its CRC does not match."""
    if len(data) < HEADER.size:
        return None
    length, crc, offset, timestamp, attributes, pos_len, key_len, value_len = (
        HEADER.unpack_from(data, 0))
    size = 4 + length
    if len(data) < size:
        return None
    if zlib.crc32(memoryview(data)[8:size]) != crc:
        raise LogCorruptError(
            f"checksum mismatch in {path} at byte {start} (offset {offset})",
            "the disk lost acknowledged data: restore the log from a copy, or rebuild it "
            "with a new bootstrap")
    at = HEADER.size
    position = data[at : at + pos_len]
    at += pos_len
    key = data[at : at + key_len]
    at += key_len
    value = None if attributes & ATTR_TOMBSTONE else data[at : at + value_len]
    return RawRecord(offset, timestamp, key, value, position, start, size)


def _wanted(buffer: bytes, cursor: int) -> int:
    """How many bytes the record at ``cursor`` needs in total (header size if unknown)."""
    if len(buffer) - cursor < 4:
        return HEADER.size
    return 4 + int.from_bytes(buffer[cursor : cursor + 4], "little")
