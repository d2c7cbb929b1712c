"""Human views of a change log: statistics tables and the JSON-lines dump."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from cdc.avro import EventCodec
from cdc.errors import LogError
from cdc.log.base import ChangeLogReader
from cdc.position import Position
from cdc.transactions import decode_event, is_transaction_topic


def log_stats(reader: ChangeLogReader) -> dict[str, Any]:
    """Per topic and partition: offsets, record and tombstone counts, bytes, segments."""
    store = reader.schemas()
    topics = []
    for info in reader.topics():
        partitions = [reader.partition_stats(info.name, index).__dict__
                      for index in range(info.partitions)]
        topics.append({
            "topic": info.name,
            "table": info.meta.get("table"),
            "partitions": partitions,
            "records": sum(p["records"] for p in partitions),
            "tombstones": sum(p["tombstones"] for p in partitions),
            "bytes": sum(p["bytes"] for p in partitions),
            "segments": sum(p["segments"] for p in partitions),
            "end_offset_total": sum(p["end_offset"] for p in partitions),
            "schema_versions": len(store.versions(f"{info.name}-value")),
        })
    return {"path": reader.where, "backend": reader.backend, "topics": topics,
            "source_offsets": reader.source_offsets()}


def print_stats(stats: dict[str, Any], console: Console) -> None:
    table = Table(title=f"change log ({stats['backend']}) at {stats['path']}")
    for column in ("topic", "table", "partitions", "records", "tombstones", "appended",
                   "bytes", "segments", "schema versions"):
        table.add_column(column, justify="left" if column in ("topic", "table") else "right")
    for topic in stats["topics"]:
        table.add_row(topic["topic"], topic["table"] or "", str(len(topic["partitions"])),
                      f"{topic['records']:,}", f"{topic['tombstones']:,}",
                      f"{topic['end_offset_total']:,}", f"{topic['bytes']:,}",
                      str(topic["segments"]), str(topic["schema_versions"]))
    console.print(table)
    if not stats["topics"]:
        console.print("the log is empty")
    for source, offset in sorted(stats["source_offsets"].items()):
        console.print(f"source [bold]{source}[/] resumes at {json.dumps(offset)}",
                      highlight=False)


def dump_lines(reader: ChangeLogReader, topics: Sequence[str] = (),
               partition: int | None = None, start: int = 0) -> Iterator[str]:
    """The ``cdc log dump`` lines: one JSON object per record, offset order per partition."""
    codec = EventCodec(reader.schemas())
    known = {info.name: info for info in reader.topics()}
    missing = [t for t in topics if t not in known]
    if missing:
        raise LogError(f"the log has no topic {', '.join(missing)}",
                       f"known topics: {', '.join(known) or 'none'}")
    for name in topics or sorted(known):
        info = known[name]
        indexes = [partition] if partition is not None else range(info.partitions)
        for index in indexes:
            for record in reader.iter_partition(name, index, start):
                value = None
                if record.value is not None and is_transaction_topic(info.meta):
                    value = decode_event(record.value)  # a BEGIN or END, not an envelope
                elif record.value is not None:
                    value = codec.decode_value(record.value).envelope
                yield json.dumps({
                    "topic": name,
                    "table": info.meta.get("table"),
                    "partition": index,
                    "offset": record.offset,
                    "position": Position.from_bytes(record.position).to_dict(),
                    "key": json.loads(record.key),
                    "value": value,
                }, ensure_ascii=False, separators=(",", ":"))


def fold_latest(reader: ChangeLogReader, topic: str
                ) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """Counts per op, and the live row per key (JSON key text -> after image) of ``topic``,
    folded by position: what a follower rebuilt from offset 0 would hold."""
    codec = EventCodec(reader.schemas())
    counts = {"records": 0, "r": 0, "c": 0, "u": 0, "d": 0, "t": 0, "tombstones": 0}
    latest: dict[str, tuple[Position, dict[str, Any] | None]] = {}
    info = reader.committed().topics.get(topic)
    if info is None:
        return counts, {}
    for index in range(info.partitions):
        for record in reader.iter_partition(topic, index):
            counts["records"] += 1
            row = None
            if record.value is None:
                counts["tombstones"] += 1
            else:
                envelope = codec.decode_value(record.value).envelope
                counts[envelope["op"]] += 1
                if envelope["op"] == "t":
                    continue
                row = envelope["after"]
            key = record.key.decode()
            position = Position.from_bytes(record.position)
            current = latest.get(key)
            if current is None or not position < current[0]:
                latest[key] = (position, row)
    return counts, {key: row for key, (_, row) in latest.items() if row is not None}


def superseded(reader: ChangeLogReader, topic: str) -> dict[int, set[int]]:
    """Per partition, the offsets of ``topic``'s records that a later record of the same key
    replaces: what compaction drops (tombstones past their retention aside)."""
    info = reader.committed().topics.get(topic)
    out: dict[int, set[int]] = {}
    for partition in range(info.partitions if info else 0):
        last: dict[bytes, int] = {}
        replaced: set[int] = set()
        for record in reader.iter_partition(topic, partition):
            before = last.get(record.key)
            if before is not None:
                replaced.add(before)
            last[record.key] = record.offset
        if replaced:
            out[partition] = replaced
    return out


def still_present(reader: ChangeLogReader, topic: str, offsets: dict[int, set[int]]
                  ) -> dict[int, set[int]]:
    """Which of ``offsets`` (per partition) ``topic`` still holds."""
    out: dict[int, set[int]] = {}
    for partition, wanted in offsets.items():
        held = {r.offset for r in reader.iter_partition(topic, partition)} & wanted
        if held:
            out[partition] = held
    return out
