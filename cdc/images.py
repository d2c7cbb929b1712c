"""Previous images: the latest after image of a key, to complete a change the source sent
partially (PostgreSQL does not send TOASTed values an UPDATE left unchanged).

Every event in the log must carry the whole row, because compaction throws older events away.
:class:`PreviousImages` answers "what was the last after image of this key?" from, in order:

1. a bounded in-memory LRU of recent after images (``max_bytes`` of encoded values);
2. the dispatcher's buffer (records added but not yet durable), newest first;
3. the log: a per-partition index ``key -> offset of its latest record``, built by reading the
   partition the first time one of its keys misses the cache and extended with what was
   appended since on every later miss. Costs one pass over that partition plus about 100 bytes
   of memory per key; only partitions that needed a lookup are indexed.

Images are kept in Avro form (as encoded, by Avro field name) with their schema id, so a value
is re-encoded exactly as it was read. A value is taken only from a column of the same name and
the same type; anything else is reported as unavailable, never silently NULL.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from cdc.avro import EventCodec, TableCodec
from cdc.events import TableSchema
from cdc.log.base import ChangeLogReader, Record
from cdc.log.partitioner import partition_for

Image = tuple[int, dict[str, Any]]  # (schema id, after image by Avro field name)

#: logical types whose values are fixed-width in every source (never TOASTed, always sent)
FIXED_WIDTH = frozenset({"boolean", "int16", "int32", "int64", "uint64", "float32", "float64",
                         "date", "time", "timestamp", "timestamptz", "uuid", "enum", "interval",
                         "money", "timetz"})
#: Python's cost of a cached image beyond its encoded size (dict, key, LRU entry)
ENTRY_OVERHEAD = 400


def may_be_partial(schema: TableSchema) -> bool:
    """Whether a source may leave some of this table's values unsent (variable-width ones)."""
    cached = _PARTIAL.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, any(c.type.name not in FIXED_WIDTH for c in schema.columns))
        _PARTIAL[id(schema)] = cached
    return cached[1]


_PARTIAL: dict[int, tuple[TableSchema, bool]] = {}


class PreviousImages:
    """Finds the latest after image of a key (see the module docstring for where it looks)."""

    def __init__(self, log: ChangeLogReader, codec: EventCodec,
                 buffer: Callable[[], Sequence[Record]], max_bytes: int = 48 * 1024**2) -> None:
        self.log = log
        self.codec = codec
        self.buffer = buffer
        self.max_bytes = max_bytes
        self._lru: OrderedDict[tuple[str, bytes], tuple[Image | None, int]] = OrderedDict()
        self._bytes = 0
        self._index: dict[tuple[str, int], dict[bytes, int]] = {}
        self._indexed_to: dict[tuple[str, int], int] = {}
        self.log_lookups = 0
        self.log_scans = 0

    # -- keeping the cache -------------------------------------------------------------------
    def remember(self, topic: str, key: bytes, image: Image | None, size: int) -> None:
        """``image`` is now the latest of ``key`` (``None``: the key was deleted)."""
        entry = (topic, key)
        old = self._lru.pop(entry, None)
        if old is not None:
            self._bytes -= old[1]
        size += ENTRY_OVERHEAD
        self._lru[entry] = (image, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._lru:
            _, (_, evicted) = self._lru.popitem(last=False)
            self._bytes -= evicted

    def forget_all(self) -> None:
        """Drop the cache (after discarding records that were never made durable)."""
        self._lru.clear()
        self._bytes = 0

    # -- looking up --------------------------------------------------------------------------
    def latest(self, topic: str, key: bytes, before: bytes) -> Image | None:
        """The latest after image of ``key`` older than position ``before``; ``None`` if it
        has none (unknown or deleted).

        The cache and the buffer hold only what this process added, in position order, so
        their newest entry is older than the change being filled. The log may also hold
        records a crashed run wrote *after* the point being replayed: those are skipped.
        """
        cached = self._lru.get((topic, key))
        if cached is not None:
            self._lru.move_to_end((topic, key))
            return cached[0]
        for record in reversed(self.buffer()):
            if record.topic == topic and record.key == key:
                return self._image_of(record.value)
        return self._from_log(topic, key, before)

    def _image_of(self, value: bytes | None) -> Image | None:
        if value is None:
            return None
        schema_id, envelope = self.codec.decode_raw(value)
        after = envelope.get("after")
        return None if after is None else (schema_id, after)

    def _from_log(self, topic: str, key: bytes, before: bytes) -> Image | None:
        if topic not in {t.name for t in self.log.topics()}:
            return None
        self.log_lookups += 1
        partition = partition_for(key, len(self.log.end_offsets(topic)))
        index = self._catch_up(topic, partition)
        offset = index.get(key)
        if offset is None:
            return None
        for record in self.log.read(topic, partition, offset, 1):
            if record.offset == offset and record.key == key and record.position < before:
                return self._image_of(record.value)
        return self._scan_for(topic, partition, key, before)

    def _scan_for(self, topic: str, partition: int, key: bytes, before: bytes) -> Image | None:
        """The slow way, for replays after a crash: the key's newest record before ``before``
        found by reading the whole partition."""
        self.log_scans += 1
        best: tuple[bytes, bytes | None] | None = None
        for record in self.log.iter_partition(topic, partition):
            if record.key == key and record.position < before and (
                    best is None or record.position >= best[0]):
                best = (record.position, record.value)
        return None if best is None else self._image_of(best[1])

    def _catch_up(self, topic: str, partition: int) -> dict[bytes, int]:
        where = (topic, partition)
        index = self._index.setdefault(where, {})
        start = self._indexed_to.get(where, 0)
        for record in self.log.iter_partition(topic, partition, start):
            index[record.key] = record.offset
            start = record.offset + 1
        self._indexed_to[where] = start
        return index

    # -- filling -----------------------------------------------------------------------------
    def filler(self, topic: str, key: bytes, unchanged: Sequence[str], position: bytes
               ) -> Callable[[TableCodec, dict[str, Any]], list[str]]:
        """A fill function for :meth:`EventCodec.encode` completing ``unchanged`` columns of
        the change at ``position``."""

        def fill(codec: TableCodec, after: dict[str, Any]) -> list[str]:
            previous = self.latest(topic, key, position)
            if previous is None:
                return list(unchanged)
            schema_id, image = previous
            old_fields = {name: (field, ctype.describe())
                          for name, field, ctype in self.codec.columns_of(schema_id)}
            types = {column.name: column.type.describe() for column in codec.schema.columns}
            fields = dict(zip((c.name for c in codec.schema.columns),
                              (f for _, f, _ in codec.columns), strict=True))
            missing = []
            for name in unchanged:
                old = old_fields.get(name)
                value = image.get(old[0]) if old is not None else None
                if old is None or old[1] != types.get(name) or value is None:
                    missing.append(name)
                else:
                    after[fields[name]] = value
            return missing

        return fill
