"""The dispatcher: one way into the log for snapshot and streaming sources alike.

Sources hand it events and checkpoints; it encodes events as records, buffers them, and commits
them to the log together with the newest source offset whose changes are all in the commit.
Only after :meth:`Dispatcher.flush` returns may the source be told that the offset is durable.

Memory stays bounded: the buffer is flushed when it holds ``max_records`` records even in the
middle of a transaction. Such a flush carries the *previous* checkpoint as source offset, so a
crash replays the transaction from its start; the replayed records carry the same positions,
which followers' version gates ignore.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc.avro import EventCodec
from cdc.events import ChangeEvent, TableSchema
from cdc.log.base import ChangeLogWriter, Record
from cdc.position import Position


@dataclass
class DispatchStats:
    events: int = 0
    records: int = 0
    commits: int = 0
    started: float = field(default_factory=time.monotonic)


class Dispatcher:
    """Buffers encoded events for one source and commits them with its source offset."""

    def __init__(self, log: ChangeLogWriter, codec: EventCodec, source: str,
                 max_records: int = 20_000, interval: float = 0.05) -> None:
        self.log = log
        self.codec = codec
        self.source = source
        self.max_records = max_records
        self.interval = interval
        self._buffer: list[Record] = []
        self._pending_offset: dict[str, Any] | None = None
        self._oldest: float | None = None
        self._topics: set[str] = set()
        self.stats = DispatchStats()

    def add(self, event: ChangeEvent) -> list[Record]:
        """Buffer ``event``; return its records (the event, plus a tombstone after a delete)."""
        self.ensure_topic(event.schema)
        records = self.codec.records(event)
        self._buffer.extend(records)
        self.stats.events += 1
        if self._oldest is None:
            self._oldest = time.monotonic()
        return records

    def add_tombstone(self, schema: TableSchema, key: bytes, position: Position) -> None:
        """Buffer a tombstone for ``key`` of ``schema``'s table (a row known only by its key)."""
        self.ensure_topic(schema)
        self._buffer.append(Record(schema.topic, key, None, position.to_bytes()))
        if self._oldest is None:
            self._oldest = time.monotonic()

    def ensure_topic(self, schema: TableSchema) -> None:
        topic = schema.topic
        if topic not in self._topics:
            self.log.ensure_topic(topic, {"source": self.source, "table": str(schema.table),
                                          "connector": schema.connector})
            self._topics.add(topic)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def checkpoint(self, offset: Mapping[str, Any]) -> None:
        """Everything added so far is complete up to ``offset`` (the source's resume point)."""
        self._pending_offset = dict(offset)
        if self._oldest is None:
            self._oldest = time.monotonic()

    def due(self) -> bool:
        """Whether a flush is due (buffer full, or the oldest item waited ``interval``)."""
        if len(self._buffer) >= self.max_records:
            return True
        return self._oldest is not None and time.monotonic() - self._oldest >= self.interval

    def flush(self) -> dict[str, Any] | None:
        """Commit the buffer with the pending offset; return that offset once durable."""
        offset = self._pending_offset
        if not self._buffer and offset is None:
            return None
        offsets = {self.source: offset} if offset is not None else None
        self.log.append(self._buffer, offsets)
        self.stats.records += len(self._buffer)
        self.stats.commits += 1
        self._buffer = []
        self._pending_offset = None
        self._oldest = None
        return offset

    def discard(self) -> None:
        """Forget what is buffered (it was never acknowledged; the source sends it again)."""
        self._buffer = []
        self._pending_offset = None
        self._oldest = None
